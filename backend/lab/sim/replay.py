"""The continuous-batching replay loop shared by every allocation policy.

The model (what one iteration means)
------------------------------------
Iteration k runs at time k * iteration_s; a fixed time per iteration, so time
averages and iteration averages are the same thing. In iteration k, running
requests go first and waiting ones after (vLLM's order):

1. Decodes. Every decoding request gains one token. A policy that allocates
   as requests grow (paged) may need room for it; requests are served oldest
   admission first, and when no room is left the most recently admitted
   running request is preempted: its memory is freed and it goes back to the
   FRONT of the waiting queue, to be recomputed (all its tokens so far are
   processed again as a prompt when it is re-admitted).
2. Prefills in progress (only with a token budget): requests admitted earlier
   whose prompt did not fit in one iteration's tokens take their next chunk.
3. Admission. Requests that have arrived (arrival time <= k * iteration_s)
   are admitted first come, first served while the policy has room for them
   and the budgets allow (backend.core.budgets); the head of the queue
   blocks the ones behind it, and nothing is admitted in an iteration that
   preempted (vLLM's rule; here the victim heads the queue and could not fit
   anyway). An admitted request's memory is taken for its whole prompt plus
   its first token (vLLM v0 allocates a prompt's blocks at admission). Its
   prompt is processed in this iteration, or, with a token budget, in chunks
   over several; the iteration of its last chunk also produces its first
   output token: it then holds prompt + 1 tokens.
4. Memory is sampled (the state the iteration's attention reads).
5. Requests that reached their final length (prompt + output) finish and free
   their memory at the end of the iteration.

Without budgets a request with output length O therefore runs for O
iterations if never preempted, holding prompt + 1, ..., prompt + O tokens.

Why it is fast
--------------
Between events nothing changes but every decoding request's length, which
grows by one per iteration. So the loop jumps from event to event: a finish,
an admission chance (after memory was released, or an arrival into an empty
queue), every iteration while a prompt is being prefilled in chunks and, for
policies with a `growth_period` B, the iteration in which a request's count
crosses a block boundary (count = 1 mod B). A decoding request's count is
kept in closed form, tokens = n + (k - a) (n tokens after iteration a), and
the sum over the decoding batch is C + b * k with C = sum(n - a); per-iteration
sums over a quiet span are arithmetic series. The time-averaged memory is
therefore exact, and the cost is O(events log batch): O(requests) for the
contiguous policies and O(tokens / B) policy calls for paged.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backend.core.budgets import IterationBudget, SchedulerBudgets
from backend.lab.sim.timeline import TimelineRecorder

Progress = Callable[[int, int], None]
NO_BUDGETS = SchedulerBudgets()


class MemoryPolicy(Protocol):
    """Where a policy keeps running requests' KV. Requests are trace indices.

    The loop reads four O(1) figures after each event: `allocated` (slots
    held: whole blocks, or whole reservations), `committed` (slots that hold
    tokens or will, for policies that reserve ahead; unused otherwise),
    `reserves_ahead`, and `external_slots(...)`.
    """

    capacity: int
    growth_period: int | None
    reserves_ahead: bool

    @property
    def allocated(self) -> int: ...

    @property
    def committed(self) -> int: ...

    def prepare(self, final_len: np.ndarray) -> None:
        """Raise PagedLabError if some request could never run alone."""

    def try_admit(self, i: int, tokens: int, final_len: int) -> bool:
        """Mutates when it returns True: request i now holds `tokens` tokens."""

    def grow(self, i: int, tokens: int) -> bool:
        """Mutates when it returns True: request i, now at a block boundary, holds `tokens`."""

    def release(self, i: int, *, preempted: bool) -> None:
        """Mutates: free request i's memory."""

    def external_slots(self, head_final_len: int | None) -> int:
        """Free slots that cannot serve the waiting head (None: nobody waits)."""

    def block_counts(self) -> tuple[int, int, int] | None:
        """(used, cached, free) blocks now; None for a policy without blocks."""


@dataclass(slots=True)
class ReplayTotals:
    """Sums over busy iterations (iterations with at least one running request)."""

    busy_iterations: int = 0
    batch_sum: int = 0
    max_batch: int = 0
    preemptions: int = 0
    # Tokens whose K/V a preemption discarded and readmission computes again: for a
    # decoding victim all it held (prompt and generated), for one still prefilling the
    # chunks it had computed.
    recomputed_tokens: int = 0
    token_sum: int = 0       # token-iterations
    allocated_sum: int = 0   # slot-iterations held by the policy
    committed_sum: int = 0   # slot-iterations of token + reservation (reserves_ahead only)
    external_sum: int = 0
    # Slot-iterations held for prompt chunks not yet computed (token budgets only).
    pending_prefill_sum: int = 0
    max_batched_tokens: int = 0   # the most tokens one iteration processed
    # Busy iterations that ended with requests waiting for memory: the next in line did
    # not fit in what was free, or the iteration preempted (not a budget's doing).
    memory_wait_iterations: int = 0
    finish_iteration: np.ndarray | None = None
    preemptions_per_request: np.ndarray | None = None
    # Per preemption: iterations between the victim's (re-)admission and its preemption.
    victim_ages: list[int] = field(default_factory=list)


def replay(arrival_iteration: np.ndarray, prompt_len: np.ndarray, final_len: np.ndarray,
           policy: MemoryPolicy, progress: Progress | None = None, *,
           budgets: SchedulerBudgets = NO_BUDGETS,
           timeline: TimelineRecorder | None = None) -> ReplayTotals:
    """Mutates `policy` (and `timeline`): replay the requests (in arrival order) to the end.

    `arrival_iteration[i]` is the first iteration request i may be admitted
    in (non-decreasing). Calls `progress(finished, total)` about every 1%.
    The policy applies the watermark; `budgets` limits sequences and tokens.
    """
    n = len(final_len)
    arr = arrival_iteration.tolist()
    final = final_len.tolist()
    prefill = prompt_len.tolist()   # tokens to process on (re)admission
    policy.prepare(final_len)
    period = policy.growth_period
    tot = ReplayTotals()
    finish_it = [0] * n
    preempted_count = [0] * n
    n_sync = [0] * n          # tokens after iteration a_sync (decoding requests)
    a_sync = [0] * n
    order = [0] * n           # admission sequence number (oldest first)
    admit_it = [0] * n        # iteration of the latest admission
    epoch = [0] * n           # invalidates heap entries of preempted requests
    running: dict[int, None] = {}   # insertion order = admission order
    prefilling: dict[int, int] = {}  # running requests still prefilling: tokens computed
    waiting: deque[int] = deque()
    heap: list[tuple[int, int, int, int]] = []
    c_sum = 0                 # sum of n_sync - a_sync over decoding requests
    admitted = 0
    nxt = 0                   # next request to arrive
    finished = 0
    retry_at = -1             # admission chance after a release
    last = -1                 # last iteration accounted
    step = max(1, n // 100)
    next_report = step
    never = 1 << 62
    finishing: list[int] = []
    # Whether the requests waiting now wait for memory: set at each admission attempt,
    # and true until the next (a quiet span only grows what is held).
    for_memory = False

    def schedule(i: int, k: int, count: int) -> None:
        # The next iteration request i needs attention: its finish, or its
        # next block boundary (count = 1 mod period), whichever comes first.
        f = k + final[i] - count
        if period is not None:
            d = (1 - count) % period or period
            f = min(f, k + d)
        heapq.heappush(heap, (f, order[i], i, epoch[i]))

    def start_decoding(i: int, k: int) -> None:
        # Its prompt is computed and its first token sampled in iteration k.
        nonlocal c_sum
        count = prefill[i] + 1
        n_sync[i] = count
        a_sync[i] = k
        c_sum += count - k
        if count == final[i]:
            finishing.append(i)
        else:
            schedule(i, k, count)

    while finished < n:
        k = heap[0][0] if heap else never
        if prefilling:
            k = min(k, last + 1)   # a prompt in chunks advances every iteration
        if 0 <= retry_at < k:
            k = retry_at
        if not waiting and nxt < n and arr[nxt] < k:
            k = arr[nxt]
        assert k != never, "replay stalled: requests wait but none can ever be admitted"

        # A quiet span last+1 .. k-1: only the decoding requests' lengths change.
        b = len(running)
        m = k - last - 1
        if b and m > 0:
            lo = last + 1
            tot.token_sum += m * c_sum + b * (lo + k - 1) * m // 2
            tot.allocated_sum += m * policy.allocated
            tot.committed_sum += m * policy.committed
            tot.external_sum += m * policy.external_slots(final[waiting[0]] if waiting else None)
            tot.busy_iterations += m
            tot.batch_sum += m * b
            if waiting and for_memory:
                tot.memory_wait_iterations += m

        while nxt < n and arr[nxt] <= k:
            waiting.append(nxt)
            nxt += 1

        finishing = []
        preempted = 0
        while heap and heap[0][0] == k:
            _, _, i, ep = heapq.heappop(heap)
            if ep != epoch[i]:
                continue
            count = n_sync[i] + k - a_sync[i]
            if period is not None and (count - 1) % period == 0:
                while not policy.grow(i, count):
                    victim = next(reversed(running))
                    del running[victim]
                    if victim in prefilling:
                        # Its chunks so far are lost (computed again on readmission);
                        # it holds its prompt's memory.
                        tot.recomputed_tokens += prefilling.pop(victim)
                    else:
                        # The victim does not grow in this iteration. Every token it
                        # holds, prompt and generated, is prefilled again on readmission.
                        prefill[victim] = n_sync[victim] + (k - 1) - a_sync[victim]
                        tot.recomputed_tokens += prefill[victim]
                        c_sum -= n_sync[victim] - a_sync[victim]
                    policy.release(victim, preempted=True)
                    epoch[victim] += 1
                    waiting.appendleft(victim)
                    preempted += 1
                    preempted_count[victim] += 1
                    tot.victim_ages.append(k - admit_it[victim])
                    if victim == i:
                        break
                if i not in running:
                    continue
            if count == final[i]:
                finishing.append(i)
            else:
                schedule(i, k, count)
        tot.preemptions += preempted

        budget = IterationBudget(budgets, len(running))
        budget.decode(len(running) - len(prefilling))
        for i, done in list(prefilling.items()):
            chunk = budget.prefill_chunk(prefill[i] - done)
            if done + chunk == prefill[i]:
                del prefilling[i]
                start_decoding(i, k)
            else:
                prefilling[i] = done + chunk

        admitted_before = admitted
        for_memory = bool(preempted)
        while waiting and not preempted and budget.may_start():
            i = waiting[0]
            if not policy.try_admit(i, prefill[i] + 1, final[i]):
                for_memory = True
                break
            waiting.popleft()
            running[i] = None
            budget.admitted()
            admitted += 1
            order[i] = admitted
            admit_it[i] = k
            chunk = budget.prefill_chunk(prefill[i])
            if chunk == prefill[i]:
                start_decoding(i, k)
            else:
                prefilling[i] = chunk

        b = len(running)
        if b:
            tokens = c_sum + (b - len(prefilling)) * k
            if prefilling:
                computed = sum(prefilling.values())
                tokens += computed
                tot.pending_prefill_sum += sum(prefill[i] + 1 for i in prefilling) - computed
            tot.token_sum += tokens
            tot.allocated_sum += policy.allocated
            tot.committed_sum += policy.committed
            tot.external_sum += policy.external_slots(final[waiting[0]] if waiting else None)
            tot.busy_iterations += 1
            tot.batch_sum += b
            if waiting and for_memory:
                tot.memory_wait_iterations += 1
            tot.max_batch = max(tot.max_batch, b)
            tot.max_batched_tokens = max(tot.max_batched_tokens,
                                         budget.decode_tokens + budget.prefill_tokens)
            if timeline is not None:
                timeline.during(k, b, len(prefilling), len(waiting), admitted - admitted_before,
                                budget.prefill_tokens, budget.decode_tokens, preempted, tokens,
                                policy.allocated, policy.block_counts())

        for i in finishing:
            del running[i]
            policy.release(i, preempted=False)
            c_sum -= n_sync[i] - a_sync[i]
            finish_it[i] = k
        finished += len(finishing)
        if timeline is not None and b:
            timeline.after(len(running), len(waiting), nxt, c_sum, policy.allocated,
                           policy.block_counts(), len(finishing))
        # Admission may change after a release, or after an iteration whose prompt
        # chunks used tokens that the next iteration's decodes leave free.
        retry = finishing or preempted or (budget.prefill_tokens and not budget.may_start())
        retry_at = k + 1 if retry and waiting else -1
        last = k
        if progress is not None and finished >= next_report:
            progress(finished, n)
            next_report = (finished // step + 1) * step

    tot.finish_iteration = np.asarray(finish_it, dtype=np.int64)
    tot.preemptions_per_request = np.asarray(preempted_count, dtype=np.int64)
    return tot
