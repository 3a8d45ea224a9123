"""Paged attention for Triton's interpreter: many (q tile, KV head) units per program.

The interpreter runs a launch's programs one after another in Python, and each
`tl.*` operation costs tens of microseconds whatever the size of its tile, while
elements are cheap (numpy). The GPU-shaped kernel (backend.kernels.attention) gives
every (q tile, KV head) its own program, so a 32-sequence decode step was 64 programs
of ~170 operations each per layer. This variant computes the same thing, with the same
online softmax in the log2 domain and the same table lookup, for BLOCK_U units at once:
every tensor gains a leading unit axis and the two products become batched 3-D tl.dot
calls. A decode step of 32 sequences is one program per layer.

    unit u = (q tile, KV head):  q tile t -> sequence tile_seq[t], its q block tile_block[t]
    rows of a unit               BLOCK_Q query tokens x G query heads (as the tiled kernel)
    each tile of BLOCK_N positions, per unit:
        block = table[seq, pos // block_size],  slot = block * block_size + pos % block_size

The tile map (tile_seq, tile_block) is computed once per launch with torch ops on the
host side, without reading any tensor to the host; the tiled kernel's per-program
binary search is gone. There is no split-K: the interpreter has no idle SMs to fill.

Interpreter only: the 3-D dots use as few rows as the group has (2 for the tiny model),
below what tl.dot accepts on a GPU. Like every kernel here it calls no other
@triton.jit function, so `kernel_variant` can wrap it on a machine that has a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.kernels.launch import Launch, kernel_variant
from backend.kernels.tuning import BatchedConfig, choose_batched_config
from backend.kernels.validate import AttentionShape

LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_batched_kernel(
    # pointers
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    tile_seq_ptr,
    tile_block_ptr,
    # sizes and scalars
    num_units,
    qk_scale,
    # strides (last dimensions contiguous; K and V share the slot and head strides)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_slot,
    stride_ch,
    stride_bt,
    # compile-time constants
    NUM_KV_HEADS: tl.constexpr,
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_U: tl.constexpr,
):
    # int64 index arithmetic: the interpreter checks every int32 operation for overflow.
    offs_u = tl.program_id(0).to(tl.int64) * BLOCK_U + tl.arange(0, BLOCK_U)
    u_mask = offs_u < num_units
    q_tile = offs_u // NUM_KV_HEADS
    kv_head = offs_u % NUM_KV_HEADS
    # The tile map holds real sequences only, so every load below stays inside the batch.
    seq = tl.load(tile_seq_ptr + q_tile, mask=u_mask, other=0).to(tl.int64)
    q_block = tl.load(tile_block_ptr + q_tile, mask=u_mask, other=0).to(tl.int64)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64) - q_start
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    context_len = seq_len - q_len
    # Units past the grid's end and spare tiles of the upper-bound tile map do no work.
    unit_ok = u_mask & (q_block * BLOCK_Q < q_len)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_idx = q_block[:, None] * BLOCK_Q + offs_m[None, :] // NUM_QUERIES_PER_KV  # [U, M]
    head = kv_head[:, None] * NUM_QUERIES_PER_KV + offs_m[None, :] % NUM_QUERIES_PER_KV
    row_mask = (unit_ok[:, None] & (offs_m[None, :] < BLOCK_Q * NUM_QUERIES_PER_KV)
                & (q_idx < q_len[:, None]))
    q_pos = context_len[:, None] + q_idx
    tok = q_start[:, None] + q_idx
    io_mask = row_mask[:, :, None] & d_mask[None, None, :]
    q = tl.load(
        q_ptr + tok[:, :, None] * stride_qt + head[:, :, None] * stride_qh
        + offs_d[None, None, :],
        mask=io_mask,
        other=0.0,
    ).to(tl.float32)  # fp32 operands: the interpreter multiplies bf16 as raw integers

    # Causal: a unit needs keys only up to the position of its last query token.
    kv_end = tl.where(unit_ok, tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q), 0)
    num_tiles = (tl.reduce(kv_end, 0, tl.standard._elementwise_max) + BLOCK_N - 1) // BLOCK_N

    m_i = tl.full([BLOCK_U, BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_U, BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_U, BLOCK_M, BLOCK_D], 0.0, dtype=tl.float32)
    table_row_ptr = block_tables_ptr + seq[:, None] * stride_bt  # [U, 1]
    head_offset = kv_head[:, None] * stride_ch
    kd_mask = d_mask[None, :, None]
    vd_mask = d_mask[None, None, :]
    q_pos_col = q_pos[:, :, None]
    offs_tile = tl.arange(0, BLOCK_N).to(tl.int64)

    for tile in range(0, num_tiles):
        offs_n = offs_tile + tile * BLOCK_N
        n_mask = offs_n[None, :] < kv_end[:, None]  # [U, N]
        # The mask keeps table padding (past a sequence's last used block) unread.
        block = tl.load(table_row_ptr + offs_n[None, :] // BLOCK_SIZE, mask=n_mask,
                        other=0).to(tl.int64)
        row = (block * BLOCK_SIZE + offs_n[None, :] % BLOCK_SIZE) * stride_slot + head_offset

        k = tl.load(k_cache_ptr + row[:, None, :] + offs_d[None, :, None],
                    mask=n_mask[:, None, :] & kd_mask, other=0.0).to(tl.float32)  # [U, D, N]
        s = tl.dot(q, k, input_precision="ieee") * qk_scale  # [U, M, N]
        # A valid row's position is below its unit's kv_end, so this also hides the
        # masked columns; padding rows may see zeros but are never stored.
        s = tl.where(offs_n[None, None, :] <= q_pos_col, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.reduce(s, 2, tl.standard._elementwise_max))
        # A row with no visible key yet keeps max -inf; subtracting 0 keeps exp2 at 0.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, :, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.reduce(p, 2, tl.standard._sum_combine)

        v = tl.load(v_cache_ptr + row[:, :, None] + offs_d[None, None, :],
                    mask=n_mask[:, :, None] & vd_mask, other=0.0).to(tl.float32)  # [U, N, D]
        acc = acc * alpha[:, :, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    # Every valid row saw key 0, so l_i > 0 there; padding rows are masked out anyway.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, :, None]
    tl.store(
        out_ptr + tok[:, :, None] * stride_ot + head[:, :, None] * stride_oh
        + offs_d[None, None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def tile_map(shape: AttentionShape, query_start_loc: torch.Tensor, block_q: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile_seq, tile_block): for each q tile, its sequence and its q block within it.

    Sequence b's tiles start at query_start_loc[b] // block_q + b, which bounds the number
    of tiles by T // block_q + batch without reading the query lengths (spare tiles at the
    end of a sequence find q_block * block_q >= q_len and do nothing). A decode-only batch
    has exactly one tile per sequence. Torch ops on the tensors' device, no host read.
    """
    device = query_start_loc.device
    if shape.num_tokens == shape.num_seqs:  # every q_len is 1
        seqs = torch.arange(shape.num_seqs, dtype=torch.int32, device=device)
        return seqs, torch.zeros_like(seqs)
    first = (torch.div(query_start_loc[:-1], block_q, rounding_mode="floor").long()
             + torch.arange(shape.num_seqs, device=device))
    tiles = torch.arange(shape.num_tokens // block_q + shape.num_seqs, device=device)
    seq = torch.searchsorted(first, tiles, right=True) - 1
    return seq.to(torch.int32), (tiles - first[seq]).to(torch.int32)


def plan_batched_attention(
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
    config: BatchedConfig | None = None,
) -> Launch:
    """The interpreted launch for validated arguments, unrun (see the module docstring)."""
    group = shape.num_heads // shape.num_kv_heads
    block_d = max(16, triton.next_power_of_2(shape.head_dim))
    if config is None:
        config = choose_batched_config(
            num_tokens=shape.num_tokens, num_seqs=shape.num_seqs,
            num_kv_heads=shape.num_kv_heads, num_queries_per_kv=group, block_d=block_d,
            max_context=shape.max_blocks_per_seq * shape.block_size)
    block_q = config.block_m // group
    tile_seq, tile_block = tile_map(shape, query_start_loc, block_q)
    num_units = tile_seq.numel() * shape.num_kv_heads
    return Launch(
        kernel=kernel_variant(_paged_attention_batched_kernel, True),
        grid=(triton.cdiv(num_units, config.block_u),),
        args=(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
              tile_seq, tile_block,
              num_units, float(scale) * LOG2E,
              query.stride(0), query.stride(1),
              out.stride(0), out.stride(1),
              k_cache.stride(1), k_cache.stride(2),
              block_tables.stride(0)),
        constexprs={
            "NUM_KV_HEADS": shape.num_kv_heads,
            "NUM_QUERIES_PER_KV": group,
            "BLOCK_SIZE": shape.block_size,
            "HEAD_DIM": shape.head_dim,
            "BLOCK_D": block_d,
            "BLOCK_M": config.block_m,
            "BLOCK_Q": block_q,
            "BLOCK_N": config.block_n,
            "BLOCK_U": config.block_u,
        },
        num_warps=1,
    )
