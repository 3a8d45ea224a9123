"""Paged attention in Triton: one launch for a mixed batch of decodes and prefill chunks.

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

Every program of a split writes a partial (max, sum, acc) in fp32 and a second kernel
(backend.kernels.split_reduce) combines them; without a split the program normalises and
writes the output directly.
Scores live in the log2 domain (scaled by log2(e)) so the kernel can use exp2.

Kernels here call no other @triton.jit function, so that `kernel_variant` can wrap the
same source in Triton's interpreter on a machine that also has a GPU (an interpreted
kernel cannot call a compiled helper). That rules out tl.max / tl.sum / tl.cdiv, which are
jit helpers themselves: reductions are written as tl.reduce with the standard library's
combine functions (exactly what tl.max and tl.sum expand to for fp32, and what the
interpreter recognises and runs as numpy reductions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.core.errors import PagedLabError
from backend.kernels.launch import Launch, compile_for_gpu, is_interpreted, kernel_variant, sm_count
from backend.kernels.split_reduce import plan_split_reduce, split_partials
from backend.kernels.tuning import (
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    AttentionConfig,
    choose_config,
    choose_num_splits,
)
from backend.kernels.validate import (
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    AttentionShape,
    require,
    same_device,
    validate_paged_attention,
)

__all__ = [
    "MAX_HEAD_DIM", "MAX_SPLITS", "MIN_TOKENS_PER_SPLIT", "SUPPORTED_DTYPES", "AttentionConfig",
    "AttentionShape", "Launch", "choose_config", "choose_num_splits", "compile_for_gpu",
    "is_interpreted", "kernel_variant", "paged_attention", "plan_paged_attention",
    "same_device", "sm_count", "validate_paged_attention",
]

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------- kernels


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
        # The mask keeps padding entries of the table (past the last used block) unread.
        block = tl.load(table_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
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


# ----------------------------------------------------------------------------- wrappers


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    check_bounds: bool = True,
    interpret: bool = False,
    config: AttentionConfig | None = None,
) -> torch.Tensor:
    """Causal grouped-query attention of packed new tokens against their paged K/V history.

    Returns `out` (allocated when None) of shape [T, H, D] in the query's dtype; query row
    i of sequence b attends to positions 0..seq_lens[b] - q_len_b + i, query head h reads
    KV head h // (H / kvh). Accumulation is fp32. `num_splits` forces the split-K path
    (None: `choose_num_splits`); `interpret` runs Triton's interpreter (required for CPU
    tensors); `config` overrides the tile sizes (benchmark sweeps). Writes only `out`.
    Raises PagedLabError for invalid arguments (see `validate_paged_attention`).
    """
    out, launches = plan_paged_attention(
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out=out,
        num_splits=num_splits, check_bounds=check_bounds, interpret=interpret, config=config)
    for launch in launches:
        launch.run()
    return out


def plan_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    check_bounds: bool = True,
    interpret: bool = False,
    config: AttentionConfig | None = None,
) -> tuple[torch.Tensor, list[Launch]]:
    """Validate and allocate like `paged_attention`, and return (out, launches) unrun.

    One launch without a split; the attention kernel and the split reduce with one.
    """
    shape = validate_paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                     query_start_loc, scale, out=out, num_splits=num_splits,
                                     check_bounds=check_bounds)
    attn_kernel = kernel_variant(_paged_attention_kernel, interpret)
    interpreted = is_interpreted(attn_kernel)
    if query.device.type != "cuda" and not interpreted:
        raise PagedLabError("compiled Triton kernels need CUDA tensors; run with the "
                            "interpreter (device cpu) or move the tensors to the GPU")

    group = shape.num_heads // shape.num_kv_heads
    # q_len >= 1 for every sequence, so T == batch means every q_len is 1 (no data read).
    decode_only = shape.num_tokens == shape.num_seqs
    if config is None:
        config = choose_config(head_dim=shape.head_dim, num_queries_per_kv=group,
                               decode_only=decode_only, interpret=interpreted)
    block_q = config.block_m // group
    require(block_q >= 1, f"config.block_m {config.block_m} is smaller than the group {group}")
    num_q_tiles = shape.num_tokens // block_q + shape.num_seqs
    if num_splits is None:
        # A decode-only batch has exactly one q tile per sequence; otherwise the grid's
        # upper bound stands in for the number of busy programs.
        busy_tiles = shape.num_seqs if decode_only else num_q_tiles
        num_splits = choose_num_splits(
            num_programs=busy_tiles * shape.num_kv_heads,
            max_context=shape.max_blocks_per_seq * shape.block_size,
            sm_count=None if interpreted else sm_count(query.device))
    split = num_splits > 1

    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if split:
        part_acc, part_max, part_sum, part_strides = split_partials(shape, num_splits,
                                                                    query.device)
    else:
        # Never dereferenced without SPLIT; Triton still wants real pointers.
        part_acc = part_max = part_sum = out
        part_strides = (0, 0, 0, 0, 0)
    block_d = max(16, triton.next_power_of_2(shape.head_dim))
    fp32 = query.dtype == torch.float32

    launches = [Launch(
        kernel=attn_kernel,
        grid=(num_q_tiles, shape.num_kv_heads, num_splits),
        args=(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
              part_acc, part_max, part_sum,
              shape.num_seqs, num_splits, float(scale) * LOG2E,
              query.stride(0), query.stride(1),
              out.stride(0), out.stride(1),
              k_cache.stride(1), k_cache.stride(2),
              block_tables.stride(0),
              *part_strides),
        constexprs={
            "NUM_QUERIES_PER_KV": group,
            "BLOCK_SIZE": shape.block_size,
            "HEAD_DIM": shape.head_dim,
            "BLOCK_D": block_d,
            "BLOCK_M": config.block_m,
            "BLOCK_Q": block_q,
            "BLOCK_N": config.block_n,
            "SPLIT": split,
            # The interpreter multiplies bf16 as raw integers in tl.dot, so it gets fp32
            # operands; fp32 caches ask for IEEE products rather than TF32 on a GPU.
            "DOT_FP32": interpreted,
            "DOT_PRECISION": "ieee" if fp32 or interpreted else "tf32",
        },
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )]
    if split:
        launches.append(plan_split_reduce(shape, out, part_acc, part_max, part_sum, part_strides,
                                          num_splits=num_splits, block_d=block_d,
                                          interpret=interpret))
    return out, launches
