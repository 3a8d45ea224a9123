"""The paged KV block manager: block tables, sharing, copy-on-write, prefix caching.

A sequence (a request, in engine terms) owns a block table: logical block i ->
physical block id. Positions map to slots like virtual addresses to physical
ones::

    block_size = 4, table [9, 2, 14], 9 tokens

    position   0 1 2 3 | 4 5 6 7 | 8 . . .
    logical       0    |    1    |    2
    physical      9    |    2    |   14        position 6 -> logical 1, offset 2,
                                                physical 2, slot 2*4+2 = 10

Tables are append-only while a sequence runs: growth adds a block only when
the last one is full, and nothing already written ever moves (except by an
explicit `apply_remap`, which rewrites every table at once).

Every mutating method validates its arguments completely before it changes
anything, so a `PagedLabError` leaves the manager exactly as it was. Each
method says whether it mutates. Costs are O(1) per block touched (plus O(tokens)
for the token bookkeeping of prefix caching).
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.paging.block_pool import AllocationMode, Block, BlockPool
from backend.paging.block_types import (
    Address,
    Allocation,
    AllocatorMetrics,
    AppendResult,
    CowCopy,
    Move,
    PromptPlan,
    SeqBlocks,
    validate_tokens,
)
from backend.paging.events import Event, EventKind
from backend.paging.hashing import hash_block, hash_prompt_blocks
from backend.paging.integrity import check_integrity

MAX_BLOCK_SIZE = 256


__all__ = [
    "Address", "Allocation", "AllocatorMetrics", "AppendResult", "BlockManager", "CowCopy",
    "Move", "PromptPlan", "SeqBlocks", "validate_tokens",
]


class BlockManager:
    """Block tables over a `BlockPool`, with sharing and prefix caching.

    `step` stamps the events; the engine sets it to the number of the
    operation being applied. `cache_salt` names the model settings so that
    blocks computed under other settings never match.
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True,
                 allocation: AllocationMode = "fifo", seed: int = 0, cache_salt: str = "",
                 record_events: bool = True) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise PagedLabError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if (isinstance(block_size, bool) or not isinstance(block_size, int)
                or not 1 <= block_size <= MAX_BLOCK_SIZE):
            raise PagedLabError(
                f"block_size must be an integer in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
        if allocation not in ("fifo", "random"):
            raise PagedLabError(f"allocation must be 'fifo' or 'random', got {allocation!r}")
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.cache_salt = cache_salt
        self.pool = BlockPool(num_blocks, allocation=allocation, seed=seed)
        self.seqs: dict[str, SeqBlocks] = {}
        self.events: list[Event] = []
        self.record_events = record_events
        self.step = 0
        # Incremental counters, so metrics() is O(1) (checked by check_integrity).
        self._filled_used = 0
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
        self._check_block_id(block_id)
        return self.pool.blocks[block_id]

    def holders(self, block_id: int) -> list[str]:
        """Sequences whose tables hold `block_id` (O(tables); for display)."""
        return [s.seq_id for s in self.seqs.values() if block_id in s.block_table]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def plan_prompt(self, tokens: Sequence[int] | int, *,
                    pinned: Sequence[int] | None = None) -> PromptPlan:
        """Reads only: how a prompt would be placed now. Raises on bad input.

        `tokens` may be a bare count when prefix caching is off (nothing then
        depends on the ids). Raises PagedLabError for a malformed prompt,
        invalid pins, or a prompt that could never fit in the pool even if it
        were empty.
        """
        toks = self._prompt_tokens(tokens)
        length = toks if isinstance(toks, int) else len(toks)
        if length < 1:
            raise PagedLabError("a prompt needs at least one token")
        n = self.blocks_for(length)
        if n > self.num_blocks:
            raise PagedLabError(
                f"a prompt of {length} tokens needs {n} blocks of {self.block_size} "
                f"but the pool has only {self.num_blocks} blocks; it can never fit")
        keys = (tuple(hash_prompt_blocks(toks, self.block_size, self.cache_salt))
                if self.prefix_caching and not isinstance(toks, int) else ())
        if pinned is not None:
            self._check_pins(pinned, n)
            return PromptPlan(n, (), n, self.pool.num_free, keys)
        hits: list[int] = []
        # A request always computes at least its last prompt token (its logits
        # start the generation), so only blocks wholly before it can be hits.
        for key in keys[: (length - 1) // self.block_size]:
            block = self.pool.lookup(key)
            if block is None:
                break
            hits.append(block.id)
        # Hit blocks still in the free queue leave it, so they are not available
        # for the prompt's new blocks.
        queued_hits = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        return PromptPlan(n, tuple(hits), n - len(hits), self.pool.num_free - queued_hits, keys)

    def blocks_needed_to_append(self, seq_id: str, num_tokens: int) -> int:
        """Reads only: free blocks an append of `num_tokens` would take, copy-on-write included."""
        seq = self._seq(seq_id)
        return self._blocks_needed(seq, num_tokens)

    def translate(self, seq_id: str, position: int) -> Address:
        """Reads only: the logical block, offset, physical block and slot of a position."""
        seq = self._seq(seq_id)
        if isinstance(position, bool) or not isinstance(position, int):
            raise PagedLabError(f"position must be an integer, got {position!r}")
        if not 0 <= position < seq.num_tokens:
            raise PagedLabError(
                f"request {seq_id!r} holds positions 0..{seq.num_tokens - 1}; "
                f"position {position} is outside it")
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
        return AllocatorMetrics(
            used_blocks=used, free_blocks=pool.num_empty, cached_blocks=pool.num_cached_free,
            filled_slots=self._filled_used,
            internal_waste_slots=used * self.block_size - self._filled_used,
            shared_blocks=self._shared, cow_copies=self.cow_copies,
            prefix_hit_blocks=self.prefix_hit_blocks, preemptions=self.preemptions,
            num_blocks=pool.num_blocks, block_size=self.block_size,
            logical_tokens=self._logical_tokens,
            blocks_saved_by_sharing=self._table_entries - used,
            prefix_queries=self.prefix_queries, prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_blocks * self.block_size,
            prefix_floor_tokens=self.prefix_floor_tokens,
        )

    # ---- mutations ---------------------------------------------------------

    def allocate(self, seq_id: str, tokens: Sequence[int] | int, *,
                 pinned: Sequence[int] | None = None) -> Allocation:
        """Mutates: admit a sequence with its prompt tokens.

        Full prompt blocks already in the prefix cache are shared (their ref
        counts rise; cached ones leave the free queue); the rest come from the
        free queue, or from `pinned` (physical ids, in order, each in state
        "free": ref count 0 and no cached prefix; no cache lookup then).
        Raises PagedLabError for a duplicate id or bad input, OutOfBlocksError
        if the pool lacks room right now.
        """
        self._check_new_id(seq_id)
        plan = self.plan_prompt(tokens, pinned=pinned)
        if not plan.fits_now:
            raise OutOfBlocksError(
                f"request {seq_id!r} needs {plan.num_new_blocks} free blocks but only "
                f"{plan.num_available} are free")
        toks = [] if isinstance(tokens, int) else list(tokens)
        length = tokens if isinstance(tokens, int) else len(toks)
        bs = self.block_size
        if self.prefix_caching and pinned is None:
            self.prefix_queries += 1
            self.prefix_query_tokens += length
            self.prefix_floor_tokens += length - (length - 1) // bs * bs
        table: list[int] = []
        for block_id in plan.hit_blocks:
            block = self.pool.blocks[block_id]
            if block.ref_count == 0:
                self.pool.take(block)
                self._filled_used += block.num_filled
            self._incref(block)
            table.append(block_id)
            self.prefix_hit_blocks += 1
            self._emit("prefix_hit", seq_id, block_id, ref_count=block.ref_count)
        new: list[int] = []
        for i in range(len(plan.hit_blocks), plan.num_blocks):
            if pinned is not None:
                block = self.pool.blocks[pinned[i]]
                self.pool.take(block)
                block.ref_count = 1
                block.num_filled = 0
            else:
                block, evicted = self.pool.pop_free()
                if evicted is not None:
                    self._emit("evict", seq_id, block.id)
            block.num_filled = min(bs, length - i * bs)
            self._filled_used += block.num_filled
            if self.prefix_caching and i < len(plan.keys):
                self.pool.register(block, plan.keys[i])
            table.append(block.id)
            new.append(block.id)
            self._emit("alloc", seq_id, block.id, ref_count=1)
        self._table_entries += len(table)
        self._logical_tokens += length
        tail = length % bs
        self.seqs[seq_id] = SeqBlocks(
            seq_id, table, length,
            tail_tokens=toks[length - tail:] if (tail and self.prefix_caching) else [],
            last_hash=plan.keys[-1] if plan.keys else None,
        )
        return Allocation(tuple(table), len(plan.hit_blocks) * bs, plan.hit_blocks, tuple(new))

    def append(self, seq_id: str, tokens: Sequence[int] | None = None, *,
               num_tokens: int | None = None) -> AppendResult:
        """Mutates: append tokens to a sequence, allocating blocks as needed.

        Writing into a last block whose ref count is above one first gives
        this sequence a private copy of it (copy-on-write; the caller copies
        the K/V data). Pass `tokens` when prefix caching is on (they key the
        blocks they fill); `num_tokens` alone suffices when it is off. All or
        nothing: raises OutOfBlocksError before changing anything if the free
        blocks do not suffice.
        """
        seq = self._seq(seq_id)
        toks: list[int] | None = None
        if tokens is not None:
            toks = validate_tokens(tokens, "appended")
            n = len(toks)
            if num_tokens is not None and num_tokens != n:
                raise PagedLabError("append: num_tokens disagrees with len(tokens)")
        else:
            if self.prefix_caching:
                raise PagedLabError("append needs the token ids when prefix caching is on")
            n = 1 if num_tokens is None else num_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PagedLabError(f"append needs at least one token, got {n!r}")
        needed = self._blocks_needed(seq, n)
        if needed > self.pool.num_free:
            raise OutOfBlocksError(
                f"request {seq_id!r} needs {needed} free block(s) for {n} more token(s) "
                f"but only {self.pool.num_free} are free")
        bs = self.block_size
        cow = None
        table = seq.block_table
        last = self.pool.blocks[table[-1]]
        if last.num_filled < bs and last.ref_count > 1:
            cow = self._copy_on_write(seq, last)
        slots: list[int] = []
        new: list[int] = []
        hashing = toks is not None and self.prefix_caching
        done = 0
        # Block by block, so a bulk append costs O(blocks touched), not O(tokens).
        while done < n:
            last = self.pool.blocks[table[-1]]
            if last.num_filled == bs:
                last, evicted = self.pool.pop_free()
                if evicted is not None:
                    self._emit("evict", seq_id, last.id)
                table.append(last.id)
                new.append(last.id)
                self._table_entries += 1
                self._emit("alloc", seq_id, last.id, ref_count=1)
            take = min(bs - last.num_filled, n - done)
            first = last.id * bs + last.num_filled
            slots.extend(range(first, first + take))
            last.num_filled += take
            if hashing:
                assert toks is not None
                seq.tail_tokens.extend(toks[done:done + take])
                if last.num_filled == bs:
                    key = hash_block(seq.last_hash, seq.tail_tokens, self.cache_salt)
                    self.pool.register(last, key)
                    seq.last_hash = key
                    seq.tail_tokens = []
            done += take
        self._filled_used += n
        seq.num_tokens += n
        self._logical_tokens += n
        return AppendResult(tuple(slots), tuple(new), cow)

    def fork(self, parent_id: str, child_id: str) -> None:
        """Mutates: the child shares every block of the parent; nothing is copied."""
        parent = self._seq(parent_id)
        self._check_new_id(child_id)
        for block_id in parent.block_table:
            block = self.pool.blocks[block_id]
            self._incref(block)
            self._emit("share", child_id, block_id, ref_count=block.ref_count)
        self._table_entries += len(parent.block_table)
        self._logical_tokens += parent.num_tokens
        self.seqs[child_id] = SeqBlocks(child_id, list(parent.block_table), parent.num_tokens,
                                        list(parent.tail_tokens), parent.last_hash)

    def free(self, seq_id: str, *, preempted: bool = False) -> list[int]:
        """Mutates: release a sequence's blocks; returns those whose count reached 0.

        Blocks are released tail first, so the prefix blocks (the likeliest to
        be reused) sit nearest the back of the queue and are evicted last.
        """
        seq = self._seq(seq_id)
        if preempted:
            self.preemptions += 1
            self._emit("preempt", seq_id, None)
        released: list[int] = []
        for block_id in reversed(seq.block_table):
            block = self.pool.blocks[block_id]
            self._decref(block)
            if block.ref_count == 0:
                self._filled_used -= block.num_filled
                self.pool.release(block)
                released.append(block_id)
            self._emit("free", seq_id, block_id, ref_count=block.ref_count)
        self._table_entries -= len(seq.block_table)
        self._logical_tokens -= seq.num_tokens
        del self.seqs[seq_id]
        return released

    def plan_remap(self, seed: int) -> dict[int, int]:
        """Reads only: a permutation of all block ids that moves every used block.

        Used blocks never map to themselves (a pool of one block is the only
        exception). Free and cached blocks are permuted too; their place in
        the free queue is kept.
        """
        import random

        n = self.num_blocks
        rng = random.Random(seed)
        perm = list(range(n))
        rng.shuffle(perm)
        if n > 1:
            for b in range(n):
                if perm[b] == b and self.pool.blocks[b].ref_count > 0:
                    # Swapping with any other index removes this fixed point
                    # without creating another (perm is a bijection).
                    j = rng.randrange(n - 1)
                    j += j >= b
                    perm[b], perm[j] = perm[j], perm[b]
        return dict(enumerate(perm))

    def apply_remap(self, mapping: dict[int, int]) -> list[Move]:
        """Mutates: relabel every block by `mapping` and rewrite every table.

        Returns the moves whose data must be copied (used and cached blocks
        that changed id). Raises PagedLabError if `mapping` is not a
        permutation of the pool's ids.
        """
        n = self.num_blocks
        if sorted(mapping) != list(range(n)) or sorted(mapping.values()) != list(range(n)):
            raise PagedLabError(f"a remap must be a permutation of the block ids 0..{n - 1}")
        moves = [Move(b.id, mapping[b.id]) for b in self.pool.blocks
                 if (b.ref_count > 0 or b.hash is not None) and mapping[b.id] != b.id]
        for seq in self.seqs.values():
            seq.block_table[:] = [mapping[b] for b in seq.block_table]
        self.pool.relabel(mapping)
        for m in moves:
            self._emit("move", None, m.dst, src=m.src, dst=m.dst)
        return moves

    # ---- internals ---------------------------------------------------------

    def _seq(self, seq_id: str) -> SeqBlocks:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise PagedLabError(
                f"request {seq_id!r} holds no blocks (unknown, waiting or finished)")
        return seq

    def _prompt_tokens(self, tokens: Sequence[int] | int) -> list[int] | int:
        if isinstance(tokens, bool):
            raise PagedLabError("a prompt is a list of token ids or a token count")
        if isinstance(tokens, int):
            if self.prefix_caching:
                raise PagedLabError("a prompt needs its token ids when prefix caching is on")
            return tokens
        return validate_tokens(tokens)

    def _check_new_id(self, seq_id: str) -> None:
        if not isinstance(seq_id, str) or not seq_id:
            raise PagedLabError(f"request id must be a non-empty string, got {seq_id!r}")
        if seq_id in self.seqs:
            raise PagedLabError(f"request {seq_id!r} already exists")

    def _check_block_id(self, block_id: int) -> None:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not (
                0 <= block_id < self.num_blocks):
            raise PagedLabError(
                f"block {block_id!r} does not exist; ids run 0..{self.num_blocks - 1}")

    def _check_pins(self, pinned: Sequence[int], n: int) -> None:
        pins = list(pinned)
        if len(pins) != n:
            raise PagedLabError(f"the prompt needs {n} blocks but {len(pins)} were pinned")
        for b in pins:
            self._check_block_id(b)
        if len(set(pins)) != len(pins):
            raise PagedLabError(f"pinned blocks {pins} name a block twice")
        for b in pins:
            block = self.pool.blocks[b]
            if block.ref_count > 0:
                raise PagedLabError(f"pinned block {b} is not free (ref count {block.ref_count})")
            if block.hash is not None:
                raise PagedLabError(f"pinned block {b} is not free: it is cached (it keeps a "
                                    "prefix for reuse); pin free blocks only")

    def _blocks_needed(self, seq: SeqBlocks, n: int) -> int:
        bs = self.block_size
        last = self.pool.blocks[seq.block_table[-1]]
        room = bs - last.num_filled
        cow = 1 if (room and last.ref_count > 1) else 0
        return cow + max(0, -(-(n - room) // bs))

    def _copy_on_write(self, seq: SeqBlocks, src: Block) -> CowCopy:
        dst, evicted = self.pool.pop_free()
        if evicted is not None:
            self._emit("evict", seq.seq_id, dst.id)
        dst.num_filled = src.num_filled
        self._filled_used += dst.num_filled
        self._decref(src)
        seq.block_table[-1] = dst.id
        self.cow_copies += 1
        self._emit("cow", seq.seq_id, dst.id, src=src.id, dst=dst.id, ref_count=1)
        return CowCopy(src.id, dst.id, src.num_filled)

    def _incref(self, block: Block) -> None:
        block.ref_count += 1
        if block.ref_count == 2:
            self._shared += 1

    def _decref(self, block: Block) -> None:
        assert block.ref_count > 0
        if block.ref_count == 2:
            self._shared -= 1
        block.ref_count -= 1

    def _emit(self, kind: EventKind, request: str | None, block: int | None, *,
              src: int | None = None, dst: int | None = None,
              ref_count: int | None = None) -> None:
        if self.record_events:
            self.events.append(Event(self.step, kind, request, block, src, dst, ref_count))

    def check_integrity(self) -> None:
        """Reads only: raise IntegrityError if any invariant is broken (O(pool))."""
        check_integrity(self.pool, self.seqs, self.metrics(), block_size=self.block_size,
                        prefix_caching=self.prefix_caching, cache_salt=self.cache_salt)

    def recount(self) -> None:
        """Mutates: recompute the incremental counters from the structures.

        Used after a snapshot restore has written blocks, queue and tables
        directly; `check_integrity` then proves the result consistent.
        """
        pool = self.pool
        used = [b for b in pool.blocks if b.ref_count > 0]
        self._filled_used = sum(b.num_filled for b in used)
        self._shared = sum(1 for b in used if b.ref_count >= 2)
        self._table_entries = sum(len(s.block_table) for s in self.seqs.values())
        self._logical_tokens = sum(s.num_tokens for s in self.seqs.values())
        pool.num_empty = sum(1 for b in pool.free_queue if b.hash is None)
        pool.num_cached_free = len(pool.free_queue) - pool.num_empty
