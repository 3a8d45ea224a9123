"""Scenario files (CONTRACT.md): parse, run, and check narrated expectations.

A scenario is a config and a list of steps. Besides its operation fields,
each step may carry two annotations that the engine ignores:

    "narration": "One sentence a reader sees beside this step."
    "expect":    {"requests.A.block_table": [9, 2, 14], "metrics.used_blocks": 3}

`expect` maps a path into the snapshot taken after the step to the value a
reader should see there. Paths are dotted: `requests.<id>.<field>` looks a
request up by id (an id may hold dots, as samples' and beams' `ID.k` do),
`blocks.<n>.<field>` a block by id, `address.<id>.<pos>` the translation of
a token position ({logical_block, offset, physical_block, slot}),
`events.<kind>` the number of events of that kind so far,
`step_events.<kind>` the number this step emitted, `text.<id>` the request's
tokens as text (tiny-byte: printable bytes as is, others escaped; a real
model: decoded), `contiguous.*` the state of the scenario's contiguous arena
(see backend/io/contiguous_mirror.py); anything else walks the snapshot's
objects and lists.
"""

from __future__ import annotations

import difflib
import json
import math
import shlex
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from backend.core.checks import (
    MAX_JSON_INT,
    SHOWN_CHARS,
    check_int,
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
from backend.io.expect_paths import shown_path, unmeetable, unmeetable_note
from backend.io.json_input import (
    decode_json,
    field_path,
    file_kind,
    read_bounded,
    unread_note,
)
from backend.paging.events import EVENT_KINDS

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
            raise ScenarioError(f"config.{key} is {_written(want[key])} but the snapshot was "
                                f"taken with {_written(have[key])}")


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


# ---- expectations ----------------------------------------------------------

def resolve(path: str, snapshot: dict[str, Any], engine: Engine,
            result: OpResult | None = None, mirror: ContiguousMirror | None = None) -> Any:
    """The value at `path` (see module docstring). Raises KeyError if there is none."""
    parts = path.split(".")
    head = parts[0]
    if head == "contiguous":
        if mirror is None:
            # Either reason reads the same: a run from a snapshot follows no arena, since
            # a snapshot holds none (`run --from` with a scenario that names one).
            raise KeyError("no contiguous arena is followed in this run: the scenario names "
                           "none, or the run started from a snapshot, which holds none")
        state = mirror.state()
        if len(parts) >= 3 and parts[1] in ("regions", "out_of_step"):
            what = "region" if parts[1] == "regions" else "request out of step"
            return _by_id(state[parts[1]], parts[2:], path, what)
        node: Any = state
        for part in parts[1:]:
            node = _child(node, part, path)
        return node
    # Request ids may hold dots (samples and beams are ID.k): an id runs to the field
    # after it, or to the end of the path.
    if head == "address" and len(parts) >= 3:
        rid, position = ".".join(parts[1:-1]), parts[-1]
        if not (position.isascii() and position.isdigit()):
            raise KeyError(f"{shown(position)} is no token position (0, 1, ...)")
        return {k: v for k, v in asdict(engine.translate(rid, int(position))).items()
                if k != "position"}
    if head in ("events", "step_events") and len(parts) == 2:
        # A kind no event has would count 0 and pass an expectation of 0 forever.
        if parts[1] not in EVENT_KINDS:
            raise KeyError(f"no event kind {shown(parts[1])} (the kinds: {', '.join(EVENT_KINDS)})")
        if head == "events":
            return sum(1 for e in snapshot["events"] if e["kind"] == parts[1])
        return 0 if result is None else sum(1 for e in result.events if e.kind == parts[1])
    if head == "text" and len(parts) >= 2:
        return engine.text(".".join(parts[1:]))
    if head == "requests" and len(parts) >= 2:
        return _by_id({r["id"]: r for r in snapshot["requests"]}, parts[1:], path, "request")
    node = snapshot
    for part in parts:
        node = _child(node, part, path)
    return node


def _by_id(by_id: dict[str, Any], parts: list[str], path: str, what: str) -> Any:
    """The value under a request id that may hold dots (samples and beams are ID.k): the
    longest id that `parts` start with, then the fields after it."""
    if not by_id:
        raise KeyError(f"there is no {what} at all")
    fields = {key for record in by_id.values() if isinstance(record, dict) for key in record}
    # The id the path means runs to the first part that is a field of the records
    # (`requests.B.4.block_table` means 'B.4', also where a 'B' exists), else to the end.
    meant = next((i for i in range(1, len(parts)) if parts[i] in fields), len(parts))
    for end in range(len(parts), 0, -1):
        node = by_id.get(".".join(parts[:end]))
        if node is None:
            continue
        if end < meant and (meant < len(parts) or parts[end].isdigit()):
            # A shorter id, and the parts after it are no field: the id meant is missing
            # ('B.4' beside 'B'), not a field of 'B' called '4'.
            break
        for part in parts[end:]:
            node = _child(node, part, path)
        return node
    raise KeyError(f"no {what} {shown('.'.join(parts[:meant]))}")


def _child(node: Any, part: str, path: str) -> Any:
    """One step of a path: a list position (>= 0) or an object key. Raises KeyError/IndexError."""
    if isinstance(node, list):
        # Digits only: Python would count "-1" from the end and read "1_0" as 10, and
        # its own words for "1e3" or a position past any index are no help here.
        if not (part.isascii() and part.isdigit()):
            raise IndexError(f"{shown(part)} is no position in a list (0, 1, ...)")
        index = int(part)
        if index >= len(node):
            raise IndexError(f"position {index:,} is past the list's "
                             f"{len(node):,} {'entry' if len(node) == 1 else 'entries'}")
        return node[index]
    if isinstance(node, dict):
        if part not in node:
            near = difflib.get_close_matches(part, [k for k in node if isinstance(k, str)], 1)
            raise KeyError(f"no field {shown(part)}"
                           + (f"; did you mean {near[0]!r}?" if near else ""))
        return node[part]
    raise KeyError(path)


# What `resolve` raises for a path that leads nowhere.
NOT_FOUND = (KeyError, IndexError, ValueError, PagedLabError)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One expectation checked: the value shown (if the path leads somewhere) and the line."""

    ok: bool
    found: bool
    got: Any            # None when not found
    failure: str | None  # the readable mismatch line, None when ok
    # Why the path leads nowhere, without the path ("not found (no request 'Z')"), for
    # a reader that names the path itself; None when found.
    problem: str | None = None


def check_expectation(path: str, want: Any, snapshot: dict[str, Any], engine: Engine,
                      result: OpResult | None = None,
                      mirror: ContiguousMirror | None = None) -> Verdict:
    """`want` against what the engine shows at `path`. Reads only; never raises for a value."""
    try:
        got = resolve(path, snapshot, engine, result, mirror)
    except NOT_FOUND as exc:
        # A KeyError's str() is its argument's repr: quotes around the whole reason.
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        problem = f"not found ({reason})"
        return Verdict(False, False, None, f"{shown_path(path)}: {problem}", problem)
    if _same(got, want):
        return Verdict(True, True, got, None)
    return Verdict(False, True, got,
                   f"{shown_path(path)}: expected {_written(want)}, got {_written(got)}")


# How much of a value a mismatch line quotes: a block table or a request's text may be long.
MISMATCH_CHARS = 200


def _written(value: Any) -> str:
    """`value` as the scenario file writes it, in JSON ("running", true, null, [0, 1]),
    cut short past MISMATCH_CHARS."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= MISMATCH_CHARS else text[:MISMATCH_CHARS - 1] + "…"


def _same(got: Any, want: Any) -> bool:
    """Equal, with floats equal to 1e-9 relative (absolute below 1), inside lists and
    objects too; true and false equal only themselves (Python's True == 1 is no match
    for a file that wrote 1).

    The expectation comes from a file: any JSON value may meet a float the
    engine holds, so whatever no float can equal (text, lists, null, an
    integer beyond float range) is simply not the same.
    """
    if isinstance(got, list | tuple) and isinstance(want, list):
        return len(got) == len(want) and all(map(_same, got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if not (isinstance(want, float) or isinstance(got, float)):
        return bool(got == want)
    if not (isinstance(got, int | float) and isinstance(want, int | float)):
        return False
    try:
        g, w = float(got), float(want)
    except OverflowError:
        return False
    if not (math.isfinite(g) and math.isfinite(w)):
        # inf - inf is nan and the tolerance below would be inf: compare exactly.
        return g == w
    return abs(g - w) <= 1e-9 * max(1.0, abs(w))


def check_expectations(expect: dict[str, Any], snapshot: dict[str, Any], engine: Engine,
                       result: OpResult | None = None,
                       mirror: ContiguousMirror | None = None) -> list[str]:
    """Every mismatch between `expect` and what the engine shows, as readable lines."""
    return [v.failure for path, want in expect.items()
            if (v := check_expectation(path, want, snapshot, engine, result, mirror)).failure]
