"""Exact tests of the block manager on the seed's worked examples and beyond."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from backend.core.errors import IntegrityError, OutOfBlocksError, PagedLabError
from backend.paging.block_manager import BlockManager


def kinds(m: BlockManager) -> list[tuple[str, str | None, int | None]]:
    return [(e.kind, e.request, e.block) for e in m.events]


def queue(m: BlockManager) -> list[int]:
    return [b.id for b in m.pool.free_queue]


def fingerprint(m: BlockManager) -> object:
    """Everything observable about a manager, for 'unchanged after an error' checks."""
    pool = m.pool
    return copy.deepcopy((
        [(b.id, b.ref_count, b.num_filled, b.hash and b.hash.digest) for b in pool.blocks],
        queue(m),
        {k: sorted(v) for k, v in pool.cache_map().items()},
        {s: (q.block_table, q.num_tokens, q.tail_tokens) for s, q in m.seqs.items()},
        len(m.events), m.metrics(), pool.random_picks,
    ))


# ---- the seed's worked examples ---------------------------------------------


def test_seed_block_table_and_address_translation() -> None:
    m = BlockManager(16, 4)
    alloc = m.allocate("A", list(b"nine toks"), pinned=[9, 2, 14])
    assert alloc.block_table == (9, 2, 14)
    a = m.translate("A", 6)
    assert (a.logical_block, a.offset, a.physical_block, a.slot) == (1, 2, 2, 10)
    # Nine tokens in three blocks of four: only position 8 in the last block.
    assert [m.block(b).num_filled for b in (9, 2, 14)] == [4, 4, 1]
    assert m.metrics().internal_waste_slots == 3
    # Sorting the table by physical id would scramble the history: position 8
    # lives in block 14, not in block 9 as a sorted table would say.
    assert m.translate("A", 8).physical_block == 14
    m.check_integrity()


def test_seed_growth_fills_the_tail_then_takes_one_block() -> None:
    m = BlockManager(16, 4)
    m.allocate("A", list(b"nine toks"), pinned=[9, 2, 14])
    for token in b"abc":  # the 10th, 11th and 12th tokens
        r = m.append("A", [token])
        assert r.new_blocks == () and r.cow is None
    assert m.block_table("A") == [9, 2, 14]
    assert m.metrics().internal_waste_slots == 0
    r = m.append("A", [ord("d")])  # the 13th
    assert r.new_blocks == (0,)  # the front of the free queue
    assert r.slots == (0,)
    assert m.block_table("A") == [9, 2, 14, 0]
    assert m.metrics().internal_waste_slots == 3
    m.check_integrity()


@pytest.mark.parametrize("block_size", [1, 2, 4, 16, 64, 256])
def test_tail_waste_is_at_most_block_size_minus_one(block_size: int) -> None:
    m = BlockManager(64, block_size, prefix_caching=False)
    m.allocate("A", [1])
    worst = 0
    for _ in range(3 * block_size):
        worst = max(worst, m.metrics().internal_waste_slots)
        m.append("A", num_tokens=1)
    assert worst == block_size - 1


def test_fifo_queue_order_and_tail_first_release() -> None:
    m = BlockManager(8, 4, prefix_caching=False)
    assert m.allocate("A", [1] * 9).block_table == (0, 1, 2)
    assert m.allocate("B", [2] * 3).block_table == (3,)
    assert queue(m) == [4, 5, 6, 7]
    assert m.free("A") == [2, 1, 0]
    # Released blocks join the back, the table's tail first.
    assert queue(m) == [4, 5, 6, 7, 2, 1, 0]
    assert m.allocate("C", [3] * 5).block_table == (4, 5)
    assert m.metrics().used_blocks == 3
    m.check_integrity()


def test_fork_shares_every_block_and_copies_nothing() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat s"))
    m.fork("A", "B")
    assert m.block_table("B") == [0, 1, 2]
    assert [m.block(b).ref_count for b in (0, 1, 2)] == [2, 2, 2]
    assert m.metrics().shared_blocks == 3
    assert m.metrics().blocks_saved_by_sharing == 3
    assert kinds(m)[-3:] == [("share", "B", 0), ("share", "B", 1), ("share", "B", 2)]
    m.check_integrity()


def test_copy_on_write_of_a_partly_filled_shared_block() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat s"))
    m.fork("A", "B")
    r = m.append("B", list(b"x"))
    assert r.cow is not None and (r.cow.src, r.cow.dst, r.cow.num_filled) == (2, 3, 1)
    assert r.slots == (3 * 4 + 1,)  # written after the copied slot
    assert m.block_table("B") == [0, 1, 3] and m.block_table("A") == [0, 1, 2]
    assert m.block(2).ref_count == 1 and m.block(3).ref_count == 1
    assert m.block(3).num_filled == 2 and m.block(2).num_filled == 1
    # Full prefix blocks stay shared.
    assert m.block(0).ref_count == 2 and m.block(1).ref_count == 2
    # The parent now owns block 2 alone: no second copy.
    r = m.append("A", list(b"y"))
    assert r.cow is None and r.slots == (2 * 4 + 1,)
    assert m.metrics().cow_copies == 1
    assert ("cow", "B", 3) in kinds(m)
    m.check_integrity()


def test_full_shared_block_stays_shared_on_append() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"12345678"))
    m.fork("A", "B")
    r = m.append("B", list(b"9"))
    assert r.cow is None and r.new_blocks == (2,)
    assert [m.block(b).ref_count for b in (0, 1, 2)] == [2, 2, 1]


def test_finishing_a_sharer_lowers_counts_without_freeing() -> None:
    m = BlockManager(8, 4, prefix_caching=False)
    m.allocate("A", list(b"12345678"))
    m.fork("A", "B")
    m.fork("A", "C")
    assert m.block(0).ref_count == 3
    assert m.free("B") == []
    assert m.block(0).ref_count == 2 and m.metrics().used_blocks == 2
    assert m.free("A") == []
    assert m.free("C") == [1, 0]
    assert m.metrics().used_blocks == 0 and m.metrics().free_blocks == 8
    frees = [(e.block, e.ref_count) for e in m.events if e.kind == "free"]
    assert frees == [(1, 2), (0, 2), (1, 1), (0, 1), (1, 0), (0, 0)]


# ---- prefix caching -----------------------------------------------------------


def test_prefix_hit_reuses_cached_blocks_after_the_owner_finished() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat sat on"))  # 14 tokens: 3 full blocks + 2
    m.free("A")
    assert m.metrics().cached_blocks == 3 and m.metrics().free_blocks == 5
    assert queue(m) == [4, 5, 6, 7, 3, 2, 1, 0]
    alloc = m.allocate("B", list(b"The cat sat on a mat"))
    assert alloc.hit_blocks == (0, 1, 2)
    assert alloc.num_cached_tokens == 12
    assert alloc.block_table[:3] == (0, 1, 2)
    assert [k for k, _, _ in kinds(m)[-5:]] == ["prefix_hit"] * 3 + ["alloc"] * 2
    met = m.metrics()
    assert (met.prefix_hit_blocks, met.prefix_queries, met.prefix_hit_tokens) == (3, 2, 12)
    m.check_integrity()


def test_a_prompt_in_pinned_blocks_is_no_prefix_cache_query() -> None:
    # Pinned blocks skip the cache lookup, so the metrics panel's query count (and its
    # help) leaves them out: scenario 02 adds two prompts and shows one query.
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat sat"), pinned=(5, 2, 7))
    met = m.metrics()
    assert (met.prefix_queries, met.prefix_query_tokens, met.prefix_floor_tokens) == (0, 0, 0)
    m.allocate("B", list(b"The cat"))
    met = m.metrics()
    assert (met.prefix_queries, met.prefix_query_tokens, met.prefix_floor_tokens) == (1, 7, 3)
    m.check_integrity()


def test_only_exact_tokens_share() -> None:
    m = BlockManager(16, 4)
    m.allocate("A", list(b"The cat sat on the mat"))
    # One byte differs in the third block: blocks 0 and 1 share, nothing after.
    alloc = m.allocate("B", list(b"The cat Sat on the mat"))
    assert alloc.hit_blocks == (0, 1)
    # Same meaning, different bytes: nothing is shared at all.
    alloc = m.allocate("C", list(b"the cat sat on the mat"))
    assert alloc.hit_blocks == ()


def test_last_prompt_token_is_always_computed() -> None:
    m = BlockManager(16, 4)
    m.allocate("A", list(b"12345678"))
    alloc = m.allocate("B", list(b"12345678"))
    # 8 tokens: only the first block precedes the last token; block 1 is recomputed.
    assert alloc.hit_blocks == (0,) and alloc.new_blocks == (2,)
    # Both copies of "5678" are keyed, and the map holds both.
    assert m.block(1).hash is not None and m.block(2).hash is not None
    assert m.block(1).hash.digest == m.block(2).hash.digest
    assert m.metrics().prefix_floor_tokens == 4 + 4
    m.check_integrity()


def test_cached_blocks_are_evicted_in_lru_order() -> None:
    m = BlockManager(4, 2)
    m.allocate("A", list(b"aabb"))
    m.free("A")
    assert queue(m) == [2, 3, 1, 0] and m.metrics().cached_blocks == 2
    m.allocate("B", list(b"xyzw"))  # takes 2 and 3: empty blocks, no eviction
    assert not any(k == "evict" for k, _, _ in kinds(m))
    m.allocate("C", list(b"q"))  # the front of the queue is cached block 1
    assert ("evict", "C", 1) in kinds(m)
    assert m.metrics().cached_blocks == 1
    # Block 0 ("aa") survives and still serves a hit.
    m.free("B")
    assert m.allocate("D", list(b"aac")).hit_blocks == (0,)
    m.check_integrity()


def test_prefix_caching_off_keeps_no_hashes() -> None:
    m = BlockManager(8, 4, prefix_caching=False)
    m.allocate("A", list(b"12345678"))
    m.free("A")
    assert m.metrics().cached_blocks == 0
    assert m.allocate("B", list(b"12345678")).hit_blocks == ()


def test_hit_blocks_count_toward_room() -> None:
    m = BlockManager(3, 2)
    m.allocate("A", list(b"aabbc"))
    m.free("A")  # blocks 0, 1 cached; 2 free
    plan = m.plan_prompt(list(b"aabbcc"))
    # Needs 3 blocks: 2 hits ("aa", "bb") and one new; the hits leave the queue.
    assert plan.hit_blocks == (0, 1) and plan.num_new_blocks == 1 and plan.fits_now
    m.allocate("B", list(b"aabbcc"))
    assert m.metrics().used_blocks == 3


# ---- random allocation ----------------------------------------------------------


def test_random_allocation_is_seeded_and_scattered() -> None:
    def tables(seed: int) -> list[int]:
        m = BlockManager(64, 4, allocation="random", seed=seed)
        m.allocate("A", [1] * 40)
        m.check_integrity()
        return m.block_table("A")

    assert tables(3) == tables(3)
    assert tables(3) != tables(4)
    assert tables(3) != sorted(tables(3))
    assert len(set(tables(3))) == 10


def test_random_allocation_prefers_empty_blocks_over_cached() -> None:
    m = BlockManager(6, 2, allocation="random", seed=1)
    m.allocate("A", list(b"aabb"))
    m.free("A")
    m.allocate("B", [7] * 8)  # four empty blocks exist: none of the cached is evicted
    assert not any(k == "evict" for k, _, _ in kinds(m))
    m.allocate("C", [9])
    assert any(k == "evict" for k, _, _ in kinds(m))


# ---- remapping --------------------------------------------------------------------


def test_remap_moves_every_used_block_and_rewrites_tables() -> None:
    m = BlockManager(16, 4)
    m.allocate("A", list(b"The cat sat"))
    m.fork("A", "B")
    m.append("B", list(b"!"))
    m.allocate("C", list(b"xy"))
    m.free("C")
    before = {s: m.block_table(s) for s in ("A", "B")}
    used = {b for t in before.values() for b in t}
    mapping = m.plan_remap(7)
    assert all(mapping[b] != b for b in used)
    moves = m.apply_remap(mapping)
    assert {(mv.src, mv.dst) for mv in moves} >= {(b, mapping[b]) for b in used}
    for s, table in before.items():
        assert m.block_table(s) == [mapping[b] for b in table]
    assert sum(1 for e in m.events if e.kind == "move") == len(moves)
    m.check_integrity()


def test_remap_keeps_free_queue_order_and_cache() -> None:
    m = BlockManager(8, 2)
    m.allocate("A", list(b"aabb"))
    m.free("A")
    m.allocate("B", list(b"cc"))
    order = queue(m)
    mapping = m.plan_remap(3)
    m.apply_remap(mapping)
    assert queue(m) == [mapping[b] for b in order]
    assert m.allocate("C", list(b"aabbd")).hit_blocks == (mapping[0], mapping[1])
    m.check_integrity()


# ---- bad input leaves everything as it was ------------------------------------


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda m: m.allocate("A", [1, 2]), "already exists"),
        (lambda m: m.allocate("Z", []), "at least one token"),
        (lambda m: m.allocate("Z", [1, 300]), "0..255"),
        (lambda m: m.allocate("Z", [1] * 33), "can never fit"),
        (lambda m: m.allocate("Z", [1] * 5, pinned=[0, 7]), "is not free"),
        (lambda m: m.allocate("Z", [1] * 5, pinned=[5, 5]), "twice"),
        (lambda m: m.allocate("Z", [1] * 5, pinned=[5, 99]), "does not exist"),
        (lambda m: m.allocate("Z", [1] * 5, pinned=[5]), "needs 2 blocks"),
        (lambda m: m.append("nope", [1]), "holds no blocks"),
        (lambda m: m.append("A", [256]), "0..255"),
        (lambda m: m.fork("nope", "Y"), "holds no blocks"),
        (lambda m: m.fork("A", "A"), "already exists"),
        (lambda m: m.free("nope"), "holds no blocks"),
        (lambda m: m.translate("A", 9), "outside"),
        (lambda m: m.apply_remap({0: 1}), "permutation"),
    ],
)
def test_caller_mistakes_raise_and_change_nothing(
        action: Callable[[BlockManager], object], message: str) -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat s"))
    m.fork("A", "B")
    before = fingerprint(m)
    with pytest.raises(PagedLabError, match=message):
        action(m)
    assert fingerprint(m) == before
    m.check_integrity()


def test_out_of_blocks_is_all_or_nothing() -> None:
    m = BlockManager(4, 4)
    m.allocate("A", [1] * 9)  # 3 blocks
    before = fingerprint(m)
    with pytest.raises(OutOfBlocksError):
        m.append("A", [2] * 8)  # needs 2 more, 1 free
    with pytest.raises(OutOfBlocksError):
        m.allocate("B", [3] * 5)
    assert fingerprint(m) == before


@pytest.mark.parametrize("kwargs", [{"num_blocks": 0}, {"block_size": 0},
                                    {"block_size": 257}, {"allocation": "lifo"}])
def test_bad_pool_settings(kwargs: dict) -> None:
    args = {"num_blocks": 8, "block_size": 4} | kwargs
    with pytest.raises(PagedLabError):
        BlockManager(args.pop("num_blocks"), args.pop("block_size"), **args)


def test_check_integrity_catches_a_wrong_ref_count() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat s"))
    m.pool.blocks[1].ref_count = 2
    with pytest.raises(IntegrityError, match="ref count 2 but 1 table"):
        m.check_integrity()


def test_check_integrity_catches_a_tampered_hash() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"The cat s"))
    block = m.pool.blocks[0]
    assert block.hash is not None
    object.__setattr__(block.hash, "tokens", tuple(b"Tha "))
    with pytest.raises(IntegrityError, match="does not match its tokens"):
        m.check_integrity()


def test_content_index_keeps_a_surviving_holder_of_duplicate_content() -> None:
    """Two forks fill identical blocks (one digest, two holders); evicting the one the
    content index names leaves it naming the other, so the content still hits."""
    m = BlockManager(6, 2)
    m.allocate("A", [1])
    m.fork("A", "B")
    m.append_one("A", 2)  # A's shared tail is copied first, then filled: [1, 2]
    m.append_one("B", 2)  # B's original block, now its own, fills the same: [1, 2]
    a, b = m.block_table("A")[0], m.block_table("B")[0]
    assert a != b and m.pool.blocks[a].hash.digest == m.pool.blocks[b].hash.digest
    named = m.pool.find(None, (1, 2))
    assert named is not None and named.id in (a, b)
    survivor = a if named.id == b else b
    loser = "A" if named.id == a else "B"
    m.free(loser)
    m.allocate("C", list(range(10, 20)))  # every free block, the cached one last: evicted
    assert named.id in m.block_table("C")
    m.check_integrity()
    found = m.pool.find(None, (1, 2))
    assert found is not None and found.id == survivor
    assert m.plan_prompt([1, 2, 3]).hit_blocks == (survivor,)
    # A tampered index is caught.
    m.pool.by_content[(None, (1, 2))] = m.pool.blocks[m.block_table("C")[0]]
    with pytest.raises(IntegrityError, match="content index"):
        m.check_integrity()


def test_content_index_names_the_lowest_id_holder_whatever_the_order() -> None:
    """Three forks fill identical blocks; whichever registers first, the index names
    the holder with the lowest id (a rebuilt index names the same), and evicting it
    promotes the next lowest."""
    m = BlockManager(8, 2)
    m.allocate("A", [1])
    m.fork("A", "B")
    m.fork("A", "C")
    for seq in ("C", "B", "A"):  # C and B copy the shared tail first; A fills its own
        m.append_one(seq, 2)
        m.check_integrity()
    holders = sorted(m.block_table(s)[0] for s in "ABC")
    pool = m.pool
    content = pool.blocks[holders[0]].hash.content
    assert pool.find(None, (1, 2)) is pool.blocks[holders[0]]
    assert sorted(pool.twins[content]) == holders[1:]
    named, twins = dict(pool.by_content), {c: dict(t) for c, t in pool.twins.items()}
    pool.reindex()
    assert pool.by_content == named and pool.twins == twins
    # Free the named holder's sequence, then take every free block: it is evicted.
    owner = next(s for s in "ABC" if m.block_table(s)[0] == holders[0])
    m.free(owner)
    m.allocate("D", list(range(10, 10 + 2 * m.num_free_blocks)))
    assert holders[0] in m.block_table("D")
    assert pool.find(None, (1, 2)) is pool.blocks[holders[1]]
    assert sorted(pool.twins[content]) == holders[2:]
    m.check_integrity()
    # A twin the index forgot, or one filed under another id, is caught.
    kept = dict(pool.twins[content])
    del pool.twins[content]
    with pytest.raises(IntegrityError, match="content index"):
        m.check_integrity()
    pool.twins[content] = {99: kept[holders[2]]}
    with pytest.raises(IntegrityError, match="content index"):
        m.check_integrity()
    pool.twins[content] = kept
    m.check_integrity()


def test_each_sequence_keeps_its_last_block_through_cow_fork_and_remap() -> None:
    m = BlockManager(12, 4)
    m.allocate("A", list(b"The cat s"))
    m.fork("A", "B")
    m.append_one("B", 1)  # copy-on-write of the shared tail
    for _ in range(4):
        m.append_one("A", 2)  # fills the tail, then takes a new block
    m.apply_remap(m.plan_remap(seed=5))
    m.append("B", [3, 4, 5, 6])
    for seq in m.seqs.values():
        assert seq.tail_block is m.pool.blocks[seq.block_table[-1]]
    m.check_integrity()
    # A table written directly (as a restore does) keeps no tail until recount.
    m.seqs["A"].tail_block = None
    m.check_integrity()
    m.recount()
    assert m.seqs["A"].tail_block is m.pool.blocks[m.seqs["A"].block_table[-1]]
    m.seqs["B"].tail_block = m.pool.blocks[m.seqs["A"].block_table[-1]]
    with pytest.raises(IntegrityError, match=r"keeps block \d+ as its last block"):
        m.check_integrity()


def test_metrics_on_a_mixed_pool() -> None:
    m = BlockManager(10, 4)
    m.allocate("A", list(b"The cat sat"))    # 3 blocks, 11 tokens
    m.fork("A", "B")
    m.append("B", list(b"!"))               # copy-on-write of block 2 -> 3
    m.allocate("C", list(b"xy"))            # block 4
    m.allocate("D", list(b"abcdefgh"))      # blocks 5, 6
    m.free("D")                             # 6 then 5 join the queue, both cached
    met = m.metrics()
    assert met.contract_dict() == {
        "used_blocks": 5, "free_blocks": 3, "cached_blocks": 2, "filled_slots": 4 + 4 + 3 + 4 + 2,
        "internal_waste_slots": 1 + 0 + 2, "shared_blocks": 2, "cow_copies": 1,
        "prefix_hit_blocks": 0, "preemptions": 0,
    }
    assert met.logical_tokens == 11 + 12 + 2
    assert met.blocks_saved_by_sharing == 2
    assert met.slot_occupancy == pytest.approx(17 / 20)


def test_bulk_append_by_count_fills_block_by_block() -> None:
    m = BlockManager(8, 4, prefix_caching=False)
    assert m.allocate("A", 3).block_table == (0,)
    r = m.append("A", num_tokens=10)
    assert r.slots == (3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    assert r.new_blocks == (1, 2, 3)
    assert m.num_tokens("A") == 13 and m.metrics().internal_waste_slots == 3
    m.check_integrity()


def test_counts_instead_of_tokens_need_prefix_caching_off() -> None:
    m = BlockManager(8, 4)
    with pytest.raises(PagedLabError, match="needs its token ids"):
        m.allocate("A", 5)
    m.allocate("A", [1, 2])
    with pytest.raises(PagedLabError, match="needs the token ids"):
        m.append("A", num_tokens=2)


def test_pinned_blocks_must_be_free_not_cached() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", list(b"abcdefgh"))
    m.free("A")
    assert m.block(0).state == "cached"
    before = fingerprint(m)
    with pytest.raises(PagedLabError, match="pinned block 0 is not free: it is cached"):
        m.allocate("B", list(b"xy"), pinned=[0])
    assert fingerprint(m) == before
    assert m.allocate("B", list(b"xy"), pinned=[5]).block_table == (5,)
