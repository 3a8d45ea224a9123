"""A contiguous arena that runs a paged run's requests, for side-by-side scenarios.

A scenario may name a contiguous arena to compare with::

    "contiguous": {"capacity": 16, "policy": "oracle", "max_len": 2048}

The mirror then serves the run's requests there, on a clock of its own:

- A request arrives in the operation, or the model iteration of a `step`,
  in which the paged engine first holds it (an `add`, a `fork`'s child, a
  parallel sample, a beam). It arrives with its prompt; a child with the
  history its parent holds here, at most what it holds in the engine.
- It asks for one region sized by the policy from its final length
  (prompt + max_new_tokens; max_len when it has no limit), placed first-fit
  and first come, first served. A forked child needs a region of its own,
  since without a block table it cannot point at its parent's history. A
  request that can never fit (or whose prompt is already past max_len
  without a limit) is set aside as never placeable.
- Every model iteration of a `step` gives each placed request one token, and
  a `grow` gives its request the tokens the engine decoded for it. A request
  that waits here generates nothing until it has a region, so it falls
  behind its paged twin: that lag, and the later finish, is what the
  scenario shows. (A request the engine keeps waiting runs ahead here.)
- A request finishes here at its final length, or, once the engine has
  finished it (end of sequence, finished by hand, a dropped beam), as soon
  as it holds as many tokens as it finished with there: a request that is
  ahead here may hold more. Its region is released and the waiting
  requests are placed; one waiting with nothing left to generate finishes
  without a region.

The engine decides arrivals, each request's final length and where it ends;
the arena decides nothing for the engine.
"""

from __future__ import annotations

from collections.abc import Callable
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
        if "capacity" not in data:
            # Said as missing: check_int would call it null, which it was not written as.
            raise PagedLabError("contiguous: missing field 'capacity' (the arena's size in "
                                "token slots)")
        cap = check_int(data["capacity"], "contiguous.capacity", 1, MAX_CAPACITY)
        policy = data.get("policy", "oracle")
        if policy not in CONTIGUOUS_POLICIES:
            raise PagedLabError("contiguous.policy must be one of "
                                f"{', '.join(CONTIGUOUS_POLICIES)}")
        max_len = check_int(data.get("max_len", DEFAULT_MAX_LEN), "contiguous.max_len", 1)
        return ContiguousSpec(cap, policy, max_len)


class ContiguousMirror:
    """Serves an engine's requests in a contiguous arena. See the module docstring.

    `run_steps` passes `on_iteration(engine)` to `Engine.apply` as the progress
    callback of a `step`, so its iterations are followed one at a time (not of a
    `grow`, whose tokens the engine reports too: `observe` takes them from the
    result); `observe` runs any iterations it was not told about, so it is
    correct on its own.
    """

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
        # In the order they finished here, with the tokens each ended with.
        self.ended_with: dict[str, int] = {}
        # Placed requests whose token count differs from the engine's after the last
        # operation (request -> here, there, the engine's status); kept here because
        # `state` reads only the arena.
        self.out_of_step: dict[str, tuple[int, int, str]] = {}
        self._iterations = 0    # of the operation being applied, followed so far

    @property
    def finished(self) -> list[str]:
        return list(self.ended_with)

    def on_iteration(self, engine: Engine) -> Callable[[int, int], bool]:
        """A progress callback for `engine.apply`: follows each model iteration."""
        def follow(done: int, total: int) -> bool:
            self._iterate(engine)
            self._iterations += 1
            return True
        return follow

    def observe(self, engine: Engine, result: OpResult) -> None:
        """Mutates: bring the arena up to date with the engine after `result`."""
        op = result.op
        if isinstance(op, Step):
            # `count` is the iterations that ran (fewer when a play was stopped).
            for _ in range(op.count - self._iterations):
                self._iterate(engine)
        elif isinstance(op, Grow) and op.request in self.arena:
            decoded = sum(1 for rid, _ in result.generated if rid == op.request)
            self._grow(op.request, decoded, engine)
        self._iterations = 0
        self._arrive(engine)
        self._settle(engine)
        self.out_of_step = {}
        for rid in self.final_len:
            if rid in self.arena:
                req = engine.requests[rid]
                here = self.arena.region(rid).tokens
                there = min(req.num_tokens, self.final_len[rid])
                if here != there:
                    self.out_of_step[rid] = (here, there, req.status)

    def _arrive(self, engine: Engine) -> None:
        """Queue the requests the engine holds that this arena has not seen."""
        for rid, req in engine.requests.items():
            if rid in self.final_len:
                continue
            limit = req.max_new_tokens
            # A real model's context ends a request there (finish_reason "context").
            final = engine.config.within_context(
                req.prompt_len + limit if limit is not None else self.spec.max_len)
            self.final_len[rid] = final
            held = req.num_tokens
            if req.parent is not None and req.parent in self.final_len:
                held = min(held, self._holds(req.parent))
            self.arrived_with[rid] = min(held, final)
            if held > final:
                # A prompt already past max_len without a limit: nothing to reserve.
                self.never.append(rid)
            else:
                self.waiting.append(rid)

    def _holds(self, rid: str) -> int:
        """The tokens `rid` holds here (or held when it finished, or will hold when placed)."""
        if rid in self.arena:
            return self.arena.region(rid).tokens
        return self.ended_with.get(rid, self.arrived_with[rid])

    def _target(self, rid: str, engine: Engine) -> int:
        """The tokens `rid` ends with here: its final length, or what the engine
        finished it with."""
        req = engine.requests[rid]
        final = self.final_len[rid]
        return min(req.num_tokens, final) if req.status == "finished" else final

    def _grow(self, rid: str, n: int, engine: Engine) -> None:
        take = min(n, self._target(rid, engine) - self.arena.region(rid).tokens)
        if take > 0:
            self.arena.grow(rid, take)

    def _iterate(self, engine: Engine) -> None:
        """One model iteration: every placed request takes a token, the requests the
        engine created in it arrive, the finished leave and the waiting are placed."""
        for region in self.arena.regions():
            self._grow(region.request_id, 1, engine)
        self._arrive(engine)
        self._settle(engine)

    def _finish(self, rid: str, tokens: int) -> None:
        if rid in self.arena:
            self.arena.release(rid)
        self.ended_with[rid] = tokens

    def _settle(self, engine: Engine) -> None:
        for region in self.arena.regions():
            if region.tokens >= self._target(region.request_id, engine):
                self._finish(region.request_id, region.tokens)
        # Nothing left to generate (finished in the engine with the tokens it holds
        # here): done without a region, and no longer in anyone's way.
        for rid in [r for r in self.waiting if self.arrived_with[r] >= self._target(r, engine)]:
            self.waiting.remove(rid)
            self._finish(rid, self.arrived_with[rid])
        while self.waiting:
            rid = self.waiting[0]
            try:
                self.arena.reserve(rid, self.final_len[rid], tokens=self.arrived_with[rid])
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
        next_fit = None
        if self.waiting:
            first = self.waiting[0]
            fit = self.arena.fits(self.final_len[first])
            next_fit = {"fits": fit.fits, "reason": fit.reason, "message": fit.message,
                        "tokens": self.arrived_with[first]}
        return {
            "capacity": self.spec.capacity, "policy": self.spec.policy,
            "free_total": self.arena.free_total, "largest_hole": self.arena.largest_hole(),
            "holes": [[h.start, h.length] for h in self.arena.holes()],
            "regions": {r.request_id: {"start": r.start, "reserved": r.reserved,
                                       "tokens": r.tokens, "final_len": r.final_len}
                        for r in self.arena.regions()},
            "waiting": list(self.waiting), "never_fits": list(self.never),
            "finished": self.finished,
            "out_of_step": {rid: {"here": here, "paged": there, "paged_status": status}
                            for rid, (here, there, status) in self.out_of_step.items()},
            "required": required,
            "next_fit": next_fit,
            "breakdown": self.arena.breakdown(required).as_dict(),
        }
