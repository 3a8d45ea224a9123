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
the pool of 16 one-token blocks places it in blocks 11-14. Both memories
hold the same number of slots: `capacity // block_size` blocks.

Everything here is computed by the backend's own `ContiguousArena` and
`BlockManager` (FIFO free queue, prefix caching off), never written down.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.checks import check_int
from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.core.words import agrees, counted
from backend.lab.contiguous import CONTIGUOUS_POLICIES, ContiguousArena
from backend.lab.contiguous_types import FitAnswer, MemoryBreakdown, Segment
from backend.paging.block_manager import BlockManager

# (request, prompt tokens, final length): the seed's requests of 6, 3 and 5 tokens.
SEED_REQUESTS: tuple[tuple[str, int, int], ...] = (("A", 2, 6), ("B", 1, 3), ("C", 2, 5))
SEED_CAPACITY = 16
DECODE_STEPS = 2
MAX_SEED_CAPACITY = 64


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


def _place_waiting(arena: ContiguousArena, pool: BlockManager, arena_wait: list[str],
                   pool_wait: list[str]) -> None:
    """Mutates: place waiting requests first come, first served while they fit."""
    spec = {rid: (prompt, f) for rid, prompt, f in SEED_REQUESTS}
    while arena_wait:
        prompt, f = spec[arena_wait[0]]
        if arena.first_fit(arena.reservation_size(f)) is None:
            break
        arena.reserve(arena_wait.pop(0), f, tokens=prompt)
    while pool_wait:
        prompt, _ = spec[pool_wait[0]]
        if pool.blocks_for(prompt) > pool.num_free_blocks:
            break
        pool.allocate(pool_wait.pop(0), prompt)


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
    # 1. Arrivals: a request that finds no room waits (it is shown, not dropped).
    for rid, prompt, f in SEED_REQUESTS:
        size = arena.reservation_size(f)
        if arena.first_fit(size) is None:
            arena_wait.append(rid)
        else:
            arena.reserve(rid, f, tokens=prompt)
        try:
            pool.allocate(rid, prompt)
        except OutOfBlocksError:
            pool_wait.append(rid)
    arena_stages = [_arena_stage("1. A, B and C arrive", arena, arena_wait, None)]
    pool_stages = [_pool_stage("1. A, B and C arrive", pool, pool_wait)]
    # 2. Decode steps, A, B, C in order; a request at its final length leaves.
    for _ in range(DECODE_STEPS):
        for rid, _, f in SEED_REQUESTS:
            if rid in arena and arena.region(rid).tokens < f:
                arena.grow(rid, 1)
                if arena.region(rid).tokens == f:
                    arena.release(rid)
            if pool.has(rid) and pool.num_tokens(rid) < f:
                if pool.blocks_needed_to_append(rid, 1) > pool.num_free_blocks:
                    continue   # no room to grow in this toy; it simply waits a step
                pool.append(rid, num_tokens=1)
                if pool.num_tokens(rid) == f:
                    pool.free(rid)
        _place_waiting(arena, pool, arena_wait, pool_wait)
    label = "2. two decode steps"
    arena_stages.append(_arena_stage(label, arena, arena_wait, None))
    pool_stages.append(_pool_stage(label, pool, pool_wait))
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
    need = pool.blocks_for(new_len - 1)
    if need <= pool.num_free_blocks:
        d_table = pool.allocate("D", new_len - 1).block_table
        pool_message = (f"D's {d_tokens} {agrees(new_len - 1, 'takes', 'take')} "
                        f"{counted(need, 'block')} of {block_size}: block table {list(d_table)}")
    else:
        free = pool.num_free_blocks
        pool_message = (f"D's {d_tokens} {agrees(new_len - 1, 'needs', 'need')} "
                        f"{counted(need, 'block')} of {block_size} but only {free} "
                        f"{agrees(free, 'is', 'are')} free")
        pool_wait.append("D")
    pool_stages.append(_pool_stage(label, pool, pool_wait))
    return SeedExample(policy, capacity, block_size, new_len, tuple(arena_stages),
                       tuple(pool_stages), fit, d_table, pool_message)
