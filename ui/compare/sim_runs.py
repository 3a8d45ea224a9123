"""Running the simulator from the page: a server-wide cache of runs and one progress bar.

Nothing here is an `st.cache_data` function. A cached function that drew the
progress bar (created outside it) crashed every session once its result was
cached: on a hit Streamlit replays the drawing into a bar that no longer
exists (CacheReplayClosureError, issue 13). So the bar is drawn here, outside
any cached function, and finished runs are kept in a plain bounded cache
shared by every session (backend.lab.sim.runs.RunCache).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from backend.lab.sim.runs import RunCache, run_policies
from backend.lab.sim.simulator import SimConfig, SimRun
from backend.lab.workloads import Trace
from ui.bars import Advance, progress_bar

# A 20k-request run with timelines for four policies is some 50 MB.
RUNS = RunCache(max_entries=48, max_bytes=384 << 20)


def run_with_bar(trace_key: Hashable, trace: Trace, configs: Sequence[SimConfig]
                 ) -> list[SimRun]:
    """Each config's run of `trace` (from the cache when it is there), with one bar whose
    text and fill come from the same `RunProgress`. Raises PagedLabError."""
    with progress_bar("Simulating...") as advance:
        return run_cached(trace_key, trace, configs, advance)


def run_cached(trace_key: Hashable, trace: Trace, configs: Sequence[SimConfig],
               advance: Advance) -> list[SimRun]:
    """`run_with_bar`'s runs, reported to `advance` (a bar, or a background job's
    progress: ui/compare/background.py). Draws nothing. Raises PagedLabError."""
    return run_policies(trace, configs, progress=lambda p: advance(p.fraction, p.text),
                        cached=lambda cfg: RUNS.get((trace_key, cfg)),
                        done=lambda cfg, run: RUNS.put((trace_key, cfg), run))
