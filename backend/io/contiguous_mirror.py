"""A contiguous arena that follows a paged run, for side-by-side scenarios.

A scenario may name a contiguous arena to compare with::

    "contiguous": {"capacity": 16, "policy": "oracle", "max_len": 2048}

The mirror then replays the run's requests there: each added request asks
for one region sized by the policy from its final length (prompt +
max_new_tokens; max_len when it has no limit), placed first-fit; a forked
child needs a region of its own, since without a block table it cannot
point at its parent's history; a finished request releases its region and
the requests waiting for room are placed first come, first served. A
placed request holds as many tokens as it has in the paged run (never more
than its final length).

The mirror models memory, not time: a request that waits here may be
running in the paged engine, which is exactly the difference the scenario
shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.core.checks import check_int
from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork
from backend.engine.results import OpResult
from backend.lab.contiguous import CONTIGUOUS_POLICIES, DEFAULT_MAX_LEN, ContiguousArena

MAX_CAPACITY = 1 << 20


@dataclass(frozen=True, slots=True)
class ContiguousSpec:
    capacity: int
    policy: str = "oracle"
    max_len: int = DEFAULT_MAX_LEN

    @staticmethod
    def from_json(data: Any) -> ContiguousSpec:
        if not isinstance(data, dict):
            raise PagedLabError("contiguous must be an object with capacity, policy, max_len")
        unknown = sorted(set(data) - {"capacity", "policy", "max_len"})
        if unknown:
            raise PagedLabError(f"contiguous: unknown field {unknown[0]!r}")
        cap = check_int(data.get("capacity"), "contiguous.capacity", 1, MAX_CAPACITY)
        policy = data.get("policy", "oracle")
        if policy not in CONTIGUOUS_POLICIES:
            raise PagedLabError("contiguous.policy must be one of "
                                f"{', '.join(CONTIGUOUS_POLICIES)}")
        max_len = check_int(data.get("max_len", DEFAULT_MAX_LEN), "contiguous.max_len", 1)
        return ContiguousSpec(cap, policy, max_len)


class ContiguousMirror:
    """Follows an engine's operations in a contiguous arena. See the module docstring."""

    def __init__(self, spec: ContiguousSpec) -> None:
        self.spec = spec
        self.arena = ContiguousArena(spec.capacity, spec.policy,  # type: ignore[arg-type]
                                     max_len=spec.max_len)
        self.final_len: dict[str, int] = {}
        self.waiting: list[str] = []
        self.never: list[str] = []

    def observe(self, engine: Engine, result: OpResult) -> None:
        """Mutates: bring the arena up to date with the engine after `result`."""
        op = result.op
        new: list[str] = []
        if isinstance(op, Add):
            new.append(op.request)
        elif isinstance(op, Fork):
            new.append(op.child)
        for rid in new:
            req = engine.requests[rid]
            limit = req.max_new_tokens
            self.final_len[rid] = (req.prompt_len + limit if limit is not None
                                   else self.spec.max_len)
            self.waiting.append(rid)
        for rid in list(self.final_len):
            if engine.requests[rid].status == "finished" and rid in self.arena:
                self.arena.release(rid)
        # Requests that finished before they were ever placed leave the queue.
        self.waiting = [r for r in self.waiting if engine.requests[r].status != "finished"]
        self._place_waiting(engine)
        for region in self.arena.regions():
            want = min(engine.requests[region.request_id].num_tokens,
                       self.final_len[region.request_id])
            if want > region.tokens:
                self.arena.grow(region.request_id, want - region.tokens)

    def _place_waiting(self, engine: Engine) -> None:
        while self.waiting:
            rid = self.waiting[0]
            final = self.final_len[rid]
            try:
                self.arena.reserve(rid, final,
                                   tokens=min(engine.requests[rid].num_tokens, final))
            except OutOfBlocksError:
                return
            except PagedLabError:
                # Longer than the whole arena: it can never be placed.
                self.never.append(rid)
            self.waiting.pop(0)

    @property
    def required(self) -> int | None:
        """The region size the first waiting request needs (None when none waits)."""
        if not self.waiting:
            return None
        return self.arena.reservation_size(self.final_len[self.waiting[0]])

    def state(self) -> dict[str, Any]:
        """Reads only: JSON-ready state, the target of `contiguous.*` expectations."""
        required = self.required
        fit = self.arena.fits(self.final_len[self.waiting[0]]) if self.waiting else None
        return {
            "capacity": self.spec.capacity, "policy": self.spec.policy,
            "free_total": self.arena.free_total, "largest_hole": self.arena.largest_hole(),
            "holes": [[h.start, h.length] for h in self.arena.holes()],
            "regions": {r.request_id: {"start": r.start, "reserved": r.reserved,
                                       "tokens": r.tokens, "final_len": r.final_len}
                        for r in self.arena.regions()},
            "waiting": list(self.waiting), "never_fits": list(self.never),
            "required": required,
            "next_fit": None if fit is None else {"fits": fit.fits, "reason": fit.reason,
                                                  "message": fit.message},
            "breakdown": self.arena.breakdown(required).as_dict(),
        }
