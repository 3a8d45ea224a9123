"""`check_integrity`: proves the block manager's invariants, or raises with counts.

Kept apart from the manager because it recomputes everything from scratch
(O(blocks + table entries + hashed tokens)) and so must never sit on a hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from backend.core.errors import IntegrityError
from backend.core.words import agrees, counted
from backend.paging.block_pool import BlockPool
from backend.paging.block_types import AllocatorMetrics, SeqBlocks
from backend.paging.hashing import BlockHash, SaltRoot, block_digest, salt_root_digest


def check_integrity(pool: BlockPool, seqs: Mapping[str, SeqBlocks], metrics: AllocatorMetrics,
                    *, block_size: int, prefix_caching: bool, cache_salt: str) -> None:
    """Raise IntegrityError naming the first broken invariant of a block manager's state.

    Takes the manager's parts rather than the manager, so this module sits
    below the block manager and the two never import each other.

    - every block is in exactly one state (used / cached / free), and the free
      queue holds exactly the blocks with ref count 0, once each, linked both ways;
    - every ref count equals the number of tables holding the block;
    - every hash matches its tokens and its parent, and the content index
      names, for each content some key holds, its lowest-id holder (the
      others as its twins) and nothing else;
    - every table has ceil(num_tokens / block_size) entries, all full but the
      last, and the last holds exactly the remaining tokens (and is the Block
      the sequence keeps as its tail, where it keeps one);
    - the incremental counters equal a recount.
    """
    bs = block_size
    problems: list[str] = []

    holders: Counter[int] = Counter()
    for seq in seqs.values():
        if len(set(seq.block_table)) != len(seq.block_table):
            problems.append(f"request {seq.seq_id!r} holds a block twice: {seq.block_table}")
        holders.update(seq.block_table)
        root = seq.root
        if root is not None and (not isinstance(root, SaltRoot) or root.digest
                                 != salt_root_digest(cache_salt, root.cache_salt)):
            problems.append(f"request {seq.seq_id!r}: its cache salt's root key does not "
                            "match the salt")
        expect = -(-seq.num_tokens // bs)
        if seq.num_tokens < 1 or len(seq.block_table) != expect:
            problems.append(f"request {seq.seq_id!r} has {seq.num_tokens} tokens but "
                            f"{len(seq.block_table)} blocks (expected {expect})")
            continue
        tail = seq.tail_block
        if tail is not None and tail is not pool.blocks[seq.block_table[-1]]:
            problems.append(f"request {seq.seq_id!r} keeps block {tail.id} as its last block "
                            f"but its table ends with {seq.block_table[-1]}")
        for i, b in enumerate(seq.block_table):
            want = bs if i < expect - 1 else seq.num_tokens - (expect - 1) * bs
            got = pool.blocks[b].num_filled
            if got != want:
                problems.append(f"request {seq.seq_id!r} logical block {i} (physical {b}) "
                                f"has {counted(got, 'filled slot')}, expected {want}")
            key = pool.blocks[b].hash
            full = want == bs
            if prefix_caching and full and key is None:
                problems.append(f"request {seq.seq_id!r}: full block {b} has no hash")
            if key is not None:
                prev = pool.blocks[seq.block_table[i - 1]].hash if i else seq.root
                want_parent = None if prev is None else prev.digest
                if (i and prev is None) or key.parent_digest != want_parent:
                    origin = f"block {seq.block_table[i - 1]}" if i else "the start"
                    # Salts are named only where both are known: a key that is itself a
                    # root has no parent, and without prefix caching no root is kept.
                    why = ("" if i or not key.tokens or not prefix_caching
                           else _salts_differ(key.parent, seq.root))
                    problems.append(f"request {seq.seq_id!r}: block {b}'s hash does not chain "
                                    f"from {origin}{why}")
        if prefix_caching:
            full_blocks = seq.num_tokens // bs
            last = (pool.blocks[seq.block_table[full_blocks - 1]].hash if full_blocks
                    else seq.root)
            if seq.last_hash is not last and (
                    last is None or seq.last_hash is None
                    or seq.last_hash.digest != last.digest):
                problems.append(f"request {seq.seq_id!r}: its chain parent is not the hash of "
                                "its last full block")
            if len(seq.tail_tokens) != seq.num_tokens % bs:
                problems.append(f"request {seq.seq_id!r} tracks {len(seq.tail_tokens)} tail "
                                f"tokens, expected {seq.num_tokens % bs}")

    queued = list(pool.free_queue)
    queued_ids = [b.id for b in queued]
    if len(set(queued_ids)) != len(queued_ids):
        problems.append("a block appears twice in the free queue")
    if len(queued) != len(pool.free_queue):
        problems.append(f"free queue length {len(pool.free_queue)} but {len(queued)} linked")
    node = pool.free_queue._tail.prev
    backward = 0
    while node is not None and node is not pool.free_queue._head:
        backward += 1
        node = node.prev
    if backward != len(queued):
        problems.append(f"free queue links disagree: {len(queued)} forward, {backward} backward")
    in_queue = set(queued_ids)

    empty = cached = filled = shared = 0
    # Each content some key holds -> the ids holding it, lowest first (blocks in id order).
    holders_of: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
    for block in pool.blocks:
        state = block.state
        if block.ref_count != holders[block.id]:
            problems.append(f"block {block.id} has ref count {block.ref_count} but "
                            f"{counted(holders[block.id], 'table')} "
                            f"{agrees(holders[block.id], 'holds', 'hold')} it")
        if (block.id in in_queue) != (block.ref_count == 0) or block.in_queue != (
                block.id in in_queue):
            problems.append(f"block {block.id} is {state} but "
                            f"{'is' if block.id in in_queue else 'is not'} in the free queue")
        if not 0 <= block.num_filled <= bs:
            problems.append(f"block {block.id} has {counted(block.num_filled, 'filled slot')}")
        if state == "free":
            empty += 1
            if block.num_filled:
                problems.append(f"free block {block.id} claims "
                                f"{counted(block.num_filled, 'filled slot')}")
        elif state == "cached":
            cached += 1
        else:
            filled += block.num_filled
            shared += block.ref_count >= 2
        key = block.hash
        if key is not None:
            if not prefix_caching:
                problems.append(f"block {block.id} holds a hash but prefix caching is off")
            if block.num_filled != bs or len(key.tokens) != bs:
                problems.append(f"block {block.id} holds a hash but is not full")
            if (block_digest(key.parent_digest, key.tokens, cache_salt) != key.digest
                    or key.content[1] != key.tokens):
                problems.append(f"block {block.id}'s hash does not match its tokens")
            holders_of.setdefault(key.content, []).append(block.id)
    # The prefix cache: every key's content is indexed, by the lowest-id block
    # holding it, with the other holders as its twins, and nothing else.
    index = {content: b.id for content, b in pool.by_content.items()}
    twins = {content: sorted(t) for content, t in pool.twins.items()}
    # Each entry must be the pool's own Block of that id (not a stale object).
    entries = [(b.id, b) for b in pool.by_content.values()]
    entries += [(i, b) for t in pool.twins.values() for i, b in t.items()]
    if (index != {content: ids[0] for content, ids in holders_of.items()}
            or twins != {content: ids[1:] for content, ids in holders_of.items() if ids[1:]}
            or any(not 0 <= i < len(pool.blocks) or pool.blocks[i] is not b
                   for i, b in entries)):
        problems.append("the content index disagrees with the blocks' keys")

    m = metrics
    for name, got, want in (
        ("free blocks", m.free_blocks, empty), ("cached blocks", m.cached_blocks, cached),
        ("filled slots", m.filled_slots, filled), ("shared blocks", m.shared_blocks, shared),
        ("table entries", m.used_blocks + m.blocks_saved_by_sharing, sum(holders.values())),
        ("logical tokens", m.logical_tokens, sum(s.num_tokens for s in seqs.values())),
    ):
        if got != want:
            problems.append(f"{name}: counter says {got}, recount says {want}")
    if m.used_blocks + m.cached_blocks + m.free_blocks != m.num_blocks:
        problems.append("used + cached + free != num_blocks")
    if problems:
        raise IntegrityError(f"{counted(len(problems), 'invariant')} broken: "
                             + "; ".join(problems[:8]))


def prefix_count_problem(metrics: AllocatorMetrics, *, prefix_caching: bool) -> str | None:
    """What is wrong with the prefix-cache query counters against each other and the
    hits, or None. Each query (BlockManager.allocate) looks up a prompt of `asked` >= 1
    tokens, of which `asked - (asked - 1) // bs * bs` (1 to bs) are past every block a
    hit could serve: the last token is always computed. So the floor lies between the
    queries and bs times them, and the hits fit in the tokens the floor leaves.

    Not part of `check_integrity`: a snapshot with the contract's fields alone does not
    hold these counters (restore reads them as 0), so restore asks this only of a file
    that holds them."""
    m = metrics
    q, q_tokens, floor = m.prefix_queries, m.prefix_query_tokens, m.prefix_floor_tokens
    if not prefix_caching:
        if q or q_tokens or floor:
            return ("prefix caching is off, but metrics.prefix_queries, prefix_query_tokens "
                    f"and prefix_floor_tokens are {q:,}, {q_tokens:,} and {floor:,} (no "
                    "prompt is looked up: each must be 0)")
        return None
    if not q <= floor <= q * m.block_size:
        return (f"metrics.prefix_floor_tokens is {floor:,}, but {counted(q, 'query', 'queries')} "
                f"of blocks of {m.block_size} leave from {q:,} to {q * m.block_size:,} tokens "
                "no block could serve (1 to block_size each: a prompt's last token is "
                "always computed)")
    if m.prefix_hit_tokens > q_tokens - floor:
        return (f"metrics.prefix_hit_blocks is {m.prefix_hit_blocks:,} "
                f"({counted(m.prefix_hit_tokens, 'token')}), more than the "
                f"{q_tokens - floor:,} tokens a hit could serve: "
                f"metrics.prefix_query_tokens ({q_tokens:,}) less "
                f"metrics.prefix_floor_tokens ({floor:,})")
    return None


def _salts_differ(keyed: BlockHash | None, root: BlockHash | None) -> str:
    """Why a first block's key does not chain from its sequence's root, where the
    two name different cache salts ("" where they agree)."""
    have, want = (k.cache_salt if isinstance(k, SaltRoot) else None for k in (keyed, root))
    if have == want:
        return ""
    block = "with no cache salt" if have is None else f"under cache salt {have!r}"
    request = "has no cache salt" if want is None else f"has cache salt {want!r}"
    return f": the block is keyed {block}, and the request {request}"
