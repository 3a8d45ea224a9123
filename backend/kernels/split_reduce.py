"""Split-K for paged attention: the fp32 partials, and the kernel that combines them.

With num_splits > 1 each attention program (backend.kernels.attention) covers one slice
of a sequence's key positions and writes, per query token and head, a partial running max,
sum and accumulator ([T, H, splits] and [T, H, splits, D], fp32). One program per
(token, head) here weighs the splits by exp2(split max - overall max) and writes the
normalised output in the output's dtype.

Like the attention kernel, this kernel calls no other @triton.jit function, so that
`kernel_variant` can wrap it in Triton's interpreter on a machine that also has a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.kernels.launch import Launch, kernel_variant
from backend.kernels.validate import AttentionShape


@triton.jit
def _split_reduce_kernel(
    # pointers
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    # sizes
    num_splits,
    # strides
    stride_ot,
    stride_oh,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_mt,
    stride_mh,
    # compile-time constants
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM

    stat = tok * stride_mt + head * stride_mh + offs_s
    split_max = tl.load(part_max_ptr + stat, mask=s_mask, other=float("-inf"))
    split_sum = tl.load(part_sum_ptr + stat, mask=s_mask, other=0.0)
    # Split 0 always holds position 0, which every query sees, so m_max is finite; a split
    # that saw no visible key has max -inf and weight exp2(-inf) = 0.
    m_max = tl.reduce(split_max, 0, tl.standard._elementwise_max)
    w = tl.math.exp2(split_max - m_max)
    total = tl.reduce(split_sum * w, 0, tl.standard._sum_combine)

    part = tok * stride_pt + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    acc = tl.load(part_acc_ptr + part, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    o = tl.reduce(acc * w[:, None], 0, tl.standard._sum_combine) / total
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d,
        o.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def split_partials(shape: AttentionShape, num_splits: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """The partial (acc, max, sum) buffers of a split launch, uninitialised, and their strides.

    The strides come in the kernels' argument order: acc's token, head and split strides,
    then the token and head strides that max and sum share.
    """
    part_acc = torch.empty((shape.num_tokens, shape.num_heads, num_splits, shape.head_dim),
                           dtype=torch.float32, device=device)
    part_max = torch.empty((shape.num_tokens, shape.num_heads, num_splits),
                           dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_strides = (*part_acc.stride()[:3], *part_max.stride()[:2])
    return part_acc, part_max, part_sum, part_strides


def plan_split_reduce(
    shape: AttentionShape,
    out: torch.Tensor,
    part_acc: torch.Tensor,
    part_max: torch.Tensor,
    part_sum: torch.Tensor,
    part_strides: tuple[int, ...],
    *,
    num_splits: int,
    block_d: int,
    interpret: bool,
) -> Launch:
    """The launch that combines the partials into `out`, unrun: one program per (token, head)."""
    return Launch(
        kernel=kernel_variant(_split_reduce_kernel, interpret),
        grid=(shape.num_tokens, shape.num_heads),
        args=(out, part_acc, part_max, part_sum,
              num_splits,
              out.stride(0), out.stride(1),
              *part_strides),
        constexprs={
            "HEAD_DIM": shape.head_dim,
            "BLOCK_D": block_d,
            "BLOCK_S": triton.next_power_of_2(num_splits),
        },
        num_warps=4,
    )
