"""The live engine's timeline as tables and a chart (backend.engine.timeline records it).

`timeline_frame` has one row per iteration the engine ran, in the simulator's
columns (so `backend.views.compare.timeline.timeline_chart` draws both) plus
`step` (the operation, whose state the Playground keeps), the prefix-hit rate
and the measured wall time. `latency_frame` has one row per request: time to
first token and time per output token, in iterations and in milliseconds of
the engine's work.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from backend.core.words import counted
from backend.engine.timeline import COLUMNS, EngineTimeline
from backend.views.describe import span

LATENCY_COLUMNS = ("request", "arrived", "first_token", "finished", "generated",
                   "ttft_iterations", "tpot_iterations", "ttft_ms", "tpot_ms")


def timeline_frame(tl: EngineTimeline, num_blocks: int, block_size: int) -> pd.DataFrame:
    """One row per recorded iteration; empty (with the columns) before the first."""
    data = np.asarray(tl.rows, dtype=np.int64).reshape(-1, len(COLUMNS))
    df = pd.DataFrame(data, columns=list(COLUMNS))
    ms = np.asarray(tl.row_ms, dtype=np.float64)
    df["wall_ms"] = ms
    df["time_s"] = np.cumsum(ms) / 1e3
    # Each derived column beside those it comes from, as the README's table lists them.
    df.insert(df.columns.get_loc("allocated_slots") + 1, "free_slots",
              num_blocks * block_size - df["allocated_slots"])
    queried = df["prefix_query_tokens"].astype("Float64")
    df.insert(df.columns.get_loc("prefix_hit_tokens") + 1, "prefix_hit_rate",
              (df["prefix_hit_tokens"] / queried.where(queried > 0)).astype("Float64"))
    return df


def strip_description(data: pd.DataFrame, per: int = 1) -> str:
    """The Playground's strip of bars to click, in a sentence: how many bars over which
    iterations, the most blocks used, and how many rows' states are no longer kept.
    `data` is what the strip draws (iteration, used_blocks, kept), `per` the iterations
    each bar stands for."""
    if data.empty:
        return "Blocks used per iteration: no iteration yet."
    lo, hi = int(data["iteration"].iloc[0]), int(data["iteration"].iloc[-1])
    each = "iteration" if per == 1 else f"{per:,} iterations"
    top = data.loc[data["used_blocks"].idxmax()]
    gone = int((data["kept"] == "not kept").sum())
    within = int((data["kept"] == "kept at its step's end").sum())
    grey = (f"; the state after {gone:,} of them is no longer kept (grey)" if gone else
            "; the state after each is kept" if not within else "")
    if within:
        grey += (f"; {within:,} fall inside a step of several iterations, whose state is kept "
                 "only at the step's end (light blue)")
    return (f"Blocks used, one bar to click per {each} ({counted(len(data), 'bar')}, "
            f"iterations {span(lo, hi)}), to show the state after it: at most "
            f"{top['used_blocks']:,.{0 if per == 1 else 1}f} used (iteration "
            f"{int(top['iteration']):,}){grey}.")


def unlisted_note(tl: EngineTimeline, request_ids: list[str]) -> str:
    """Which of the engine's requests the latency table leaves out, and why ('' when it
    lists them all): those that arrived before this timeline began (a reload, a
    restored snapshot or a session reopened starts a new one)."""
    missing = [rid for rid in request_ids if rid not in tl.requests]
    if not missing:
        return ""
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8:,} more" if len(missing) > 8
                                      else "")
    its = "its" if len(missing) == 1 else "their"
    return (f"Not listed: {shown}, which arrived before this timeline began (a reload, a "
            f"restored snapshot or a reopened session starts a new one), so {its} arrival "
            "and first token are not on it.")


def latency_frame(tl: EngineTimeline) -> pd.DataFrame:
    """One row per request the timeline saw arrive, in arrival order.

    `arrived`, `first_token` and `finished` are rows of the timeline (its
    `iteration`, as the chart numbers them). TTFT counts from the `add` to the
    first token; TPOT is the time from the first token to the last over the
    tokens after the first (empty until a request has two). Their iterations are
    the scheduler's; milliseconds are the engine's work time, not time spent
    between clicks.
    """
    rows = []
    for rid, t in tl.requests.items():
        ttft = None if t.first_token is None else t.first_token - t.arrived
        ttft_ms = None if t.first_token_s is None else (t.first_token_s - t.arrived_s) * 1e3
        tpot = tpot_ms = None
        if t.num_generated > 1:
            assert t.first_token is not None and t.last_token is not None
            assert t.first_token_s is not None and t.last_token_s is not None
            tpot = (t.last_token - t.first_token) / (t.num_generated - 1)
            tpot_ms = (t.last_token_s - t.first_token_s) * 1e3 / (t.num_generated - 1)
        rows.append((rid, t.arrived_row, t.first_token_row, t.finished_row, t.num_generated,
                     ttft, tpot, ttft_ms, tpot_ms))
    df = pd.DataFrame(rows, columns=list(LATENCY_COLUMNS))
    for col in ("arrived", "first_token", "finished", "generated", "ttft_iterations"):
        df[col] = df[col].astype("Int64")
    for col in ("tpot_iterations", "ttft_ms", "tpot_ms"):
        df[col] = df[col].astype("Float64")
    return df
