"""Swap against recompute by block size (backend.engine.measure) as a table, a chart and words.

The paper (section 7.3, Figure 19) finds swapping slow at small block sizes,
where it becomes many small CPU-GPU transfers, and recomputation's cost flat
in the block size, so recomputation wins for small blocks and the two are
comparable for medium ones. These functions show what the live engine
measured, and say what is the same and what is not: here the host pool is
ordinary memory on the same CPU unless the engine runs on a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import altair as alt
import pandas as pd

from backend.core.words import counted, sentence
from backend.engine.measure import PreemptionRun
from backend.views.describe import trend


def runs_frame(runs: Sequence[PreemptionRun]) -> pd.DataFrame:
    """One row per run: block size, mode and what it did and cost."""
    return pd.DataFrame([{
        "block size": r.block_size, "mode": r.mode, "blocks": r.num_blocks, "steps": r.steps,
        "wall ms": round(r.wall_ms, 1), "preemptions": r.preemptions,
        "recomputed tokens": r.recomputed_tokens, "recompute ms": round(r.recompute_ms, 2),
        "swapped blocks": r.swapped_blocks, "swap ms": round(r.swap_ms, 2),
        # NaN, not None: a missing number, which the page's table shows as its placeholder.
        "µs per block": (round(_per_block(r), 1)
                         if r.swapped_blocks else float("nan")),
        "same tokens": r.same_tokens,
    } for r in runs])


def overhead_frame(runs: Sequence[PreemptionRun]) -> pd.DataFrame:
    """Per block size: the time each method spent on its preemptions (long form)."""
    rows = []
    for r in runs:
        if r.mode == "recompute":
            rows.append({"block size": r.block_size, "method": "recompute (re-prefill)",
                         "ms": r.recompute_ms})
        elif r.mode == "swap":
            rows.append({"block size": r.block_size, "method": "swap (copy out and in)",
                         "ms": r.swap_ms})
    return pd.DataFrame(rows, columns=["block size", "method", "ms"])


def overhead_chart(runs: Sequence[PreemptionRun], *, width: int = 520) -> alt.Chart:
    df = overhead_frame(runs)
    # Streamlit's theme fits title, legend and axes into the height: with the x labels
    # upright and 300 px, the plot keeps room for its y scale.
    # A legend of strokes, so it shows each method's dash (points would blur it); one
    # legend for colour and dash, as a legend left out for one would conflict with the
    # other's (Vega-Lite warns in the console).
    legend = alt.Legend(orient="top", symbolType="stroke")
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("block size:O", title="block size (tokens)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("ms:Q", title="time spent on preemptions (ms)"),
        color=alt.Color("method:N", title=None, legend=legend),
        strokeDash=alt.StrokeDash("method:N", title=None, legend=legend),
        tooltip=["block size:O", "method:N", alt.Tooltip("ms:Q", format=",.2f")],
    ).properties(width=width, height=300,
                 title="Preemption overhead by block size, measured on this engine",
                 description=_overhead_description(df))


def _overhead_description(df: pd.DataFrame) -> str:
    """Each method's milliseconds at each block size (the first and last size past
    MAX_LISTED of them)."""
    told = []
    for method in dict.fromkeys(df["method"]):
        rows = df[df["method"] == method].sort_values("block size")
        points = [f"{ms:,.2f} ms at block size {int(b)}"
                  for b, ms in zip(rows["block size"], rows["ms"], strict=True)]
        told.append(f"{method} {trend(points)}")
    said = "; ".join(told) if told else "no run preempted"
    return ("Preemption overhead by block size, measured on this engine: the time each "
            f"method spent on its preemptions, one line per method. {sentence(said)}.")


def _per_block(r: PreemptionRun) -> float:
    """Microseconds of swap copying per block moved."""
    return r.swap_ms * 1e3 / r.swapped_blocks


def _per_slot(r: PreemptionRun) -> float:
    """Microseconds of swap copying per token slot moved."""
    return _per_block(r) / r.block_size


def _copy_sentence(swapped: Sequence[PreemptionRun]) -> str:
    """What swapping's copies cost at the smallest and largest block size that swapped,
    per block and per token slot; the paper's point (small blocks cost more per slot)
    judged over every size that swapped, and only where there are two."""
    lo, hi = swapped[0], swapped[-1]
    if lo is hi:
        return (f"Swapping copied {lo.swapped_blocks:,} blocks, only at block size "
                f"{lo.block_size}: {_per_block(lo):.1f} µs per block, "
                f"{_per_slot(lo):.2f} µs per token slot. ")
    said = (f"Swapping copied {lo.swapped_blocks:,} blocks at block size {lo.block_size} and "
            f"{hi.swapped_blocks:,} at {hi.block_size}: {_per_block(lo):.1f} µs per block "
            f"against {_per_block(hi):.1f} µs, or {_per_slot(lo):.2f} µs per token slot "
            f"against {_per_slot(hi):.2f} µs. ")
    # As printed: ends that read alike ("5.00 µs against 5.00 µs") are not told apart.
    slots = [round(_per_slot(r), 2) for r in swapped]
    if slots[0] <= slots[-1]:
        return said + ("Per slot moved, small blocks did not cost more here, unlike the "
                       "paper's finding. ")
    if all(a > b for a, b in itertools.pairwise(slots)):
        return said + ("Per slot moved, small blocks cost more: each copy's fixed overhead "
                       "weighs most at small blocks, the paper's point. ")
    # The ends agree with the paper, the sizes between do not all: said with every
    # figure, since one reading of the ends would claim more than the runs show.
    each = ", ".join(f"{v:.2f} µs at {r.block_size}" for r, v in zip(swapped, slots,
                                                                       strict=True))
    return said + ("Per slot moved, the smallest block cost more than the largest, as in the "
                   f"paper, but not at every size between ({each}): copies this short are "
                   "timed with noise. ")


def summary(runs: Sequence[PreemptionRun], device: str, slots: int | None = None) -> str:
    """What the runs show, in a few sentences with their numbers (`slots`: the device
    pool asked for, in token slots, to say where the runs needed more)."""
    swap = sorted((r for r in runs if r.mode == "swap" and r.swapped_blocks),
                  key=lambda r: r.block_size)
    rec = {r.block_size: r for r in runs if r.mode == "recompute"}
    if not swap:
        return ("No run preempted: the pool held every request at these block sizes. Use "
                "more requests or fewer token slots.")
    same = all(r.same_tokens for r in runs)
    lo = swap[0]
    faster = [r.block_size for r in swap if r.block_size in rec
              and r.swap_ms < rec[r.block_size].recompute_ms]
    # The decisions themselves, not only their count: which request, at which step.
    alike = all(r.block_size in rec and r.preempted == rec[r.block_size].preempted
                and r.steps == rec[r.block_size].steps for r in swap)
    parts = [
        ("Both methods made the same decisions, preempting the same requests at the same "
         f"steps at every block size ({counted(lo.preemptions, 'preemption')} at block size "
         f"{lo.block_size}); " if alike else
         "The two methods' runs took different decisions; ")
        + ("every request generated exactly the tokens of the run that never preempted. "
           if same else "some request's tokens differed from the reference run: a bug. "),
        _copy_sentence(swap),
        _recompute_sentence([rec[b] for b in sorted(rec) if rec[b].recomputed_tokens]),
        (f"Swapping spent less time on its preemptions than recomputing did at block "
         f"size{'s' * (len(faster) > 1)} {', '.join(map(str, faster))} (the runs' wall "
         "times include everything else). " if faster else
         "Recomputing spent less time on its preemptions than swapping did at every block "
         "size here. "),
    ]
    raised = sorted({(r.block_size, r.num_blocks * r.block_size) for r in runs
                     if r.mode != "roomy" and slots is not None
                     and r.num_blocks * r.block_size > slots})
    if raised:
        parts.append("To hold the longest request, with a block to spare, the pool took more "
                     "than the "
                     f"{slots:,} slots asked for at block "
                     f"size{'s' * (len(raised) > 1)} "
                     + ", ".join(f"{bs} ({n:,} slots)" for bs, n in raised) + ". ")
    if device == "cpu":
        parts.append("On this machine the host pool is the same CPU's memory, so a swap is a "
                     "memory copy, not a PCIe transfer as in the paper, and the tiny model's "
                     "prefill is cheap: the shape is what compares, not the magnitudes.")
    return "".join(parts)


# Recomputation's costs per token at every block size count as the same when the highest
# is within this ratio of the lowest: the paper's is flat, and a CPU's prefill timings
# move by tens of percent.
SAME_WITHIN = 1.5
# A recompute cost per token below this (µs) prints as 0.0, and is not compared.
UNTIMED_US = 0.05


def _recompute_sentence(recomputed: Sequence[PreemptionRun]) -> str:
    """What recomputation cost per token at every block size that recomputed (in order
    of size); whether that was about the same at all of them (the paper's flat cost) is
    judged over every size, not the two ends alone, which could hide a peak between."""
    def per(r: PreemptionRun) -> float:
        return r.recompute_ms * 1e3 / r.recomputed_tokens

    if not recomputed:
        return ""
    lo, hi = recomputed[0], recomputed[-1]
    if lo is hi:
        cost = ("too quick to time" if per(lo) < UNTIMED_US else
                f"{per(lo):.1f} µs per token")
        return (f"Recomputation re-prefilled {lo.recomputed_tokens:,} tokens, only at block "
                f"size {lo.block_size} ({cost}). ")
    costs = [per(r) for r in recomputed]
    said = (f"Recomputation re-prefilled {lo.recomputed_tokens:,} tokens at block size "
            f"{lo.block_size} and {hi.recomputed_tokens:,} at {hi.block_size}; µs per token: "
            + ", ".join(f"{c:.1f} at {r.block_size}"
                        for r, c in zip(recomputed, costs, strict=True)))
    # Below UNTIMED_US a cost prints as 0.0: not a time to compare.
    untimed = [r.block_size for r, c in zip(recomputed, costs, strict=True) if c < UNTIMED_US]
    if untimed:
        sizes = ", ".join(map(str, untimed))
        return said + (f". Too quick to time at block size{'s' * (len(untimed) > 1)} {sizes}, "
                       "so the sizes are not compared. ")
    low, high = min(costs), max(costs)
    if high / low < SAME_WITHIN:
        return said + (f". About the same at every size (the highest {high / low:.2f}× the "
                       f"lowest, under {SAME_WITHIN:g}×), as the paper's flat cost. ")
    return said + (f". Not the same at every size here (the highest {high / low:.1f}× the "
                   "lowest; each is one timed run). ")
