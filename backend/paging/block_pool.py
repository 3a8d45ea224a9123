"""The physical block pool: blocks, the free queue, and the prefix cache's content index.

Every block is in exactly one of three states::

    used    ref_count >= 1                      held by one or more block tables
    cached  ref_count == 0, hash set            in the free queue, still findable
                                                by a prefix-cache lookup
    free    ref_count == 0, no hash             in the free queue

One doubly linked queue holds every block with ref_count 0, cached or free, and
it is also the eviction order (as in vLLM v1): allocation takes from the front,
a released block joins the back, and a prefix hit unlinks a cached block from
the middle in O(1). A cached block keeps its hash until it is handed out again;
only then is its hash dropped (an eviction).

In "random" allocation mode the pool hands out a pseudo-random block with no
cached prefix (so the cache is not thrown away needlessly): it probes up to
RANDOM_PROBES random ids for one that is free and empty, and otherwise takes
the front of the queue, as fifo mode would. The choice is a pure function of
(seed, number of picks so far, block states, queue order), all of which a
snapshot records, so a restored run continues identically.

The pool knows nothing about requests; `BlockManager` owns block tables and
records events. Every method on the allocation path is O(1), save one rare
case: evicting the block the content index names for a content that other
blocks also hold promotes the lowest-id of those twins, O(twins). `reindex`,
`relabel` and `cache_map` are O(pool).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from backend.paging.hashing import BlockHash

AllocationMode = Literal["fifo", "random"]

# Random ids tried per pick before falling back to the front of the free queue.
RANDOM_PROBES = 32


@dataclass(eq=False, slots=True)
class Block:
    """One physical KV block. `prev`/`next` link it into the free queue."""

    id: int
    ref_count: int = 0
    num_filled: int = 0
    hash: BlockHash | None = None
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)
    in_queue: bool = False

    @property
    def state(self) -> Literal["used", "cached", "free"]:
        if self.ref_count > 0:
            return "used"
        return "cached" if self.hash is not None else "free"


class FreeBlockQueue:
    """Doubly linked list of blocks with ref_count 0, in eviction order."""

    def __init__(self) -> None:
        # Sentinels keep every insert and unlink branch-free.
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next

    def front(self) -> Block | None:
        node = self._head.next
        return None if node is self._tail else node

    def append(self, block: Block) -> None:
        assert not block.in_queue, f"block {block.id} is already in the free queue"
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        block.in_queue = True
        self._len += 1

    def remove(self, block: Block) -> None:
        assert block.in_queue, f"block {block.id} is not in the free queue"
        assert block.prev is not None and block.next is not None
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = None
        block.in_queue = False
        self._len -= 1


def _mix64(seed: int, counter: int) -> int:
    """SplitMix64 of (seed, counter): a stateless, well-spread pseudo-random word."""
    z = (seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB)
    z &= (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return z ^ (z >> 31)


class BlockPool:
    """Owns the blocks, the free queue and the prefix cache's content index.

    Mutating methods say so; every other method only reads.
    """

    def __init__(self, num_blocks: int, *, allocation: AllocationMode = "fifo",
                 seed: int = 0) -> None:
        self.blocks: list[Block] = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue()
        self.allocation: AllocationMode = allocation
        self.seed = seed
        # Picks made so far in random mode; with `seed` it fixes the next pick.
        self.random_picks = 0
        # Free blocks without a hash: the candidates of a random pick.
        self.num_empty = 0
        # The prefix cache: (parent digest, tokens) -> a block whose key holds
        # exactly that content (`BlockHash.content`), for every content some
        # block's key holds. That content is what a digest commits to, so a
        # prompt's leading blocks are found by their tokens without hashing
        # them (`find`), and the dict's own key comparison is the exact check
        # of tokens and parent (no digest is trusted alone). Where several
        # blocks hold one content (two forks that sampled the same token fill
        # identical blocks), the index names the one with the lowest id and
        # `twins` keeps the others, so the choice depends only on the blocks'
        # state (a restored pool names the same one) and an eviction of the
        # named block promotes a twin in O(twins).
        self.by_content: dict[tuple[str | None, tuple[int, ...]], Block] = {}
        self.twins: dict[tuple[str | None, tuple[int, ...]], dict[int, Block]] = {}
        self.num_cached_free = 0
        for block in self.blocks:
            self.free_queue.append(block)
            self.num_empty += 1

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks with ref_count 0, cached ones included (all can be handed out)."""
        return len(self.free_queue)

    # ---- reads -------------------------------------------------------------

    def find(self, parent_digest: str | None, tokens: tuple[int, ...]) -> Block | None:
        """A cached block holding exactly `tokens` after a block keyed `parent_digest`, or None.

        One dict lookup whose key comparison checks the content itself. O(1).
        """
        return self.by_content.get((parent_digest, tokens))

    def cache_map(self) -> dict[str, dict[int, Block]]:
        """Reads only: digest -> {block id: block} for every block with a key (O(pool)).

        The view by digest, for checks and display; nothing on the hot path
        keeps it.
        """
        out: dict[str, dict[int, Block]] = {}
        for block in self.blocks:
            if block.hash is not None:
                out.setdefault(block.hash.digest, {})[block.id] = block
        return out

    def _random_empty_block(self) -> Block | None:
        n = self.num_blocks
        for attempt in range(RANDOM_PROBES):
            block = self.blocks[_mix64(self.seed, self.random_picks * RANDOM_PROBES + attempt) % n]
            if block.ref_count == 0 and block.hash is None:
                return block
        # A nearly full pool: fall back to the queue's order rather than scan.
        return self.free_queue.front()

    # ---- mutations ---------------------------------------------------------

    def pop_free(self) -> tuple[Block, BlockHash | None]:
        """Mutates: hand out one block with ref_count 0 (now 1, with no slot filled).

        Returns the block and the hash it lost, if it was cached (the caller
        records the eviction). The caller must have checked `num_free`.
        Random allocation picks an empty block by its seeded probes; fifo, the queue's
        front.
        """
        if self.allocation == "random" and self.num_empty:
            block = self._random_empty_block()
            assert block is not None, "pop_free on an empty pool"
            self.random_picks += 1
            self.take(block)
        else:
            # Fifo (or a random pool with no empty block): the front of the
            # queue, unlinked here (FreeBlockQueue.popleft, inlined).
            queue = self.free_queue
            head = queue._head
            block = head.next  # type: ignore[assignment]
            assert block is not None and block is not queue._tail, "pop_free on an empty pool"
            nxt = block.next
            assert nxt is not None and block.ref_count == 0
            head.next = nxt
            nxt.prev = head
            block.prev = block.next = None
            block.in_queue = False
            queue._len -= 1
            if block.hash is None:
                self.num_empty -= 1
            else:
                self.num_cached_free -= 1
        evicted = block.hash
        if evicted is not None:
            self.uncache(block)
        block.ref_count = 1
        block.num_filled = 0
        return block, evicted

    def take(self, block: Block) -> None:
        """Mutates: unlink a ref_count-0 block from the free queue (O(1))."""
        assert block.ref_count == 0
        # FreeBlockQueue.remove, inlined: every hit on a cached block passes here.
        assert block.in_queue, f"block {block.id} is not in the free queue"
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        block.in_queue = False
        self.free_queue._len -= 1
        if block.hash is None:
            self.num_empty -= 1
        else:
            self.num_cached_free -= 1

    def release(self, block: Block) -> None:
        """Mutates: a block whose ref_count just reached 0 joins the back of the queue."""
        assert block.ref_count == 0
        # FreeBlockQueue.append, inlined: every released block passes here.
        queue = self.free_queue
        assert not block.in_queue, f"block {block.id} is already in the free queue"
        tail = queue._tail
        last = tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = tail
        tail.prev = block
        block.in_queue = True
        queue._len += 1
        if block.hash is None:
            self.num_empty += 1
            block.num_filled = 0
        else:
            self.num_cached_free += 1

    def register(self, block: Block, key: BlockHash) -> None:
        """Mutates: give a used, full block its prefix-cache key."""
        assert block.hash is None and block.ref_count > 0
        block.hash = key
        content = key.content
        named = self.by_content.setdefault(content, block)
        if named is not block:
            # A second holder of one content: the lower id is the one named.
            twins = self.twins.setdefault(content, {})
            if block.id < named.id:
                self.by_content[content] = block
                block = named
            twins[block.id] = block

    def uncache(self, block: Block) -> None:
        """Mutates: drop a block's key from the prefix cache (eviction)."""
        key = block.hash
        assert key is not None
        content = key.content
        twins = self.twins.get(content) if self.twins else None
        if twins is None:
            assert self.by_content[content] is block
            del self.by_content[content]
        elif self.by_content[content] is block:
            heir = twins.pop(min(twins))
            self.by_content[content] = heir
            if not twins:
                del self.twins[content]
        else:
            del twins[block.id]
            if not twins:
                del self.twins[content]
        block.hash = None

    def reindex(self) -> None:
        """Mutates: rebuild the prefix cache from the blocks' keys (O(pool)).

        For a restore, which writes the blocks directly, and a relabel.
        """
        self.by_content = {}
        self.twins = {}
        for block in self.blocks:  # in id order, so the first holder met is the lowest
            key = block.hash
            if key is not None:
                named = self.by_content.setdefault(key.content, block)
                if named is not block:
                    self.twins.setdefault(key.content, {})[block.id] = block

    def relabel(self, mapping: dict[int, int]) -> None:
        """Mutates: block `old` becomes block `mapping[old]`; a permutation of all ids.

        The Block objects keep their state and their place in the free queue;
        only their ids (and so the id-keyed indexes) change.
        """
        assert sorted(mapping) == sorted(mapping.values()) == list(range(self.num_blocks))
        new_blocks: list[Block | None] = [None] * self.num_blocks
        for block in self.blocks:
            block.id = mapping[block.id]
            new_blocks[block.id] = block
        self.blocks = [b for b in new_blocks if b is not None]
        self.reindex()
