"""A small trace replayed one iteration at a time, recording the memory map after each.

The trace simulator (backend.lab.sim.simulator) jumps from event to event and keeps
token counts in closed form, which is what lets it replay 100k requests, but
it never holds a picture of memory. For the "memory maps over time" view we
want that picture: which slot holds what, at every iteration. So this module
replays a *small* trace with the same iteration model (backend.lab.sim.replay:
growth, then first-come-first-served admission, then the memory sample, then
finishing; preemption of the most recently admitted request when a paged
request finds no free block) but one token at a time, through a real
`ContiguousArena` (its regions grow token by token) or a real `BlockManager`
(every token appended, so each block's fill count is exact). The replay and
the simulator agree exactly on the time-averaged breakdown, the batch sizes
and the preemptions (tests check it), so the maps show what the simulator
measures.

Each busy iteration gets a frame with the slot count of each of Figure 2's
five kinds (exact, O(1) for paged memory, O(regions) for contiguous). A map
only has room for a few hundred columns, so the full picture, the runs of
slots in one state, is kept for at most `max_snapshots` iterations (and at
most MAX_SNAPSHOT_SEGMENTS runs in all), evenly spaced: every
`snapshot_every`-th iteration, a power of two that doubles (and drops every
other snapshot) whenever a budget is exceeded. For paged memory
a used block's written slots are token states and its empty slots internal
fragmentation (tail waste); free blocks, and the capacity % block_size slots
no block covers, are free.

Cost: O(iterations x regions) for contiguous memory, O(iterations x running
requests) for paged, plus the snapshots (about twice the budgets); the limits
below keep it to at most hundreds of requests and a few thousand slots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from backend.core.checks import check_int
from backend.core.errors import PagedLabError
from backend.lab.contiguous import CONTIGUOUS_POLICIES, DEFAULT_MAX_LEN, ContiguousArena
from backend.lab.contiguous_types import SEGMENT_KINDS, SegmentKind
from backend.lab.sim.paged import DEFAULT_WATERMARK
from backend.lab.sim.simulator import DEFAULT_ITERATION_S, SimConfig, make_policy
from backend.lab.workloads import Trace, make_trace
from backend.paging.block_manager import BlockManager

MAX_MAP_REQUESTS = 200
MAX_MAP_CAPACITY = 8192
MAX_MAP_ITERATIONS = 20_000
MAX_SNAPSHOTS = 256
# Segments kept over all snapshots: a pool of thousands of one-token blocks can
# hold thousands of runs per snapshot, and the map only needs a few hundred columns.
MAX_SNAPSHOT_SEGMENTS = 100_000
# Indices into SEGMENT_KINDS, for the paged map's slot arrays.
_TOKEN = SEGMENT_KINDS.index("token_states")
_INTERNAL = SEGMENT_KINDS.index("internal_fragmentation")
_FREE = SEGMENT_KINDS.index("free")


@dataclass(frozen=True, slots=True)
class MapSegment:
    """A run of `length` slots from `start` in one state; `owner` None for free slots."""

    start: int
    length: int
    kind: SegmentKind
    owner: str | None


@dataclass(frozen=True, slots=True)
class MapFrame:
    """Memory after one iteration's admissions (the state its attention reads)."""

    iteration: int
    running: int
    waiting: int
    counts: dict[str, int]            # slots per kind, summing to the capacity
    # In address order, covering every slot once; None between snapshots.
    segments: tuple[MapSegment, ...] | None


@dataclass(frozen=True, slots=True)
class MapReplay:
    """Every busy iteration's frame (iterations with at least one running request)."""

    policy: str
    capacity: int
    block_size: int | None   # paged only
    frames: tuple[MapFrame, ...]
    preemptions: int
    snapshot_every: int = 1  # frames at iterations divisible by this carry segments

    @property
    def mean_batch_size(self) -> float:
        return sum(f.running for f in self.frames) / len(self.frames)

    @property
    def max_batch_size(self) -> int:
        return max(f.running for f in self.frames)

    def breakdown(self) -> dict[str, float]:
        """Time-averaged share of the capacity per kind (sums to 1), as the simulator reports."""
        total = self.capacity * len(self.frames)
        return {k: sum(f.counts[k] for f in self.frames) / total for k in SEGMENT_KINDS}


class _ContiguousMemory:
    """One region per request in a `ContiguousArena`, grown token by token."""

    def __init__(self, capacity: int, policy: str, max_len: int) -> None:
        self.arena = ContiguousArena(capacity, policy, max_len=max_len)  # type: ignore[arg-type]

    def admit(self, rid: str, tokens: int, final_len: int) -> bool:
        arena = self.arena
        if arena.first_fit(arena.reservation_size(final_len)) is None:
            return False
        arena.reserve(rid, final_len, tokens=tokens)
        return True

    def grow(self, rid: str) -> bool:
        # Sized for the final length up front: growth never needs room.
        self.arena.grow(rid, 1)
        return True

    def release(self, rid: str, *, preempted: bool) -> None:
        assert not preempted, "contiguous regions never run out while growing"
        self.arena.release(rid)

    def _required(self, head_final_len: int | None) -> int | None:
        # External fragmentation is judged against the waiting head's region.
        if head_final_len is None:
            return None
        return self.arena.reservation_size(head_final_len)

    def counts(self, head_final_len: int | None) -> dict[str, int]:
        return self.arena.breakdown(self._required(head_final_len)).as_dict()

    def segments(self, head_final_len: int | None) -> list[MapSegment]:
        return [MapSegment(s.start, s.length, s.kind, s.owner)
                for s in self.arena.segments(self._required(head_final_len))]


class _PagedMemory:
    """`capacity // block_size` blocks in a `BlockManager`, one append per token."""

    def __init__(self, capacity: int, block_size: int, watermark: float) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.manager = BlockManager(capacity // block_size, block_size, prefix_caching=False,
                                    record_events=False)
        # The simulator's admission rule: keep this many blocks free for growth.
        self.watermark_blocks = int(watermark * self.manager.num_blocks)

    def admit(self, rid: str, tokens: int, final_len: int) -> bool:
        m = self.manager
        if m.blocks_for(tokens) + self.watermark_blocks > m.num_free_blocks:
            return False
        m.allocate(rid, tokens)
        return True

    def grow(self, rid: str) -> bool:
        m = self.manager
        if m.blocks_needed_to_append(rid, 1) > m.num_free_blocks:
            return False
        m.append(rid, num_tokens=1)
        return True

    def release(self, rid: str, *, preempted: bool) -> None:
        self.manager.free(rid, preempted=preempted)

    def counts(self, head_final_len: int | None) -> dict[str, int]:
        m = self.manager
        used = (m.num_blocks - m.num_free_blocks) * self.block_size
        filled = m.metrics().filled_slots
        return {"token_states": filled, "reservation": 0,
                "internal_fragmentation": used - filled, "external_fragmentation": 0,
                "free": self.capacity - used}

    def segments(self, head_final_len: int | None) -> list[MapSegment]:
        m = self.manager
        bs = self.block_size
        # Slot by slot in arrays, then run-length encoded: a pool of thousands of
        # one-token blocks costs microseconds, not a Python loop over every block.
        kind = np.full(self.capacity, _FREE, dtype=np.int64)
        owner = np.full(self.capacity, -1, dtype=np.int64)
        rids = list(m.seqs)
        offsets = np.arange(bs)
        for j, rid in enumerate(rids):
            table = np.asarray(m.block_table(rid), dtype=np.int64)
            slots = (table[:, None] * bs + offsets).ravel()
            kind[slots] = _TOKEN
            owner[slots] = j
            # Nothing is shared (no prefix caching, no forks), so only a table's
            # last block can be partly written.
            tail = m.num_tokens(rid) - (len(table) - 1) * bs
            assert 1 <= tail <= bs, (rid, tail)
            if tail < bs:
                kind[slots[tail - bs:]] = _INTERNAL
        code = kind * (len(rids) + 1) + owner + 1
        starts = np.flatnonzero(np.diff(code, prepend=-1))
        ends = np.append(starts[1:], self.capacity)
        names: list[str | None] = [*rids, None]   # owner -1 picks the trailing None
        return [MapSegment(a, b - a, SEGMENT_KINDS[k], names[o])
                for a, b, k, o in zip(starts.tolist(), ends.tolist(), kind[starts].tolist(),
                                      owner[starts].tolist(), strict=True)]


def replay_maps(trace: Trace, policy: str, capacity: int, *, block_size: int = 16,
                max_len: int = DEFAULT_MAX_LEN, iteration_s: float = DEFAULT_ITERATION_S,
                watermark: float = DEFAULT_WATERMARK,
                max_snapshots: int = MAX_SNAPSHOTS) -> MapReplay:
    """Replay `trace` under `policy` ("paged", "max", "pow2" or "oracle"), one frame per
    busy iteration, at most `max_snapshots` of them with segments. Pure: builds its own
    memory.

    Raises PagedLabError for a bad configuration, a trace or capacity beyond this
    view's limits, or a request that could never run in the capacity (the
    simulator's message).
    """
    config = SimConfig(policy, capacity, block_size, max_len, iteration_s,  # type: ignore[arg-type]
                       watermark)
    # The simulator's own checks, with its messages (bad fields, a request too long).
    make_policy(config).prepare(trace.final_len)
    if len(trace) > MAX_MAP_REQUESTS:
        raise PagedLabError(f"the memory map replays at most {MAX_MAP_REQUESTS:,} requests, "
                            f"got {len(trace):,}")
    check_int(max_snapshots, "max_snapshots", 1)
    if capacity > MAX_MAP_CAPACITY:
        raise PagedLabError(f"the memory map draws at most {MAX_MAP_CAPACITY:,} slots, "
                            f"got {capacity:,}")
    arrival = np.ceil(trace.arrival_s / float(iteration_s)).astype(np.int64).tolist()
    if arrival[-1] > MAX_MAP_ITERATIONS:
        raise PagedLabError(
            f"the last request arrives at iteration {arrival[-1]}; the memory map covers at "
            f"most {MAX_MAP_ITERATIONS} iterations: raise the rate or use fewer requests")
    mem: _ContiguousMemory | _PagedMemory
    if policy == "paged":
        mem = _PagedMemory(capacity, block_size, watermark)
    else:
        assert policy in CONTIGUOUS_POLICIES
        mem = _ContiguousMemory(capacity, policy, max_len)
    final = trace.final_len.tolist()
    prefill = trace.prompt_len.tolist()   # tokens to process on (re)admission
    n = len(final)
    ids = [f"r{i}" for i in range(n)]
    tokens = [0] * n
    running: dict[int, None] = {}        # insertion order = admission order
    waiting: deque[int] = deque()
    frames: list[MapFrame] = []
    every = 1          # snapshot spacing (a power of two)
    snapshots = kept = 0   # snapshots and their segments held
    preemptions = 0
    nxt = finished = k = 0
    # Far past any real finish: every token, each recomputed once, after the last arrival.
    stall = arrival[-1] + 2 * sum(final) + 1
    while finished < n:
        while nxt < n and arrival[nxt] <= k:
            waiting.append(nxt)
            nxt += 1
        finishing: list[int] = []
        # 1. Growth, oldest admission first; a paged request that finds no block
        # preempts the most recently admitted one (possibly itself).
        for i in list(running):
            if i not in running:
                continue
            while not mem.grow(ids[i]):
                victim = next(reversed(running))
                del running[victim]
                mem.release(ids[victim], preempted=True)
                prefill[victim] = tokens[victim]   # recomputed as a prompt later
                waiting.appendleft(victim)
                preemptions += 1
                if victim == i:
                    break
            if i not in running:
                continue
            tokens[i] += 1
            if tokens[i] == final[i]:
                finishing.append(i)
        # 2. Admission, first come first served: the head blocks the rest.
        while waiting:
            i = waiting[0]
            count = prefill[i] + 1   # the prompt's pass also yields the first token
            if not mem.admit(ids[i], count, final[i]):
                break
            waiting.popleft()
            running[i] = None
            tokens[i] = count
            if count == final[i]:
                finishing.append(i)
        # 3. The sample: what this iteration's attention reads.
        if running:
            head = final[waiting[0]] if waiting else None
            segs = tuple(mem.segments(head)) if k % every == 0 else None
            frames.append(MapFrame(k, len(running), len(waiting), mem.counts(head), segs))
            if segs is not None:
                snapshots += 1
                kept += len(segs)
            while snapshots > max_snapshots or (kept > MAX_SNAPSHOT_SEGMENTS and snapshots > 1):
                # Keep every other snapshot, and take half as many from now on.
                every *= 2
                frames = [f if f.segments is None or f.iteration % every == 0
                          else replace(f, segments=None) for f in frames]
                snapshots = sum(f.segments is not None for f in frames)
                kept = sum(len(f.segments or ()) for f in frames)
        # 4. Finished requests free their memory at the end of the iteration.
        for i in finishing:
            del running[i]
            mem.release(ids[i], preempted=False)
        finished += len(finishing)
        k += 1
        assert k <= stall, "map replay stalled: requests wait but none can ever be admitted"
    return MapReplay(policy, capacity, block_size if policy == "paged" else None,
                     tuple(frames), preemptions, every)


def small_trace(workload: str, requests: int, rate: float, seed: int, max_len: int) -> Trace:
    """A seeded trace for the memory maps, every request cut to at most `max_len` tokens.

    A small arena cannot hold the 2048-token requests the workloads allow, so
    this models a server whose maximum sequence length is `max_len`: a prompt
    longer than max_len - 1 is truncated, and generation stops at max_len
    tokens. Arrivals are the workload's own. Raises PagedLabError for bad input.
    """
    check_int(max_len, "the maximum sequence length", 2)
    if isinstance(requests, int) and requests > MAX_MAP_REQUESTS:
        raise PagedLabError(f"the memory map replays at most {MAX_MAP_REQUESTS:,} requests, "
                            f"got {requests:,}")
    t = make_trace(workload, requests, rate, seed)
    prompt = np.minimum(t.prompt_len, max_len - 1)
    output = np.minimum(t.output_len, max_len - prompt)
    return Trace(t.workload, t.rate, t.seed, t.arrival_s, prompt, output)


__all__ = ["MapFrame", "MapReplay", "MapSegment", "replay_maps", "small_trace"]
