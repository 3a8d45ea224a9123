"""Several policies on one trace, with one progress report, and a bounded cache of runs.

`run_policies` replays a trace under each configuration in turn and reports
progress as one `RunProgress`: its `fraction` (what a progress bar draws) and
its `text` are computed from the same counts, so the words never disagree
with the bar (issue 13: "paged: 800 of 20,000 requests finished" under a bar
that counted every policy).

`RunCache` keeps finished runs server-wide, without Streamlit: a page must
not cache a function that draws its progress bar (Streamlit replays the
drawing on a cache hit, into a bar that no longer exists), so the page
computes outside any cached function and stores the result here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from backend.lab.sim.simulator import SimConfig, SimRun, simulate_run
from backend.lab.workloads import Trace


@dataclass(frozen=True, slots=True)
class RunProgress:
    """Where a run of `count` replays stands: replay `index` (0-based) has `done` of `total`."""

    policy: str
    index: int
    count: int
    done: int
    total: int

    @property
    def fraction(self) -> float:
        """Of all the replays together, in 0..1: what the bar shows."""
        return min(1.0, (self.index + self.done / self.total) / self.count)

    @property
    def text(self) -> str:
        """The bar's fraction in words, then where the current replay is."""
        overall = self.index * self.total + self.done
        return (f"{self.fraction:.0%}: {overall:,} of {self.count * self.total:,} requests "
                f"replayed ({self.policy}, policy {self.index + 1} of {self.count}: "
                f"{self.done:,} of {self.total:,})")


def run_policies(trace: Trace, configs: Sequence[SimConfig], *,
                 progress: Callable[[RunProgress], None] | None = None,
                 timeline: bool = True,
                 done: Callable[[SimConfig, SimRun], None] | None = None,
                 cached: Callable[[SimConfig], SimRun | None] | None = None) -> list[SimRun]:
    """Reads only: `simulate_run` of `trace` under each config, in order.

    `cached(config)` may supply a run already made (reported as complete);
    `done(config, run)` hears of each new one. Raises PagedLabError as
    `simulate_run` does.
    """
    runs: list[SimRun] = []
    n = len(trace)
    for index, config in enumerate(configs):
        run = cached(config) if cached is not None else None
        if run is None:
            def tick(finished: int, total: int, index: int = index,
                     policy: str = config.policy) -> None:
                if progress is not None:
                    progress(RunProgress(policy, index, len(configs), finished, total))
            run = simulate_run(trace, config, progress=tick, timeline=timeline)
            if done is not None:
                done(config, run)
        elif progress is not None:
            progress(RunProgress(config.policy, index, len(configs), n, n))
        runs.append(run)
    return runs


def run_bytes(run: SimRun) -> int:
    """About what a run keeps in memory: its timeline and per-request arrays."""
    tl = run.timeline.nbytes if run.timeline is not None else 0
    return tl + int(run.preemptions_per_request.nbytes) + int(run.victim_ages.nbytes)


class RunCache:
    """A thread-safe LRU of runs: at most `max_entries` of them and about `max_bytes`
    (a run larger than that alone is not kept). Keys are any hashable values."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._runs: OrderedDict[Hashable, tuple[SimRun, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> SimRun | None:
        with self._lock:
            found = self._runs.get(key)
            if found is None:
                return None
            self._runs.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, run: SimRun) -> None:
        size = run_bytes(run)
        with self._lock:
            old = self._runs.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._runs[key] = (run, size)
            self._bytes += size
            while len(self._runs) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, gone) = self._runs.popitem(last=False)
                self._bytes -= gone

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes
