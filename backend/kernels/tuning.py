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


@dataclass(frozen=True)
class BatchedConfig:
    """Tile sizes of one launch of the interpreter's batched kernel (attention_batched).

    block_m: rows per unit (BLOCK_Q query tokens x the G heads of one KV group).
    block_n: context positions per inner-loop tile.
    block_u: (q tile, KV head) units per program.
    """

    block_m: int
    block_n: int
    block_u: int


# Elements of the largest tile a batched program holds ([units, rows or head_dim,
# positions]): large enough that a 32-sequence decode of the tiny model is one program,
# small enough that one tile stays a few MiB of numpy arrays, and at most Triton's
# largest tensor (2^20 elements). 2^18..2^20 time alike for 32 x 112 tokens; for
# 64 x 505, 2^19 is ~13% faster than 2^18.
BATCHED_TILE_ELEMENTS = 1 << 19
BATCHED_MAX_BLOCK_N = 4096


def choose_batched_config(*, num_tokens: int, num_seqs: int, num_kv_heads: int,
                          num_queries_per_kv: int, block_d: int,
                          max_context: int) -> BatchedConfig:
    """Tile sizes for the interpreter's batched kernel (a pure function of the shape).

    The interpreter pays per operation (tens of microseconds) and little per element, so
    a launch should be as few programs and loop iterations as memory allows: a tile
    covers the whole context (`max_context`, the block-table capacity) when it fits,
    and a program as many units as fit beside it. Decode rows are the group's heads
    alone (no padding to 16: the interpreter's tl.dot takes any size); with prefill
    chunks 64 rows let one unit's K/V tile serve 64 / G query tokens.
    """
    group = triton.next_power_of_2(num_queries_per_kv)
    block_m = group if num_tokens == num_seqs else max(64, group)
    num_units = (num_tokens // (block_m // num_queries_per_kv) + num_seqs) * num_kv_heads
    if num_tokens == num_seqs:
        num_units = num_seqs * num_kv_heads
    block_n = max(16, min(triton.next_power_of_2(max_context), BATCHED_MAX_BLOCK_N))
    block_u = triton.next_power_of_2(num_units)
    width = max(block_m, block_d)
    # Shrink the tile first while it is long (more loop iterations cost less than more
    # programs, each of which reloads its units' queries), then the units.
    while block_u * width * block_n > BATCHED_TILE_ELEMENTS:
        if block_n > 256 or block_u == 1:
            if block_n == 16:
                break
            block_n //= 2
        else:
            block_u //= 2
    return BatchedConfig(block_m=block_m, block_n=block_n, block_u=block_u)


def choose_num_splits(*, num_programs: int, max_context: int, capacity: int | None) -> int:
    """Split-K heuristic: how many programs share one q tile's context.

    A decode batch of B sequences and kvh KV heads gives only B x kvh programs; when that
    is under what the GPU keeps resident at once (`capacity`: programs per SM, from the
    compiled kernel's registers and shared memory, times SMs; see
    `launch.resident_capacity`), long contexts are cut into splits of at least
    MIN_TOKENS_PER_SPLIT positions so that every resident slot streams K/V, in a single
    wave. A batch that fills the GPU is not split: partials and a reduce only add work.
    `max_context` is the block-table capacity (known without a device sync). With no GPU
    (`capacity` None) the interpreter runs programs one after another, so splitting only
    adds work: it stays at 1 unless forced.
    """
    if capacity is None or num_programs >= capacity:
        return 1
    # Rounded down: a split that needs a second wave of programs only adds a reduce.
    splits = min(capacity // num_programs, max_context // MIN_TOKENS_PER_SPLIT, MAX_SPLITS)
    return max(1, splits)
