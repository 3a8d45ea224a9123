"""A Playground engine's operation log: every operation applied since it started, as JSON.

The log starts where the engine's state starts: a fresh engine of the
session's config (`base` None) or a restored snapshot (`base` that
snapshot, as `export_snapshot` wrote it). Replaying the log's operations on
that start reproduces the engine's state exactly (the engine is
deterministic, and a stopped step is logged as the step that ran), which is
what turns a session into a scenario file (backend/io/scenario_export.py).

Bounded: at most MAX_OPS operations and MAX_OP_BYTES of their JSON. A log
that passes either bound stops being kept (`complete` False, its operations
dropped): a partial log replays to some other state, so it is worth nothing.
A saved session whose log cannot be read back opens without one the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.ops import Op
from backend.io.scenario import MAX_STEPS, FromSnapshot
from backend.io.scenario_export import export_scenario, op_to_json

Snapshot = dict[str, Any]

MAX_OPS = MAX_STEPS          # a scenario file holds at most this many steps
MAX_OP_BYTES = 4 << 20


def op_bytes(op: dict[str, Any]) -> int:
    """What one logged operation costs against MAX_OP_BYTES: its compact JSON's length."""
    return len(json.dumps(op, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass(slots=True)
class OpLog:
    """The operations since the engine's start (see module doc). Not shared between tabs."""

    base: Snapshot | None = None
    ops: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True
    nbytes: int = 0
    # Why it is not kept, where this process knows (a log read back from a saved
    # session as not kept does not say why).
    dropped: str | None = None

    @property
    def base_step(self) -> int:
        """The engine's step where the log starts (0 for a fresh engine)."""
        return 0 if self.base is None else int(self.base["step"])

    @property
    def needs_base(self) -> bool:
        """Whether the operations replay only from `base`: False for a fresh start, and for
        a restored snapshot of a fresh engine (step 0, no request, every block free, the
        free queue in its first order, no random pick made), which a fresh engine of its
        config reproduces: the Scenarios page's Continue in the Playground at step 0, or a
        `run` of no steps uploaded."""
        b = self.base
        if b is None:
            return False
        first_order = list(range(len(b["blocks"])))
        fresh = (b["step"] == 0 and not b["requests"]
                 and all(x["state"] == "free" for x in [*b["blocks"], *b.get("cpu_blocks", [])])
                 and b.get("free_queue", first_order) == first_order
                 and not b.get("allocator", {}).get("random_picks"))
        return not fresh

    def restart(self, base: Snapshot | None) -> None:
        """Mutates: the engine starts again, fresh (None) or from the snapshot `base`."""
        self.base = base
        self.ops = []
        self.complete = True
        self.nbytes = 0
        self.dropped = None

    def drop(self, why: str) -> None:
        """Mutates: stop keeping the log (see the module doc), because `why`."""
        self.complete = False
        self.ops = []
        self.nbytes = 0
        self.dropped = why

    def append(self, op: Op) -> dict[str, Any] | None:
        """Mutates: log one applied operation; its JSON, or None when the log is not kept."""
        if not self.complete:
            return None
        data = op_to_json(op)
        size = op_bytes(data)
        if len(self.ops) >= MAX_OPS or self.nbytes + size > MAX_OP_BYTES:
            self.drop(f"its operation log passed {MAX_OPS:,} operations or "
                      f"{MAX_OP_BYTES >> 20} MiB, so it is no longer kept")
            return None
        self.ops.append(data)
        self.nbytes += size
        return data

    def why_not_exportable(self) -> str | None:
        """Why this log cannot become a scenario file, or None when it can."""
        if not self.complete:
            return self.dropped or (
                f"its operation log is no longer kept: it passed {MAX_OPS:,} operations or "
                f"{MAX_OP_BYTES >> 20} MiB, or was found damaged when the session was "
                "opened")
        if not self.ops and self.base is None:
            return "no operation has been applied yet"
        if not self.ops:
            return (f"no operation has been applied since this state was restored (step "
                    f"{self.base_step:,}): the snapshot export holds it")
        return None

    def scenario(self, config: EngineConfig, final: Snapshot, known: list[Snapshot], *,
                 name: str, description: str, base_file: str | None = None
                 ) -> dict[str, Any]:
        """This log as a scenario file's object (see export_scenario). Raises PagedLabError
        when the log is not exportable or does not end at `final`'s step. A log that
        starts from a restored snapshot names it in `from_snapshot` (`base_file`: the
        name it is downloaded as), unless that snapshot is of a fresh engine."""
        problem = self.why_not_exportable()
        if problem is not None:
            raise PagedLabError(f"this session cannot be exported as a scenario: {problem}")
        start = FromSnapshot(self.base_step, base_file) if self.needs_base else None
        return export_scenario(config, self.ops, final, known, first_step=self.base_step + 1,
                               name=name, description=description, from_snapshot=start)
