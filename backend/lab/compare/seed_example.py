"""The seed text's contiguous-allocation example, in a contiguous arena and in a paged pool.

The same timeline as the scenario `assets/scenarios/01-contiguous-problem.json`:

    A  prompt 2, final 6      B  prompt 1, final 3      C  prompt 2, final 5
    1. A, B and C arrive. The arena reserves one region per request, sized by
       the policy from its final length, first-fit; the pool takes blocks only
       for the tokens that exist.
    2. Two decode steps: every request gains a token per step; B reaches its
       final 3 tokens and finishes, releasing its memory.
    3. A new request D arrives with new_len - 1 tokens and will reach new_len.
       The arena asks `fits`; the pool places D's tokens in any free blocks.

With the defaults (16 slots, oracle, D of 5) the arena has 5 slots free in
holes of 3 and 2, so D cannot be placed although the free total suffices;
the pool of 16 one-token blocks places it in blocks 11-14. Those were never
used: the pool hands out blocks from the front of its free queue (vLLM's
order) and a finished request's blocks join the back, so B's freed blocks
2, 6 and 9 are reused only by a D of final length 7 or more, which runs past
the never-used ones (`reuse_length`). Both memories hold the same number of
slots: `capacity // block_size` blocks.

Under the other policies the arena tells a different story (under "max" A's
reservation fills the arena, so B and C wait throughout and B never runs):
`arena_log` and `pool_log` record who was placed, who waited and why, and who
finished, for the page to narrate.

Everything here is computed by the backend's own `ContiguousArena` and
`BlockManager` (FIFO free queue, prefix caching off), never written down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from backend.core.checks import check_int
from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.core.words import agrees, counted, joined
from backend.lab.contiguous import CONTIGUOUS_POLICIES, ContiguousArena
from backend.lab.contiguous_types import FitAnswer, MemoryBreakdown, Segment
from backend.paging.block_manager import BlockManager

# (request, prompt tokens, final length): the seed's requests of 6, 3 and 5 tokens.
SEED_REQUESTS: tuple[tuple[str, int, int], ...] = (("A", 2, 6), ("B", 1, 3), ("C", 2, 5))
SEED_CAPACITY = 16
DECODE_STEPS = 2
MAX_SEED_CAPACITY = 64


@dataclass(frozen=True, slots=True)
class SeedEvent:
    """One thing that happened to a request in one memory, for the page's narration.

    `step` is 0 at arrival and 1..DECODE_STEPS for the decode steps (a request
    placed after a step's growth is logged at that step). In the arena `start`
    and `size` are the region's first slot and length (the region asked for,
    when it waits) and `largest` the largest hole then; in the pool `blocks`
    are the table placed or the blocks released (in release order), `size`
    the blocks asked for and `free` the free blocks then.
    """

    step: int
    request: str
    kind: Literal["placed", "waits", "finishes"]
    start: int = -1
    size: int = 0
    free: int = 0
    largest: int = 0
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ArenaStage:
    """The arena after one stage of the timeline."""

    label: str
    segments: tuple[Segment, ...]
    breakdown: MemoryBreakdown
    holes: tuple[tuple[int, int], ...]   # (start, length) in address order
    free_total: int
    largest_hole: int
    waiting: tuple[str, ...]             # requests with no region (they wait for room)
    text: str                            # ContiguousArena.render(), one glyph per slot


@dataclass(frozen=True, slots=True)
class PoolBlock:
    """One physical block: its holder (None when free) and its written slots."""

    block: int
    owner: str | None
    filled: int


@dataclass(frozen=True, slots=True)
class PoolStage:
    """The paged pool after one stage of the timeline."""

    label: str
    blocks: tuple[PoolBlock, ...]
    tables: dict[str, tuple[int, ...]]   # request -> block table (running requests)
    tokens: dict[str, int]               # request -> tokens held
    free_blocks: int
    waiting: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SeedExample:
    """The whole timeline: three stages of each memory and the answers about D."""

    policy: str
    capacity: int
    block_size: int
    new_len: int
    arena: tuple[ArenaStage, ...]
    pool: tuple[PoolStage, ...]
    fit: FitAnswer                       # the arena's answer for D
    d_table: tuple[int, ...] | None      # D's block table, None if the pool could not place it
    pool_message: str
    reservations: dict[str, int]         # request -> the region the policy reserves for it
    arena_log: tuple[SeedEvent, ...]
    pool_log: tuple[SeedEvent, ...]
    # The pool's free queue when D arrives, front first: the order it hands blocks out.
    free_order: tuple[int, ...]
    # Blocks released by requests that finished in the pool before D, in release order.
    freed: tuple[int, ...]
    # Blocks the pool lacks for the decode step after D's arrival (0: it has them all).
    short_next_step: int = 0

    def reuse_length(self, *, every: bool = False) -> int | None:
        """The smallest final length of D whose blocks include one of `freed` (all of
        them with `every`), or None if no D up to the capacity gets there.

        D takes blocks from the queue's front, so it reaches the freed block at
        queue position i once it needs i + 1 blocks, that is once its
        new_len - 1 tokens exceed i full blocks.
        """
        where = [i for i, b in enumerate(self.free_order) if b in set(self.freed)]
        if not where:
            return None
        length = (max(where) if every else min(where)) * self.block_size + 2
        return length if length <= self.capacity else None


def _arena_stage(label: str, arena: ContiguousArena, waiting: list[str],
                 required: int | None) -> ArenaStage:
    holes = arena.holes()
    return ArenaStage(label, tuple(arena.segments(required)), arena.breakdown(required),
                      tuple((h.start, h.length) for h in holes), arena.free_total,
                      arena.largest_hole(), tuple(waiting),
                      arena.render(required, width=arena.capacity))


def _pool_stage(label: str, m: BlockManager, waiting: list[str]) -> PoolStage:
    owner = {b: rid for rid in m.seqs for b in m.block_table(rid)}
    blocks = tuple(PoolBlock(b, owner.get(b), m.block(b).num_filled if b in owner else 0)
                   for b in range(m.num_blocks))
    return PoolStage(label, blocks, {rid: tuple(m.block_table(rid)) for rid in m.seqs},
                     {rid: m.num_tokens(rid) for rid in m.seqs}, m.num_free_blocks,
                     tuple(waiting))


def _next_step_shortfall(pool: BlockManager, new_len: int) -> tuple[int, str]:
    """How many blocks the pool, D placed, lacks for its next decode step, and a
    sentence saying so ((0, "") when it has them all).

    The pool admits on the blocks a request needs now, not on its final length, so
    with blocks of more than one slot it can place D and then lack a block for the
    requests whose last block is full. The arena reserved each request's final
    length (or more) up front, so it never runs short later.
    """
    finals = {rid: final for rid, _, final in SEED_REQUESTS} | {"D": new_len}
    full = [rid for rid, final in finals.items()
            if pool.has(rid) and pool.num_tokens(rid) < final
            and pool.blocks_needed_to_append(rid, 1)]
    free = pool.num_free_blocks
    if len(full) <= free:
        return 0, ""
    names = joined(full)
    return len(full) - free, (
        f". The next decode step needs {counted(len(full), 'new block')} ({names} "
        f"{agrees(len(full), 'has a full', 'each have a full')} last block) and {free} "
        f"{agrees(free, 'is', 'are')} free, so an engine would then preempt a request: "
        "the pool admits on the blocks a request needs now, while the arena reserved "
        "each final length up front and never runs short later")


def _place_waiting(arena: ContiguousArena, pool: BlockManager, arena_wait: list[str],
                   pool_wait: list[str], step: int, arena_log: list[SeedEvent],
                   pool_log: list[SeedEvent]) -> None:
    """Mutates: place waiting requests first come, first served while they fit."""
    spec = {rid: (prompt, f) for rid, prompt, f in SEED_REQUESTS}
    while arena_wait:
        prompt, f = spec[arena_wait[0]]
        size = arena.reservation_size(f)
        if arena.first_fit(size) is None:
            break
        region = arena.reserve(arena_wait.pop(0), f, tokens=prompt)
        arena_log.append(SeedEvent(step, region.request_id, "placed", region.start, size))
    while pool_wait:
        prompt, _ = spec[pool_wait[0]]
        if pool.blocks_for(prompt) > pool.num_free_blocks:
            break
        rid = pool_wait.pop(0)
        table = pool.allocate(rid, prompt).block_table
        pool_log.append(SeedEvent(step, rid, "placed", size=len(table), blocks=tuple(table)))


def seed_example(policy: str = "oracle", block_size: int = 1, new_len: int = 5, *,
                 capacity: int = SEED_CAPACITY, max_len: int | None = None) -> SeedExample:
    """Reads only: run the seed's timeline in both memories.

    `max_len` is the max policy's reservation (default: the whole arena).
    Raises PagedLabError for a policy, block size, capacity or length that
    cannot describe this example.
    """
    if policy not in CONTIGUOUS_POLICIES:
        raise PagedLabError(f"policy must be one of {', '.join(CONTIGUOUS_POLICIES)}, "
                            f"got {policy!r}")
    for what, value, low, high in (("capacity", capacity, 8, MAX_SEED_CAPACITY),
                                   ("block size", block_size, 1, capacity),
                                   ("the new request's length", new_len, 2, capacity)):
        check_int(value, what, low, high)
    arena = ContiguousArena(capacity, policy, max_len=capacity if max_len is None else max_len)  # type: ignore[arg-type]
    pool = BlockManager(capacity // block_size, block_size, prefix_caching=False,
                        record_events=False)
    arena_wait: list[str] = []
    pool_wait: list[str] = []
    arena_log: list[SeedEvent] = []
    pool_log: list[SeedEvent] = []
    reservations = {rid: arena.reservation_size(f) for rid, _, f in SEED_REQUESTS}
    # 1. Arrivals: a request that finds no room waits (it is shown, not dropped).
    for rid, prompt, f in SEED_REQUESTS:
        size = reservations[rid]
        start = arena.first_fit(size)
        if start is None:
            arena_wait.append(rid)
            arena_log.append(SeedEvent(0, rid, "waits", size=size, free=arena.free_total,
                                       largest=arena.largest_hole()))
        else:
            arena.reserve(rid, f, tokens=prompt)
            arena_log.append(SeedEvent(0, rid, "placed", start, size))
        try:
            table = pool.allocate(rid, prompt).block_table
            pool_log.append(SeedEvent(0, rid, "placed", size=len(table), blocks=tuple(table)))
        except OutOfBlocksError:
            pool_wait.append(rid)
            pool_log.append(SeedEvent(0, rid, "waits", size=pool.blocks_for(prompt),
                                      free=pool.num_free_blocks))
    arena_stages = [_arena_stage("1. A, B and C arrive", arena, arena_wait, None)]
    pool_stages = [_pool_stage("1. A, B and C arrive", pool, pool_wait)]
    # 2. Decode steps, A, B, C in order; a request at its final length leaves.
    freed: list[int] = []
    for step in range(1, DECODE_STEPS + 1):
        for rid, _, f in SEED_REQUESTS:
            if rid in arena and arena.region(rid).tokens < f:
                arena.grow(rid, 1)
                if arena.region(rid).tokens == f:
                    region = arena.release(rid)
                    arena_log.append(SeedEvent(step, rid, "finishes", region.start,
                                               region.reserved))
            if pool.has(rid) and pool.num_tokens(rid) < f:
                if pool.blocks_needed_to_append(rid, 1) > pool.num_free_blocks:
                    continue   # no room to grow in this toy; it simply waits a step
                pool.append(rid, num_tokens=1)
                if pool.num_tokens(rid) == f:
                    released = pool.free(rid)
                    freed.extend(released)
                    pool_log.append(SeedEvent(step, rid, "finishes", size=len(released),
                                              blocks=tuple(released)))
        _place_waiting(arena, pool, arena_wait, pool_wait, step, arena_log, pool_log)
    label = "2. two decode steps"
    arena_stages.append(_arena_stage(label, arena, arena_wait, None))
    pool_stages.append(_pool_stage(label, pool, pool_wait))
    # The order the pool will hand D its blocks: the free queue, front first. A
    # finished request's blocks joined its back, behind every block never used.
    free_order = tuple(b.id for b in pool.pool.free_queue)
    # 3. D arrives: new_len - 1 tokens now, new_len at the end.
    fit = arena.fits(new_len)
    d_tokens = counted(new_len - 1, "token")
    # Its prompt now, its final length in the arena's reservation: the label says both.
    label = f"3. D arrives ({d_tokens}, final length {new_len})"
    if fit.fits:
        arena.reserve("D", new_len, tokens=new_len - 1)
        arena_stages.append(_arena_stage(label, arena, arena_wait, None))
    else:
        # External fragmentation is judged against the region D needs, and only where the
        # free slots would hold it if they were one hole: with fewer free than that, the
        # arena lacks room (the message says so) and its holes are plain free slots.
        frag = fit.size if fit.reason == "external_fragmentation" else None
        arena_stages.append(_arena_stage(label, arena, [*arena_wait, "D"], frag))
    d_table: tuple[int, ...] | None = None
    short = 0
    need = pool.blocks_for(new_len - 1)
    if need <= pool.num_free_blocks:
        d_table = pool.allocate("D", new_len - 1).block_table
        short, why = _next_step_shortfall(pool, new_len)
        pool_message = (f"D's {d_tokens} {agrees(new_len - 1, 'takes', 'take')} "
                        f"{counted(need, 'block')} of {block_size}: block table {list(d_table)}"
                        + why)
    else:
        free = pool.num_free_blocks
        pool_message = (f"D's {d_tokens} {agrees(new_len - 1, 'needs', 'need')} "
                        f"{counted(need, 'block')} of {block_size} but only {free} "
                        f"{agrees(free, 'is', 'are')} free")
        pool_wait.append("D")
    pool_stages.append(_pool_stage(label, pool, pool_wait))
    reservations["D"] = fit.size
    return SeedExample(policy, capacity, block_size, new_len, tuple(arena_stages),
                       tuple(pool_stages), fit, d_table, pool_message, reservations,
                       tuple(arena_log), tuple(pool_log), free_order, tuple(freed), short)
