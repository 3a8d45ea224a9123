"""The scheduler: which requests run, in what order, and who makes room.

It owns the waiting queue and the running list and decides, never computes:
admission (first come, first served, while prompts fit), the preemption
victim (the most recently admitted request), and what can never fit. Its
decisions change block tables through the block manager (allocate on
admission, free on finish and preemption); the engine then runs what was
decided: prefill forwards, sampling, K/V writes, copy-on-write copies.

    waiting ──admit──▶ running ──finish──▶ finished
       ▲                  │
       └────preempt───────┘   (blocks released; recomputed when readmitted)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from backend.core.config import EngineConfig
from backend.engine.request import FinishReason, Request
from backend.engine.results import Outcome
from backend.paging.block_manager import BlockManager


class Scheduler:
    """Queues and policies over one block manager. Not thread-safe."""

    def __init__(self, config: EngineConfig, manager: BlockManager,
                 requests: dict[str, Request]) -> None:
        self.config = config
        self.manager = manager
        self.requests = requests
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        self.admissions = 0
        self.outcome = Outcome()

    # ---- decisions ---------------------------------------------------------

    def never_admissible(self, num_tokens: int) -> bool:
        """Whether the tokens plus a first generated one exceed even an empty pool."""
        return self.manager.blocks_for(num_tokens + 1) > self.config.num_blocks

    def admit(self) -> list[tuple[Request, int]]:
        """Mutates: admit waiting requests in order while they fit.

        Returns the admitted requests with how many leading tokens the prefix
        cache supplied; the engine prefills the rest in one batch.

        A request fits when its prompt's new blocks, plus a block for its own
        first decoded token if the prompt ends on a block boundary, come out of
        the free blocks left after reserving what the running requests' next
        tokens need. Admitting into those reserved blocks would only force the
        decode that follows to preempt the newcomer again.
        """
        bs = self.config.block_size
        reserve = sum(self.manager.blocks_needed_to_append(rid, 1) for rid in self.running)
        admitted: list[tuple[Request, int]] = []
        while self.waiting:
            req = self.requests[self.waiting[0]]
            if self.never_admissible(req.num_tokens):
                # A preempted request that grew to fill the whole pool.
                self.finish(req, "capacity")
                continue
            plan = self.manager.plan_prompt(req.tokens)
            own = 1 if req.num_tokens % bs == 0 else 0
            if plan.num_new_blocks + own > plan.num_available - reserve:
                break
            self.waiting.popleft()
            admitted.append((req, self.allocate(req, None)))
            reserve += own
        return admitted

    def decode_order(self) -> Iterator[Request]:
        """The running requests in admission order, skipping any preempted on the way."""
        for rid in list(self.running):
            req = self.requests[rid]
            if req.status == "running":
                yield req

    def make_room(self, req: Request) -> bool:
        """Mutates: free what `req`'s next token needs; False if `req` cannot decode now.

        A request that even an empty pool could not hold one more token for
        finishes ("capacity"). Otherwise the most recently admitted requests are
        preempted until a block is free, which may be `req` itself.
        """
        if self.manager.blocks_for(req.num_tokens + 1) > self.config.num_blocks:
            self.finish(req, "capacity")
            return False
        while self.manager.blocks_needed_to_append(req.id, 1) > self.manager.num_free_blocks:
            victim = self.requests[self.running[-1]]
            self.preempt(victim)
            if victim is req:
                break
        return req.status == "running"

    # ---- transitions -------------------------------------------------------

    def allocate(self, req: Request, pinned: list[int] | None) -> int:
        """Mutates: give a request its blocks and run it; returns the cached token count."""
        alloc = self.manager.allocate(req.id, req.tokens, pinned=pinned)
        req.status = "running"
        req.admitted = self.next_admission()
        self.running.append(req.id)
        self.outcome.admitted.append(req.id)
        return alloc.num_cached_tokens

    def finish_if_done(self, ids: list[str]) -> None:
        """Mutates: finish each running request that sampled end-of-sequence or hit its limit."""
        for rid in ids:
            req = self.requests[rid]
            if req.status == "running" and req.stopped:
                self.finish(req, "eos")
            elif req.status == "running" and req.reached_limit:
                self.finish(req, "max_new_tokens")

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Mutates: release a waiting or running request's blocks and retire it."""
        if req.status == "running":
            self.manager.free(req.id)
            self.running.remove(req.id)
        elif req.status == "waiting":
            self.waiting.remove(req.id)
        req.status = "finished"
        req.finish_reason = reason
        req.logits = None
        req.admitted = None
        self.outcome.finished.append(req.id)

    def preempt(self, req: Request) -> None:
        """Mutates: release a running request's blocks; it waits to be recomputed."""
        self.manager.free(req.id, preempted=True)
        self.running.remove(req.id)
        req.status = "waiting"
        req.logits = None
        req.admitted = None
        req.num_preemptions += 1
        # Back to the front of the queue: it was admitted before anything waiting.
        self.waiting.appendleft(req.id)
        self.outcome.preempted.append(req.id)

    def next_admission(self) -> int:
        self.admissions += 1
        return self.admissions
