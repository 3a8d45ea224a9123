"""Prompt checks: refused exactly as `validate_tokens` refuses, wherever the bad id sits.

With prefix caching, `plan_prompt` checks the ids' types first and their
range only past the prefix-cache hits (a hit block's ids equal a cached
block's, checked when it was cached). These tests put bad ids before, inside
and after a would-be hit and expect the full check's error, message and all,
with nothing changed.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend.core.errors import PagedLabError
from backend.paging.block_manager import BlockManager, validate_tokens
from backend.paging.block_types import all_exact_ints

CACHED = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full blocks of 4, cached after a free


def manager(vocab_size: int = 300) -> BlockManager:
    m = BlockManager(8, 4, vocab_size=vocab_size)
    m.allocate("old", CACHED)
    m.free("old")
    return m


BAD: list[Any] = [True, False, -1, 300, 2**32, 2**70, 1.0, "a", None]


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("where", [0, 2, 4, 7, 8, 10])
def test_a_bad_id_anywhere_is_refused_as_the_full_check_refuses(bad: Any, where: int) -> None:
    m = manager()
    prompt: list[Any] = [*CACHED, 10, 11]
    prompt[where] = bad
    with pytest.raises(PagedLabError) as want:
        validate_tokens(prompt, vocab_size=300)
    before = (len(m.events), m.metrics(), [b.id for b in m.pool.free_queue])
    for call in (m.plan_prompt, lambda p: m.allocate("new", p)):
        with pytest.raises(PagedLabError) as got:
            call(prompt)
        assert str(got.value) == str(want.value)
    assert (len(m.events), m.metrics(), [b.id for b in m.pool.free_queue]) == before
    m.check_integrity()


@pytest.mark.parametrize("where", [1, 5, 8, 9])
def test_a_negative_id_is_named_in_a_wide_block_a_narrow_one_or_the_tail(where: int) -> None:
    """Past the hits, the hashing of full blocks is what refuses a negative id (in
    blocks hashed four bytes per id and one byte per id alike); the partial last
    block is checked on its own."""
    m = BlockManager(8, 4, vocab_size=32_000)
    prompt = [31_999, 7, 8, 9, 1, 2, 3, 4, 5, 6]  # a wide block, a narrow one, a tail
    prompt[where] = -1
    with pytest.raises(PagedLabError, match=f"prompt token {where} is -1"):
        m.allocate("p", prompt)
    assert not m.seqs and len(m.events) == 0 and m.num_free_blocks == 8
    m.check_integrity()


def test_a_bool_equal_to_a_cached_id_is_not_a_hit() -> None:
    m = manager()
    with pytest.raises(PagedLabError, match="prompt token 0 is True"):
        m.allocate("new", [True, *CACHED[1:], 10])
    assert m.allocate("new", [*CACHED, 10]).hit_blocks != ()


def test_bad_ids_are_named_before_a_prompt_that_never_fits() -> None:
    m = manager()
    long = [5] * 40 + [300]
    with pytest.raises(PagedLabError, match="prompt token 40 is 300"):
        m.plan_prompt(long)
    with pytest.raises(PagedLabError, match="can never fit"):
        m.plan_prompt([5] * 40)


def test_the_pinned_and_uncached_paths_check_every_id() -> None:
    m = manager()
    with pytest.raises(PagedLabError, match="prompt token 1 is 300"):
        m.allocate("p", [1, 300], pinned=[m.pool.free_queue.front().id])  # type: ignore[union-attr]
    off = BlockManager(8, 4, prefix_caching=False, vocab_size=300)
    with pytest.raises(PagedLabError, match="prompt token 1 is -1"):
        off.allocate("p", [1, -1])


class Id(int):
    """An int subclass: equal to an int, but not exactly one."""


@pytest.mark.parametrize("odd", [True, False, Id(3), 3.0, "3", None], ids=repr)
def test_exact_ints_means_exactly_int(odd: Any) -> None:
    assert all_exact_ints([]) and all_exact_ints([0, 5, 2**70])
    for where in range(3):
        values = [1, 2, 3]
        values[where] = odd
        assert not all_exact_ints(values)
        if isinstance(odd, Id):
            assert validate_tokens(values) == values  # its slow check takes int subclasses
        else:
            with pytest.raises(PagedLabError):
                validate_tokens(values)
