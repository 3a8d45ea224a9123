"""Tile sizes and the split-K heuristic of the paged-attention kernel."""

from __future__ import annotations

from dataclasses import dataclass

import triton

# A split shorter than this spends more on its partial write and the reduce than it gains.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


@dataclass(frozen=True)
class AttentionConfig:
    """Tile sizes and launch settings of one paged-attention launch.

    block_m: rows per program (query tokens x the G query heads of one KV group), a power
        of two >= 16 so tl.dot has the tile it needs on a GPU.
    block_n: context positions per inner-loop tile (a power of two).
    num_warps, num_stages: Triton launch settings (ignored by the interpreter).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def choose_config(
    *, head_dim: int, num_queries_per_kv: int, decode_only: bool, interpret: bool
) -> AttentionConfig:
    """Pick tile sizes for a launch (a pure function of the shape, so tests can call it).

    Decode (every q_len == 1) is memory-bound: one token's G heads share each K/V tile, so
    16 rows (the tl.dot minimum on a GPU) suffice. With prefill chunks in the batch, 64
    rows let a tile hold 64 / G query tokens, so each K/V tile serves more of them.
    On a GPU a 64-position tile of a 128-wide bf16 head is 16 KiB per K or V load, fetched
    as 16-byte asynchronous copies that the pipeliner (num_stages) issues for the next
    tile while the current one is computed; wide heads (256) halve the tile to keep
    registers and shared memory in bounds. These are starting points:
    `bench/kernel.py --sweep` times the alternatives on the GPU at hand.
    The interpreter pays per Python-level operation, not per element: 256-position tiles
    run a 1000-token context about 2.6x faster there than 64-position ones.
    """
    rows = 16 if decode_only else 64
    block_m = max(rows, triton.next_power_of_2(num_queries_per_kv))
    if interpret:
        return AttentionConfig(block_m=block_m, block_n=256, num_warps=1, num_stages=1)
    block_d = max(16, triton.next_power_of_2(head_dim))
    if block_d <= 128:
        block_n, num_stages = 64, 3
    else:
        block_n, num_stages = 32, 2
    num_warps = 4 if block_m <= 64 else 8
    return AttentionConfig(block_m=block_m, block_n=block_n, num_warps=num_warps,
                           num_stages=num_stages)


def choose_num_splits(*, num_programs: int, max_context: int, sm_count: int | None) -> int:
    """Split-K heuristic: how many programs share one q tile's context.

    A decode batch of B sequences and kvh KV heads gives only B x kvh programs; when that
    is well under what the GPU keeps resident (about two per SM), long contexts are cut
    into splits of at least MIN_TOKENS_PER_SPLIT positions, so that every SM streams K/V.
    `max_context` is the block-table capacity (known without a device sync). With no GPU
    (`sm_count` None) the interpreter runs programs one after another, so splitting only
    adds work: it stays at 1 unless forced.
    """
    if sm_count is None:
        return 1
    target = 2 * sm_count
    if num_programs >= target:
        return 1
    splits = min(triton.cdiv(target, num_programs), max_context // MIN_TOKENS_PER_SPLIT,
                 MAX_SPLITS)
    return max(1, splits)
