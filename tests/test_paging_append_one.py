"""`append_one` against `append(seq_id, [token])`: the same state, events and errors.

Two managers built alike replay one random operation stream; the only
difference is that decode tokens go through `append_one` in one and through
the general `append` in the other. After every operation everything
observable must agree: what the call returned (or the error it raised, type
and message), every block, the free queue, the cache map, every table with
its tail tokens and chain parent, the metrics, the random-pick counter and
the whole event log.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.paging.block_manager import BlockManager


def state(m: BlockManager) -> Any:
    pool = m.pool
    return (
        [(b.id, b.ref_count, b.num_filled, b.hash and b.hash.digest, b.in_queue)
         for b in pool.blocks],
        [b.id for b in pool.free_queue],
        {d: sorted(h) for d, h in pool.cache_map().items()},
        {s: (q.block_table, q.num_tokens, q.tail_tokens, q.last_hash and q.last_hash.digest)
         for s, q in m.seqs.items()},
        m.metrics(), pool.random_picks, pool.num_empty, pool.num_cached_free,
        list(m.events),
    )


def call(f: Any, *args: Any) -> Any:
    try:
        if f.__name__ == "free":  # free(seq_id, preempted)
            return ("ok", f(args[0], preempted=args[1]))
        return ("ok", f(*args))
    except (PagedLabError, OutOfBlocksError) as exc:
        return ("error", type(exc), str(exc))


BAD_TOKENS: list[Any] = [True, False, -1, 1.0, "a", None, [1]]


def run_pair(seed: int, *, num_blocks: int, block_size: int, caching: bool,
             allocation: str, vocab_size: int, steps: int = 300) -> None:
    rng = random.Random(seed)
    kw: dict[str, Any] = dict(prefix_caching=caching, allocation=allocation, seed=seed,
                              vocab_size=vocab_size, cache_salt="salt" if seed % 2 else "")
    fast, slow = BlockManager(num_blocks, block_size, **kw), BlockManager(num_blocks, block_size,
                                                                          **kw)
    # A small alphabet, so prompts share prefixes and decodes fill identical blocks.
    alphabet = [rng.randrange(vocab_size) for _ in range(3)]
    next_id = 0
    for step in range(1, steps + 1):
        fast.step = slow.step = step
        live = sorted(fast.seqs)
        r = rng.random()
        if r < 0.55 and live:
            sid = rng.choice(live) if rng.random() > 0.02 else "nobody"
            token: Any = rng.choice(alphabet) if rng.random() > 0.03 else rng.choice(
                [*BAD_TOKENS, vocab_size])
            got = call(fast.append_one, sid, token)
            want = call(lambda s, t: (lambda res: (res.slots[0], res.cow))(slow.append(s, [t])),
                        sid, token)
            assert got == want, (step, sid, token)
        elif r < 0.70 or not live:
            next_id += 1
            prompt = [rng.choice(alphabet) for _ in range(rng.randrange(1, 3 * block_size + 2))]
            assert call(fast.allocate, f"s{next_id}", prompt) == call(slow.allocate,
                                                                      f"s{next_id}", prompt)
        elif r < 0.80:
            next_id += 1
            parent = rng.choice(live)
            assert call(fast.fork, parent, f"s{next_id}") == call(slow.fork, parent,
                                                                  f"s{next_id}")
        elif r < 0.95:
            sid = rng.choice(live)
            pre = rng.random() < 0.3
            assert call(fast.free, sid, pre) == call(slow.free, sid, pre)
        elif num_blocks > 1:
            mapping = fast.plan_remap(step)
            assert call(fast.apply_remap, mapping) == call(slow.apply_remap, mapping)
        assert state(fast) == state(slow), step
    fast.check_integrity()


@pytest.mark.parametrize("seed", range(24))
def test_append_one_matches_append(seed: int) -> None:
    rng = random.Random(1000 + seed)
    run_pair(seed, num_blocks=rng.choice([1, 2, 5, 12, 40]),
             block_size=rng.choice([1, 2, 3, 4, 16]), caching=seed % 3 != 2,
             allocation="random" if seed % 4 == 3 else "fifo",
             vocab_size=rng.choice([256, 300, 49152]))


def test_append_one_returns_the_slot_and_the_copy_on_write() -> None:
    m = BlockManager(8, 4)
    m.allocate("A", [1, 2, 3])
    slot, cow = m.append_one("A", 4)
    assert (slot, cow) == (m.translate("A", 3).slot, None)
    slot, cow = m.append_one("A", 5)  # the tail is full: the next free block
    assert m.block_table("A")[-1] == slot // 4 and slot % 4 == 0 and cow is None
    m.fork("A", "B")
    slot, cow = m.append_one("B", 6)  # a shared, partly filled tail: copy-on-write
    assert cow is not None and cow.num_filled == 1 and m.block_table("B")[-1] == cow.dst
    assert slot == cow.dst * 4 + 1
    m.check_integrity()


def test_append_one_refuses_like_append_and_changes_nothing() -> None:
    m = BlockManager(2, 2, vocab_size=300)
    m.allocate("A", [1, 2, 3, 4])
    for sid, token in [("nobody", 1), ("A", True), ("A", -1), ("A", 300), ("A", 2.0)]:
        before = state(m)
        with pytest.raises(PagedLabError):
            m.append_one(sid, token)
        assert state(m) == before
    before = state(m)
    with pytest.raises(OutOfBlocksError, match="needs 1 free block"):
        m.append_one("A", 5)
    assert state(m) == before
