"""A contiguous arena that runs a paged run's requests, for side-by-side scenarios.

A scenario may name a contiguous arena to compare with::

    "contiguous": {"capacity": 16, "policy": "oracle", "max_len": 2048}

The mirror then serves the run's requests there, on a clock of its own:

- A request arrives when the paged engine first holds it (an `add`, a
  `fork`'s child, a parallel sample, a beam), with the tokens it holds
  there then (its prompt, or a child's inherited history).
- It asks for one region sized by the policy from its final length
  (prompt + max_new_tokens; max_len when it has no limit), placed first-fit
  and first come, first served. A forked child needs a region of its own,
  since without a block table it cannot point at its parent's history.
- Every model iteration of a `step` gives each placed request one token, and
  a `grow` gives the request it names its tokens, as in the paged engine. A
  request that waits here generates nothing until it has a region, so it
  falls behind its paged twin: that lag is what the scenario shows.
- A request finishes here when it reaches its final length, or, once the
  paged run has finished it (end of sequence, finished by hand, dropped),
  when it holds as many tokens as it finished with there. Its region is
  released and the requests waiting are placed.

The arena never decides anything for the paged run; the paged run decides
nothing here except arrivals and where a request ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.core.checks import check_int
from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Grow, Step
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
    """Serves an engine's requests in a contiguous arena. See the module docstring."""

    def __init__(self, spec: ContiguousSpec) -> None:
        self.spec = spec
        self.arena = ContiguousArena(spec.capacity, spec.policy,  # type: ignore[arg-type]
                                     max_len=spec.max_len)
        # Every request seen, in arrival order: the length its region is sized for and
        # the tokens it arrived with (what it holds when placed).
        self.final_len: dict[str, int] = {}
        self.arrived_with: dict[str, int] = {}
        self.waiting: list[str] = []
        self.never: list[str] = []
        self.finished: list[str] = []
        # Placed requests whose token count differs from the paged run's after the
        # last operation: request -> (here, there).
        self.out_of_step: dict[str, tuple[int, int]] = {}

    def observe(self, engine: Engine, result: OpResult) -> None:
        """Mutates: bring the arena up to date with the engine after `result`."""
        op = result.op
        if isinstance(op, Step):
            # `count` is the iterations that ran (fewer when a play was stopped).
            for _ in range(op.count):
                self._iterate(engine)
        elif isinstance(op, Grow) and op.request in self.arena:
            self._grow(op.request, op.tokens, engine)
        for rid, req in engine.requests.items():
            if rid not in self.final_len:
                limit = req.max_new_tokens
                final = req.prompt_len + limit if limit is not None else self.spec.max_len
                self.final_len[rid] = final
                self.arrived_with[rid] = min(req.num_tokens, final)
                self.waiting.append(rid)
        self._settle(engine)
        self.out_of_step = {
            r.request_id: (r.tokens, there) for r in self.arena.regions()
            if (there := min(engine.requests[r.request_id].num_tokens,
                             r.final_len)) != r.tokens}

    def _target(self, rid: str, engine: Engine) -> int:
        """The tokens `rid` ends with here: its final length, or what the paged run
        finished it with."""
        req = engine.requests[rid]
        final = self.final_len[rid]
        return min(req.num_tokens, final) if req.status == "finished" else final

    def _grow(self, rid: str, n: int, engine: Engine) -> None:
        room = self._target(rid, engine) - self.arena.region(rid).tokens
        if min(n, room) > 0:
            self.arena.grow(rid, min(n, room))

    def _iterate(self, engine: Engine) -> None:
        """One model iteration: every placed request takes a token, then the finished
        ones leave and the waiting ones are placed."""
        for region in self.arena.regions():
            self._grow(region.request_id, 1, engine)
        self._settle(engine)

    def _settle(self, engine: Engine) -> None:
        for region in self.arena.regions():
            rid = region.request_id
            if region.tokens >= self._target(rid, engine):
                self.arena.release(rid)
                self.finished.append(rid)
        while self.waiting:
            rid = self.waiting[0]
            final = self.final_len[rid]
            try:
                self.arena.reserve(rid, final, tokens=self.arrived_with[rid])
            except OutOfBlocksError:
                return
            except PagedLabError:
                # Longer than the whole arena: it can never be placed.
                self.never.append(rid)
            self.waiting.pop(0)
            # Arrived with all its tokens (a prompt the paged run finished at once).
            if rid in self.arena and self.arrived_with[rid] >= self._target(rid, engine):
                self.arena.release(rid)
                self.finished.append(rid)

    @property
    def required(self) -> int | None:
        """The region size the first waiting request needs (None when none waits)."""
        if not self.waiting:
            return None
        return self.arena.reservation_size(self.final_len[self.waiting[0]])

    def state(self) -> dict[str, Any]:
        """Reads only: JSON-ready state, the target of `contiguous.*` expectations."""
        required = self.required
        first = self.waiting[0] if self.waiting else None
        fit = None if first is None else self.arena.fits(self.final_len[first])
        return {
            "capacity": self.spec.capacity, "policy": self.spec.policy,
            "free_total": self.arena.free_total, "largest_hole": self.arena.largest_hole(),
            "holes": [[h.start, h.length] for h in self.arena.holes()],
            "regions": {r.request_id: {"start": r.start, "reserved": r.reserved,
                                       "tokens": r.tokens, "final_len": r.final_len}
                        for r in self.arena.regions()},
            "waiting": list(self.waiting), "never_fits": list(self.never),
            "finished": list(self.finished),
            "out_of_step": {rid: {"here": here, "paged": there}
                            for rid, (here, there) in self.out_of_step.items()},
            "required": required,
            "next_fit": None if fit is None or first is None else {
                "fits": fit.fits, "reason": fit.reason, "message": fit.message,
                "tokens": self.arrived_with[first]},
            "breakdown": self.arena.breakdown(required).as_dict(),
        }
