"""View models for the "Contiguous vs paged" page: pandas DataFrames and sentences.

Pure functions over backend results (no Streamlit): labels, the memory maps and
the simulator's results here; the seed's example in backend.views.compare.seed; the
block-size, sharing and memory-calculator tables in backend.views.compare.tables.
Charts built from these frames live in backend.views.compare.charts. Fractions stay
fractions (0..1); the charts and the page format them as percentages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from backend.core.words import counted, percent, tenths
from backend.lab.compare.memory_maps import MapReplay, MapSegment, replay_maps, small_trace
from backend.lab.contiguous_types import SEGMENT_KINDS
from backend.lab.sim.simulator import SimConfig, SimResult, simulate

KIND_LABELS: dict[str, str] = {
    "token_states": "token states", "reservation": "reservation",
    "internal_fragmentation": "internal fragmentation",
    "external_fragmentation": "external fragmentation", "free": "free",
}
POLICY_LABELS: dict[str, str] = {
    "max": "contiguous, max length", "pow2": "contiguous, next power of two",
    "oracle": "contiguous, exact final length", "paged": "paged",
}
POLICY_SHORT: dict[str, str] = {"max": "max length", "pow2": "next power of two",
                                "oracle": "exact final length", "paged": "paged"}
POLICY_ORDER: tuple[str, ...] = ("max", "pow2", "oracle", "paged")
# The PagedAttention paper's Figure 2: the share of KV memory holding token
# states, measured on the paper's own testbed, and the systems it names.
PAPER_TOKEN_SHARE: dict[str, float] = {"max": 0.204, "pow2": 0.268, "oracle": 0.382,
                                       "paged": 0.963}
PAPER_SYSTEMS: dict[str, str] = {"max": "Orca (Max)", "pow2": "Orca (Pow2)",
                                 "oracle": "Orca (Oracle)", "paged": "vLLM"}


# The sharing kinds as the Sharing tab names them, in the order it shows them.
SHARING_KINDS: dict[str, str] = {"parallel": "parallel sampling", "beam": "beam search"}


def sharing_kinds(df: pd.DataFrame) -> list[str]:
    """The sharing kinds `df`'s "kind" column holds, in SHARING_KINDS' order."""
    present = set(df["kind"])
    return [k for k in SHARING_KINDS.values() if k in present]


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal: 0.2044 -> '20.4%' (`words.percent`)."""
    return percent(x)


# ---- one workload, two memories -----------------------------------------------


_KIND_INDEX = {k: i for i, k in enumerate(SEGMENT_KINDS)}


def _binned(segments: tuple[MapSegment, ...], capacity: int, per: int
            ) -> list[tuple[int, int, str, str | None]]:
    """Runs of (start, end, kind, owner) with slots grouped `per` to a row.

    A row shows the state holding most of its slots (ties go to the kind
    listed first, as in ContiguousArena.render) and that state's first owner.
    """
    kinds = np.repeat([_KIND_INDEX[s.kind] for s in segments], [s.length for s in segments])
    owners = [s.owner for s in segments]
    owner_ix = np.repeat(np.arange(len(segments)), [s.length for s in segments])
    rows = -(-capacity // per)
    pad = rows * per - capacity
    # Padding counts as nothing: kind index len(SEGMENT_KINDS) never wins.
    k2 = np.concatenate([kinds, np.full(pad, len(SEGMENT_KINDS))]).reshape(rows, per)
    o2 = np.concatenate([owner_ix, np.zeros(pad, dtype=np.int64)]).reshape(rows, per)
    counts = np.stack([(k2 == k).sum(axis=1) for k in range(len(SEGMENT_KINDS))], axis=1)
    dominant = counts.argmax(axis=1)
    first = (k2 == dominant[:, None]).argmax(axis=1)
    owner = o2[np.arange(rows), first]
    out: list[tuple[int, int, str, str | None]] = []
    for r, (k, o) in enumerate(zip(dominant.tolist(), owner.tolist(), strict=True)):
        kind, who = SEGMENT_KINDS[k], owners[o]
        end = min((r + 1) * per, capacity)
        if out and out[-1][2] == kind and out[-1][3] == who:
            out[-1] = (out[-1][0], end, kind, who)
        else:
            out.append((r * per, end, kind, who))
    return out


def _rects(replay: MapReplay, lo: int, hi: int, stride: int, per: int
           ) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    seen: set[int] = set()
    for f in replay.frames:
        col = (f.iteration - lo) // stride
        if f.segments is None or col in seen:
            continue
        seen.add(col)
        x = lo + col * stride
        runs = ([(s.start, s.start + s.length, s.kind, s.owner) for s in f.segments]
                if per == 1 else _binned(f.segments, replay.capacity, per))
        for start, end, kind, owner in runs:
            # The last column ends with the run, not a whole stride past it (and its axis).
            rows.append({"iteration": x, "iteration_end": min(x + stride, hi + 1),
                         "start": start, "end": end, "slots": end - start,
                         "kind": KIND_LABELS[kind], "owner": owner or ""})
    return rows


def map_segments(replay: MapReplay, *, first: int | None = None, last: int | None = None,
                 max_rects: int = 4500, max_columns: int = 200, max_rows: int = 384
                 ) -> tuple[pd.DataFrame, int]:
    """Rectangles of the memory map and the iterations each column spans.

    Long replays are drawn one column per `stride` iterations, each showing
    the first snapshot in its span, with at most `max_columns` columns and
    `max_rects` rectangles (a browser draws a few thousand marks quickly, not
    tens of thousands). The stride is a multiple of the replay's snapshot
    spacing, so every busy span has a snapshot. More slots than `max_rows`
    (more than a chart has pixels for) are grouped into rows of equal size,
    each showing its dominant state. The columns span `first`..`last` (default:
    the replay's own run), so a short run is never drawn at a longer run's
    stride; the last column ends one past `last`. Columns: iteration,
    iteration_end, start, end, slots, kind, owner.
    """
    shots = [f for f in replay.frames if f.segments is not None]
    lo = replay.frames[0].iteration if first is None else first
    hi = replay.frames[-1].iteration if last is None else last
    span = hi - lo + 1
    every = replay.snapshot_every
    per_shot = min(max_rows, sum(len(f.segments or ()) for f in shots) / len(shots))
    columns = max(1, min(max_columns, int(max_rects / per_shot)))
    stride = every * max(1, -(-span // (columns * every)))
    per = -(-replay.capacity // max_rows)
    rows = _rects(replay, lo, hi, stride, per)
    # The mean segment count can undershoot a busy stretch: widen until it fits.
    while len(rows) > max_rects and stride < span:
        stride = every * -(-stride * len(rows) // (max_rects * every))
        rows = _rects(replay, lo, hi, stride, per)
    return pd.DataFrame(rows), stride


def map_fractions(replay: MapReplay, stride: int = 1) -> pd.DataFrame:
    """Long form: iteration, kind, fraction (mean over each span of `stride` iterations)."""
    frames = replay.frames
    lo = frames[0].iteration
    sums: dict[int, dict[str, int]] = {}
    n: dict[int, int] = {}
    for f in frames:
        x = lo + (f.iteration - lo) // stride * stride
        acc = sums.setdefault(x, dict.fromkeys(SEGMENT_KINDS, 0))
        for k in SEGMENT_KINDS:
            acc[k] += f.counts[k]
        n[x] = n.get(x, 0) + 1
    rows = [{"iteration": x, "kind": KIND_LABELS[k], "order": i,
             "fraction": acc[k] / (n[x] * replay.capacity)}
            for x, acc in sums.items() for i, k in enumerate(SEGMENT_KINDS)]
    return pd.DataFrame(rows)


# What each state of the breakdown holds, in both memories: shown where the states are.
STATES_NOTE = (
    "What each state holds: token states, slots holding a token; reservation, slots kept "
    "for tokens still to come (contiguous) or blocks taken for prompt chunks not yet "
    "computed (paged); internal fragmentation, reserved slots past the final length, "
    "which will never hold a token (contiguous), or the empty slots of the blocks a "
    "request holds, fewer than a block per request, which its next tokens may still "
    "fill (paged); "
    "external fragmentation, free slots that together would hold the next waiting "
    "request's region but lie in holes each too small for it; free, every other free "
    "slot. Paged memory has no external fragmentation (any free block serves), and its "
    "capacity too small for a whole block counts as free.")


# The breakdown's row comparable with the paper's Figure 2, whose shares add up to the
# memory the systems hold: there is no "free" among its categories.
HELD_ROW = "token states (held)"
# What that row leaves out, said beside every table that has it.
HELD_NOTE = (f"\"{HELD_ROW}\" is the row to compare with the paper's Figure 2 shares: the "
             "token states' share of the memory, with the free slots left out and external "
             "fragmentation kept in (free slots too, but stranded between regions), as "
             "Figure 2 counts it.")


def held_token_share(result: SimResult) -> float:
    """The token-state share of the memory that is not free (free slots left out, external
    fragmentation kept in, as the paper's Figure 2 counts it): under load, when little is
    free, the same as the share of all memory. 0 when all is free."""
    held = 1.0 - result.memory["free"]
    return result.memory["token_states"] / held if held > 0 else 0.0


def breakdown_table(results: Sequence[SimResult]) -> pd.DataFrame:
    """One column per policy (in POLICY_ORDER) and a row per measure: the memory it is,
    batch sizes, preemptions, the five time-averaged shares, the token-state share of the
    memory held (`held_token_share`), and the paper's Figure 2 token-state share beside
    it. Policies side by side, as the paper's systems are,
    and narrow enough for a page: ten measures across would not be.

    Each cell fits a policy's 100 px column beside the sidebar in a 1024 px window
    (ui.compare.breakdown): "contiguous, next power of two" and "26.8% (Orca (Pow2))"
    were cut there. The column's name (max, pow2, oracle) says which contiguous policy
    and which Orca, and its tooltip names both in full."""
    ordered = sorted(results, key=lambda r: POLICY_ORDER.index(r.policy))
    rows: list[tuple[str, list[str]]] = [
        ("memory", ["paged" if r.policy == "paged" else "contiguous" for r in ordered]),
        ("mean batch", [f"{r.mean_batch_size:.2f}" for r in ordered]),
        ("max batch", [f"{r.max_batch_size:,}" for r in ordered]),
        ("preemptions", [f"{r.preemptions:,}" for r in ordered]),
        *((KIND_LABELS[k], [pct(r.memory[k]) for r in ordered]) for k in SEGMENT_KINDS),
        (HELD_ROW, [pct(held_token_share(r)) for r in ordered]),
        ("paper: token states", [f"{pct(PAPER_TOKEN_SHARE[r.policy])} "
                                 f"({PAPER_SYSTEMS[r.policy].split(' (')[0]})"
                                 for r in ordered]),
    ]
    return pd.DataFrame([[measure, *values] for measure, values in rows],
                        columns=["measure", *(r.policy for r in ordered)])


def memory_long(results: Sequence[SimResult]) -> pd.DataFrame:
    """Long form for a stacked bar: policy, kind, order, fraction."""
    return pd.DataFrame([{"policy": r.policy, "kind": KIND_LABELS[k], "order": i,
                          "fraction": r.memory[k]}
                         for r in results for i, k in enumerate(SEGMENT_KINDS)])


def policy_metrics(results: Sequence[SimResult]) -> pd.DataFrame:
    """policy, mean batch size, token-state share (of all memory, and of the memory held),
    the paper's share, preemptions,
    throughput, normalized latency: one row per result, in policy order."""
    return pd.DataFrame([{
        "policy": r.policy, "mean batch size": r.mean_batch_size,
        "max batch size": r.max_batch_size, "token states": r.memory["token_states"],
        HELD_ROW: held_token_share(r),
        "paper token states": PAPER_TOKEN_SHARE[r.policy], "preemptions": r.preemptions,
        "requests/s": r.throughput_requests_per_s,
        "normalized latency (s/token)": r.mean_normalized_latency_s,
        "iterations": r.iterations,
    } for r in sorted(results, key=lambda r: POLICY_ORDER.index(r.policy))])


def batch_gain_sentence(results: Sequence[SimResult]) -> str:
    """How many times the paged mean batch exceeds each contiguous one ('' if paged is absent)."""
    by = {r.policy: r for r in results}
    paged = by.get("paged")
    if paged is None:
        return ""
    parts = [f"{tenths(paged.mean_batch_size / by[p].mean_batch_size)}x {p}"
             for p in POLICY_ORDER[:3] if p in by]
    if not parts:
        return ""
    # tenths: the rounding of the Mean batch size chart's labels, so the two agree.
    return (f"Paged memory ran a mean batch of {tenths(paged.mean_batch_size)} requests: "
            + ", ".join(parts) + ".")


# Past this mean share of free memory, a policy's token-state share says more about the
# load than about the policy: the caption says so.
MOSTLY_FREE = 0.25
# From this share of its busy iterations with requests waiting for memory, a paged
# policy's free memory was not idle for want of work: the next request did not fit in it.
OFTEN_WAITED = 0.1


def free_memory_note(results: Sequence[SimResult]) -> str:
    """Why a token-state share sits far below the paper's when much memory stayed free
    ('' when every policy used most of its memory): free slots count in the shares. Free
    memory is the load's (the trace did not need it) unless, in paged memory, requests
    often waited for memory meanwhile: then the next in line did not fit in it. (In
    contiguous memory, free slots that would hold a waiting request together but in no
    one hole count as external fragmentation, not free; see STATES_NOTE.)"""
    idle = [r for r in results if r.memory["free"] > MOSTLY_FREE]
    if not idle:
        return ""
    most = max(idle, key=lambda r: r.memory["free"])
    left = (f"Free memory counts in these shares: {most.policy} left "
            f"{pct(most.memory['free'])} of its memory free on average")
    held = (f"the table's \"{HELD_ROW}\" leaves the free slots out ({most.policy}: "
            f"{pct(held_token_share(most))})")
    waited = most.memory_wait_iterations / most.iterations
    if most.block_size is not None and waited >= OFTEN_WAITED:
        return (f"{left}, yet in {pct(waited)} of its busy iterations requests waited for "
                "memory: the next in line needed more blocks than admission could give it "
                "(those free, less the watermark kept back), and those behind it waited "
                "too. Its token-state share is low because memory sat free that the queue "
                f"could not use, not because the policy wasted what it held; {held}.")
    capped = _budget_reached(most)
    if capped is not None:
        # The scheduler's budget, not the load, kept the batch small: a higher rate would
        # only lengthen the queue.
        return (f"{left}, while its batch was held at the scheduler budget ({capped}, "
                "reached): its token-state share is low because the budget let few requests "
                "run at once, not because the trace did not need the memory or the policy "
                f"wasted it; raise or clear the budget (Scheduler budgets), and {held}.")
    return (f"{left}, so its token-state share is low because this trace did not need the "
            "memory, not because the policy wasted it. The paper's shares are for memory "
            "under load: a higher rate (or time scale) or a smaller capacity fills it, and "
            f"{held}.")


def _budget_reached(r: SimResult) -> str | None:
    """The scheduler budget a run's batch reached ("max_num_batched_tokens 1"), if any:
    its busiest iteration ran as many tokens, or as many requests, as the budget allows."""
    if r.max_num_batched_tokens is not None and r.max_batched_tokens >= r.max_num_batched_tokens:
        return f"max_num_batched_tokens {r.max_num_batched_tokens:,}"
    if r.max_num_seqs is not None and r.max_batch_size >= r.max_num_seqs:
        return f"max_num_seqs {r.max_num_seqs:,}"
    return None


def finish_sentence(contiguous: MapReplay, paged: MapReplay) -> str:
    """In which iteration each memory finished the same requests, and the mean batch it ran."""
    def done(r: MapReplay) -> str:
        return (f"iteration {r.frames[-1].iteration:,} (mean batch "
                f"{tenths(r.mean_batch_size)}, {counted(r.preemptions, 'preemption')})")
    return (f"The last request finished in {done(contiguous)} in contiguous memory "
            f"({contiguous.policy}) and in {done(paged)} in paged memory.")


# A map shares the other's time axis only while its run fills at least this share of it;
# a shorter run would be a sliver at the left (a 614-iteration paged run beside an
# 11,552-iteration contiguous one), so each map then spans its own run.
SHARED_AXIS_SHARE = 0.25
# Points of a share chart at most: each averages its span's iterations, every one counted.
SHARE_POINTS = 300


def share_sentence(replay: MapReplay) -> str:
    """The run's time-averaged shares, the figures the breakdown table gives its policy."""
    shares = replay.breakdown()
    kept = [f"{KIND_LABELS[k]} {pct(shares[k])}" for k in SEGMENT_KINDS if shares[k] > 0]
    return (f"Averaged over its {len(replay.frames):,} busy iterations: " + ", ".join(kept)
            + ".")


def map_caption(stride: int, share_stride: int) -> str:
    """How the map's columns and the share chart's points sample the run ('' when both
    show every iteration)."""
    if stride == 1 and share_stride == 1:
        return ""
    columns = (f"One column per {stride:,} iterations (a snapshot from each span)"
               if stride > 1 else "One column per iteration")
    shares = (f"each point of the shares averages {share_stride:,} iterations, every one "
              "counted" if share_stride > 1 else "the shares show every iteration")
    return f"{columns}; {shares}."


def two_memories(workload: str, requests: int, rate: float, seed: int, max_len: int,
                 capacity: int, policy: str, block_size: int) -> dict[str, Any]:
    """One small trace replayed through a contiguous arena (`policy`) and the paged pool.

    Keys: finish (finish_sentence), shared (whether both maps use one time axis), axes
    (the sentence that says why they do not, '' when they do), left
    and right (a dict each: segments and stride from map_segments, fractions from
    map_fractions, domain, caption, shares), and table (the simulator's result for every
    policy on the same trace). Each map's columns and share points are spaced by its
    own run's length, never by the other's; the axes are shared only while the shorter
    run fills SHARED_AXIS_SHARE of it.
    """
    trace = small_trace(workload, requests, rate, seed, max_len)
    left = replay_maps(trace, policy, capacity, max_len=max_len)
    right = replay_maps(trace, "paged", capacity, block_size=block_size, max_len=max_len)
    spans = {side: (r.frames[0].iteration, r.frames[-1].iteration + 1)
             for side, r in (("left", left), ("right", right))}
    lengths = [hi - lo for lo, hi in spans.values()]
    shared = min(lengths) >= SHARED_AXIS_SHARE * max(lengths)
    if shared:
        both = (min(lo for lo, _ in spans.values()), max(hi for _, hi in spans.values()))
        spans = dict.fromkeys(spans, both)
    (a, b), (c, d) = spans["left"], spans["right"]
    axes = ("" if shared else
            f"The contiguous run spans iterations {a:,}–{b - 1:,} and the paged run "
            f"{c:,}–{d - 1:,}: too different to share a time axis (the shorter would be a "
            "sliver), so each map and share chart spans its own run.")
    out: dict[str, Any] = {"finish": finish_sentence(left, right), "shared": shared,
                           "axes": axes}
    for side, replay in (("left", left), ("right", right)):
        segs, stride = map_segments(replay)
        own = replay.frames[-1].iteration - replay.frames[0].iteration + 1
        share_stride = max(1, -(-own // SHARE_POINTS))
        out[side] = {"segments": segs, "stride": stride,
                     "fractions": map_fractions(replay, share_stride),
                     "domain": spans[side], "caption": map_caption(stride, share_stride),
                     "shares": share_sentence(replay)}
    out["table"] = [simulate(trace, SimConfig(p, capacity, block_size, max_len))  # type: ignore[arg-type]
                    for p in POLICY_ORDER]
    return out
