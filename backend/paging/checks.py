"""Argument checks of the block manager: each raises PagedLabError, none mutates.

The manager runs these before it changes anything, so that a bad argument
leaves it exactly as it was. They take the manager's parts (the pool, the
table map, its settings) rather than the manager, so this module sits below
the block manager and never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.core.checks import check_int
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.paging.block_pool import BlockPool
from backend.paging.block_types import SeqBlocks, validate_tokens

MAX_BLOCK_SIZE = 256


def check_config(num_blocks: int, block_size: int, allocation: str) -> None:
    """The pool size, block size and allocation mode a manager is built with."""
    check_int(num_blocks, "num_blocks", 1)
    check_int(block_size, "block_size", 1, MAX_BLOCK_SIZE)
    if allocation not in ("fifo", "random"):
        raise PagedLabError(f"allocation must be 'fifo' or 'random', got {allocation!r}")


def prompt_tokens(tokens: Sequence[int] | int, *, prefix_caching: bool,
                  vocab_size: int = 256) -> list[int] | int:
    """A prompt as validated token ids, or as a bare count when prefix caching is off."""
    if isinstance(tokens, bool):
        raise PagedLabError("a prompt is a list of token ids or a token count")
    if isinstance(tokens, int):
        if prefix_caching:
            raise PagedLabError("a prompt needs its token ids when prefix caching is on")
        return tokens
    return validate_tokens(tokens, vocab_size=vocab_size)


def append_tokens(tokens: Sequence[int] | None, num_tokens: int | None, *,
                  prefix_caching: bool, vocab_size: int = 256) -> tuple[list[int] | None, int]:
    """An append's validated token ids (None if not given) and its token count."""
    toks: list[int] | None = None
    if tokens is not None:
        toks = validate_tokens(tokens, "appended", vocab_size)
        n = len(toks)
        if num_tokens is not None and num_tokens != n:
            raise PagedLabError("append: num_tokens disagrees with len(tokens)")
    else:
        if prefix_caching:
            raise PagedLabError("append needs the token ids when prefix caching is on")
        n = 1 if num_tokens is None else num_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PagedLabError(f"append needs at least one token, got {n!r}")
    return toks, n


def check_new_id(seq_id: str, seqs: Mapping[str, SeqBlocks]) -> None:
    """A request id that is a non-empty string and not yet in use."""
    if not isinstance(seq_id, str) or not seq_id:
        raise PagedLabError(f"request id must be a non-empty string, got {seq_id!r}")
    if seq_id in seqs:
        raise PagedLabError(f"request {seq_id!r} already exists")


def check_position(seq_id: str, num_tokens: int, position: int) -> None:
    """A position that request `seq_id`, holding `num_tokens` tokens, already holds."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise PagedLabError(f"position must be an integer, got {position!r}")
    if not 0 <= position < num_tokens:
        raise PagedLabError(
            f"request {seq_id!r} holds positions 0..{num_tokens - 1}; "
            f"position {position} is outside it")


def check_block_id(block_id: int, num_blocks: int) -> None:
    """A physical block id of a pool of `num_blocks` blocks."""
    if isinstance(block_id, bool) or not isinstance(block_id, int) or not (
            0 <= block_id < num_blocks):
        raise PagedLabError(
            f"block {block_id!r} does not exist; ids run 0..{num_blocks - 1}")


def check_pins(pool: BlockPool, pinned: Sequence[int], n: int) -> None:
    """`n` distinct pinned block ids, each of a block in state "free" (not cached)."""
    pins = list(pinned)
    if len(pins) != n:
        raise PagedLabError(f"the prompt needs {counted(n, 'block')} but "
                             f"{counted(len(pins), 'block was', 'blocks were')} pinned")
    for b in pins:
        check_block_id(b, pool.num_blocks)
    if len(set(pins)) != len(pins):
        raise PagedLabError(f"pinned blocks {pins} name a block twice")
    for b in pins:
        block = pool.blocks[b]
        if block.ref_count > 0:
            raise PagedLabError(f"pinned block {b} is not free (ref count {block.ref_count})")
        if block.hash is not None:
            raise PagedLabError(f"pinned block {b} is not free: it is cached (it keeps a "
                                "prefix for reuse); pin free blocks only")
