"""A run's operations as a scenario file (CONTRACT.md), checked against the state it reached.

`op_to_json` writes one operation as CONTRACT.md's operation JSON, the inverse
of `backend.engine.ops.parse_op`: `parse_op(op_to_json(op)) == op` for every
operation the parser accepts. A Playground session keeps its operations in
this form (its operation log), and `export_scenario` turns that log into a
scenario whose steps carry `expect` values read from the session's snapshots,
so replaying it with `python -m backend run FILE --check` both reproduces the
state and proves that it did.

Which `expect` paths are written: after the last step every contract metric
and each request's status, num_tokens and block table (the complete outcome
in a few lines); after an earlier step whose snapshot is still known, three
block counts. Request paths are dotted (`requests.<id>.<field>`), so a
request whose id holds a "." (a fork's default child id, "A.1") cannot be
named by one: its figures are covered by the metrics only.

A run that started from a snapshot (an upload, "Continue in the Playground") is not
a run from a fresh engine: its scenario replays with `--from` that snapshot,
which the caller writes beside it (`needs_base`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import agrees, counted
from backend.engine.ops import (
    INHERIT,
    Add,
    Finish,
    Fork,
    Grow,
    Op,
    Shuffle,
    Step,
    describe_op,
    label_narration,
    parse_op,
)
from backend.io.scenario import FromSnapshot

Snapshot = dict[str, Any]

# The contract's metrics (CONTRACT.md, snapshot `metrics`): the last step checks all of them.
FINAL_METRICS = ("used_blocks", "free_blocks", "cached_blocks", "filled_slots",
                 "internal_waste_slots", "shared_blocks", "cow_copies", "prefix_hit_blocks",
                 "preemptions")
STEP_METRICS = ("used_blocks", "cached_blocks", "filled_slots")
REQUEST_FIELDS = ("status", "num_tokens", "block_table")


def op_to_json(op: Op) -> dict[str, Any]:
    """`op` as CONTRACT.md's operation object: what `parse_op` reads back to `op`."""
    match op:
        case Add():
            out: dict[str, Any] = {"op": "add", "request": op.request}
            if op.prompt is not None:
                out["prompt"] = op.prompt
            elif op.prompt_tokens is not None:
                out["prompt_tokens"] = list(op.prompt_tokens)
            elif op.messages is not None:
                out["messages"] = [{"role": r, "content": c} for r, c in op.messages]
            else:
                out["prompt_len"] = op.prompt_len
            # Omitted means "the config's default"; null means "no limit".
            if op.max_new_tokens != INHERIT:
                out["max_new_tokens"] = op.max_new_tokens
            if op.blocks is not None:
                out["blocks"] = list(op.blocks)
            if op.n is not None:
                out["n"] = op.n
            if op.beam_width is not None:
                out["beam_width"] = op.beam_width
            if op.cache_salt is not None:
                out["cache_salt"] = op.cache_salt
            return out
        case Grow():
            return {"op": "grow", "request": op.request, "tokens": op.tokens}
        case Fork():
            return {"op": "fork", "request": op.request, "child": op.child}
        case Finish():
            return {"op": "finish", "request": op.request}
        case Step():
            return {"op": "step", "count": op.count}
        case Shuffle():
            return {"op": "shuffle"} if op.seed is None else {"op": "shuffle", "seed": op.seed}
    raise AssertionError(op)


def _addressable(request_id: str) -> bool:
    """Can an `expect` path name this request? Paths split on "." (see module doc)."""
    return "." not in request_id


def final_expect(snapshot: Snapshot) -> dict[str, Any]:
    """The `expect` of a run's last step: the state `snapshot` shows, in path: value pairs."""
    out: dict[str, Any] = {f"metrics.{m}": snapshot["metrics"][m] for m in FINAL_METRICS}
    for r in snapshot["requests"]:
        if _addressable(r["id"]):
            for f in REQUEST_FIELDS:
                out[f"requests.{r['id']}.{f}"] = r[f]
    return out


def step_expect(snapshot: Snapshot) -> dict[str, Any]:
    """The `expect` of an earlier step: a few block counts of its snapshot."""
    return {f"metrics.{m}": snapshot["metrics"][m] for m in STEP_METRICS}


def export_scenario(config: EngineConfig, ops: Sequence[dict[str, Any]],
                    final: Snapshot, known: Iterable[Snapshot] = (), *,
                    first_step: int = 1, name: str = "playground-session",
                    description: str = "",
                    from_snapshot: FromSnapshot | None = None) -> dict[str, Any]:
    """A scenario replaying `ops` (operation JSON, oldest first) on `config`.

    `final` is the snapshot after the last operation; `known` are snapshots of
    earlier steps (any subset, e.g. the session's history), matched to the
    operations by their `step`: operation i (0-based) made step
    `first_step + i`. `first_step` is 1 for a run from a fresh engine, the
    base snapshot's step + 1 for a run from a snapshot, which `from_snapshot` then
    names (written to the file, so that a reader refuses to replay it on a fresh
    engine). Each step's narration
    is its operation in words. Reads only.
    """
    by_step = {s["step"]: s for s in known}
    last = first_step + len(ops) - 1
    if ops and final["step"] != last:
        raise PagedLabError(f"the final snapshot is step {final['step']}, but "
                            f"{counted(len(ops), 'operation')} from step {first_step} "
                            f"{agrees(len(ops), 'ends', 'end')} at step {last}")
    steps = []
    for i, raw in enumerate(ops):
        step = first_step + i
        # Parsed again, so a malformed log fails here, not in the file a person downloads.
        op = parse_op(raw, vocab_size=config.vocab_size)
        entry: dict[str, Any] = {**raw, "narration": label_narration(step, describe_op(op))}
        if step == last:
            entry["expect"] = final_expect(final)
        elif step in by_step:
            entry["expect"] = step_expect(by_step[step])
        steps.append(entry)
    start = {} if from_snapshot is None else {"from_snapshot": from_snapshot.to_json()}
    return {"name": name, "description": description, **start, "config": config.to_json(),
            "steps": steps}


def scenario_json(scenario: dict[str, Any]) -> str:
    """The scenario as the text written to files (stable key order, one trailing newline)."""
    return json.dumps(scenario, indent=1, ensure_ascii=False) + "\n"
