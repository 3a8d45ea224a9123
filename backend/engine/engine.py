"""The engine: CONTRACT.md's operations over a real allocator, model and kernel.

One engine is one KV pool with its requests. Each operation validates fully
and then runs to completion, so a refused operation (PagedLabError) leaves the
engine exactly as it was. Model work goes through the model's `forward`
(backend.models: TinyByteLM, or SmolLM2 over weights shared by every engine):
the allocator chooses slots, the forward pass writes the new tokens' K/V there
and the paged kernel reads every earlier token back through the block tables.
The scheduler (backend/engine/scheduler.py) decides what runs each step,
the model runner (backend/engine/runner.py) computes it, and this module
validates each operation and has them carry it out.

A step of continuous batching::

    1. admit   swapped requests first, then waiting ones, first come first
               served, while their prompts fit beside the blocks the running
               requests' next tokens need (and within the scheduler's budgets);
               one batched prefill computes what the prefix cache lacks
    2. decode  every running request samples one token from its last logits
               and takes a slot for it (copy-on-write, new block); when no
               block is free the most recently admitted request is preempted:
               its blocks are released and it waits to be recomputed, or
               (preemption "swap") its K/V goes to the host pool
    3. forward one batched model step writes the new K/V and yields the next
               logits; requests that reach max_new_tokens finish
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

import torch

from backend.core.checks import MAX_COUNTER, check_int
from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine import beams, checks, operations
from backend.engine.kv_cache import KVCache
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Shuffle, Step, check_op
from backend.engine.prompts import next_token
from backend.engine.request import Request
from backend.engine.results import (
    EngineMetrics,
    KernelReport,
    OpResult,
    Outcome,
    Prefill,
    Verification,
)
from backend.engine.runner import ModelRunner
from backend.engine.scheduler import Chunk, Scheduler
from backend.engine.swap import HostPool
from backend.engine.timeline import EngineTimeline
from backend.kernels import KernelBackend
from backend.models.base import LanguageModel
from backend.paging.block_manager import Address, BlockManager
from backend.paging.events import Event

# Called after each iteration of a step with (iterations done, iterations asked);
# returning False stops the step there.
Progress = Callable[[int, int], bool]


class Engine:
    """A paged KV-cache serving engine in miniature.

    One operation at a time: `apply` holds `lock`, so two threads driving one
    engine (two clicks in one browser session) run their operations one after
    the other. A reader in another thread that needs a consistent state (an
    export while an operation may run) holds `lock` too.
    """

    def __init__(self, config: EngineConfig | None = None, *, device: str = "auto",
                 kernel: str = "auto", check_reference: bool = True,
                 kv_fill: float | None = 0.0, weights: bool = True) -> None:
        """`weights=False`: an engine that keeps the books alone (allocator, requests,
        queues) with no weights and no K/V memory, to check a snapshot; an operation
        that runs a forward on it fails."""
        self.config = config or EngineConfig()
        # The model, kernels and K/V pools; the engine decides, the runner computes.
        self.runner = ModelRunner(self.config, device=device, kernel=kernel,
                                  check_reference=check_reference, kv_fill=kv_fill,
                                  weights=weights)
        c = self.config
        self.manager = BlockManager(c.num_blocks, c.block_size, prefix_caching=c.prefix_caching,
                                    allocation=c.allocation, seed=c.seed,
                                    cache_salt=c.cache_salt(), vocab_size=c.vocab_size)
        self.requests: dict[str, Request] = {}
        self.scheduler = Scheduler(c, self.manager, self.requests, self.runner.host, self.runner)
        self.step = 0
        # What each iteration did, for timelines (not part of a snapshot).
        self.timeline = EngineTimeline()
        self.lock = threading.RLock()
        # Set when an operation failed half-way (a bug, or the process ran out of
        # memory): the state is then inconsistent, and every later operation is
        # refused until the caller replaces the engine (see sessions/playground.py).
        self.broken: str | None = None
        # The log may not hold every event so far: restored from a file whose own log
        # was not held to that (see io/restore.py). Its exports say so (events_partial),
        # so that restoring them does not hold the log to it either.
        self.log_partial = False

    def set_kernels(self, device: str, kernel: str) -> None:
        """Mutates: run the next model steps with another kernel on the same device.

        K/V tensors, tables and pending logits stay exactly as they are; the
        kernel report keeps describing the step that already ran. Moving to
        another device is a snapshot restore (backend.io.snapshot), not this.
        """
        self.runner.set_kernels(device, kernel)

    # ---- reads -------------------------------------------------------------

    @property
    def model(self) -> LanguageModel:
        return self.runner.model

    @property
    def cache(self) -> KVCache:
        return self.runner.cache

    @property
    def host(self) -> HostPool | None:
        """The host pool of swap preemption (None with recompute)."""
        return self.runner.host

    @property
    def kernels(self) -> KernelBackend:
        return self.runner.kernels

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def check_reference(self) -> bool:
        return self.runner.check_reference

    @property
    def kernel_report(self) -> KernelReport:
        """What ran the last model step (a restore sets the snapshot's)."""
        return self.runner.kernel_report

    @kernel_report.setter
    def kernel_report(self, report: KernelReport) -> None:
        self.runner.kernel_report = report

    @property
    def events(self) -> Sequence[Event]:
        return self.manager.events

    @property
    def waiting(self) -> deque[str]:
        """Request ids waiting for admission, in the order they will be considered."""
        return self.scheduler.waiting

    @property
    def swapped(self) -> deque[str]:
        """Request ids swapped out to the host pool, in the order they come back."""
        return self.scheduler.swapped

    @property
    def running(self) -> list[str]:
        """Running request ids in admission order (the last is preempted first)."""
        return self.scheduler.running

    @property
    def idle(self) -> bool:
        """No request runs, waits or is swapped out: a step would do nothing."""
        return not (self.scheduler.running or self.scheduler.waiting
                    or self.scheduler.swapped)

    def request(self, request_id: str) -> Request:
        req = self.requests.get(request_id)
        if req is None:
            raise PagedLabError(f"request {request_id!r} does not exist")
        return req

    def text(self, request_id: str) -> str:
        """A request's tokens as text: tiny-byte's bytes shown as in render_tokens, a
        real model's tokens decoded (special tokens written out)."""
        return self.model.codec.decode(self.request(request_id).tokens)

    def token_pieces(self, tokens: list[int]) -> list[str]:
        """Each token's own text, to show where token boundaries fall."""
        return self.model.codec.pieces(tokens)

    def block_table(self, request_id: str) -> list[int]:
        req = self.request(request_id)
        return self.manager.block_table(request_id) if req.status == "running" else []

    def metrics(self) -> EngineMetrics:
        n_fin = sum(1 for r in self.requests.values() if r.status == "finished")
        return EngineMetrics(self.manager.metrics(), len(self.running), len(self.waiting),
                             n_fin, self.config.bytes_per_block, self.cache.total_bytes)

    def translate(self, request_id: str, position: int) -> Address:
        req = self.request(request_id)
        if req.status != "running":
            raise PagedLabError(f"request {request_id!r} is {req.status}: it holds no blocks")
        return self.manager.translate(request_id, position)

    def read_kv(self, request_id: str, position: int,
                layer: int = 0) -> tuple[Address, torch.Tensor, torch.Tensor]:
        """The address of a token and the key and value vectors stored at its slot."""
        check_int(layer, "layer", 0, self.config.num_layers - 1)
        addr = self.translate(request_id, position)
        k, v = self.cache.read_slot(layer, addr.slot)
        return addr, k.float().cpu(), v.float().cpu()

    def verify_recomputation(self) -> Verification:
        """Reads only: compare the paged state with a from-scratch contiguous pass.

        See backend/engine/checks.py: unlike `kernel_report.max_abs_err` this
        catches a wrong block, a missed copy-on-write, a bad move or a prefix
        hit on other tokens.
        """
        return checks.verify_recomputation(
            self.model, self.cache, self.manager, [self.requests[rid] for rid in self.running],
            self.host, [self.requests[rid] for rid in self.swapped])

    def check_integrity(self) -> None:
        """Allocator invariants, plus: tables agree with the requests' tokens."""
        self.manager.check_integrity()
        self.check_requests()

    def check_requests(self, *, logits: bool = True) -> None:
        """The engine's invariants on top of the allocator's (not rechecked here);
        `logits=False` leaves out which requests hold logits (before any forward)."""
        checks.check_requests(self.requests, self.scheduler, self.manager, logits=logits)

    # ---- operations --------------------------------------------------------

    def apply(self, op: Op, *, progress: Progress | None = None) -> OpResult:
        """Mutates: apply one operation; all or nothing.

        `progress(done, total)` is called after each iteration of a `step`
        and each token of a `grow`; returning False stops it there, between
        two, with the engine consistent: the result's `op` is then the `step`
        or `grow` that ran (its count the iterations or tokens done), so
        replaying the results' operations reproduces the state exactly.

        A refusal (PagedLabError) is raised before anything changes, an operation
        built in Python held first to the rules a parsed one meets (`ops.check_op`:
        Step(0) or a Grow of 1.5 tokens is refused, not applied). Any other
        exception means the operation stopped half-way: the engine marks
        itself broken and refuses everything after, rather than run on from a
        state no operation sequence could produce.
        """
        with self.lock:
            if self.broken is not None:
                raise PagedLabError(f"this engine stopped half-way through an operation "
                                    f"({self.broken}); reset it or restore a snapshot")
            self._check_counters()
            check_op(op)
            try:
                return self._apply(op, progress)
            except PagedLabError:
                raise
            except BaseException as exc:
                self.broken = f"step {self.step + 1}: {type(exc).__name__}: {exc}"
                raise

    def _check_counters(self) -> None:
        """Refuse an operation while a count it raises is past MAX_COUNTER (a restored
        snapshot's): the snapshot after it could hold a number no reader keeps exactly."""
        m = self.manager
        counts = {"step": self.step, "metrics.cow_copies": m.cow_copies,
                  "metrics.prefix_hit_blocks": m.prefix_hit_blocks,
                  "metrics.preemptions": m.preemptions,
                  "metrics.prefix_queries": m.prefix_queries,
                  "metrics.prefix_query_tokens": m.prefix_query_tokens,
                  "metrics.prefix_floor_tokens": m.prefix_floor_tokens,
                  "scheduler.admissions": self.scheduler.admissions,
                  "allocator.random_picks": m.pool.random_picks}
        if self.host is not None:
            counts["metrics.swap_outs"] = self.host.swap_outs
            counts["metrics.swap_ins"] = self.host.swap_ins
        for name, count in counts.items():
            if count > MAX_COUNTER:
                raise PagedLabError(
                    f"{name} is {count:,}, past the {MAX_COUNTER:,} an operation may start "
                    "from: the snapshot after it could hold a number past 2^53 - 1, which "
                    "no JSON reader keeps exactly. This state can be viewed and exported, "
                    "not stepped on")

    def _apply(self, op: Op, progress: Progress | None) -> OpResult:
        before = len(self.manager.events)
        self.manager.step = self.step + 1
        self.scheduler.outcome = Outcome()
        self.timeline.begin(self.scheduler, self.runner.prefill_tokens)
        try:
            match op:
                case Add():
                    operations.add(self, op)
                case Grow():
                    stopped_at = operations.grow(self, op, progress)
                    if stopped_at is not None:
                        op = Grow(op.request, stopped_at)
                case Fork():
                    operations.fork(self, op)
                case Finish():
                    operations.finish(self, op)
                case Step():
                    for done in range(1, op.count + 1):
                        self.timeline.iteration_started()
                        self._iteration()
                        self._record_row()
                        if progress is not None and not progress(done, op.count) \
                                and done < op.count:
                            op = Step(done)
                            break
                case Shuffle():
                    operations.shuffle(self, op)
                case _:
                    raise PagedLabError(f"unknown operation {op!r}")
            if not isinstance(op, Step):
                self._record_row()
        except PagedLabError:
            # Validation happens before any change, so nothing needs undoing.
            assert len(self.manager.events) == before, "a refused operation changed state"
            self.manager.step = self.step
            self.timeline.end(counted=False)
            raise
        self.timeline.end()
        # An added request that did not start says why (asked before the step counts it,
        # as the next iteration will ask).
        queued = operations.first_id(op) if isinstance(op, Add) else None
        waits = ((queued, self.scheduler.why_waiting(queued)),) if (
            queued is not None and queued in self.waiting) else ()
        self.step += 1
        o = self.scheduler.outcome
        return OpResult(self.step, op, tuple(self.manager.events[before:]), tuple(o.admitted),
                        tuple(o.preempted), tuple(o.finished), tuple(o.generated),
                        tuple(o.prefilled), tuple(o.host_released), tuple(o.swapped_in),
                        waits)

    def _record_row(self) -> None:
        """Mutates the timeline: a row for what ran since the last one in this operation."""
        self.timeline.record_state(self.step + 1, self.scheduler, self.runner.prefill_tokens)

    # ---- running what the scheduler decided (operations.py calls these too) ----

    def prefill(self, work: list[Chunk]) -> None:
        """Run prefill chunks, then fork the parallel samples of prompts now complete."""
        self.runner.prefill(work, self.manager)
        self.scheduler.outcome.prefilled += [Prefill(req.id, end - start, req.num_computed,
                                                     req.num_tokens)
                                             for req, start, end in work if end > start]
        for req, _, _ in work:
            if req.pending_samples and req.status == "running" and not req.prefilling:
                operations.spawn_samples(self, req)

    def _iteration(self) -> None:
        """One step of continuous batching: the scheduler's plan (prefill chunks within
        its budgets), then one batched decode of the requests it lets decode."""
        plan = self.scheduler.plan()
        self.prefill(plan.prefills)
        batch: list[tuple[Request, int]] = []
        for unit in self.scheduler.decoders(plan):
            if unit[0].beam_width is not None:
                # A beam group's round: its beams' tokens are chosen together.
                batch += [(beam, self.take_next_token(beam, token))
                          for beam, token in beams.run_round(self, unit)]
            elif self.scheduler.make_room(unit[0]):
                batch.append((unit[0], self.take_next_token(unit[0])))
        if batch:
            self.decode(batch)
            self.scheduler.finish_if_done([r.id for r, _ in batch])

    def take_next_token(self, req: Request, token: int | None = None) -> int:
        """Sample from the pending logits (or take `token`, a beam search's choice) and
        give the token a slot (may copy-on-write)."""
        if token is None:
            assert req.logits is not None
            token = next_token(req.logits, self.config, self.model, req.id, req.num_tokens)
        slot, cow = self.manager.append_one(req.id, token)
        if cow is not None:
            self.runner.copy_blocks([cow.src], [cow.dst])
        req.tokens.append(token)
        req.stopped = token == self.model.eos_token_id
        self.scheduler.outcome.generated.append((req.id, token))
        self.timeline.generated(req.id)
        return slot

    def decode(self, work: list[tuple[Request, int]]) -> None:
        """One batched forward of each request's newest token, written at its slot."""
        self.runner.decode(work, self.manager)
