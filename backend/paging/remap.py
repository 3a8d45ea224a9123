"""Block remapping: relabel every physical block at once, as a compaction would.

The plan is a permutation of all block ids; applying it rewrites every block
table and the pool's id-keyed indexes together. Kept apart from the block
manager because it touches the whole pool at once (O(blocks + table entries)),
unlike the manager's per-block operations. Takes the manager's parts rather
than the manager, so this module sits below the block manager and never
imports it.
"""

from __future__ import annotations

import random
from collections.abc import Container, Mapping

from backend.core.errors import PagedLabError
from backend.paging.block_pool import BlockPool
from backend.paging.block_types import Move, SeqBlocks


def plan_remap(pool: BlockPool, seed: int) -> dict[int, int]:
    """Reads only: a permutation of all block ids that moves every used block.

    Used blocks never map to themselves (a pool of one block is the only
    exception). Free and cached blocks are permuted too; their place in
    the free queue is kept.
    """
    return remap_permutation(pool.num_blocks, {b.id for b in pool.blocks if b.ref_count > 0},
                             seed)


def remap_permutation(num_blocks: int, used: Container[int], seed: int) -> dict[int, int]:
    """`plan_remap` of a pool of `num_blocks` whose blocks `used` have references: a
    function of these alone, so a snapshot restore can repeat a shuffle's plan."""
    n = num_blocks
    rng = random.Random(seed)
    perm = list(range(n))
    rng.shuffle(perm)
    if n > 1:
        for b in range(n):
            if perm[b] == b and b in used:
                # Swapping with any other index removes this fixed point
                # without creating another (perm is a bijection).
                j = rng.randrange(n - 1)
                j += j >= b
                perm[b], perm[j] = perm[j], perm[b]
    return dict(enumerate(perm))


def apply_remap(pool: BlockPool, seqs: Mapping[str, SeqBlocks],
                mapping: dict[int, int]) -> list[Move]:
    """Mutates: relabel every block by `mapping` and rewrite every table.

    Returns the moves whose data must be copied (used and cached blocks
    that changed id); the caller records their events. Raises
    PagedLabError, before changing anything, if `mapping` is not a
    permutation of the pool's ids.
    """
    n = pool.num_blocks
    if sorted(mapping) != list(range(n)) or sorted(mapping.values()) != list(range(n)):
        raise PagedLabError(f"a remap must be a permutation of the block ids 0..{n - 1}")
    moves = [Move(b.id, mapping[b.id]) for b in pool.blocks
             if (b.ref_count > 0 or b.hash is not None) and mapping[b.id] != b.id]
    for seq in seqs.values():
        seq.block_table[:] = [mapping[b] for b in seq.block_table]
    pool.relabel(mapping)
    return moves
