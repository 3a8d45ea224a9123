"""The paged KV block manager: block tables, sharing, copy-on-write, prefix caching.

`BlockManager` adds the mutations (allocate, append, fork, free, remap) to
`BlockTables` (block_tables.py), which holds the tables and answers the reads;
the address diagram is there.

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

from backend.core.errors import OutOfBlocksError
from backend.core.words import agrees, counted
from backend.paging.block_pool import Block
from backend.paging.block_tables import BlockTables
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
from backend.paging.checks import append_tokens, check_new_id
from backend.paging.events import (
    ALLOC,
    COW,
    EVICT,
    FORK,
    FREE,
    KIND_BITS,
    MOVE,
    PREEMPT,
    PREFIX_HIT,
    SHARE,
)
from backend.paging.hashing import BlockHash, SaltRoot, hash_block
from backend.paging.remap import apply_remap, plan_remap

__all__ = [
    "Address", "Allocation", "AllocatorMetrics", "AppendResult", "BlockManager", "CowCopy",
    "Move", "PromptPlan", "SeqBlocks", "validate_tokens",
]


class BlockManager(BlockTables):
    """Block tables over a `BlockPool`, with sharing and prefix caching.

    It inherits its constructor, state and reads from `BlockTables`. `step`
    stamps the events; the engine sets it to the number of the
    operation being applied. `cache_salt` names the model settings so that
    blocks computed under other settings never match.
    """

    # ---- mutations ---------------------------------------------------------

    def allocate(self, seq_id: str, tokens: Sequence[int] | int, *,
                 pinned: Sequence[int] | None = None,
                 prompt_len: int | None = None,
                 cache_salt: str | None = None,
                 shared: Sequence[int] = ()) -> Allocation:
        """Mutates: admit a sequence with its prompt tokens.

        Full prompt blocks already in the prefix cache are shared (their ref
        counts rise; cached ones leave the free queue); the rest come from the
        free queue, or from `pinned` (physical ids, in order, each in state
        "free": ref count 0 and no cached prefix; no cache lookup then).
        `prompt_len` is the whole prompt's length when `tokens` is only its first
        prefill chunk (which finds the same hits): the prefix-cache query counts
        the prompt, not the chunk. A `cache_salt` (checked by the caller) keys the
        sequence's blocks under that salt: it shares only blocks cached under it.
        `shared` (a list `tokens`, no `pinned`): held blocks that already hold the
        K/V of the first tokens, every one full but a last that ends them (a beam
        that another beam of its group brought back from the host pool): they are
        shared, a `share` event each, and the tokens after them allocated as above,
        their prefix-cache keys chained after the last shared block's; the
        Allocation's hits and new blocks are those past the shared ones.
        Raises PagedLabError for a duplicate id or bad input, OutOfBlocksError
        if the pool lacks room right now.
        """
        check_new_id(seq_id, self.seqs)
        # Tested here first: an unsalted request (most) makes no call.
        root = None if cache_salt is None else self.salt_root(cache_salt)
        chain: BlockHash | None = root
        offset = 0
        if shared:
            assert pinned is None and prompt_len is None and not isinstance(tokens, int)
            offset = len(shared) * self.block_size
            if offset >= len(tokens):
                return self._share_all(seq_id, tokens, shared, root)
            # Every shared block is full here, and in a caching pool keyed.
            assert all(self.pool.blocks[b].num_filled == self.block_size for b in shared)
            chain = self.pool.blocks[shared[-1]].hash if self.prefix_caching else root
            assert chain is not None or not self.prefix_caching
            plan, toks = self._plan(tokens[offset:], pinned, chain)
        else:
            plan, toks = self._plan(tokens, pinned, chain)
        if not plan.fits_now:
            raise OutOfBlocksError(
                f"request {seq_id!r} needs {counted(plan.num_new_blocks, 'free block')} but "
                f"only {plan.num_available} {agrees(plan.num_available, 'is', 'are')} free")
        length = toks if isinstance(toks, int) else len(toks)
        bs = self.block_size
        pool = self.pool
        blocks = pool.blocks
        caching = self.prefix_caching
        if shared:
            self._share_blocks(seq_id, shared)
        # Events go to the log as flat records (events.EventLog), their codes
        # made once per call.
        record = self._log.record if self.record_events else None
        step = self.step << KIND_BITS
        hit_code, alloc_code, evict_code = step | PREFIX_HIT, step | ALLOC, step | EVICT
        if caching and pinned is None:
            asked = length if prompt_len is None else prompt_len
            self.prefix_queries += 1
            self.prefix_query_tokens += asked
            self.prefix_floor_tokens += asked - (asked - 1) // bs * bs
        table = [*shared, *plan.hit_blocks]
        filled_total = 0
        now_shared = 0      # hit blocks that this hit makes shared (ref count 1 -> 2)
        cached_hits = 0
        for block_id in plan.hit_blocks:
            block = blocks[block_id]
            rc = block.ref_count
            if rc == 0:
                # A cached free block leaves the queue: BlockPool.take, inlined
                # (a returning conversation takes most of its prompt this way).
                assert block.in_queue and block.hash is not None
                prev, nxt = block.prev, block.next
                assert prev is not None and nxt is not None
                prev.next = nxt
                nxt.prev = prev
                block.prev = block.next = None
                block.in_queue = False
                cached_hits += 1
                filled_total += block.num_filled
            elif rc == 1:
                now_shared += 1
            block.ref_count = rc = rc + 1
            if record is not None:
                record((hit_code, seq_id, block_id, rc))
        pool.free_queue._len -= cached_hits
        pool.num_cached_free -= cached_hits
        self.prefix_hit_blocks += len(plan.hit_blocks)
        self._shared += now_shared
        new: list[int] = []
        keys = plan.keys
        num_keys = len(keys) if caching else 0
        last = plan.num_blocks - 1
        for i in range(len(plan.hit_blocks), plan.num_blocks):
            if pinned is not None:
                block = blocks[pinned[i]]
                pool.take(block)
                block.ref_count = 1
            else:
                block, evicted = pool.pop_free()
                if evicted is not None and record is not None:
                    record((evict_code, seq_id, block.id, None))
            # Every block but the last is full.
            filled = bs if i < last else length - i * bs
            block.num_filled = filled
            filled_total += filled
            if i < num_keys:
                pool.register(block, keys[i])
            table.append(block.id)
            new.append(block.id)
            if record is not None:
                record((alloc_code, seq_id, block.id, 1))
        self._filled_used += filled_total
        self._table_entries += len(table)
        self._logical_tokens += offset + length
        tail = length % bs
        self.seqs[seq_id] = SeqBlocks(  # tail tokens, last hash, tail block, root
            seq_id, table, offset + length,
            toks[length - tail:] if tail and caching and not isinstance(toks, int) else [],
            keys[-1] if keys else chain, blocks[table[-1]], root,
        )
        return Allocation(tuple(table), len(plan.hit_blocks) * bs, plan.hit_blocks, tuple(new))

    def _share_all(self, seq_id: str, tokens: Sequence[int], shared: Sequence[int],
                   root: SaltRoot | None) -> Allocation:
        """Mutates: `allocate` where the shared blocks hold every token (nothing new)."""
        bs = self.block_size
        blocks = self.pool.blocks
        length = len(tokens)
        assert self.blocks_for(length) == len(shared)
        self._share_blocks(seq_id, shared)
        tail = length % bs
        full = len(shared) - (1 if tail else 0)
        last_hash = blocks[shared[full - 1]].hash if full and self.prefix_caching else root
        self._table_entries += len(shared)
        self._logical_tokens += length
        self.seqs[seq_id] = SeqBlocks(
            seq_id, list(shared), length,
            list(tokens[length - tail:]) if tail and self.prefix_caching else [],
            last_hash, blocks[shared[-1]], root)
        return Allocation(tuple(shared), 0, (), ())

    def _share_blocks(self, seq_id: str, shared: Sequence[int]) -> None:
        """Mutates: `seq_id` takes a holder's share of each held block (a `share` each)."""
        for block_id in shared:
            block = self.pool.blocks[block_id]
            assert block.ref_count > 0
            self._incref(block)
            self._emit(SHARE, seq_id, block_id, ref_count=block.ref_count)

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
        toks, n = append_tokens(tokens, num_tokens, prefix_caching=self.prefix_caching,
                                vocab_size=self.vocab_size)
        needed = self._blocks_needed(seq, n)
        if needed > self.pool.num_free:
            raise OutOfBlocksError(
                f"request {seq_id!r} needs {counted(needed, 'free block')} for "
                f"{counted(n, 'more token')} but only {self.pool.num_free} "
                f"{agrees(self.pool.num_free, 'is', 'are')} free")
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
                    self._emit(EVICT, seq_id, last.id)
                table.append(last.id)
                new.append(last.id)
                self._table_entries += 1
                self._emit(ALLOC, seq_id, last.id, ref_count=1)
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
        seq.tail_block = self.pool.blocks[table[-1]]
        return AppendResult(tuple(slots), tuple(new), cow)

    def append_one(self, seq_id: str, token: int) -> tuple[int, CowCopy | None]:
        """Mutates: append one token; returns its slot and the copy-on-write made first.

        The decode step's call. Exactly `append(seq_id, [token])` (the same
        state, events, metrics and errors; `slot` and `cow` are that result's
        `slots[0]` and `cow`) without building the result: a token written into
        an unshared tail block with room touches no list and builds no object,
        a token that fills a block keys it for the prefix cache, and one that
        finds the tail full takes the next free block. A copy-on-write and
        every refusal (unknown id, bad token, no free block) take `append`'s
        path. O(1).
        """
        try:
            seq = self.seqs[seq_id]
        except KeyError:
            return self._append_general(seq_id, token)
        # `__class__ is int` passes exactly the ints (not bools, not subclasses);
        # anything else is checked, and refused, by the general path.
        if token.__class__ is not int or not 0 <= token < self.vocab_size:
            return self._append_general(seq_id, token)
        block = seq.tail_block
        if block is None:
            block = seq.tail_block = self.pool.blocks[seq.block_table[-1]]
        bs = self.block_size
        offset = block.num_filled  # where the token goes
        if offset == bs:
            pool = self.pool
            if not pool.free_queue._len:
                return self._append_general(seq_id, token)
            block, evicted = pool.pop_free()
            if self.record_events:
                record = self._log.record
                code = self.step << KIND_BITS
                if evicted is not None:
                    record((code | EVICT, seq_id, block.id, None))
                record((code | ALLOC, seq_id, block.id, 1))
            seq.block_table.append(block.id)
            seq.tail_block = block
            self._table_entries += 1
            offset = 0
        elif block.ref_count > 1:
            return self._append_general(seq_id, token)
        block.num_filled = filled = offset + 1
        if self.prefix_caching:
            seq.tail_tokens.append(token)
            if filled == bs:
                key = hash_block(seq.last_hash, seq.tail_tokens, self.cache_salt)
                self.pool.register(block, key)
                seq.last_hash = key
                seq.tail_tokens = []
        self._decoded += 1  # a filled slot and a logical token (metrics)
        seq.num_tokens += 1
        return block.id * bs + offset, None

    def _append_general(self, seq_id: str, token: int) -> tuple[int, CowCopy | None]:
        result = self.append(seq_id, [token])
        return result.slots[0], result.cow

    def fork(self, parent_id: str, child_id: str) -> None:
        """Mutates: the child shares every block of the parent; nothing is copied.

        Events: a `fork` naming the child, then a `share` per block of the parent.
        """
        parent = self._seq(parent_id)
        check_new_id(child_id, self.seqs)
        self._emit(FORK, child_id, None)
        self._share_blocks(child_id, parent.block_table)
        self._table_entries += len(parent.block_table)
        self._logical_tokens += parent.num_tokens
        self.seqs[child_id] = SeqBlocks(child_id, list(parent.block_table), parent.num_tokens,
                                        list(parent.tail_tokens), parent.last_hash,
                                        parent.tail_block, parent.root)

    def free(self, seq_id: str, *, preempted: bool = False) -> list[int]:
        """Mutates: release a sequence's blocks; returns those whose count reached 0.

        Blocks are released tail first, so the prefix blocks (the likeliest to
        be reused) sit nearest the back of the queue and are evicted last.
        """
        seq = self._seq(seq_id)
        record = self._log.record if self.record_events else None
        code = self.step << KIND_BITS
        free_code = code | FREE
        if preempted:
            self.preemptions += 1
            if record is not None:
                record((code | PREEMPT, seq_id, None, None))
        # Each block whose count reaches 0 joins the back of the free queue as it
        # is met (BlockPool.release, inlined: the queue is linked in one pass).
        pool = self.pool
        blocks = pool.blocks
        queue = pool.free_queue
        tail = queue._tail
        last = tail.prev
        assert last is not None
        released: list[int] = []
        filled = shared = empty = 0
        for block_id in reversed(seq.block_table):
            block = blocks[block_id]
            block.ref_count = rc = block.ref_count - 1
            if rc == 0:
                assert not block.in_queue, block_id
                filled += block.num_filled
                last.next = block
                block.prev = last
                block.in_queue = True
                last = block
                if block.hash is None:
                    empty += 1
                    block.num_filled = 0
                released.append(block_id)
            else:
                assert rc > 0, block_id
                shared += rc == 1
            if record is not None:
                record((free_code, seq_id, block_id, rc))
        if released:
            last.next = tail
            tail.prev = last
            queue._len += len(released)
            pool.num_empty += empty
            pool.num_cached_free += len(released) - empty
        self._filled_used -= filled
        self._shared -= shared
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
        return plan_remap(self.pool, seed)

    def apply_remap(self, mapping: dict[int, int]) -> list[Move]:
        """Mutates: relabel every block by `mapping` and rewrite every table.

        Returns the moves whose data must be copied (used and cached blocks
        that changed id). Raises PagedLabError if `mapping` is not a
        permutation of the pool's ids.
        """
        moves = apply_remap(self.pool, self.seqs, mapping)
        for m in moves:
            self._emit(MOVE, None, m.dst, src=m.src, dst=m.dst)
        return moves

    # ---- internals ---------------------------------------------------------

    def _copy_on_write(self, seq: SeqBlocks, src: Block) -> CowCopy:
        dst, evicted = self.pool.pop_free()
        if evicted is not None:
            self._emit(EVICT, seq.seq_id, dst.id)
        dst.num_filled = src.num_filled
        self._filled_used += dst.num_filled
        self._decref(src)
        seq.block_table[-1] = dst.id
        seq.tail_block = dst
        self.cow_copies += 1
        self._emit(COW, seq.seq_id, dst.id, src=src.id, dst=dst.id, ref_count=1)
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

    def _emit(self, kind: int, request: str | None, block: int | None, *,
              src: int | None = None, dst: int | None = None,
              ref_count: int | None = None) -> None:
        """Record one event of kind code `kind` (events.KIND_CODES), if events are on."""
        if self.record_events:
            self._log.add(self.step, kind, request, block, src, dst, ref_count)

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
        self._decoded = 0
        for seq in self.seqs.values():
            seq.tail_block = pool.blocks[seq.block_table[-1]]
        pool.num_empty = sum(1 for b in pool.free_queue if b.hash is None)
        pool.num_cached_free = len(pool.free_queue) - pool.num_empty
