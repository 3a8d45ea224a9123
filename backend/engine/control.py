"""Control runs: the same operations without the perturbation, compared token by token.

A lesson's claim that moving blocks, preemption or a prefix hit changes
nothing is checked here live, not against a stored string. `ControlRun`
applies each operation to the engine as the user ran it and to a control
engine of the same model and seed that has none of the perturbations:

    no shuffle        `shuffle` is not replayed (no block ever moves)
    no preemption     a pool roomy enough for every sequence's every token
                      (`control_config`), recompute preemption, no budgets
    no prefix cache   prefix caching off: every prompt is computed in full
    no pinned blocks  `add` without `blocks`: placement is the pool's

Sampling is seeded by (seed, request, position), so both engines must draw
the same token at every position both reach; the control only gets there
sooner (nothing waits). After every operation the next-token logits that
each engine holds at a (request, position) are compared with the other's at
the same (request, position) as soon as both have them, so a preempted
request is compared when its recomputation catches up. The report gives,
per request, whether the tokens agree over the length both reached and the
largest logit difference seen. A wrong block table entry, a missed copy or
a bad move shows there as differing logits, and soon as differing tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import INHERIT, Add, Fork, Grow, Op, Shuffle, Step
from backend.engine.results import logit_tolerance
from backend.models.registry import codec_for

# The control pool is sized from the operations; past this it is refused rather
# than allocated (the pool is real K/V memory).
MAX_CONTROL_BYTES = 512 << 20
# Logits waiting for the other engine to reach their position, at most (each is one
# vocabulary-sized float32 row); past it the oldest are dropped uncompared.
MAX_PENDING_ROWS = 4096


@dataclass(frozen=True, slots=True)
class RequestComparison:
    """One request in both runs."""

    request: str
    tokens: list[int]            # as the user's run has them
    control_tokens: list[int]
    first_mismatch: int | None   # the first position both reached with different tokens
    positions_compared: int      # positions whose next-token logits were compared
    max_logit_diff: float        # the largest |difference| among them (0.0 if none)

    @property
    def compared_tokens(self) -> int:
        """Tokens both runs reached, compared one by one."""
        return min(len(self.tokens), len(self.control_tokens))

    @property
    def same(self) -> bool:
        return self.first_mismatch is None


@dataclass(frozen=True, slots=True)
class ControlReport:
    """Both runs compared: per request, and what the control did not replay."""

    requests: tuple[RequestComparison, ...]
    not_replayed: tuple[str, ...]    # operations the control left out, and why
    control_config: EngineConfig
    # A replay (compare_with_control) stopped before its end: the operations it replayed
    # whole, of how many. None: it ran to the end (or the report is of a run followed
    # step by step, ControlRun).
    stopped_after: tuple[int, int] | None = None

    @property
    def same(self) -> bool:
        """Every token both runs reached is the same."""
        return all(r.same for r in self.requests)

    @property
    def tolerance(self) -> float:
        return logit_tolerance(self.control_config.dtype)

    @property
    def agrees(self) -> bool:
        """The same tokens, and logits no further apart than reordered arithmetic explains."""
        return self.same and self.max_logit_diff <= self.tolerance

    @property
    def max_logit_diff(self) -> float:
        return max((r.max_logit_diff for r in self.requests), default=0.0)

    @property
    def positions_compared(self) -> int:
        return sum(r.positions_compared for r in self.requests)


def _upper_tokens(config: EngineConfig, op: Add, iterations: int) -> int:
    """Tokens one sequence of `op` may reach: its prompt (bounded by its text's bytes, as
    every token is at least one byte) and at most `iterations` generated ones."""
    if op.prompt_len is not None:
        prompt = op.prompt_len
    elif op.prompt_tokens is not None:
        prompt = len(op.prompt_tokens)
    elif op.prompt is not None:
        prompt = len(op.prompt.encode())
    else:
        assert op.messages is not None
        text = codec_for(config.model).render_chat(
            [{"role": r, "content": c} for r, c in op.messages])
        prompt = len(text.encode())
    limit = config.max_new_tokens if op.max_new_tokens == INHERIT else op.max_new_tokens
    new = iterations if not isinstance(limit, int) else min(limit, iterations)
    # A real model's context ends a request there, whatever it asked for.
    return config.within_context(prompt + new)


def control_config(config: EngineConfig, ops: Sequence[Op]) -> EngineConfig:
    """`config` with none of the perturbations, in a pool every sequence fits in whole.

    Raises PagedLabError if that pool would pass MAX_CONTROL_BYTES.
    """
    iterations = sum(op.count for op in ops if isinstance(op, Step)) + sum(
        op.tokens for op in ops if isinstance(op, Grow)) + 1
    bs = config.block_size
    blocks = 1
    bound: dict[str, int] = {}
    for op in ops:
        if isinstance(op, Add):
            tokens = _upper_tokens(config, op, iterations)
            # n samples, or at most W live beams (a round drops beams before it forks).
            copies = op.n or op.beam_width or 1
            blocks += copies * (-(-tokens // bs) + 1)
            bound[op.request] = tokens
        elif isinstance(op, Fork):
            tokens = bound.get(op.request, iterations)
            bound[op.child] = tokens
            blocks += -(-tokens // bs) + 1
    blocks = max(blocks, config.num_blocks)
    need = blocks * config.bytes_per_block
    if need > MAX_CONTROL_BYTES:
        raise PagedLabError(
            f"a control run of these operations needs a pool of {blocks} blocks "
            f"({need >> 20} MiB), more than the {MAX_CONTROL_BYTES >> 20} MiB allowed")
    return config.replace(num_blocks=blocks, prefix_caching=False, preemption="recompute",
                          num_cpu_blocks=0, max_num_seqs=None, max_num_batched_tokens=None,
                          watermark_blocks=None)


class ControlRun:
    """The control engine of one run, and the comparisons so far.

    The user's engine is passed to each call rather than kept (a page may
    replace it with one on another kernel, with the same state): `apply` runs
    an operation on both, `follow` on the control only, after the caller ran
    it on the user's engine. A fault injected into the user's engine between
    operations shows in the report.
    """

    def __init__(self, config: EngineConfig, ops: Sequence[Op], *, device: str = "auto",
                 kernel: str = "torch",
                 admit: Callable[[EngineConfig], None] | None = None) -> None:
        """`admit`, if given, sees the control's config before its pool is allocated and
        may refuse it by raising PagedLabError (a browser session's K/V budget)."""
        sized = control_config(config, ops)
        if admit is not None:
            admit(sized)
        self.control = Engine(sized, device=device, kernel=kernel, check_reference=False)
        # (request, num_tokens) -> next-token logits one side held there, not yet
        # matched by the other side's: [0] the user's run, [1] the control's.
        self._pending: tuple[dict[tuple[str, int], torch.Tensor], ...] = ({}, {})
        # Per request: the positions compared so far, and the largest difference seen. An
        # operation that leaves a request where it was (an add of another, a shuffle)
        # compares the same logits again: the position counts once.
        self._positions: dict[str, set[int]] = {}
        self._worst: dict[str, float] = {}
        self.not_replayed: list[str] = []
        # The user's step after which the control follows no more (an operation of it
        # stopped part-way: its state is no longer that run's without the perturbations).
        self.stopped_at: int | None = None

    def apply(self, op: Op, engine: Engine) -> None:
        """Mutates: `op` on the user's `engine` (a refusal raises, as `Engine.apply` does),
        then `follow`."""
        engine.apply(op)
        self.follow(op, engine)

    def follow(self, op: Op, engine: Engine,
               keep_going: Callable[[int, int], bool] | None = None) -> None:
        """Mutates: `op`, which `engine` just applied, on the control (left out as the
        module docstring says, or noted if the control refuses it); then compare the
        logits both hold at the same positions.

        `keep_going(done, total)` hears of each iteration of the control's `step` (each
        token of its `grow`); False stops it there, and the control then follows no
        later operation (noted in the report)."""
        if self.stopped_at is not None:
            return
        if isinstance(op, Shuffle):
            self.not_replayed.append(f"step {engine.step}: shuffle (no block moves in the "
                                     "control)")
        else:
            self._end_where_finished(engine)
            control_op = replace(op, blocks=None) if isinstance(op, Add) else op
            try:
                done = self.control.apply(control_op, progress=keep_going)
            except PagedLabError as exc:
                # Said with why the two runs can differ there, or the line reads as a fault
                # beside a verdict of "Same": a request preempted in the user's run
                # has gone on decoding in the control, and may have finished.
                self.not_replayed.append(
                    f"step {engine.step}: refused in the control, where nothing waits for "
                    f"room or is preempted, so a request can be further along than in this "
                    f"run: {exc}")
            else:
                if done.op != control_op:
                    self.stopped_at = engine.step
                    self.not_replayed.append(
                        f"step {engine.step}: the control was stopped part-way through it, "
                        "so it follows no later step")
        self._compare(engine)

    def _end_where_finished(self, engine: Engine) -> None:
        """Mutates the control: a request the user's run has finished goes no further in
        the control than it went there.

        That run holds no later position of it to compare, and the control's roomy
        pool would otherwise let it decode on: a request that filled the user's whole
        pool (finished, "capacity") would run every remaining iteration of a long
        step in the control. Its limit is lowered to the length it finished at (a beam
        keeps its group's: the search reads it)."""
        for rid, req in engine.requests.items():
            twin = self.control.requests.get(rid)
            if (req.status != "finished" or twin is None or twin.status == "finished"
                    or twin.beam_width is not None):
                continue
            limit = max(0, req.num_tokens - twin.prompt_len)
            if twin.max_new_tokens is None or twin.max_new_tokens > limit:
                twin.max_new_tokens = limit

    def _compare(self, engine: Engine) -> None:
        sides = ((engine, self._pending[0], self._pending[1]),
                 (self.control, self._pending[1], self._pending[0]))
        for side, mine, theirs in sides:
            for rid in side.running:
                req = side.requests[rid]
                if req.logits is None or req.prefilling:
                    continue
                key = (rid, req.num_tokens)
                other = theirs.pop(key, None)
                if other is not None:
                    diff = float((req.logits.float().cpu() - other).abs().max())
                    self._positions.setdefault(rid, set()).add(req.num_tokens)
                    self._worst[rid] = max(self._worst.get(rid, 0.0), diff)
                elif key not in mine:
                    mine[key] = req.logits.float().cpu().clone()
        for pending in self._pending:
            while len(pending) > MAX_PENDING_ROWS:
                pending.pop(next(iter(pending)))

    def report(self, engine: Engine) -> ControlReport:
        """Reads only: every request of the user's `engine` against the control's."""
        out = []
        for rid, req in engine.requests.items():
            twin = self.control.requests.get(rid)
            theirs = [] if twin is None else twin.tokens
            common = min(len(req.tokens), len(theirs))
            first = next((i for i in range(common) if req.tokens[i] != theirs[i]), None)
            if first is None and twin is None:
                first = 0
            n = len(self._positions.get(rid, ()))
            out.append(RequestComparison(rid, list(req.tokens), list(theirs), first, n,
                                         self._worst.get(rid, 0.0)))
        return ControlReport(tuple(out), tuple(self.not_replayed), self.control.config)


def compare_with_control(config: EngineConfig, ops: Sequence[Op], *, kernel: str = "torch",
                         device: str = "auto",
                         progress: Callable[[int, int], bool] | None = None,
                         keep_going: Callable[[int, int], bool] | None = None
                         ) -> ControlReport:
    """Replay `ops` from a fresh engine of `config` and on its control; the comparison.

    `progress(done, total)` after each operation; False stops there. `keep_going(done,
    total)` within an operation, after each iteration of a `step` (each token of a
    `grow`) on either engine; False stops the replay there, part-way through that
    operation. A replay stopped either way reports the operations it replayed whole
    (`stopped_after`), and compares what both engines reached: a position one of them
    never reached is not compared, so a stop costs coverage, never a false difference.
    """
    engine = Engine(config, device=device, kernel=kernel, check_reference=False)
    run = ControlRun(config, ops, device=engine.device.type, kernel=kernel)
    stopped_after = None
    for i, op in enumerate(ops, start=1):
        done = engine.apply(op, progress=keep_going)
        if done.op != op:
            # Stopped part-way on this side: the control does not follow it, so nothing
            # this side reached in it has a position to compare with.
            stopped_after = i - 1
            break
        run.follow(op, engine, keep_going)
        if run.stopped_at is not None:
            # Its note (the last) is said by stopped_after: the replay stopped, not the
            # control alone.
            run.not_replayed.pop()
            stopped_after = i - 1
            break
        if progress is not None and not progress(i, len(ops)):
            stopped_after = i if i < len(ops) else None
            break
    report = run.report(engine)
    if stopped_after is None:
        return report
    return replace(report, stopped_after=(stopped_after, len(ops)))
