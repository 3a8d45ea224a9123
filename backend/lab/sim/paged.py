"""The paged policy for the replay: PagedLab's own `BlockManager`, prefix caching off.

The manager is told about a request's tokens lazily: at admission (its prompt
plus first token) and whenever the request's next token starts a new block.
Between those moments the request's extra tokens fit in its last block, so
the manager's block counts, which are all the memory accounting needs, are
exact at every iteration. Calling it once per token would make a 100k-request
ShareGPT replay (about 34M tokens) far too slow.

Admission keeps a watermark of free blocks (vLLM v0's default: 1% of the
pool, or `watermark_blocks` exactly): a request is admitted only if that many
blocks stay free after its prompt, so that the requests already running have
room to grow and a newcomer is not preempted again at once.
"""

from __future__ import annotations

import numpy as np

from backend.core.budgets import fits_with_watermark
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.paging.block_manager import BlockManager

DEFAULT_WATERMARK = 0.01
# The largest KV capacity a simulation takes, in token slots.
MAX_CAPACITY_TOKENS = 1 << 24


def watermark_for(num_blocks: int, watermark: float = DEFAULT_WATERMARK,
                  watermark_blocks: int | None = None) -> int:
    """The free blocks admission keeps back: `watermark_blocks`, or vLLM v0's
    int(watermark * num_gpu_blocks)."""
    return int(watermark * num_blocks) if watermark_blocks is None else watermark_blocks


def admits(capacity: int, block_size: int, longest: int,
           watermark_blocks: int | None = None) -> bool:
    """Whether an empty pool of `capacity` slots in blocks of `block_size`, keeping its
    watermark free (`watermark_blocks`, or DEFAULT_WATERMARK of the pool), admits a
    request of `longest` tokens: what `PagedPolicy.prepare` checks, without a pool."""
    num_blocks = capacity // block_size
    kept = watermark_for(num_blocks, watermark_blocks=watermark_blocks)
    return -(-longest // block_size) <= num_blocks - kept


class PagedPolicy:
    """`capacity // block_size` blocks of `block_size` slots (the remainder is never used)."""

    growth_period: int | None
    reserves_ahead = False

    def __init__(self, capacity: int, block_size: int, *,
                 watermark: float = DEFAULT_WATERMARK,
                 watermark_blocks: int | None = None) -> None:
        num_blocks = capacity // block_size
        if num_blocks < 1:
            raise PagedLabError(
                f"a capacity of {counted(capacity, 'token')} holds no block of "
                f"{block_size} tokens")
        self.capacity = capacity
        self.block_size = block_size
        self.growth_period = block_size
        self.manager = BlockManager(num_blocks, block_size, prefix_caching=False,
                                    record_events=False)
        self.watermark_blocks = watermark_for(num_blocks, watermark, watermark_blocks)
        # The share the watermark follows when no count was given (it grows with the pool).
        self.watermark_share = watermark if watermark_blocks is None else None
        self._ids: list[str] = []
        self._synced: list[int] = []   # tokens the manager holds, per request

    @property
    def num_blocks(self) -> int:
        return self.manager.num_blocks

    @property
    def allocated(self) -> int:
        m = self.manager
        return (m.num_blocks - m.num_free_blocks) * self.block_size

    @property
    def committed(self) -> int:
        return 0

    def prepare(self, final_len: np.ndarray) -> None:
        """Raise PagedLabError if the longest request could not run in an empty pool."""
        longest = int(final_len.max())
        need = -(-longest // self.block_size)
        room = self.num_blocks - self.watermark_blocks
        if room <= 0:
            raise PagedLabError(
                f"a watermark of {counted(self.watermark_blocks, 'block')} is not below the "
                f"pool's {self.num_blocks:,}: no request could ever be admitted; use a "
                f"watermark under {self.num_blocks:,}")
        if need > room:
            least = self.least_blocks(need) * self.block_size
            bare = need * self.block_size
            # Past the largest capacity only a smaller watermark makes room, or, where
            # rounding up to whole blocks is what overflows, a block size that divides
            # it; a request longer than it fits no setting at all.
            if least <= MAX_CAPACITY_TOKENS:
                advice = f"use a capacity of at least {least:,} tokens"
            elif longest > MAX_CAPACITY_TOKENS:
                advice = (f"that is more than the largest capacity, "
                          f"{MAX_CAPACITY_TOKENS:,} tokens, so no setting admits it; leave "
                          "it out of the trace")
            elif bare > MAX_CAPACITY_TOKENS:
                advice = (f"in blocks of {self.block_size} that is more than the largest "
                          f"capacity, {MAX_CAPACITY_TOKENS:,} tokens; use a block size that "
                          f"divides {MAX_CAPACITY_TOKENS:,} (a power of two), a watermark of 0 "
                          "blocks and that capacity")
            else:
                advice = (f"no capacity up to {MAX_CAPACITY_TOKENS:,} tokens admits it with "
                          "this watermark; use a watermark of 0 blocks and a capacity of at "
                          f"least {bare:,} tokens")
            raise PagedLabError(
                f"the longest request needs {longest:,} tokens ({need:,} blocks of "
                f"{self.block_size}) but the pool admits at most {counted(room, 'block')} "
                f"({counted(self.num_blocks, 'block')}, {self.watermark_blocks:,} kept free); "
                f"{advice}")
        self._ids = [str(i) for i in range(len(final_len))]
        self._synced = [0] * len(final_len)

    def least_blocks(self, need: int) -> int:
        """The fewest blocks whose pool admits a request of `need` blocks: with a
        watermark given as a share of the pool, a larger pool keeps more free, so the
        capacity suggested for the longest request must count its own watermark."""
        if self.watermark_share is None:
            return need + self.watermark_blocks
        blocks = need + int(self.watermark_share * need)
        while blocks - int(self.watermark_share * blocks) < need:
            blocks += 1
        return blocks

    def try_admit(self, i: int, tokens: int, final_len: int) -> bool:
        m = self.manager
        if not fits_with_watermark(m.num_free_blocks, -(-tokens // self.block_size),
                                   self.watermark_blocks):
            return False
        # Token ids only matter to prefix caching, which is off: a count will do.
        m.allocate(self._ids[i], tokens)
        self._synced[i] = tokens
        return True

    def grow(self, i: int, tokens: int) -> bool:
        # The manager's last block is full (tokens - 1 is a multiple of the
        # block size), so the append takes exactly one free block.
        if self.manager.num_free_blocks == 0:
            return False
        self.manager.append(self._ids[i], num_tokens=tokens - self._synced[i])
        self._synced[i] = tokens
        return True

    def release(self, i: int, *, preempted: bool) -> None:
        self.manager.free(self._ids[i], preempted=preempted)

    def external_slots(self, head_final_len: int | None) -> int:
        return 0

    def block_counts(self) -> tuple[int, int, int]:
        pool = self.manager.pool
        return pool.num_blocks - pool.num_free, pool.num_cached_free, pool.num_empty
