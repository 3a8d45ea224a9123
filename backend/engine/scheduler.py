"""The scheduler: which requests run, in what order, and who makes room.

It owns the waiting queue and the running list and decides, never computes:
admission (first come, first served, while prompts fit; its rules are in
backend/engine/admission.py, the Scheduler's base), the preemption victim
(the most recently admitted request, or beam group), and what can never fit. Its
decisions change block tables through the block manager (allocate on
admission, free on finish and preemption); the engine then runs what was
decided: prefill forwards, sampling, K/V writes, copy-on-write copies.

    waiting ──admit──▶ running ──finish──▶ finished
       ▲                 │  ▲
       └───preempt───────┘  │          (recompute: blocks released; recomputed
                 swap out   │ swap in   when readmitted)
                    ▼       │
                    swapped ┘          (swap: K/V copied to the host pool and back)

`preemption: "swap"` (backend/engine/swap.py) sends a victim to the host pool
when its blocks fit there, and to the waiting queue otherwise. As in vLLM
v0, swapped requests come back before any waiting request is admitted, the
longest-waiting first, when their blocks fit with the watermark kept free.

With vLLM's budgets in the config (backend.core.budgets, the rules the
simulator applies too) an iteration is planned in vLLM's order: running
requests first, each decode one token, then the prompts still being
prefilled, then admissions while a sequence slot, a token and the blocks
(with `watermark_blocks` kept free) are left. A prompt longer than the
tokens left is prefilled in chunks over several iterations, and, as in vLLM
v1, a chunk takes its blocks when it is scheduled: a full block enters the
prefix cache only in the iteration that computes its K/V, so no request can
hit a block whose K/V is not there. Admission still asks for room for the
whole prompt. Without budgets the plan is exactly the unbudgeted one: every
admitted prompt is prefilled whole and every running request decodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from backend.core.budgets import IterationBudget
from backend.core.config import EngineConfig
from backend.engine.admission import Admission, Chunk, KVMover
from backend.engine.request import FinishReason, Request
from backend.engine.results import Outcome
from backend.engine.swap import HostPool
from backend.paging.block_manager import BlockManager
from backend.paging.events import SWAP_OUT


@dataclass(slots=True)
class IterationPlan:
    """What one iteration runs: prefill chunks, then decodes within `budget`.

    `reserved` holds the requests whose decode token the budget already
    counted (those with their prompt computed when the iteration began); a
    request that completes its prompt in this iteration decodes too, while
    the budget has a token left.
    """

    budget: IterationBudget
    prefills: list[Chunk] = field(default_factory=list)
    reserved: set[str] = field(default_factory=set)


class Scheduler(Admission):
    """Queues and policies over one block manager. Not thread-safe."""

    def __init__(self, config: EngineConfig, manager: BlockManager,
                 requests: dict[str, Request], host: HostPool | None = None,
                 mover: KVMover | None = None) -> None:
        self.config = config
        self.manager = manager
        self.requests = requests
        self.host = host
        self.mover = mover
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        # Swapped out to the host pool, in the order they come back.
        self.swapped: deque[str] = deque()
        self.admissions = 0
        self.outcome = Outcome()

    # ---- decisions ---------------------------------------------------------

    def plan(self) -> IterationPlan:
        """Mutates (admissions): one iteration's prefill chunks and decode budget.

        Decodes are counted first, in admission order (with a token budget
        smaller than the running batch, the newest wait), then the running
        requests' remaining prompt chunks, then admissions (`admit`).
        """
        plan = IterationPlan(IterationBudget(self.config.budgets, self.running_seqs()))
        budget = plan.budget
        plan.reserved.update(self._decodes_first(budget))
        self._continue_prefills(plan)
        while (not plan.prefills and not plan.reserved and budget.tokens_left != 0
               and len(self.running) > 1
               and len(self.running) > len(self.unit_of(self.requests[self.running[-1]]))):
            # Every running request is mid-prefill and none has room for its next
            # chunk (decodes took the blocks they were counting on): the newest
            # gives its blocks back, as a decode would have made it, so the oldest
            # can go on.
            self.preempt_unit(self.requests[self.running[-1]])
            self._continue_prefills(plan)
        self.swap_in(budget)
        plan.prefills += self.admit(budget)
        return plan

    def _decodes_first(self, budget: IterationBudget) -> list[str]:
        """Spends `budget` on the running requests' decodes, in admission order; the ids
        that decode. A beam group decodes all its beams in one iteration, or none of
        them. (`budget` only is changed: `why_waiting` spends a copy of its own.)"""
        decoding: list[str] = []
        for unit in self.units(self.requests[rid] for rid in self.running):
            left = budget.tokens_left
            if (not any(r.prefilling for r in unit)
                    and (left is None or left >= len(unit))):
                budget.decode(len(unit))
                decoding += [r.id for r in unit]
        return decoding

    def _prefill_chunks(self, budget: IterationBudget,
                        decoding: list[str]) -> Iterator[tuple[Request, int]]:
        """Spends `budget` on the next chunk of each request mid-prefill, as far as its
        tokens and the free blocks go (leaving the decodes' next blocks free): each
        request with the tokens it takes. Reads the pool as it is when each is yielded;
        appending them is the caller's."""
        spare = self.manager.num_free_blocks - sum(
            self.manager.blocks_needed_to_append(rid, 1) for rid in decoding)
        for rid in self.running:
            req = self.requests[rid]
            if req.prefilling:
                take = budget.prefill_chunk(min(req.uncomputed, self._room(rid, spare)))
                if take:
                    spare -= self.manager.blocks_needed_to_append(rid, take)
                    yield req, take

    def _continue_prefills(self, plan: IterationPlan) -> None:
        """Mutates: the next chunk of each request mid-prefill (`_prefill_chunks`)."""
        for req, take in self._prefill_chunks(plan.budget, list(plan.reserved)):
            start = req.num_computed
            self.manager.append(req.id, req.tokens[start:start + take])
            req.uncomputed -= take
            plan.prefills.append((req, start, start + take))

    def _room(self, rid: str, spare_blocks: int) -> int:
        """How many tokens `rid` could take now: its last block's free slots plus
        `spare_blocks` whole blocks."""
        if spare_blocks < 0:
            spare_blocks = 0
        bs = self.config.block_size
        tail = self.manager.num_tokens(rid) % bs
        return (bs - tail if tail else 0) + spare_blocks * bs

    def decoders(self, plan: IterationPlan) -> Iterator[list[Request]]:
        """The running requests that decode this iteration, in admission order, as units:
        one request, or every live beam of a beam group (which decode together or not
        at all).

        Those counted in `plan.reserved`, and those that completed their
        prompt in this iteration while the budget has a token for them.
        """
        for unit in self.units(self.decode_order()):
            if any(r.prefilling for r in unit):
                continue
            fresh = [r for r in unit if r.id not in plan.reserved]
            if fresh:
                left = plan.budget.tokens_left
                if left is not None and left < len(fresh):
                    continue
                plan.budget.decode(len(fresh))
            yield unit

    def decode_order(self) -> Iterator[Request]:
        """The running requests in admission order, skipping any preempted on the way."""
        for rid in list(self.running):
            req = self.requests[rid]
            if req.status == "running":
                yield req

    def units(self, reqs: Iterator[Request]) -> Iterator[list[Request]]:
        """`reqs` (running, in running order) as scheduling units: a request alone, or
        a beam group's running beams together, at the place of its first."""
        seen: set[str] = set()
        for req in reqs:
            if req.beam_width is None:
                yield [req]
            elif req.group not in seen and req.status == "running":
                assert req.group is not None
                seen.add(req.group)
                yield self.unit_of(req)

    def unit_of(self, req: Request) -> list[Request]:
        """`req` and the beams of its group in the same state, in their queue's order."""
        if req.beam_width is None:
            return [req]
        queue = {"running": self.running, "waiting": self.waiting,
                 "swapped": self.swapped}.get(req.status)
        if queue is None:
            return [req]
        return [self.requests[rid] for rid in queue
                if self.requests[rid].group == req.group
                and self.requests[rid].beam_width is not None]

    def make_room(self, req: Request) -> bool:
        """Mutates: free what `req`'s next token needs; False if `req` cannot decode now.

        A request that even an empty pool could not hold one more token for
        finishes ("capacity"). Otherwise the most recently admitted requests are
        preempted until a block is free, which may be `req` itself.
        """
        if self.manager.blocks_for(req.num_tokens + 1) > self.config.num_blocks:
            self.finish(req, "capacity")
            return False
        return self.make_room_for([req], self.manager.blocks_needed_to_append(req.id, 1))

    def make_room_for(self, unit: list[Request], need: int) -> bool:
        """Mutates: preempt the most recently admitted units until `need` blocks are
        free for `unit`; False (and `unit` preempted) if it came to `unit` itself."""
        mine = {r.id for r in unit}
        while need > self.manager.num_free_blocks:
            victim = self.requests[self.running[-1]]
            self.preempt_unit(victim)
            if victim.id in mine:
                return False
        return True

    def insert_fork(self, parent: Request, child: Request) -> None:
        """Mutates: run `child`, a beam forked from `parent`, beside its group: it joins
        the running list after the group's last beam, not at the end, so the group
        stays one unit there and is preempted when its turn as a unit comes."""
        last = max(i for i, rid in enumerate(self.running)
                   if self.requests[rid].group == parent.group)
        child.status = "running"
        child.admitted = self.next_admission()
        self.running.insert(last + 1, child.id)

    # ---- transitions -------------------------------------------------------

    def allocate(self, req: Request, pinned: list[int] | None, stop: int | None = None) -> int:
        """Mutates: give a request blocks for its first `stop` tokens (all if None) and run
        it; the rest of its prompt is prefilled later (`uncomputed`). Returns the cached
        token count."""
        tokens = req.tokens if stop is None or stop == req.num_tokens else req.tokens[:stop]
        alloc = self.manager.allocate(req.id, tokens, pinned=pinned, prompt_len=req.num_tokens,
                                      cache_salt=req.cache_salt)
        req.uncomputed = req.num_tokens - len(tokens)
        req.status = "running"
        req.admitted = self.next_admission()
        self.running.append(req.id)
        self.outcome.admitted.append(req.id)
        return alloc.num_cached_tokens

    def finish_if_done(self, ids: list[str]) -> None:
        """Mutates: finish each running request that sampled end-of-sequence, hit its
        limit, or filled its model's context (its next token would have no position)."""
        context = self.config.context_length
        for rid in ids:
            req = self.requests[rid]
            if req.status == "running" and req.stopped:
                self.finish(req, "eos")
            elif req.status == "running" and req.reached_limit:
                self.finish(req, "max_new_tokens")
            elif req.status == "running" and context is not None and req.num_tokens >= context:
                self.finish(req, "context")

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Mutates: release a waiting or running request's blocks and retire it."""
        if req.status == "running":
            self.manager.free(req.id)
            self.running.remove(req.id)
            req.uncomputed = 0
        elif req.status == "waiting":
            self.waiting.remove(req.id)
        elif req.status == "swapped":
            assert self.host is not None
            self.outcome.host_released.append((req.id, len(self.host.release(req.id))))
            self.swapped.remove(req.id)
            req.uncomputed = 0
        req.status = "finished"
        req.finish_reason = reason
        req.logits = None
        req.admitted = None
        # Samples still to fork from it never will be.
        req.pending_samples = 0
        self.outcome.finished.append(req.id)

    def preempt_unit(self, req: Request) -> None:
        """Mutates: preempt `req`, or, if it is a beam, every running beam of its group:
        all to the host pool if they fit there together (a device block the beams share
        takes one host block), else all recomputed, queued side by side in running order
        so they come back together."""
        unit = self.unit_of(req)
        if len(unit) == 1:
            self.preempt(req)
            return
        held = {b for r in unit for b in self.manager.block_table(r.id)}
        if self.host is None or len(held) > self.host.num_free:
            for member in reversed(unit):
                self.preempt(member, swap=False)
            return
        copied: dict[int, int] = {}
        for member in reversed(unit):
            self._swap_out(member, copied)

    def preempt(self, req: Request, *, swap: bool | None = None) -> None:
        """Mutates: release a running request's blocks: to the host pool if preemption is
        "swap" and they fit there (or as `swap` says), else it waits to be recomputed."""
        if swap is None:
            swap = (self.host is not None
                    and len(self.manager.block_table(req.id)) <= self.host.num_free)
        if swap:
            self._swap_out(req, {})
            return
        self.manager.free(req.id, preempted=True)
        self.running.remove(req.id)
        req.status = "waiting"
        req.logits = None
        req.admitted = None
        req.uncomputed = 0
        req.num_preemptions += 1
        # Back to the front of the queue: it was admitted before anything waiting.
        self.waiting.appendleft(req.id)
        self.outcome.preempted.append(req.id)

    def _swap_out(self, req: Request, copied: dict[int, int]) -> None:
        """Mutates: copy a running request's blocks to the host pool and release them.

        `copied`: the device blocks this swap-out of a beam group has put in the host
        pool already, and where (HostPool.take): those are shared, not copied again.
        Each block logs a `swap_out` naming its host block, shared or copied, so that a
        request's events are its host table."""
        assert self.host is not None and self.mover is not None
        table = self.manager.block_table(req.id)
        blocks = self.manager.pool.blocks
        fresh = [i for i, b in enumerate(table) if b not in copied]
        host = self.host.take(req.id, table, [blocks[b].num_filled for b in table], copied)
        # The copies read the device blocks, so they run before the blocks are released.
        self.mover.swap_out([table[i] for i in fresh], [host[i] for i in fresh])
        self._record_swap(SWAP_OUT, req.id, table, host)
        self.manager.free(req.id, preempted=True)
        self.host.swap_outs += 1
        self.running.remove(req.id)
        req.status = "swapped"
        req.admitted = None
        req.num_preemptions += 1
        # Back first among the swapped: it was admitted before any of them was.
        self.swapped.appendleft(req.id)
        self.outcome.preempted.append(req.id)

    def _record_swap(self, code: int, rid: str, src: Sequence[int], dst: Sequence[int]) -> None:
        """One event per block copied, in the allocator's log beside its frees and allocs.

        `block` is the device block: the source of a swap-out, the target of a swap-in.
        """
        m = self.manager
        if not m.record_events:
            return
        for s, d in zip(src, dst, strict=True):
            m.events.add(m.step, code, rid, s if code == SWAP_OUT else d, s, d, None)

    def next_admission(self) -> int:
        self.admissions += 1
        return self.admissions
