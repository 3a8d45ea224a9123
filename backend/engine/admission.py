"""Who comes in: admission of waiting requests and the return of swapped ones.

`Admission` is the part of the Scheduler (backend/engine/scheduler.py) that
decides whether the head of a queue fits now: first come, first served; a
beam group comes in whole or waits; a request's prompt blocks, its own first
token's block and one per sequence still to fork must come out of the free
blocks left after what the running requests still need (their forks included),
with `watermark_blocks` kept free; a unit that even an empty pool could not take
is ended ("capacity"), waiting or swapped, so that the queue behind it goes on.
It owns no state: the queues, the allocator and the transitions (allocate,
finish) are the Scheduler's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

from backend.core.budgets import IterationBudget, fits_with_watermark
from backend.core.config import EngineConfig
from backend.core.words import agrees, counted
from backend.engine.beams import group_members, keep_count
from backend.engine.request import FinishReason, Request
from backend.engine.results import Outcome
from backend.engine.swap import HostPool
from backend.paging.block_manager import BlockManager
from backend.paging.block_types import PromptPlan
from backend.paging.events import SWAP_IN

# A prefill chunk: the request, and the token range [start, stop) to compute now.
Chunk = tuple[Request, int, int]


def seqs_taken(seqs: int) -> str:
    """The running requests' sequence slots said where forks to come are among them (a
    wait or a refusal under max_num_seqs): "1 request is running" under a limit of 4
    read as a contradiction."""
    return f"the {seqs:,} sequences of the running requests (their forks to come included)"


def shared_prefixes(tables: Sequence[Sequence[int]]) -> list[int]:
    """For each host table of a swapped beam group, in the order its beams come back,
    how many of its leading host blocks an earlier beam's table holds: swap-in brings
    those back once and the later beam shares the device blocks (sharing is a
    prefix of each table, as the device tables were)."""
    seen: set[int] = set()
    out = []
    for table in tables:
        k = 0
        while k < len(table) and table[k] in seen:
            k += 1
        out.append(k)
        seen.update(table)
    return out


class KVMover(Protocol):
    """Copies K/V between the device pool and the host pool (the engine does it)."""

    def swap_out(self, device_blocks: Sequence[int], host_blocks: Sequence[int]) -> None: ...

    def swap_in(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None: ...


class Admission(ABC):
    """Admission and swap-in, the Scheduler's base (which sets these attributes)."""

    config: EngineConfig
    manager: BlockManager
    requests: dict[str, Request]
    host: HostPool | None
    mover: KVMover | None
    waiting: deque[str]
    running: list[str]
    swapped: deque[str]
    outcome: Outcome

    # The Scheduler's transitions that admission calls.
    @abstractmethod
    def allocate(self, req: Request, pinned: list[int] | None,
                 stop: int | None = None) -> int: ...

    @abstractmethod
    def finish(self, req: Request, reason: FinishReason) -> None: ...

    # The Scheduler's spending of an iteration's budget, which `why_waiting` repeats on a
    # budget of its own.
    @abstractmethod
    def _decodes_first(self, budget: IterationBudget) -> list[str]: ...

    @abstractmethod
    def _prefill_chunks(self, budget: IterationBudget,
                        decoding: list[str]) -> Iterator[tuple[Request, int]]: ...

    @abstractmethod
    def next_admission(self) -> int: ...

    @abstractmethod
    def units(self, reqs: Iterator[Request]) -> Iterator[list[Request]]: ...

    @abstractmethod
    def _record_swap(self, code: int, rid: str, src: Sequence[int],
                     dst: Sequence[int]) -> None: ...

    def never_admissible(self, num_tokens: int, *, watermark: bool = True) -> bool:
        """Whether the tokens plus a first generated one exceed even an empty pool, with
        the watermark kept free if `watermark` (vLLM v0's AllocStatus.NEVER): admission
        could never take them, and first come, first served, nothing behind them either."""
        return self._never_fit(self.manager.blocks_for(num_tokens + 1), watermark=watermark)

    def _unit_never_fits(self, unit: Sequence[Request], *, swapped: bool = False) -> bool:
        """Whether a queued unit could not come in even were the pool empty of requests
        (its cached blocks kept), with the watermark kept free: admission and swap-in,
        which wait for that much, never take it, and first come, first served, nothing
        behind it would start either.

        At most its tokens, each with its next one, the sequences it will fork and its
        next round's forks (whose first tokens each take a block). Past that, a beam
        group is counted as admission counts it (`_unit_need`), its prefix in the cache
        shared: counted beam by beam, a group that had run in the pool was ended as
        never fitting it. A prefix evicted since is counted again at the next check."""
        blocks = self.manager.blocks_for
        if not self._never_fit(sum(blocks(r.num_tokens + 1) + r.forks_to_come for r in unit)
                               + self._round_forks(unit)):
            return False
        if len(unit) == 1 or any(blocks(r.num_tokens) > self.config.num_blocks for r in unit):
            return True
        plans, own, shared = self._unit_plans(unit, swapped=swapped)
        _, need = self._unit_need(plans, own, shared)
        # On a pool empty of requests, the first beam's hits take blocks too.
        return self._never_fit(need + len(plans[0].hit_blocks))

    def _unit_plans(self, unit: Sequence[Request], *,
                    swapped: bool) -> tuple[list[PromptPlan], int, list[int]]:
        """A queued unit's prompt plans, the blocks it needs beyond them, and each
        request's leading blocks that an earlier beam of it brings back (`shared_prefixes`;
        none at admission), as admission (the whole tokens) or swap-in (the computed ones,
        each with its token) counts them.

        A beam whose partial last block comes back shared with an earlier beam copies it
        at its next token (copy-on-write): a block more."""
        if not swapped:
            return ([self.manager.plan_prompt(r.tokens, cache_salt=r.cache_salt) for r in unit],
                    self._own_blocks(unit), [0] * len(unit))
        assert self.host is not None
        bs = self.config.block_size
        plans = [self.manager.plan_prompt(r.tokens[:r.num_computed], cache_salt=r.cache_salt)
                 for r in unit]
        tables = [self.host.tables[r.id] for r in unit]
        shared = shared_prefixes(tables)
        own = sum((1 if r.num_computed % bs == 0 and not r.prefilling
                   else int(k == len(t))) + r.forks_to_come
                  for r, t, k in zip(unit, tables, shared, strict=True)) + self._round_forks(unit)
        return plans, own, shared

    def _never_fit(self, blocks: int, *, watermark: bool = True) -> bool:
        """Whether `blocks` (with the watermark, if `watermark`) exceed even an empty pool."""
        keep = (self.config.watermark_blocks or 0) if watermark else 0
        return blocks + keep > self.config.num_blocks

    def _reserve(self) -> int:
        """Free blocks the running requests still need: the rest of a prefill, the next
        token's block, a block per sample still to fork and per fork of a beam group's
        next round, as admission counts them for a unit it lets in. Admission and
        swap-in leave them: a request let into them was preempted again by the decode
        that followed, its prefill (or its swap traffic) thrown away."""
        need = self.manager.blocks_needed_to_append
        return sum(need(r.id, r.uncomputed + 1) + r.forks_to_come
                   for r in self._running()) + self._running_round_forks()

    def running_seqs(self) -> int:
        """The sequences the running requests take under max_num_seqs: one each, one per
        sample still to fork, one per fork of a beam group's next round (counted so at
        admission: a request let in beside them ran one sequence over the limit)."""
        return sum(1 + r.forks_to_come for r in self._running()) + self._running_round_forks()

    def _running(self) -> Iterator[Request]:
        return (self.requests[rid] for rid in self.running)

    def _running_round_forks(self) -> int:
        """The forks the running beam groups' next rounds make at least (`_round_forks`;
        0 for a request alone)."""
        return sum(self._round_forks(unit) for unit in self.units(self._running()))

    def swap_in(self, budget: IterationBudget) -> None:
        """Mutates: bring swapped requests back, in order, while their blocks fit.

        A request gets device blocks for its computed tokens (leading blocks
        still in the prefix cache are hits and need no copy), its host copies
        go into the new ones, and its host blocks are freed. It resumes with
        the logits it had, so it decodes in this iteration if the budget lets it.
        A beam group comes back whole or waits; a unit that an empty pool could not
        take back is ended ("capacity").
        """
        if not self.swapped:
            return
        assert self.host is not None and self.mover is not None
        reserve = self._reserve()
        while self.swapped and budget.may_start():
            unit = self._queued_unit(self.swapped)
            if self._unit_never_fits(unit, swapped=True):
                # Its blocks with its next token's, its next round's forks and the
                # watermark are more than the pool (it was swapped out of a pool full to
                # its last slot): it could never come back, and the swapped come back
                # before anything else.
                for req in unit:
                    self.finish(req, "capacity")
                continue
            seqs = sum(1 + r.forks_to_come for r in unit)
            if not budget.may_start(seqs):
                break
            plans, own, shared = self._unit_plans(unit, swapped=True)
            if not self._fits_all(plans, own, reserve, shared):
                break
            # Host block -> the device block it came back to: a later beam's leading host
            # blocks that an earlier one brought back are shared, not copied again.
            back: dict[int, int] = {}
            for req, k in zip(unit, shared, strict=True):
                self.swapped.popleft()
                host = self.host.tables[req.id]
                alloc = self.manager.allocate(req.id, req.tokens[:req.num_computed],
                                              cache_salt=req.cache_salt,
                                              shared=[back[h] for h in host[:k]])
                first = k + len(alloc.hit_blocks)
                src, dst = host[first:], list(alloc.block_table[first:])
                self.mover.swap_in(src, dst)
                self._record_swap(SWAP_IN, req.id, src, dst)
                for h, d in zip(host, alloc.block_table, strict=True):
                    back.setdefault(h, d)
                self.host.release(req.id)
                self.host.swap_ins += 1
                req.status = "running"
                req.admitted = self.next_admission()
                self.running.append(req.id)
                self.outcome.admitted.append(req.id)
                self.outcome.swapped_in.append(req.id)
            budget.admitted(seqs)
            reserve += own

    def admit(self, budget: IterationBudget | None = None) -> list[Chunk]:
        """Mutates: admit waiting requests in order while they fit.

        Returns each admitted request's first prefill chunk: from the tokens
        the prefix cache supplied to the end of the prompt, or as far as
        `budget`'s tokens go (a fresh iteration's budget if None, as when an
        `add` admits at once).

        A request fits when its prompt's new blocks, plus a block for its own
        first decoded token if the prompt ends on a block boundary (and one per
        parallel sample still to fork), come out of the free blocks left after
        reserving what the running requests still need (their next token, the
        rest of a prefill), with `watermark_blocks` still free. Admitting into
        those reserved blocks would only force the decode that follows to
        preempt the newcomer again. A prompt's blocks are taken only as far as
        its first chunk: a full block enters the prefix cache in the iteration
        that computes it, so no request can hit a block whose K/V is not there.
        """
        if budget is None:
            budget = IterationBudget(self.config.budgets, self.running_seqs())
        bs = self.config.block_size
        reserve = self._reserve()
        admitted: list[Chunk] = []
        # First come, first served: nothing new starts while a swapped request waits.
        while self.waiting and not self.swapped and budget.may_start():
            unit = self._queued_unit(self.waiting)
            if self._unit_never_fits(unit):
                # A preempted request that grew to fill the whole pool, or all of it but
                # the watermark (or a beam group that, recomputed beam by beam, no longer
                # fits in it): waiting, it would hold up every request behind it.
                for req in unit:
                    self.finish(req, "capacity")
                continue
            # n parallel samples, or a beam group's W beams, run as n (W) sequences
            # (vLLM counts them so too); each beam takes at least one token now.
            seqs = sum(1 + r.forks_to_come for r in unit)
            left = budget.tokens_left
            if not budget.may_start(seqs) or (left is not None and left < len(unit)):
                break
            plans, own, _ = self._unit_plans(unit, swapped=False)
            if not self._fits_all(plans, own, reserve):
                break
            for i, req in enumerate(unit):
                self.waiting.popleft()
                # A beam's allocation can revive or evict blocks the next beam's plan
                # counted on: plan each again right before it takes its blocks (the fit
                # test above held for any outcome).
                plan = plans[0] if i == 0 else self.manager.plan_prompt(
                    req.tokens, cache_salt=req.cache_salt)
                cached = len(plan.hit_blocks) * bs
                # Leave a token of the budget for each beam after this one: a chunk of 0
                # would allocate only its cached prefix, whose last block the allocator
                # then computes again rather than hit.
                want = req.num_tokens - cached
                left = budget.tokens_left
                if left is not None:
                    want = min(want, left - (len(unit) - 1 - i))
                stop = cached + budget.prefill_chunk(want)
                # The first chunk's tokens only: the prefix floor keeps the same hits.
                start = self.allocate(req, None, stop)
                assert start == cached
                admitted.append((req, start, stop))
            budget.admitted(seqs)
            reserve += own
        return admitted

    def why_waiting(self, rid: str) -> str:
        """Why waiting request `rid` has not started (or, preempted, started again):
        the first of admission's rules that holds it back at the next iteration, with
        the advice that would let it in. Reads only (its plans allocate nothing).

        The rules in `plan`'s and `admit`'s order: swapped requests come back first;
        first come, first served (the queue's head, a beam group whole); a head that
        could never fit is ended; max_num_seqs; the token budget, spent first on the
        running requests' decodes and prefill chunks (a beam group needs a token per
        beam); the pool's free blocks beyond what the running requests still need, with
        the watermark kept free.
        """
        if self.swapped:
            n = len(self.swapped)
            back = self._queued_unit(self.swapped)
            if self._unit_never_fits(back, swapped=True):
                # The next step ends it and goes on to the waiting requests.
                return (f"{counted(len(back), 'swapped-out request')} ahead of it can never "
                        "come back into the pool (with its watermark): the next step ends "
                        f"{agrees(len(back), 'it', 'them')} (finish reason capacity)")
            return (f"{counted(n, 'swapped-out request')} {agrees(n, 'comes', 'come')} back "
                    "first; step the batch")
        unit = self._queued_unit(self.waiting)
        head = self.waiting[0]
        never = self._unit_never_fits(unit)
        if rid not in {r.id for r in unit}:
            ahead = list(self.waiting).index(rid)
            first = (f"{head!r}, which can never fit the pool, ends at the next step"
                     if never else f"{head!r} starts first")
            return (f"it is queued behind {counted(ahead, 'request')}, first come, first "
                    f"served ({first}); step the batch")
        if never:
            return ("it can never fit the pool (with its watermark): the next step ends it "
                    "(finish reason capacity)")
        budgets = self.config.budgets
        running, requests = self.running_seqs(), len(self.running)
        seqs = sum(1 + r.forks_to_come for r in unit)
        if budgets.max_num_seqs is not None and running + seqs > budgets.max_num_seqs:
            over = running + seqs - budgets.max_num_seqs
            # A sample or beam still to fork takes its slot from admission on.
            if running == requests:
                # "and it starts N sequences" read as the running request's doing.
                held = (f"{counted(running, 'request')} {agrees(running, 'is', 'are')} "
                        "running" if seqs == 1 else f"it starts {seqs} sequences beside the "
                        f"{counted(running, 'request')} running")
            else:
                taken = seqs_taken(running)
                held = (f"{taken} take their slots" if seqs == 1 else
                        f"it starts {seqs} sequences beside {taken}")
            return (f"{held}, and max_num_seqs is {budgets.max_num_seqs}; finish "
                    f"{'one' if over == 1 else f'{over:,}'} first")
        # The budget as `plan` spends it before admission: decodes, then prefill chunks
        # (counted, not appended).
        budget = IterationBudget(budgets, running)
        chunks = list(self._prefill_chunks(budget, self._decodes_first(budget)))
        tokens = budgets.max_num_batched_tokens
        if tokens is not None:
            left, decoding = budget.tokens_left or 0, budget.decode_tokens
            if left < len(unit):
                # A beam group starts whole, a token per beam.
                needs = "" if len(unit) == 1 else f" (its {len(unit)} beams need one each)"
                advice = ("finish one first" if decoding + len(unit) > tokens else
                          "step the batch: the prompts still prefilling take it first")
                return (f"the running requests take the token budget first{needs}, and "
                        f"max_num_batched_tokens is {tokens}; {advice}")
        plans, own, _ = self._unit_plans(unit, swapped=False)
        # A later beam's prefix hits that may be lost are said as blocks it needs, not
        # as fewer free ones (`_unit_need`).
        available, need = self._unit_need(plans, own)
        # Blocks of its prompt that a running prefill computes first at the next step
        # are hits by the time it is admitted: the running request's reserve takes them.
        coming = sum(self._hits_to_come(r, len(p.hit_blocks), chunks)
                     for r, p in zip(unit, plans, strict=True))
        need -= coming
        reserve = self._reserve()
        free = max(available - reserve, 0)
        keep = self.config.watermark_blocks or 0
        if fits_with_watermark(free, need, keep):
            return "its blocks are free now: the next step starts it"
        kept = f" with the watermark's {counted(keep, 'block')} kept free" if keep else ""
        # Counted as the pool hands them out, free and cached (evictable) together, so
        # neither the Free blocks metric nor the Cached one alone is the figure said.
        room = (f"{available:,} {agrees(available, 'is', 'are')} free or cached" if not reserve
                else f"{free:,} of the {available:,} free or cached {agrees(free, 'is', 'are')} "
                     f"left once the running requests take the {reserve:,} they still need")
        # A cached block the prompt would hit is not one of its new blocks' sources: said
        # beside the Cached blocks metric, which counts it, "0 are free or cached" read
        # as a contradiction.
        own = 0 if len(plans) > 1 else sum(
            self.manager.pool.blocks[b].ref_count == 0 for b in plans[0].hit_blocks)
        if own:
            room += f" besides the {counted(own, 'cached block')} its prompt would hit"
        # Said, so that "needs 1 new block" for a prompt of many reads as counted.
        shared = (f" (and will share {counted(coming, 'block')} of its prompt that a running "
                  "prefill computes first)") if coming else ""
        return (f"the pool has no room for it yet: it needs {counted(need, 'new block')}"
                f"{shared}{kept}, and {room}; step the batch to admit it as they finish")

    def _hits_to_come(self, req: Request, hits: int, chunks: Sequence[tuple[Request, int]],
                      ) -> int:
        """How many blocks past its `hits` cached ones the prompt of waiting `req` will
        hit at its admission because a running request's prefill chunk (`chunks`, as
        `plan` takes them before admitting) fills them first with the same tokens: a
        full block enters the prefix cache in the iteration that computes it. Only
        blocks wholly before the prompt's last token are hits."""
        if not self.manager.prefix_caching:
            return 0
        bs = self.config.block_size
        tokens = req.tokens
        most = hits
        for other, take in chunks:
            if other.cache_salt != req.cache_salt:
                continue
            filled = (other.num_computed + take) // bs
            same = 0
            limit = min(len(tokens) - 1, filled * bs)
            theirs = other.tokens
            while same < limit and theirs[same] == tokens[same]:
                same += 1
            most = max(most, same // bs)
        return most - hits

    def _fits_all(self, plans: Sequence[PromptPlan], own: int, reserve: int,
                  shared: Sequence[int] | None = None) -> bool:
        """Whether the requests of a unit (a request alone, a beam group's beams), with
        `own` more blocks, fit in the free blocks beyond the `reserve` the running
        requests still need, with the watermark kept free (`_unit_need`)."""
        available, need = self._unit_need(plans, own, shared)
        return fits_with_watermark(available - reserve, need, self.config.watermark_blocks or 0)

    @staticmethod
    def _unit_need(plans: Sequence[PromptPlan], own: int,
                   shared: Sequence[int] | None = None) -> tuple[int, int]:
        """The free blocks a unit's allocations may draw on, and the most they take.

        The first plan is allocated as planned: its hits leave the free queue (they
        are not available) and its new blocks are drawn. A later beam is planned again
        right before its allocation, and the blocks the beams before it drew may have
        evicted a cached block it counted on, which it then computes as a new block:
        each of its hits the first plan does not share counts as a block it may take
        (one it revives, or one it draws instead). Hits the first plan shares are held
        by then and cost nothing. A prefix that every beam shares is so counted once;
        counted once per beam and once more as not available, it made a group that an
        empty pool holds wait for good.

        A swapped beam's leading blocks that an earlier beam brings back (`shared[i]`,
        `shared_prefixes`) are shared and cost nothing; past them, its hits count as
        above and every other block as one it draws (after the shared ones it may hit
        blocks its plan, made before the earlier beams came back, did not find).

        On a pool empty of requests, the need and the first plan's hits are what
        `_unit_never_fits` compares with the pool: a unit it does not end fits there."""
        first = set(plans[0].hit_blocks)
        need = own + plans[0].num_new_blocks
        for i, p in enumerate(plans[1:], 1):
            k = shared[i] if shared is not None else 0
            hits = p.hit_blocks
            need += sum(1 for b in hits[k:] if b not in first)
            need += p.num_blocks - max(k, len(hits))
        return plans[0].num_available, need

    def _own_blocks(self, unit: Sequence[Request]) -> int:
        """The blocks a waiting unit needs beyond its prompt's, as `admit` counts them and
        `why_waiting` says them: its own first token's block where the prompt ends on a
        boundary, one per sequence to be forked (a copy of the shared last block, or a
        new one), and its next round's forks (`_round_forks`)."""
        bs = self.config.block_size
        return (sum((1 if r.num_tokens % bs == 0 else 0) + r.forks_to_come for r in unit)
                + self._round_forks(unit))

    def _round_forks(self, unit: Sequence[Request]) -> int:
        """The forks a beam group back mid-search makes at least in its next round, a
        block each: the round keeps `keep_count` extensions over the beams alive, so
        fewer beams fork the difference. A lone beam of width 2 admitted on one block
        per beam was preempted again by its own round, step after step, its re-prefill
        (or its swap traffic) thrown away each time. 0 for anything else (a group's
        first round is its forks_to_come)."""
        head = unit[0]
        if head.beam_width is None or head.group is None or head.forks_to_come:
            return 0
        return max(0, keep_count(group_members(self.requests, head.group)) - len(unit))

    def _queued_unit(self, queue: deque[str]) -> list[Request]:
        """The requests at the head of `queue` that start together: a beam group's
        beams (queued side by side, as they were preempted), or the head alone."""
        head = self.requests[queue[0]]
        if head.beam_width is None:
            return [head]
        unit = [head]
        for rid in list(queue)[1:]:
            req = self.requests[rid]
            if req.group != head.group or req.beam_width is None:
                break
            unit.append(req)
        return unit

