"""A scenario step's `expect` (CONTRACT.md): what the engine shows at a path, and
whether it is what the file says a reader should see.

    "expect": {"requests.A.block_table": [9, 2, 14], "metrics.used_blocks": 3}

Each key is a path into the snapshot taken after the step. Paths are dotted:
`requests.<id>.<field>` looks a request up by id (an id may hold dots, as
samples' and beams' `ID.k` do), `blocks.<n>.<field>` a block by id,
`address.<id>.<pos>` the translation of a token position ({logical_block,
offset, physical_block, slot}), `events.<kind>` the number of events of that
kind so far, `step_events.<kind>` the number this step emitted, `text.<id>` the
request's tokens as text (tiny-byte: printable bytes as is, others escaped; a
real model: decoded), `contiguous.*` the state of the scenario's contiguous
arena (see backend/io/contiguous_mirror.py); anything else walks the
snapshot's objects and lists. Paths no run could ever resolve are named when
the file is read (backend/io/expect_paths.py).
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from backend.core.checks import shown
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.results import OpResult
from backend.io.contiguous_mirror import ContiguousMirror
from backend.io.expect_paths import shown_path
from backend.paging.events import EVENT_KINDS


def resolve(path: str, snapshot: dict[str, Any], engine: Engine,
            result: OpResult | None = None, mirror: ContiguousMirror | None = None) -> Any:
    """The value at `path` (see the module docstring). Raises KeyError if there is none."""
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
    if same(got, want):
        return Verdict(True, True, got, None)
    return Verdict(False, True, got,
                   f"{shown_path(path)}: expected {written(want)}, got {written(got)}")


# How much of a value a mismatch line quotes: a block table or a request's text may be long.
MISMATCH_CHARS = 200


def written(value: Any) -> str:
    """`value` as the scenario file writes it, in JSON ("running", true, null, [0, 1]),
    cut short past MISMATCH_CHARS."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= MISMATCH_CHARS else text[:MISMATCH_CHARS - 1] + "…"


def same(got: Any, want: Any) -> bool:
    """Equal, with floats equal to 1e-9 relative (absolute below 1), inside lists and
    objects too; true and false equal only themselves (Python's True == 1 is no match
    for a file that wrote 1).

    The expectation comes from a file: any JSON value may meet a float the
    engine holds, so whatever no float can equal (text, lists, null, an
    integer beyond float range) is simply not the same.
    """
    if isinstance(got, list | tuple) and isinstance(want, list):
        return len(got) == len(want) and all(map(same, got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
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
