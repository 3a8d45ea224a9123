"""Running the simulator from the page: a server-wide cache of runs, reported to one bar.

Nothing here is an `st.cache_data` function. A cached function that drew the
progress bar (created outside it) crashed every session once its result was
cached: on a hit Streamlit replays the drawing into a bar that no longer
exists (CacheReplayClosureError, issue 13). So the runs draw nothing: they
report to the `Advance` they are given (a background job's, whose bar the page
draws: ui/compare/background.py), and finished runs are kept in a plain bounded
cache shared by every session (backend.lab.sim.runs.RunCache).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from backend.lab.sim.runs import RunCache, run_policies
from backend.lab.sim.simulator import SimConfig, SimRun
from backend.lab.workloads import Trace
from ui.bars import Advance

# A 20k-request run with timelines for four policies is some 50 MB.
RUNS = RunCache(max_entries=48, max_bytes=384 << 20)


def run_cached(trace_key: Hashable, trace: Trace, configs: Sequence[SimConfig],
               advance: Advance) -> list[SimRun]:
    """Each config's run of `trace` (from the cache when it is there), reported to
    `advance`, whose fill and text come from the same `RunProgress`. Draws nothing.
    Raises PagedLabError."""
    return run_policies(trace, configs, progress=lambda p: advance(p.fraction, p.text),
                        cached=lambda cfg: RUNS.get((trace_key, cfg)),
                        done=lambda cfg, run: RUNS.put((trace_key, cfg), run))


def reused(trace_key: Hashable, configs: Sequence[SimConfig]) -> int:
    """How many of `configs`' runs of the trace are in the cache now: a replay of them
    shows at once, and its time is the one they took when first run."""
    return sum(RUNS.get((trace_key, cfg)) is not None for cfg in configs)
