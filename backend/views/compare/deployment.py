"""The real-deployment preset's words and its Figure 13 chart (no Streamlit)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby, pairwise

import altair as alt
import pandas as pd

from backend.core.words import counted, joined, percent, tenths
from backend.lab import deployment as dep
from backend.lab.sim.simulator import SimResult, SimRun
from backend.views.compare.frames import PAPER_SYSTEMS, POLICY_ORDER


def rate_text(per_s: float) -> str:
    """A measured rate to three significant digits, with thousands separators and no
    trailing zeros: 5.5312 -> '5.53', 276.18 -> '276', 1,027.4 -> '1,027', 0.05531 ->
    '0.0553'. The trace simulator and the deployment preset both say a trace's mean rate
    this way, so one trace reads the same in both."""
    if not per_s > 0:
        return "0"
    places = max(0, 2 - math.floor(math.log10(per_s)))
    shown = f"{per_s:,.{places}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def as_typed(x: float) -> str:
    """A number as typed in one of the page's fields (a time scale, a rate: two decimals
    at most), with thousands separators and no exponent: 1e6 -> '1,000,000', 0.01 ->
    '0.01', 50.0 -> '50'."""
    shown = f"{x:,.2f}"
    return shown.rstrip("0").rstrip(".")


def synthetic_label(workload: str, requests: int, rate: float, seed: int) -> str:
    """How a synthetic trace is named in the last run's caption: 'sharegpt, 1 request at
    4/s, seed 0' (the rate as typed)."""
    return f"{workload}, {counted(requests, 'request')} at {as_typed(rate)}/s, seed {seed:,}"


def compression(scale: float) -> str:
    """What a time scale did to the arrivals, in words: 'not compressed' at 1, 'compressed
    50 times' above it, 'spread out 100 times' below it (the gaps multiplied)."""
    if as_typed(scale) == "1":
        return "not compressed"
    if scale > 1:
        return f"compressed {as_typed(scale)} times"
    return f"spread out {rate_text(1 / scale)} times"


def preset_sentence(d: dep.Deployment) -> str:
    """Markdown: the machine, the memory and the trace the preset replays."""
    cap = d.capacity
    left = (f"; {counted(d.left_out, 'request')} longer than the "
            f"{dep.CONTEXT_LEN:,}-token context left out" if d.left_out else "")
    return (
        f"**{dep.MODEL} on one {dep.GPU}.** {cap.bytes_per_token:,} bytes of KV per token "
        f"(2 x {cap.model.num_layers} layers x {cap.model.num_kv_heads} KV heads x "
        f"{cap.model.head_dim} x 2 bytes); of {cap.gpu_bytes / 2**30:g} GiB, a 10% reserve "
        f"and {cap.weight_bytes / 2**30:.2f} GiB of bf16 weights leave "
        # Exact bytes: 111.0 GiB x 8,192 tokens a GiB is not the slot count, the bytes
        # divided by the bytes a token takes are.
        f"{cap.kv_bytes / 2**30:.2f} GiB ({cap.kv_bytes:,} bytes / "
        f"{cap.bytes_per_token:,}): **{d.capacity_tokens:,} token slots** for the "
        f"contiguous policies, **{d.num_blocks:,} blocks of {dep.BLOCK_SIZE}** for paged "
        f"({_block_slots(d)}). Orca (Max) reserves the "
        f"{dep.CONTEXT_LEN:,}-token context per request. The trace: {d.workload}, "
        f"{len(d.trace):,} requests{left}, arrivals {compression(d.time_scale)} "
        f"(mean {rate_text(d.trace.rate)} requests/s), {dep.ITERATION_S * 1000:g} ms per "
        "iteration.")


def _block_slots(d: dep.Deployment) -> str:
    # The pool holds whole blocks: the token slots past the last one hold nothing.
    slots = d.num_blocks * dep.BLOCK_SIZE
    spare = d.capacity_tokens - slots
    return f"{slots:,} slots" + (f"; the {spare:,} left over fill no block" if spare else "")


def figure13_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """policy, system (the paper's names), mean batched requests, in the paper's order."""
    by = {r.policy: r for r in results}
    return pd.DataFrame([{"policy": p, "system": PAPER_SYSTEMS[p],
                          "mean batched requests": by[p].mean_batch_size}
                         for p in POLICY_ORDER if p in by])


def _shown(value: float) -> float:
    # What the sentence and the chart's labels show (words.tenths): values compared at
    # this precision, so that two bars labelled 29.1 are never said to differ.
    return float(tenths(value).replace(",", ""))


def figure13_holds(results: Sequence[SimResult]) -> bool:
    """Whether Orca Max < Pow2 < Oracle < paged in mean batched requests as shown (one
    decimal; all four run)."""
    values = [_shown(v) for v in figure13_frame(results)["mean batched requests"]]
    return len(values) == 4 and all(a < b for a, b in pairwise(values))


def figure13_sentence(results: Sequence[SimResult]) -> str:
    """'Mean batched requests: Orca (Max) 109.3 < ...' (each pair compared as shown: <, =
    or >) and what that says against the paper's Figure 13."""
    df = figure13_frame(results)
    systems = df["system"].tolist()
    values = df["mean batched requests"].tolist()
    parts = [f"{s} {tenths(v)}" for s, v in zip(systems, values, strict=True)]
    if len(parts) < 4:
        return "Mean batched requests: " + ", ".join(parts) + "."
    shown = [_shown(v) for v in values]
    said = parts[0]
    for (a, b), part in zip(pairwise(shown), parts[1:], strict=True):
        said += f" {'<' if a < b else '=' if a == b else '>'} {part}"
    said = "Mean batched requests: " + said
    if figure13_holds(results):
        return said + ": the direction of the paper's Figure 13" + _close_note(results) + "."
    if any(a > b for a, b in pairwise(shown)):
        return said + ": NOT the direction of the paper's Figure 13."
    if len(set(shown)) == 1:
        return (said + ": equal, so memory is not the limit at this load, as the "
                "introduction above says; a larger time scale makes it bind, the regime of "
                "the paper's Figure 13.")
    # Never backwards, but some systems level: memory has not yet set them apart.
    level = [joined([s for s, _ in g]) for _, g in groupby(zip(systems, shown, strict=True),
                                                             key=lambda p: p[1])]
    level = [names for names in level if " and " in names]
    return (said + ": the paper's direction where the values differ, but "
            + "; ".join(f"{names} batch the same" for names in level)
            + ": at this load memory does not set them apart (in the paper's Figure 13 each "
            "system batches more than the one before it).")


# Bars within this share of vLLM's are said to be close: the order holds, the gap is small.
CLOSE = 0.05


def _near(results: Sequence[SimResult]) -> list[str]:
    """The policies, in POLICY_ORDER, whose mean batch lies within CLOSE of paged memory's
    (paged itself included)."""
    by = {r.policy: r for r in results}
    top = by["paged"].mean_batch_size
    return [p for p in POLICY_ORDER if p in by and by[p].mean_batch_size >= (1 - CLOSE) * top]


def _close_note(results: Sequence[SimResult]) -> str:
    """'' unless the systems next below vLLM batch within CLOSE of it; then which, and
    how close."""
    near = _near(results)
    if len(near) < 2:
        return ""
    by = {r.policy: r for r in results}
    low = min(by[p].mean_batch_size for p in near)
    return (f", but {joined([PAPER_SYSTEMS[p] for p in near])} lie within "
            f"{percent(1 - low / by['paged'].mean_batch_size)} of one another")


def figure13_waits(results: Sequence[SimResult]) -> str:
    """Why bars lie close ('' unless `figure13_sentence` says they do): how often requests
    waited for room under each policy. Memory can set the policies apart only in those
    iterations (the preset sets no budget, so a request waits only for memory)."""
    if len(_near(results)) < 2 or not figure13_holds(results):
        return ""
    by = {r.policy: r for r in results}
    waits = [f"{percent(by[p].memory_wait_iterations / by[p].iterations)} under "
             f"{PAPER_SYSTEMS[p]}" for p in POLICY_ORDER if p in by]
    waits[0] = waits[0].replace(" under ", " of the busy iterations under ", 1)
    return (f"Requests waited for room in {joined(waits)}: only there can memory hold a "
            "batch back, and in the other iterations every request that had arrived was "
            "running, whatever the policy, so the means differ little (below: why the gaps "
            "are small on this trace).")


def figure13_chart(df: pd.DataFrame) -> alt.LayerChart:
    """One bar per system, labelled with its mean batch (the paper's Figure 13 layout)."""
    order = df["system"].tolist()
    # Labels written here, as the sentence writes them (the browser rounds 1.25 to 1.3,
    # Python's own formatting to 1.2).
    df = df.assign(label=[tenths(v) for v in df["mean batched requests"]])
    base = alt.Chart(df).encode(x=alt.X("system:N", sort=order, title=None,
                                        axis=alt.Axis(labelAngle=0)))
    bars = base.mark_bar(color="#1f4e8c").encode(
        y=alt.Y("mean batched requests:Q", title="mean batched requests"),
        tooltip=["system:N", alt.Tooltip("label:N", title="mean batched requests")])
    text = base.mark_text(baseline="bottom", dy=-3).encode(
        y="mean batched requests:Q", text=alt.Text("label:N"))
    told = ", ".join(f"{s} {t}" for s, t in zip(order, df["label"], strict=True))
    return (bars + text).properties(
        title="Mean batched requests (cf. the paper's Figure 13)", height=260,
        description=f"Mean batched requests, one bar per system (cf. the paper's Figure 13): "
                    f"{told}.")


def memory_filled(runs: Sequence[SimRun]) -> list[str] | None:
    """The systems (the paper's names, in its order) under which a request ever waited for
    room, or None when there is no run, or one without a timeline, to tell. The preset sets
    no scheduler budget, so a request waits only when memory cannot take it: memory was
    full for that policy."""
    if not runs or any(r.timeline is None for r in runs):
        return None
    waited = {r.result.policy for r in runs
              if r.timeline is not None and bool((r.timeline.columns["waiting"] > 0).any())}
    return [PAPER_SYSTEMS[p] for p in POLICY_ORDER if p in waited]


def length_note(d: dep.Deployment, runs: Sequence[SimRun]) -> str:
    """Why paged memory's gain over Orca (Oracle) is as large as it is on this trace, and
    whether memory filled in these runs (`runs`: the preset's replays)."""
    t = d.trace
    share = float(t.output_len.sum() / t.final_len.sum())
    max_fit = d.capacity_tokens // dep.CONTEXT_LEN
    said = (
        f"On {d.workload} the outputs are {percent(share)} of the tokens a request holds when it "
        f"finishes (prompts {t.prompt_len.mean():,.0f} tokens on average, outputs "
        f"{t.output_len.mean():,.0f}). Orca (Oracle) reserves exactly the final length, so "
        "what paged memory saves over it is the output not generated yet plus the holes "
        "between regions: the longer the outputs, the larger the gap. Orca (Max) reserves "
        f"the whole {dep.CONTEXT_LEN:,}-token context and fits {max_fit:,} requests at "
        "most; Pow2 rounds each final length up to a power of two.")
    filled = memory_filled(runs)
    if filled is None:
        return said
    if not filled:
        return (said + " In these replays memory never filled: no request waited for room "
                "under any policy, so each ran from its arrival and the mean batch is the "
                "trace's own concurrency, the same for every policy.")
    everyone = len(filled) == len({r.result.policy for r in runs})
    return (said + (" Once memory is full" if everyone else
                    f" Memory filled for {joined(filled)} only (a request waited for room); "
                    "once it is full")
            + " the mean batch is set by what fits; once the burst is served, the last long "
            "outputs run almost alone (see the timeline).")
