"""The GPU-shaped paged-attention kernel: one program per (q tile, KV head, split).

Layout (fixed by PagedLab)::

    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   contiguous
    block_tables       int32 [batch, max_blocks_per_seq]   entry j = physical block of
                       positions j*block_size .. (j+1)*block_size-1; entries past
                       ceil(seq_len / block_size) are padding and are never read
    query, out         [T, num_heads, head_dim]   new tokens of all sequences, packed
    query_start_loc    int32 [batch+1]   sequence b owns rows query_start_loc[b]:[b+1]
    seq_lens           int32 [batch]     context length including the new tokens

How one program sees the work (grid = q tiles x kv heads x splits)::

    rows of a tile = BLOCK_Q query tokens x G query heads of one KV group (G = H / kvh)

          key positions ->  0 ........................................ seq_len-1
    split 0            [tile0][tile1][tile2] | split 1 [tile3][tile4] ...
    token i of seq b   sits at position p = seq_len - q_len + i and sees keys 0..p

    each BLOCK_N tile of positions pos:  block = table[b, pos // block_size],
                                         slot  = block * block_size + pos % block_size

The block ids of a tile are loaded once per block when the tile holds whole blocks
(block_size divides BLOCK_N), once per tile when one block holds the whole tile, and
once per position otherwise (block sizes such as 12). Every program of a split writes a
partial (max, sum, acc) in fp32 and a second kernel (backend.kernels.split_reduce)
combines them; without a split the program normalises and writes the output directly.
Scores live in the log2 domain (scaled by log2(e)) so the kernel can use exp2.

Kernels here call no other @triton.jit function, so that `kernel_variant` can wrap the
same source in Triton's interpreter on a machine that also has a GPU (an interpreted
kernel cannot call a compiled helper). That rules out tl.max / tl.sum / tl.cdiv, which are
jit helpers themselves: reductions are written as tl.reduce with the standard library's
combine functions (exactly what tl.max and tl.sum expand to for fp32, and what the
interpreter recognises and runs as numpy reductions).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from backend.kernels.launch import Launch, resident_capacity
from backend.kernels.split_reduce import plan_split_reduce, split_partials
from backend.kernels.tuning import AttentionConfig, choose_num_splits
from backend.kernels.validate import AttentionShape, require

LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    # pointers
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    # sizes and scalars
    num_seqs,
    num_splits,
    qk_scale,
    # strides: the last dimension of every tensor is contiguous; K and V caches are
    # contiguous with one shape, so a slot (one token's row) has one stride in both
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_slot,
    stride_ch,
    stride_bt,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_mt,
    stride_mh,
    # compile-time constants
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TABLE_LOADS: tl.constexpr,
):
    # Index arithmetic is int64 throughout: element offsets of a large pool overflow int32
    # (and the interpreter checks every int32 operation for overflow, which is slow).
    q_tile = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)

    # Sequence b's q tiles start at query_start_loc[b] // BLOCK_Q + b. That bound lets the
    # host size the grid as T // BLOCK_Q + batch without reading the query lengths; a
    # binary search finds the last sequence whose first tile is <= this program's tile.
    lo = tl.cast(0, tl.int64)
    hi = tl.cast(num_seqs, tl.int64)
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= q_tile:
            lo = mid + 1
        else:
            hi = mid
    # In range by construction: sequence 0's first tile is 0, so 0 <= seq < num_seqs.
    seq = lo - 1

    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64) - q_start
    q_block = q_tile - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return  # a spare program of the upper-bound grid
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_idx = q_block * BLOCK_Q + offs_m // NUM_QUERIES_PER_KV
    head = kv_head * NUM_QUERIES_PER_KV + offs_m % NUM_QUERIES_PER_KV
    # Rows past BLOCK_Q * G pad the tile up to the 16 rows tl.dot needs on a GPU.
    row_mask = (offs_m < BLOCK_Q * NUM_QUERIES_PER_KV) & (q_idx < q_len)
    q_pos = context_len + q_idx
    tok = q_start + q_idx

    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)

    # Causal: this tile needs keys only up to the position of its last query token.
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    num_tiles = (kv_end + BLOCK_N - 1) // BLOCK_N
    if SPLIT:
        tiles_per_split = (num_tiles + num_splits - 1) // num_splits
        tile_lo = tl.program_id(2).to(tl.int64) * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    else:
        tile_lo = 0
        tile_hi = num_tiles

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    table_row_ptr = block_tables_ptr + seq * stride_bt
    k_tile_ptr = k_cache_ptr + kv_head * stride_ch + offs_d[:, None]  # K as [D, N]
    v_tile_ptr = v_cache_ptr + kv_head * stride_ch + offs_d[None, :]  # V as [N, D]
    kd_mask = d_mask[:, None]
    vd_mask = d_mask[None, :]
    q_pos_col = q_pos[:, None]
    offs_tile = tl.arange(0, BLOCK_N).to(tl.int64)

    for tile in range(tile_lo, tile_hi):
        offs_n = offs_tile + tile * BLOCK_N
        n_mask = offs_n < kv_end
        # Masks keep padding entries of the table (past the last used block) unread.
        if TABLE_LOADS == "per_block":
            # Whole blocks per tile: one id per block, repeated for its BLOCK_SIZE slots.
            offs_b = tile * (BLOCK_N // BLOCK_SIZE) + tl.arange(0, BLOCK_N // BLOCK_SIZE)
            ids = tl.load(table_row_ptr + offs_b, mask=offs_b * BLOCK_SIZE < kv_end, other=0)
            block = tl.reshape(tl.broadcast_to(ids.to(tl.int64)[:, None],
                                               [BLOCK_N // BLOCK_SIZE, BLOCK_SIZE]), [BLOCK_N])
        elif TABLE_LOADS == "per_tile":
            # A tile inside one block: one id; the tile starts below kv_end, so it is used.
            block = tl.load(table_row_ptr + (tile * BLOCK_N) // BLOCK_SIZE).to(tl.int64)
        else:
            block = tl.load(table_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask,
                            other=0).to(tl.int64)
        slot = block * BLOCK_SIZE + offs_n % BLOCK_SIZE
        row = slot * stride_slot

        k = tl.load(k_tile_ptr + row[None, :], mask=kd_mask & n_mask[None, :], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        # A valid row's position is below kv_end, so this also hides the masked columns;
        # padding rows may see them (zeros) but are never stored.
        s = tl.where(offs_n[None, :] <= q_pos_col, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        # A row that has seen no visible key yet keeps max -inf; subtracting 0 instead of
        # -inf keeps exp2 at 0 rather than NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)

        v = tl.load(v_tile_ptr + row[:, None], mask=n_mask[:, None] & vd_mask, other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = row_mask[:, None] & d_mask[None, :]
    if SPLIT:
        split = tl.program_id(2).to(tl.int64)
        part = tok * stride_pt + head * stride_ph + split * stride_ps
        tl.store(part_acc_ptr + part[:, None] + offs_d[None, :], acc, mask=out_mask)
        stat = tok * stride_mt + head * stride_mh + split
        tl.store(part_max_ptr + stat, m_i, mask=row_mask)
        tl.store(part_sum_ptr + stat, l_i, mask=row_mask)
    else:
        # Every valid row saw key 0, so l_i > 0 there; padding rows are masked out anyway.
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


def table_loads(block_size: int, block_n: int) -> str:
    """How a tile finds its block ids: "per_block", "per_tile" or "per_token"."""
    pow2 = block_size & (block_size - 1) == 0
    if pow2 and block_n % block_size == 0:
        return "per_block"
    if block_size % block_n == 0:
        return "per_tile"
    return "per_token"


def plan_tiled_attention(
    shape: AttentionShape,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    kernel: Any,
    interpreted: bool,
    config: AttentionConfig,
    num_splits: int | None,
) -> list[Launch]:
    """The launches for validated arguments, unrun: the kernel, and the reduce if split.

    `num_splits` None asks `choose_num_splits` with the GPU's resident capacity for this
    launch (no split under the interpreter). Reads no tensor to the host.
    """
    group = shape.num_heads // shape.num_kv_heads
    block_q = config.block_m // group
    require(block_q >= 1, f"config.block_m {config.block_m} is smaller than the group {group}")
    num_q_tiles = shape.num_tokens // block_q + shape.num_seqs
    block_d = max(16, triton.next_power_of_2(shape.head_dim))
    fp32 = query.dtype == torch.float32
    constexprs = {
        "NUM_QUERIES_PER_KV": group,
        "BLOCK_SIZE": shape.block_size,
        "HEAD_DIM": shape.head_dim,
        "BLOCK_D": block_d,
        "BLOCK_M": config.block_m,
        "BLOCK_Q": block_q,
        "BLOCK_N": config.block_n,
        "SPLIT": False,
        # The interpreter multiplies bf16 as raw integers in tl.dot, so it gets fp32
        # operands; fp32 caches ask for IEEE products rather than TF32 on a GPU.
        "DOT_FP32": interpreted,
        "DOT_PRECISION": "ieee" if fp32 or interpreted else "tf32",
        "TABLE_LOADS": table_loads(shape.block_size, config.block_n),
    }

    def attention_launch(splits: int, partials: tuple[torch.Tensor, ...],
                         part_strides: tuple[int, ...]) -> Launch:
        return Launch(
            kernel=kernel,
            grid=(num_q_tiles, shape.num_kv_heads, splits),
            args=(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                  *partials,
                  shape.num_seqs, splits, float(scale) * LOG2E,
                  query.stride(0), query.stride(1),
                  out.stride(0), out.stride(1),
                  k_cache.stride(1), k_cache.stride(2),
                  block_tables.stride(0),
                  *part_strides),
            constexprs={**constexprs, "SPLIT": splits > 1},
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )

    # Never dereferenced without SPLIT; Triton still wants real pointers.
    unsplit = attention_launch(1, (out, out, out), (0, 0, 0, 0, 0))
    if num_splits is None:
        # A decode-only batch has exactly one q tile per sequence; otherwise the grid's
        # upper bound stands in for the number of busy programs.
        busy_tiles = shape.num_seqs if shape.num_tokens == shape.num_seqs else num_q_tiles
        num_splits = choose_num_splits(
            num_programs=busy_tiles * shape.num_kv_heads,
            max_context=shape.max_blocks_per_seq * shape.block_size,
            capacity=None if interpreted else resident_capacity(unsplit, query.device))
    if num_splits == 1:
        return [unsplit]
    part_acc, part_max, part_sum, part_strides = split_partials(shape, num_splits,
                                                                query.device)
    return [attention_launch(num_splits, (part_acc, part_max, part_sum), part_strides),
            plan_split_reduce(shape, out, part_acc, part_max, part_sum, part_strides,
                              num_splits=num_splits, block_d=block_d,
                              interpret=interpreted)]
