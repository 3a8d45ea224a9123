"""A scenario run a person steps through: every state it passed through, kept for time travel.

The Scenarios page shows one step at a time, but any earlier step must be
viewable at once and exportable exactly. So a `TourRun` applies a
scenario's steps one by one on its own engine and keeps a `Frame` per state:
index 0 is the fresh engine, index n the state after step n. A frame holds
the snapshot dict (what the views draw and the exports write, so a past
step costs no recomputation), the narrated expectations checked against the
engine at that moment, and the contiguous arena's state when the scenario
has one.

    frames:  [start] [after 1] [after 2] ... [after taken]      taken <= total
                                   ^ viewed (any of them)

The engine only ever moves forward; looking back is reading a frame. A step
the engine refuses stops the run there (`error`), with the state it had
before that step, exactly as `python -m backend run` leaves it. A `step` or
`grow` that would run past `step_time_limit_s` (an uploaded file's 100,000
iterations) is stopped between two iterations or tokens and ends the run too
(`stopped`), so one step cannot hold a core of the shared server for long. The
engine is then past the last frame, which stays the newest state shown.

No Streamlit here: ui/tour.py keeps one `TourRun` per browser session.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from backend.core.checks import file_kind
from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.control import ControlReport, ControlRun
from backend.engine.engine import Engine
from backend.engine.ops import Grow, Step, describe_op
from backend.engine.results import OpResult
from backend.io.contiguous_mirror import ContiguousMirror
from backend.io.expect import check_expectation
from backend.io.json_input import decode_json
from backend.io.scenario import (
    MAX_SCENARIO_BYTES,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
    run_steps,
)
from backend.io.snapshot import export_snapshot
from backend.sessions.budget import SERVER_BUDGET, KVBudget
from backend.sessions.playground import switch_kernels
from backend.sessions.summary import summarize

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "assets" / "scenarios"


# ---- the shipped scenarios ------------------------------------------------------

def shipped_paths() -> dict[str, Path]:
    """Every shipped scenario file by its stem ('08-fork-copy-on-write'), in file order."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.json"))}


@cache
def _load_shipped(path: Path, mtime_ns: int) -> Scenario:
    # Keyed by modification time too, so an edited file is read again.
    return load_scenario(path)


def shipped_scenario(stem: str) -> Scenario:
    """A shipped scenario by stem. Raises PagedLabError naming the unknown stem."""
    path = shipped_paths().get(stem)
    if path is None:
        raise PagedLabError(f"there is no scenario {stem!r}")
    return _load_shipped(path, path.stat().st_mtime_ns)


def parse_scenario_upload(data: bytes, filename: str) -> Scenario:
    """An uploaded scenario file, parsed as JSON data only and bounded in size.

    Raises PagedLabError with a message naming the file and the problem (for
    a bad step: its number and operation, as the command line says it).
    """
    if len(data) > MAX_SCENARIO_BYTES:
        raise PagedLabError(f"{filename} is {len(data):,} bytes; a scenario may be at most "
                            f"{MAX_SCENARIO_BYTES >> 20} MiB")
    raw = decode_json(data, filename)
    try:
        scenario = parse_scenario(raw)
    except PagedLabError as exc:
        # A snapshot is the other JSON file PagedLab writes: where it goes is the whole
        # answer (the scenario parser's list of unknown fields would bury it).
        if file_kind(raw) == "snapshot":
            raise PagedLabError(f"{filename} is a snapshot (it has 'schema_version'), not a "
                                "scenario: upload it on the Playground to continue from its "
                                "state") from None
        raise PagedLabError(f"{filename}: {exc}") from None
    if scenario.from_snapshot is not None:
        # Every scenario here starts on a fresh engine, where its steps would name
        # requests it does not hold and most of its checks would fail.
        raise PagedLabError(f"{filename} {scenario.from_snapshot.needed(filename)}; this "
                            "page starts every scenario on a fresh engine, so it cannot "
                            "step through it")
    return scenario


def parse_step(text: str, total: int) -> int | None:
    """A link's `step` value as a step of a scenario with `total` steps, or None.

    Only plain ASCII digits count ("3", "03"): no sign, blanks, exponent or other
    scripts' digits, which int() would take. The length is checked before
    converting, so a link with thousands of digits is just not a step (int() refuses
    strings past Python's digit limit with a ValueError).
    """
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(total)):
        return None
    n = int(digits)
    return n if n <= total else None


# ---- narrated numbers ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Check:
    """One narrated number: where to look, what the narration says, what the engine shows."""

    path: str
    expected: Any
    got: Any            # None when the path leads nowhere (then `problem` says why)
    ok: bool
    problem: str | None = None


def check_rows(expect: dict[str, Any], snapshot: dict[str, Any], engine: Engine,
               result: OpResult | None, mirror: ContiguousMirror | None) -> tuple[Check, ...]:
    """Each expectation with the value the engine shows. Reads only.

    The verdict is `check_expectation`'s, the one the command line's `--check`
    prints, so the page and the CLI can never disagree.
    """
    rows = []
    for path, want in expect.items():
        v = check_expectation(path, want, snapshot, engine, result, mirror)
        # The row names the path already: its problem is the reason alone ("not found
        # (no field 'x')"), where the CLI's line starts with the path.
        rows.append(Check(path, want, v.got, v.ok, v.problem))
    return tuple(rows)


# ---- frames and the run -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Frame:
    """The state after `step` steps (0: the fresh engine), with what the reader is told."""

    step: int
    snapshot: dict[str, Any]
    label: str                      # the step's operation, e.g. "fork A -> A2"; "start"
    narration: str | None
    summary: str | None             # what the engine did, one line; None at the start
    checks: tuple[Check, ...]
    arena: dict[str, Any] | None    # the contiguous arena (ContiguousMirror.state + segments)
    # The same steps so far in a control run without the perturbations (None at the
    # start, or when the scenario's control does not fit; see `TourRun.control`).
    control: ControlReport | None = None
    # The kernel backend the step's model steps ran on; None when it ran none (a fork,
    # a finish) or at the start.
    ran_on: str | None = None

    @property
    def all_ok(self) -> bool:
        return all(c.ok for c in self.checks)


def arena_state(mirror: ContiguousMirror | None) -> dict[str, Any] | None:
    """The arena's JSON-ready state plus its memory map as runs of slots. Reads only."""
    if mirror is None:
        return None
    state = mirror.state()
    state["segments"] = [
        {"start": s.start, "length": s.length, "owner": s.owner, "kind": s.kind}
        for s in mirror.arena.segments(state["required"])
    ]
    return state


# The longest one step of a scenario may run on the Scenarios page, in seconds. The
# shipped scenarios' steps take well under a second on torch and a few under Triton's
# interpreter on a CPU; a file's `step` may ask for 100,000 iterations.
STEP_TIME_LIMIT_S = 60.0


class TourRun:
    """One scenario being stepped through, on its own engine. See the module docstring.

    `key` names where the scenario came from (a shipped file's stem, or
    "upload"); `title` is what the page calls it.
    """

    def __init__(self, scenario: Scenario, key: str, title: str, *, device: str = "auto",
                 kernel: str = "auto", owner: str | None = None,
                 budget: KVBudget = SERVER_BUDGET, replacing: TourRun | None = None,
                 step_time_limit_s: float | None = None) -> None:
        self.scenario = scenario
        # Read here, not as the default's value, so a test can lower the module's.
        self.step_time_limit_s = (STEP_TIME_LIMIT_S if step_time_limit_s is None
                                  else step_time_limit_s)
        self.key = key
        self.title = title
        self.device = device
        self.kernel = kernel
        self.owner = owner
        self.budget = budget
        # Raises PagedLabError for a device or kernel this machine lacks, or (for a
        # browser session, `owner`) a pool its K/V budget has no room for.
        # `replacing`, the session's run this one replaces, gives its engines back.
        def make() -> Engine:
            return Engine(scenario.config, device=device, kernel=kernel)

        if owner is None:
            self.engine = make()
        else:
            # The old run's control engine too: counted while the new engine was
            # checked, it refused a scenario that fits once the old run is gone.
            old = [] if replacing is None else [replacing.engine] + (
                [] if replacing.control is None else [replacing.control.control])
            self.engine = budget.built(budget.claim(scenario.config, owner, replacing=old),
                                       make)
        if replacing is not None:
            budget.retire(replacing.engine)
            if replacing.control is not None:
                budget.retire(replacing.control.control)
        self.mirror = scenario.mirror()
        # The control run beside it (backend/engine/control.py): its own engine, sized
        # for the whole scenario and counted against the same K/V budget.
        self.control: ControlRun | None = None
        self.control_problem: str | None = None
        ops = [s.op for s in scenario.steps]
        claims: list[int] = []

        def admit(sized: EngineConfig) -> None:
            if owner is not None:
                claims.append(budget.claim(sized, owner))

        try:
            self.control = ControlRun(scenario.config, ops, device=self.engine.device.type,
                                      admit=admit)
        except BaseException as exc:
            for c in claims:
                budget.cancel(c)
            if not isinstance(exc, PagedLabError):
                raise
            self.control_problem = str(exc)
        else:
            for c in claims:
                budget.bind(c, self.control.control)
        self.frames: list[Frame] = [Frame(0, export_snapshot(self.engine), "start", None, None,
                                          (), arena_state(self.mirror))]
        self.error: str | None = None
        # Why the run ended on a step it stopped part-way (see the module docstring).
        self.stopped: str | None = None

    @property
    def total(self) -> int:
        return len(self.scenario.steps)

    @property
    def taken(self) -> int:
        return len(self.frames) - 1

    @property
    def can_advance(self) -> bool:
        return self.taken < self.total and self.error is None and self.stopped is None

    @property
    def engine_at_newest(self) -> bool:
        """Whether the engine holds the newest frame's state (not past it: `stopped`)."""
        return self.stopped is None

    def frame(self, step: int) -> Frame:
        return self.frames[max(0, min(step, self.taken))]

    def next_label(self, step: int) -> str | None:
        """The operation of the step after `step`, if the scenario has one."""
        return describe_op(self.scenario.steps[step].op) if step < self.total else None

    def advance(self, progress: Callable[[int, int], bool] | None = None) -> Frame | None:
        """Mutates: apply the next step and keep its frame.

        Returns None when there is no next step, the engine refused it, or it ran
        out of time or was stopped. A refusal sets `error` (the CLI's one line,
        naming the step) and the engine keeps the state before that step; a `step`
        still running after `step_time_limit_s` stops between two iterations and
        sets `stopped`. `progress(done, total)` hears of each iteration of a `step`
        and each token of a `grow`; False from it stops the step there too (its
        user's Stop), and `stopped` says so.
        """
        if not self.can_advance:
            return None
        i = self.taken + 1
        step = self.scenario.steps[i - 1]
        deadline = time.monotonic() + self.step_time_limit_s
        asked = False

        def in_time(done: int, total: int) -> bool:
            nonlocal asked
            if progress is not None and not progress(done, total):
                asked = True
                return False
            return time.monotonic() < deadline

        # Each model step reports anew: the same report after the step means none ran.
        before = self.engine.kernel_report
        try:
            _, _, result = next(run_steps(self.engine, (step,), first=i, mirror=self.mirror,
                                          keep_going=in_time))
        except ScenarioError as exc:
            self.error = str(exc)
            return None
        except Exception as exc:
            if self.engine.broken is None:
                raise
            # It stopped half-way (a bug, or the server out of memory): the engine holds
            # a state no operations produce, so the run ends at the step before, as at
            # the time limit, and the page draws that frame without it.
            self.stopped = (f"Step {i}, {describe_op(step.op)}, stopped half-way "
                            f"({type(exc).__name__}: {exc}): a failure of PagedLab or of "
                            f"the server, not of the scenario. The run ends at step {i - 1}; "
                            "Reset starts it again.")
            return None
        if result.op != step.op:
            # Only a `step` or a `grow` stops part-way, and only here, at the limit.
            if isinstance(result.op, Step) and isinstance(step.op, Step):
                where = f"at iteration {result.op.count:,} of {step.op.count:,}"
            else:
                assert isinstance(result.op, Grow) and isinstance(step.op, Grow)
                where = f"after {result.op.tokens:,} of its {step.op.tokens:,} tokens"
            limit = f"{self.step_time_limit_s:g} s"
            if asked:
                self.stopped = (f"Step {i}, {describe_op(step.op)}, was stopped as you "
                                f"asked, {where}. The run ends at step {i - 1}; Reset runs "
                                "the scenario again from step 0.")
            else:
                self.stopped = (f"Step {i}, {describe_op(step.op)}, was stopped at the "
                                f"{limit} limit, {where}: this page gives one step at most "
                                f"{limit} of the shared server. The run ends at step "
                                f"{i - 1}; the command line (python -m backend run) takes "
                                "the file whole.")
            return None
        snap = export_snapshot(self.engine)
        checks = () if not step.expect else check_rows(step.expect, snap, self.engine, result,
                                                       self.mirror)
        report = None
        if self.control is not None:
            # The control's share of the step: its own time limit, the same Stop. The
            # bar stays full meanwhile (the step's iterations are done; its clock runs on).
            control_deadline = time.monotonic() + self.step_time_limit_s

            def control_in_time(done: int, total: int) -> bool:
                if progress is not None and not progress(total, total):
                    return False
                return time.monotonic() < control_deadline

            self.control.follow(step.op, self.engine, control_in_time)
            report = self.control.report(self.engine)
        after = self.engine.kernel_report
        frame = Frame(i, snap, describe_op(step.op), step.narration, summarize(result, snap),
                      checks, arena_state(self.mirror), report,
                      None if after is before else after.backend)
        self.frames.append(frame)
        return frame

    def run_to(self, step: int) -> int:
        """Mutates: apply steps until `step` have been taken (or the run stops); the count."""
        while self.taken < step and self.advance() is not None:
            pass
        return self.taken

    def set_kernels(self, device: str, kernel: str) -> None:
        """Mutates: run the next steps on another kernel; the state so far is unchanged.

        Raises PagedLabError for a device or kernel this machine lacks.
        """
        old = self.engine
        self.engine = switch_kernels(old, device, kernel, self.owner, budget=self.budget)
        if self.engine is not old:
            self.budget.retire(old)
        self.device, self.kernel = device, kernel

    def snapshots(self) -> list[dict[str, Any]]:
        """The snapshot after each step taken (steps 1..taken), as `--snapshots` writes them."""
        return [f.snapshot for f in self.frames[1:]]
