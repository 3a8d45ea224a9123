"""Scenario files (CONTRACT.md): parse and run them.

A scenario is a config and a list of steps. Besides its operation fields,
each step may carry two annotations that the engine ignores: a `narration`,
one sentence a reader sees beside the step, and an `expect`, the values a
reader should see after it (checked by backend/io/expect.py).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from backend.core.checks import (
    MAX_JSON_INT,
    SHOWN_CHARS,
    check_int,
    file_kind,
    json_kind,
    shown,
    unicode_text,
)
from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Op, Step, parse_op
from backend.engine.results import OpResult
from backend.io.contiguous_mirror import ContiguousMirror, ContiguousSpec
from backend.io.expect import written
from backend.io.expect_paths import unmeetable, unmeetable_note
from backend.io.json_input import (
    decode_json,
    field_path,
    read_bounded,
    unread_note,
)

Parsed = TypeVar("Parsed")

MAX_SCENARIO_BYTES = 4 << 20
# A snapshot file named on the command line (uploads in the app have a smaller bound,
# backend.io.snapshot.MAX_SNAPSHOT_BYTES): long runs carry many events.
MAX_SNAPSHOT_FILE_BYTES = 512 << 20
MAX_STEPS = 10_000
# A name is a title: the app shows it as a heading and in messages. (A description or
# narration is prose, bounded by the file's size.)
MAX_NAME_CHARS = 200
# The top-level fields a scenario's reader knows. Others are not refused (the contract
# lets fields be added; another tool may keep its own there) but named, so that a
# misspelt "descripton" is not lost without a word. (In `config` and in a step an
# unknown field is refused: it would change the run.)
TOP_FIELDS = ("name", "description", "config", "contiguous", "steps", "from_snapshot")
# A `from_snapshot` file name is a name to show in a message, not a path to open.
MAX_FILE_NAME_CHARS = 200


@dataclass(frozen=True, slots=True)
class FromSnapshot:
    """A scenario's `from_snapshot` (a PagedLab field): its steps continue the state of a
    snapshot at `step`, downloaded as `file`, so they replay only from that snapshot
    (`run --from`). A Playground session that started from a restored snapshot exports
    such a scenario; on a fresh engine its steps would act on requests it does not hold."""

    step: int
    file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, **({} if self.file is None else {"file": self.file})}

    @staticmethod
    def from_json(raw: Any) -> FromSnapshot:
        if not isinstance(raw, dict):
            raise PagedLabError(f"from_snapshot must be an object, got {json_kind(raw)}")
        unknown = sorted(set(raw) - {"step", "file"})
        if unknown:
            raise PagedLabError(f"unknown field {shown(unknown[0])} in from_snapshot (its "
                                "fields: step, file)")
        if "step" not in raw:
            raise PagedLabError("from_snapshot needs its \"step\": the step of the snapshot "
                                "the scenario continues")
        step = check_int(raw["step"], "from_snapshot.step", 0, MAX_JSON_INT)
        file = raw.get("file")
        if file is not None:
            if not isinstance(file, str):
                raise PagedLabError(f"from_snapshot.file must be a string, got "
                                    f"{json_kind(file)}")
            unicode_text(file, "from_snapshot.file")
            if not file or len(file) > MAX_FILE_NAME_CHARS or not file.isprintable():
                raise PagedLabError(f"from_snapshot.file must be a file name of 1 to "
                                    f"{MAX_FILE_NAME_CHARS} printable characters")
        return FromSnapshot(step, file)

    def needed(self, scenario: str) -> str:
        """Why a fresh engine cannot replay the file `scenario`, said for a person after
        its name: what it continues, and the command that replays it."""
        base = self.file or "SNAPSHOT.json"
        return (f"continues a snapshot of step {self.step:,} (its from_snapshot"
                + (f": {self.file}" if self.file else "") + "), so its steps replay only "
                f"from that state: python -m backend run {shlex.quote(scenario)} --from "
                f"{shlex.quote(base)} --check")


@dataclass(frozen=True, slots=True)
class ScenarioStep:
    op: Op
    narration: str | None = None
    expect: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    config: EngineConfig
    config_fields: frozenset[str]   # the config keys the file actually set
    steps: tuple[ScenarioStep, ...]
    contiguous: ContiguousSpec | None = None
    # Top-level fields the reader does not know, in the file's order (see TOP_FIELDS).
    unread: tuple[str, ...] = ()
    # (step, path, reason) of each expectation no run could meet (expect_paths.py).
    unmeetable: tuple[tuple[int, str, str], ...] = ()
    from_snapshot: FromSnapshot | None = None

    def notes(self) -> list[str]:
        """What the reader should be told besides the steps: sentences without their
        full stop, naming the top-level fields that were ignored and the expectations
        that can never be met."""
        return (unread_note([field_path("scenario", key) for key in self.unread])
                + unmeetable_note(list(self.unmeetable)))

    def mirror(self) -> ContiguousMirror | None:
        """A fresh contiguous arena to run beside this scenario's engine, if it names one."""
        return None if self.contiguous is None else ContiguousMirror(self.contiguous)


class ScenarioError(PagedLabError):
    """A scenario problem located at a step (1-based) or at the file level (step None)."""

    def __init__(self, reason: str, step: int | None = None, op: str | None = None,
                 partial: Scenario | None = None) -> None:
        self.reason = reason
        self.step = step
        self.op = op
        # Set when a step is malformed: the scenario up to the step before it,
        # which a runner may apply so the state is the last good one.
        self.partial = partial
        where = "" if step is None else f"step {step} ({op or '?'}): "
        super().__init__(where + reason)


def parse_scenario(data: Any, *, vocab_size: int | None = None,
                   base: EngineConfig | None = None) -> Scenario:
    """Validate a scenario object completely before anything runs.

    Steps' token ids are checked against `vocab_size`, by default the vocabulary of
    the scenario's own model; a run from a snapshot passes the snapshot's, since its
    model is the one the steps run on (a config naming another is refused anyway).
    A run from a snapshot also passes its config as `base`: the fields the scenario
    leaves out keep the snapshot's values, so a config is checked whole with them
    (`preemption: "swap"` takes the snapshot's `num_cpu_blocks`). Whether the fields
    it gives agree with the snapshot is `check_config_matches`'s to say.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"a scenario must be a JSON object, got {json_kind(data)}")
    name = data.get("name", "untitled")
    description = data.get("description", "")
    for field, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            raise ScenarioError(f"{field} must be a string, got {json_kind(value)}")
    try:
        unicode_text(name, "name")
        unicode_text(description, "description")
    except PagedLabError as exc:
        raise ScenarioError(str(exc)) from None
    if len(name) > MAX_NAME_CHARS:
        raise ScenarioError(f"name must be at most {MAX_NAME_CHARS} characters (a title; "
                            f"the description holds prose), got {len(name):,}")
    raw_config = data.get("config", {})
    try:
        config = _config(raw_config, base)
    except PagedLabError as exc:
        raise ScenarioError(str(exc)) from None
    from_snapshot = _optional(data, "from_snapshot", FromSnapshot.from_json)
    contiguous = _optional(data, "contiguous", ContiguousSpec.from_json)
    steps_raw = data.get("steps")
    if not isinstance(steps_raw, list):
        got = "none" if "steps" not in data else json_kind(steps_raw)
        raise ScenarioError(f"a scenario needs a \"steps\" list (it may be empty), got {got}")
    if len(steps_raw) > MAX_STEPS:
        raise ScenarioError(f"a scenario may have at most {MAX_STEPS:,} steps")
    steps: list[ScenarioStep] = []
    for i, raw in enumerate(steps_raw, start=1):
        op_name = raw.get("op") if isinstance(raw, dict) else None
        # The file's text: a long one is cut short, as the reason quotes it.
        label = None if not isinstance(op_name, str) else (
            op_name if len(op_name) <= SHOWN_CHARS else op_name[:SHOWN_CHARS] + "…")
        try:
            op = parse_op(raw, vocab_size=vocab_size or config.vocab_size)
            narration = raw.get("narration")
            if narration is not None and not isinstance(narration, str):
                raise PagedLabError("narration must be a string")
            if narration is not None:
                unicode_text(narration, "narration")
            expect = raw.get("expect")
            if expect is not None and not isinstance(expect, dict):
                raise PagedLabError("expect must be an object of path: value")
            if expect is not None:
                _check_texts(expect, "expect")
        except PagedLabError as exc:
            partial = Scenario(name, description, config, frozenset(raw_config or {}),
                               tuple(steps), contiguous, from_snapshot=from_snapshot)
            raise ScenarioError(str(exc), i, label, partial) from None
        steps.append(ScenarioStep(op, narration, expect))
    unread = tuple(key for key in data if key not in TOP_FIELDS)
    never = unmeetable(((i, s.expect) for i, s in enumerate(steps, start=1)), config,
                       has_arena=contiguous is not None)
    return Scenario(name, description, config, frozenset(raw_config or {}), tuple(steps),
                    contiguous, unread, tuple(never), from_snapshot)


def _optional(data: dict[str, Any], key: str, parse: Callable[[Any], Parsed]) -> Parsed | None:
    """Top-level field `key` read by `parse`, or None where it is left out or null; its
    refusal as the file's (a ScenarioError naming no step)."""
    if data.get(key) is None:
        return None
    try:
        return parse(data[key])
    except PagedLabError as exc:
        raise ScenarioError(str(exc)) from None


def _check_texts(value: Any, where: str) -> None:
    """Every string in `value` (keys too) is text that can be shown: an expectation's
    path and value are printed beside the step. Every number is one JSON has: Python's
    reader also takes NaN, Infinity and 1e400 (read as infinite), which no snapshot
    holds, and which would be printed back as what the file does not say."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PagedLabError(f"{where} is {shown(value)}: no snapshot holds it")
    if isinstance(value, str):
        unicode_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            unicode_text(key, f"a key of {where}")
            _check_texts(item, f"{where}[{shown(key)}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_texts(item, f"{where}[{i}]")


def _config(raw: Any, base: EngineConfig | None) -> EngineConfig:
    """The scenario's config: `raw` alone, or over `base`'s fields (see parse_scenario).

    Over a base, a field the file gets wrong on its own is refused in its own words;
    only a combination (swap without a host pool of its own) takes the base's value.
    """
    if base is None or not isinstance(raw, dict) or raw.get("model", base.model) != base.model:
        # Another model: its dimensions are not the base's, and check_config_matches
        # refuses it by name.
        return EngineConfig.from_json(raw)
    try:
        return EngineConfig.from_json({**base.to_json(), **raw})
    except PagedLabError:
        EngineConfig.from_json(raw)     # the file's own mistake, if it has one
        raise


def load_scenario(path: Path, *, vocab_size: int | None = None,
                  base: EngineConfig | None = None) -> Scenario:
    """The scenario file at `path`, parsed (see `parse_scenario`)."""
    raw = read_json(path, "scenario")
    # A snapshot is the other JSON file PagedLab writes: say where it goes instead of
    # listing the scenario fields it lacks.
    if file_kind(raw) == "snapshot":
        raise PagedLabError(f"{str(path)!r} is a snapshot (it has 'schema_version'), not a "
                            "scenario: start from its state with python -m backend run "
                            f"SCENARIO --from {shlex.quote(str(path))}")
    return parse_scenario(raw, vocab_size=vocab_size, base=base)


def read_json(path: Path, what: str) -> Any:
    """Read a regular JSON file as data only, bounded in size, with one-line errors."""
    limit = MAX_SCENARIO_BYTES if what == "scenario" else MAX_SNAPSHOT_FILE_BYTES
    return decode_json(read_bounded(path, what, limit), f"{what} {str(path)!r}")


def check_start(scenario: Scenario, path: Path, start: int | None) -> None:
    """A scenario with `from_snapshot` runs only from a snapshot of its step: `start` is
    the step of the `--from` snapshot, None for a fresh engine. ScenarioError if not."""
    need = scenario.from_snapshot
    if need is None:
        return
    if start is None:
        raise ScenarioError(f"{path} {need.needed(str(path))}")
    if start != need.step:
        raise ScenarioError(f"{path} continues a snapshot of step {need.step:,} (its "
                            f"from_snapshot), but the --from snapshot is at step {start:,}")


def check_config_matches(scenario: Scenario, config: EngineConfig) -> None:
    """With --from, a scenario's explicit config fields must agree with the snapshot's."""
    have = config.to_json()
    want = scenario.config.to_json()
    for key in sorted(scenario.config_fields):
        if have[key] != want[key]:
            # In JSON's words, as the files write them (null, true, "fifo").
            raise ScenarioError(f"config.{key} is {written(want[key])} but the snapshot was "
                                f"taken with {written(have[key])}")


def run_steps(engine: Engine, steps: tuple[ScenarioStep, ...], first: int = 1,
              mirror: ContiguousMirror | None = None,
              keep_going: Callable[[int, int], bool] | None = None,
              ) -> Iterator[tuple[int, ScenarioStep, OpResult]]:
    """Apply steps in order, yielding after each; a refused step raises ScenarioError.

    `keep_going(done, total)` is asked after each iteration of a `step` and each token
    of a `grow`; False stops it between two, and its result's op then counts those
    that ran.
    """
    for i, step in enumerate(steps, start=first):
        # The arena follows a `step`'s iterations; a grow's tokens it takes from the
        # result (ContiguousMirror.observe).
        follow = (mirror.on_iteration(engine) if mirror is not None
                  and isinstance(step.op, Step) else None)
        try:
            result = engine.apply(step.op, progress=_both(follow, keep_going))
        except PagedLabError as exc:
            raise ScenarioError(str(exc), i, step.op.op) from None
        if mirror is not None:
            mirror.observe(engine, result)
        yield i, step, result


def _both(first: Callable[[int, int], bool] | None,
          then: Callable[[int, int], bool] | None) -> Callable[[int, int], bool] | None:
    """One progress callback calling `first`, then `then`: go on only if both say so.
    Both are called every iteration (the arena follows each one that ran)."""
    if first is None or then is None:
        return first or then

    def progress(done: int, total: int) -> bool:
        go = first(done, total)
        return then(done, total) and go
    return progress
