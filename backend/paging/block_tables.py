"""The block manager's state and its reads: block tables over a `BlockPool`.

A sequence (a request, in engine terms) owns a block table: logical block i ->
physical block id. Positions map to slots like virtual addresses to physical
ones::

    block_size = 4, table [9, 2, 14], 9 tokens

    position   0 1 2 3 | 4 5 6 7 | 8 . . .
    logical       0    |    1    |    2
    physical      9    |    2    |   14        position 6 -> logical 1, offset 2,
                                                physical 2, slot 2*4+2 = 10

`BlockTables` holds the pool, the tables and the incremental counters, and
answers every question that changes nothing (translation, planning, metrics,
the integrity check). `BlockManager` (block_manager.py) derives from it and
adds the mutations; this module never imports that one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.paging.block_pool import AllocationMode, Block, BlockPool
from backend.paging.block_types import (
    Address,
    AllocatorMetrics,
    PromptPlan,
    SeqBlocks,
    exact_ints,
    validate_tokens,
)
from backend.paging.checks import (
    check_block_id,
    check_config,
    check_pins,
    check_position,
    prompt_tokens,
)
from backend.paging.events import Event, EventLog
from backend.paging.hashing import BlockHash, SaltRoot, hash_prompt_blocks, salt_root
from backend.paging.integrity import check_integrity

__all__ = ["BlockTables"]

# Cache salts whose root keys are kept for reuse (more are made again as needed).
MAX_ROOTS = 1024


class BlockTables:
    """The state of a `BlockManager` and its read-only methods.

    Built only as a `BlockManager`, which takes the same arguments and
    documents them.
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True,
                 allocation: AllocationMode = "fifo", seed: int = 0, cache_salt: str = "",
                 record_events: bool = True, vocab_size: int = 256) -> None:
        check_config(num_blocks, block_size, allocation)
        self.block_size = block_size
        # Token ids are 0..vocab_size - 1: bytes for tiny-byte, a real model's ids otherwise.
        self.vocab_size = vocab_size
        self.prefix_caching = prefix_caching
        self.cache_salt = cache_salt
        self.pool = BlockPool(num_blocks, allocation=allocation, seed=seed)
        self.seqs: dict[str, SeqBlocks] = {}
        # One root key per request cache salt in use (hashing.SaltRoot).
        self._roots: dict[str, SaltRoot] = {}
        self._log = EventLog()
        self.record_events = record_events
        self.step = 0
        # Incremental counters, so metrics() is O(1) (checked by check_integrity).
        self._filled_used = 0
        # Tokens `append_one` wrote into a block only its sequence holds: each adds
        # one filled slot and one logical token, so one counter serves both
        # (metrics adds it to each).
        self._decoded = 0
        self._shared = 0
        self._table_entries = 0
        self._logical_tokens = 0
        # Totals so far.
        self.cow_copies = 0
        self.prefix_hit_blocks = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_query_tokens = 0
        self.prefix_floor_tokens = 0

    # ---- reads -------------------------------------------------------------

    @property
    def events(self) -> EventLog:
        """Every event recorded so far, in order (a sequence of `Event`; empty when
        `record_events` is off). Assigning a sequence of events replaces the log
        (a snapshot restore does)."""
        return self._log

    @events.setter
    def events(self, events: Iterable[Event]) -> None:
        self._log = EventLog(events)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free and cached)."""
        return self.pool.num_free

    def has(self, seq_id: str) -> bool:
        return seq_id in self.seqs

    def block_table(self, seq_id: str) -> list[int]:
        return list(self._seq(seq_id).block_table)

    def num_tokens(self, seq_id: str) -> int:
        return self._seq(seq_id).num_tokens

    def block(self, block_id: int) -> Block:
        check_block_id(block_id, self.num_blocks)
        return self.pool.blocks[block_id]

    def holders(self, block_id: int) -> list[str]:
        """Sequences whose tables hold `block_id` (O(tables); for display)."""
        return [s.seq_id for s in self.seqs.values() if block_id in s.block_table]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def salt_root(self, cache_salt: str | None) -> SaltRoot | None:
        """The root key of chains salted with `cache_salt` (None: unsalted, no root; and
        without prefix caching, where nothing is keyed, a salt changes nothing).

        The caller has checked the salt (hashing.check_cache_salt)."""
        if cache_salt is None or not self.prefix_caching:
            return None
        root = self._roots.get(cache_salt)
        if root is None:
            if len(self._roots) >= MAX_ROOTS:
                # Only a memo: a root is its digest, and sequences keep their own.
                self._roots.clear()
            root = self._roots[cache_salt] = salt_root(self.cache_salt, cache_salt)
        return root

    def plan_prompt(self, tokens: Sequence[int] | int, *,
                    pinned: Sequence[int] | None = None,
                    cache_salt: str | None = None) -> PromptPlan:
        """Reads only: how a prompt would be placed now. Raises on bad input.

        `tokens` may be a bare count when prefix caching is off (nothing then
        depends on the ids). Raises PagedLabError for a malformed prompt,
        invalid pins, or a prompt that could never fit in the pool even if it
        were empty. With a `cache_salt`, only blocks cached under the same salt
        are hits.
        """
        return self._plan(tokens, pinned, self.salt_root(cache_salt))[0]

    def _plan(self, tokens: Sequence[int] | int, pinned: Sequence[int] | None,
              root: BlockHash | None = None) -> tuple[PromptPlan, list[int] | int]:
        """`plan_prompt`, and the validated tokens (a new list) or the bare count."""
        bs = self.block_size
        pool = self.pool
        # With prefix caching and no pins, the range of the ids is checked last
        # and only past the prefix-cache hits: a hit block's ids equal, one for
        # one, the ids of a cached block, which were checked when it was cached
        # (the types are checked first, so equal means the same ints).
        ints = (exact_ints(tokens) if self.prefix_caching and pinned is None
                and not isinstance(tokens, int) else None)
        lazy = ints is not None
        toks: list[int] | int = ints if ints is not None else prompt_tokens(
            tokens, prefix_caching=self.prefix_caching, vocab_size=self.vocab_size)
        length = toks if isinstance(toks, int) else len(toks)
        if length < 1:
            raise PagedLabError("a prompt needs at least one token")
        n = self.blocks_for(length)
        if n > self.num_blocks and not lazy:
            self._never_fits(length, n)
        keys: list[BlockHash] = []
        hits: list[int] = []
        queued_hits = 0
        if self.prefix_caching and not isinstance(toks, int):
            parent = root
            if pinned is None:
                # A request always computes at least its last prompt token (its
                # logits start the generation), so only blocks wholly before it
                # can be hits. A hit block is found by (parent digest, tokens),
                # the inputs of its digest, compared exactly by the content
                # index; its key is the cached block's own. BlockPool.find,
                # inlined (one per full block of every prompt).
                by_content = pool.by_content.get
                parent_digest = None if root is None else root.digest
                frozen = tuple(toks)  # its slices are the blocks' tuples, made once each
                for start in range(0, (length - 1) // bs * bs, bs):
                    block = by_content((parent_digest, frozen[start:start + bs]))
                    if block is None:
                        break
                    held = block.hash
                    assert held is not None
                    parent = held
                    parent_digest = held.digest
                    keys.append(held)
                    hits.append(block.id)
                    # Hit blocks still in the free queue leave it, so they are
                    # not available for the prompt's new blocks.
                    queued_hits += block.ref_count == 0
            try:
                keys += hash_prompt_blocks(toks[len(hits) * bs:], bs, self.cache_salt, parent)
            except (ValueError, struct.error):
                # A negative id, or one past 32 bits: let the full check name it.
                validate_tokens(toks, vocab_size=self.vocab_size)
                raise
        if pinned is not None:
            check_pins(pool, pinned, n)
            return PromptPlan(n, (), n, pool.num_free, tuple(keys)), toks
        if lazy:
            assert not isinstance(toks, int)
            rest = toks[len(hits) * bs:]
            # The full blocks past the hits were just hashed, which refuses a
            # negative id (bytes() and the unsigned struct both raise), so only
            # the ids past the last full block need their lower bound checked.
            if rest and (max(rest) >= self.vocab_size
                         or min(toks[length // bs * bs:], default=0) < 0):
                validate_tokens(toks, vocab_size=self.vocab_size)  # raises, naming the id
                raise AssertionError("validate_tokens passed an out-of-range id")
            if n > self.num_blocks:
                self._never_fits(length, n)
        return (PromptPlan(n, tuple(hits), n - len(hits), pool.num_free - queued_hits,
                           tuple(keys)), toks)

    def _never_fits(self, length: int, n: int) -> None:
        raise PagedLabError(
            f"a prompt of {counted(length, 'token')} needs {counted(n, 'block')} of "
            f"{self.block_size} but the pool has only {counted(self.num_blocks, 'block')}; "
            "it can never fit")

    def blocks_needed_to_append(self, seq_id: str, num_tokens: int) -> int:
        """Reads only: free blocks an append of `num_tokens` would take, copy-on-write included."""
        seq = self._seq(seq_id)
        return self._blocks_needed(seq, num_tokens)

    def translate(self, seq_id: str, position: int) -> Address:
        """Reads only: the logical block, offset, physical block and slot of a position."""
        seq = self._seq(seq_id)
        check_position(seq_id, seq.num_tokens, position)
        logical, offset = divmod(position, self.block_size)
        physical = seq.block_table[logical]
        return Address(position, logical, offset, physical, physical * self.block_size + offset)

    def slots_of(self, seq_id: str, start: int, stop: int) -> list[int]:
        """Reads only: slots of positions start..stop-1 (already allocated)."""
        seq = self._seq(seq_id)
        assert 0 <= start <= stop <= seq.num_tokens
        bs = self.block_size
        table = seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, stop)]

    def metrics(self) -> AllocatorMetrics:
        """Reads only: O(1)."""
        pool = self.pool
        used = pool.num_blocks - pool.num_free
        filled = self._filled_used + self._decoded
        return AllocatorMetrics(
            used_blocks=used, free_blocks=pool.num_empty, cached_blocks=pool.num_cached_free,
            filled_slots=filled, internal_waste_slots=used * self.block_size - filled,
            shared_blocks=self._shared, cow_copies=self.cow_copies,
            prefix_hit_blocks=self.prefix_hit_blocks, preemptions=self.preemptions,
            num_blocks=pool.num_blocks, block_size=self.block_size,
            logical_tokens=self._logical_tokens + self._decoded,
            blocks_saved_by_sharing=self._table_entries - used,
            prefix_queries=self.prefix_queries, prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_blocks * self.block_size,
            prefix_floor_tokens=self.prefix_floor_tokens,
        )

    # ---- internals ---------------------------------------------------------

    def _seq(self, seq_id: str) -> SeqBlocks:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise PagedLabError(
                f"request {seq_id!r} holds no blocks (unknown, waiting or finished)")
        return seq

    def _blocks_needed(self, seq: SeqBlocks, n: int) -> int:
        bs = self.block_size
        last = self.pool.blocks[seq.block_table[-1]]
        room = bs - last.num_filled
        cow = 1 if (room and last.ref_count > 1) else 0
        return cow + max(0, -(-(n - room) // bs))

    def check_integrity(self) -> None:
        """Reads only: raise IntegrityError if any invariant is broken (O(pool))."""
        check_integrity(self.pool, self.seqs, self.metrics(), block_size=self.block_size,
                        prefix_caching=self.prefix_caching, cache_salt=self.cache_salt)
