"""The live engine's timeline: one row per iteration, and each request's latencies.

The simulator's timeline (backend.lab.sim.timeline) models a trace; this one
records what the engine did. A row is written after every iteration of a
`step` (`scheduled` 1) and after every other operation (`scheduled` 0: an
`add` may prefill, a `finish` frees blocks), so memory and queues are never
out of date between two rows; `iteration` numbers the rows. `step` is the
operation a row belongs to: the Playground keeps each operation's state, so a
row leads back to the grid as it was after it.

Each request's arrival, first token and finish are stamped with the row they
happened in (the `iteration` a chart of the rows shows them at). Latencies are
counted in scheduler iterations (rows with `scheduled` 1; an `add` between two
of them is not one) and in measured wall time of the engine's own work (what a
user waited for):

    time to first token (TTFT)   from the `add` to the request's first token
    time per output token (TPOT) from the first token to the last, over the tokens
                                 after the first

The timeline is not part of a snapshot (CONTRACT.md fixes that format): a
restored engine starts a new one, with the restored step as its origin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.engine.scheduler import Scheduler

# One row per iteration. `prefix_query_tokens` / `prefix_hit_tokens` are the
# prompt tokens looked up in (and served by) the prefix cache in that row.
COLUMNS: tuple[str, ...] = (
    "iteration", "step", "scheduled", "running", "prefilling", "waiting", "swapped", "admitted",
    "prefill_tokens", "decode_tokens", "preemptions", "finished", "token_slots", "allocated_slots",
    "used_blocks", "cached_blocks", "free_blocks", "prefix_query_tokens",
    "prefix_hit_tokens")
# Rows kept per engine; older ones are dropped first (a long Step N stays bounded).
MAX_ROWS = 100_000


@dataclass(slots=True)
class RequestTimes:
    """When a request arrived, produced its first and last tokens and finished: as the
    row of the timeline it happened in (`*_row`), and for its latencies in scheduler
    iterations run so far and in seconds on the engine's clock. None: not yet."""

    arrived: int
    arrived_s: float
    arrived_row: int
    first_token: int | None = None
    first_token_s: float | None = None
    first_token_row: int | None = None
    last_token: int | None = None
    last_token_s: float | None = None
    finished_row: int | None = None
    num_generated: int = 0


@dataclass(slots=True)
class EngineTimeline:
    """Rows as tuples in COLUMNS order, each row's wall time, and request times.

    The clock advances only while the engine runs an operation, so time a user
    spends reading the page between clicks is not counted as latency.
    """

    rows: list[tuple[int, ...]] = field(default_factory=list)
    row_ms: list[float] = field(default_factory=list)
    requests: dict[str, RequestTimes] = field(default_factory=dict)
    iteration: int = 0          # rows recorded so far (dropped ones included)
    iterations_run: int = 0     # scheduler iterations among them
    clock_s: float = 0.0        # seconds of finished operations
    dropped: int = 0
    _started: float | None = None
    _last_row_s: float = 0.0    # the clock when the previous row was recorded
    _in_iteration: bool = False
    # Counts at the previous row of this operation: admitted, preempted, finished,
    # generated (the outcome's lengths), prefill tokens, prefix query and hit totals.
    _mark: tuple[int, ...] = (0, 0, 0, 0, 0, 0, 0)

    def begin(self, scheduler: Scheduler, prefill_tokens: int) -> None:
        """Mutates: an operation starts running (its outcome is still empty)."""
        self._started = time.perf_counter()
        m = scheduler.manager
        self._mark = (0, 0, 0, 0, prefill_tokens, m.prefix_query_tokens, m.prefix_hit_blocks)

    def record_state(self, step: int, scheduler: Scheduler, prefill_tokens: int) -> None:
        """Mutates: a row for what ran since the previous row of operation `step`, and
        the state it left (`prefill_tokens`: the runner's total so far)."""
        o = scheduler.outcome
        admitted, preempted, finished, generated, prefill, queried, hits = self._mark
        m = scheduler.manager
        for rid in o.finished[finished:]:
            self.finished(rid)
        metrics = m.metrics()
        bs = m.block_size
        running = scheduler.running
        self.record(step, (
            len(running), sum(1 for rid in running if scheduler.requests[rid].prefilling),
            len(scheduler.waiting), len(scheduler.swapped), len(o.admitted) - admitted,
            prefill_tokens - prefill,
            len(o.generated) - generated, len(o.preempted) - preempted,
            len(o.finished) - finished, metrics.filled_slots, metrics.used_blocks * bs,
            metrics.used_blocks, metrics.cached_blocks, metrics.free_blocks,
            m.prefix_query_tokens - queried, (m.prefix_hit_blocks - hits) * bs))
        self._mark = (len(o.admitted), len(o.preempted), len(o.finished), len(o.generated),
                      prefill_tokens, m.prefix_query_tokens, m.prefix_hit_blocks)

    def now(self) -> float:
        """The engine's work clock: seconds of operations so far, this one's included."""
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.clock_s + running

    def iteration_started(self) -> None:
        """Mutates: a scheduler iteration runs until the next `record`."""
        self._in_iteration = True

    def _at(self) -> int:
        """The scheduler iteration that tokens produced now belong to."""
        return self.iterations_run + (1 if self._in_iteration else 0)

    def arrived(self, request_id: str) -> None:
        """Mutates: `request_id` was added (it arrives with the iteration to come; the
        row being written is the add's)."""
        self.requests[request_id] = RequestTimes(self.iterations_run, self.now(),
                                                 self.iteration)

    def forked(self, parent: str, child: str) -> None:
        """Mutates: `child` was forked from `parent` by the engine (a parallel sample, a
        beam): it arrived with its parent's `add`. A parent restored with the engine has
        no known arrival, and nor does its child."""
        t = self.requests.get(parent)
        if t is not None:
            self.requests[child] = RequestTimes(t.arrived, t.arrived_s, t.arrived_row)

    def generated(self, request_id: str) -> None:
        """Mutates: `request_id` produced a token in the iteration being recorded."""
        t = self.requests.get(request_id)
        if t is None:        # restored with the engine: its arrival is unknown
            return
        now, at = self.now(), self._at()
        if t.first_token is None:
            t.first_token, t.first_token_s, t.first_token_row = at, now, self.iteration
        t.last_token, t.last_token_s = at, now
        t.num_generated += 1

    def finished(self, request_id: str) -> None:
        t = self.requests.get(request_id)
        if t is not None and t.finished_row is None:
            t.finished_row = self.iteration

    def record(self, step: int, row: tuple[int, ...]) -> None:
        """Mutates: what just ran, as a row without its `iteration`, `step` and `scheduled`
        columns (`step`: the operation's number)."""
        assert len(row) == len(COLUMNS) - 3
        now = self.now()
        self.rows.append((self.iteration, step, int(self._in_iteration), *row))
        if self._in_iteration:
            self.iterations_run += 1
            self._in_iteration = False
        self.row_ms.append((now - self._last_row_s) * 1e3)
        self._last_row_s = now
        self.iteration += 1
        if len(self.rows) > MAX_ROWS:
            cut = len(self.rows) - MAX_ROWS
            del self.rows[:cut]
            del self.row_ms[:cut]
            self.dropped += cut

    def end(self, *, counted: bool = True) -> None:
        """Mutates: the operation is over; its time joins the clock (not a refused one's,
        which changed nothing)."""
        if self._started is not None and counted:
            self.clock_s += time.perf_counter() - self._started
        self._started = None
        self._in_iteration = False
        self._last_row_s = self.clock_s
