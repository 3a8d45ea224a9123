"""Per-iteration timelines of a replay: requests, blocks, tokens and preemptions over time.

The replay visits only iterations where something happens (backend.lab.sim.replay);
between two visits nothing changes but the decoding requests' lengths and the
arrivals into the waiting queue. So the recorder keeps, for each visited busy
iteration, the state during it and the state after its finishes, and `build`
fills the quiet iterations in between exactly: the same running requests, each
decoding one token, no prefill, no preemption, the same memory, and the waiting
queue grown by the arrivals up to that iteration. Idle iterations (nothing
running, nobody waiting) are not iterations the engine runs, so they are left
out, as in the averages.

Columns of `Timeline.columns`, one entry per busy iteration:

    iteration, running, prefilling (running requests still in their prompt's
    chunks), waiting, admitted (requests admitted in the iteration, readmissions
    after a preemption included), prefill_tokens, decode_tokens, preemptions, finished,
    token_slots (slots holding a computed token), allocated_slots (slots the
    policy holds), used_blocks, cached_blocks, free_blocks (paged only; -1
    for the contiguous policies)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS: tuple[str, ...] = (
    "iteration", "running", "prefilling", "waiting", "admitted", "prefill_tokens",
    "decode_tokens",
    "preemptions", "finished", "token_slots", "allocated_slots", "used_blocks",
    "cached_blocks", "free_blocks")
_NO_BLOCKS = (-1, -1, -1)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One row per busy iteration, in order; `columns` maps COLUMNS to integer arrays."""

    columns: dict[str, np.ndarray]
    iteration_s: float
    capacity_tokens: int
    block_size: int | None      # None for the contiguous policies

    def __len__(self) -> int:
        return len(self.columns["iteration"])

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.columns.values())


class TimelineRecorder:
    """Filled by `replay` (`during`, then `after`, once per visited busy iteration)."""

    def __init__(self) -> None:
        self._during: list[tuple[int, ...]] = []
        self._after: list[tuple[int, ...]] = []

    def during(self, k: int, running: int, prefilling: int, waiting: int, admitted: int,
               prefill_tokens: int, decode_tokens: int, preemptions: int, tokens: int,
               allocated: int, blocks: tuple[int, int, int] | None) -> None:
        """Mutates: the state iteration k's attention reads (before its finishes)."""
        self._during.append((k, running, prefilling, waiting, admitted, prefill_tokens,
                             decode_tokens, preemptions, tokens, allocated,
                             *(blocks or _NO_BLOCKS)))

    def after(self, running: int, waiting: int, arrived: int, c_sum: int, allocated: int,
              blocks: tuple[int, int, int] | None, finished: int) -> None:
        """Mutates: the state after the finishes of the iteration just recorded.

        `arrived`: requests pulled into the queue so far; `c_sum`: the replay's
        sum of n - a over decoding requests (tokens at iteration j = c_sum + running * j).
        """
        self._after.append((running, waiting, arrived, c_sum, allocated,
                            *(blocks or _NO_BLOCKS), finished))

    def build(self, arrival_iteration: np.ndarray, *, iteration_s: float, capacity_tokens: int,
              block_size: int | None) -> Timeline:
        """Reads only: the per-iteration timeline, quiet iterations filled in."""
        d = np.asarray(self._during, dtype=np.int64).reshape(-1, 13)
        a = np.asarray(self._after, dtype=np.int64).reshape(-1, 9)
        k = d[:, 0]
        run_after = a[:, 0]
        # Quiet iterations after row r: k_r + 1 .. k_{r+1} - 1, if anything still runs.
        gaps = np.zeros(len(k), dtype=np.int64)
        if len(k) > 1:
            gaps[:-1] = k[1:] - k[:-1] - 1
        gaps[run_after == 0] = 0
        src = np.repeat(np.arange(len(k)), gaps)
        # Offsets 1..gap within each span.
        starts = np.cumsum(gaps) - gaps
        off = np.arange(len(src), dtype=np.int64) - np.repeat(starts, gaps) + 1
        qk = k[src] + off
        q_run = run_after[src]
        arrived_by = np.searchsorted(np.asarray(arrival_iteration, dtype=np.int64), qk,
                                     side="right")
        zeros = np.zeros(len(src), dtype=np.int64)
        quiet = {
            "iteration": qk, "running": q_run, "prefilling": zeros,
            "waiting": a[src, 1] + arrived_by - a[src, 2], "admitted": zeros,
            "prefill_tokens": zeros, "decode_tokens": q_run, "preemptions": zeros,
            "finished": zeros, "token_slots": a[src, 3] + q_run * qk,
            "allocated_slots": a[src, 4], "used_blocks": a[src, 5],
            "cached_blocks": a[src, 6], "free_blocks": a[src, 7],
        }
        busy = {
            "iteration": k, "running": d[:, 1], "prefilling": d[:, 2], "waiting": d[:, 3],
            "admitted": d[:, 4], "prefill_tokens": d[:, 5], "decode_tokens": d[:, 6],
            "preemptions": d[:, 7], "finished": a[:, 8], "token_slots": d[:, 8],
            "allocated_slots": d[:, 9], "used_blocks": d[:, 10], "cached_blocks": d[:, 11],
            "free_blocks": d[:, 12],
        }
        idx = np.argsort(np.concatenate([k, qk]), kind="stable")
        # Every count but the iteration is bounded by the capacity (at most 2^24
        # slots) or the number of requests, so int32 halves a long run's footprint.
        cols = {c: np.concatenate([busy[c], quiet[c]])[idx].astype(
            np.int64 if c == "iteration" else np.int32) for c in COLUMNS}
        return Timeline(cols, iteration_s, capacity_tokens, block_size)
