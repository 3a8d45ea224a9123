"""Cache maintenance kernels: write new K/V into slots, copy whole blocks.

Slots address the cache flattened to rows of one token::

    cache [num_blocks, block_size, kvh, D]  ->  cache.view(-1, kvh, D)
    slot = block * block_size + offset      ->  row `slot`

`write_kv` scatters T new rows (one per token) into their slots; `copy_blocks` copies
whole blocks (block_size x kvh x D contiguous elements) for copy-on-write (same cache)
and for moving blocks through a staging cache (two caches). Each op has a Triton kernel
and a plain torch twin used by the torch backend. Their argument checks
(`validate_write_kv`, `validate_copy_blocks`) are in backend.kernels.validate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.core.errors import PagedLabError
from backend.kernels.checks import resolve_checks
from backend.kernels.launch import Launch, is_interpreted, kernel_variant
from backend.kernels.validate import validate_copy_blocks, validate_write_kv

# Elements per program. On a GPU a few KiB per program keeps many programs in flight; the
# interpreter runs programs one by one, so it takes as much as it can per program.
_GPU_TILE = 4096
_INTERPRETER_TILE = 1 << 16


@triton.jit
def _write_kv_kernel(
    # pointers
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    # sizes
    num_tokens,
    # strides
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_slot,
    # compile-time constants
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HD: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    # Columns walk one token's kvh x D values; in the cache they are one contiguous row.
    offs_c = tl.arange(0, BLOCK_HD)
    t_mask = offs_t < num_tokens
    c_mask = offs_c < NUM_KV_HEADS * HEAD_DIM
    mask = t_mask[:, None] & c_mask[None, :]
    offs_h = offs_c // HEAD_DIM
    offs_d = offs_c % HEAD_DIM
    tok = offs_t.to(tl.int64)

    slot = tl.load(slot_mapping_ptr + offs_t, mask=t_mask, other=0).to(tl.int64)
    dst = slot[:, None] * stride_slot + offs_c[None, :]

    k = tl.load(
        key_ptr + tok[:, None] * stride_kt + offs_h[None, :] * stride_kh
        + offs_d[None, :] * stride_kd,
        mask=mask,
    )
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(
        value_ptr + tok[:, None] * stride_vt + offs_h[None, :] * stride_vh
        + offs_d[None, :] * stride_vd,
        mask=mask,
    )
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def _copy_blocks_kernel(
    # pointers
    src_ptr,
    dst_ptr,
    src_ids_ptr,
    dst_ids_ptr,
    # sizes
    block_numel,
    # strides
    stride_src_block,
    stride_dst_block,
    # compile-time constants
    BLOCK: tl.constexpr,
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src_block = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + pair).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < block_numel
    x = tl.load(src_ptr + src_block * stride_src_block + offs, mask=mask)
    tl.store(dst_ptr + dst_block * stride_dst_block + offs, x, mask=mask)


# ----------------------------------------------------------------------------- wrappers


def _check_launchable(kernel: object, device: torch.device) -> None:
    if device.type != "cuda" and not is_interpreted(kernel):
        raise PagedLabError("compiled Triton kernels need CUDA tensors; run with the "
                            "interpreter (device cpu) or move the tensors to the GPU")


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_bounds: bool | None = None,
    interpret: bool = False,
) -> None:
    """Scatter new K/V rows into their slots: cache.view(-1, kvh, D)[slot_mapping[t]] = key[t].

    Mutates k_cache and v_cache at the named slots only, K and V in one launch.
    `check_bounds` reads the slots to check them (None: the PAGEDLAB_KERNEL_CHECKS
    setting, off by default); `interpret` runs Triton's interpreter (required for CPU
    tensors). Raises PagedLabError for invalid arguments (see `validate_write_kv`) before
    writing anything.
    """
    launch = plan_write_kv(key, value, k_cache, v_cache, slot_mapping,
                           check_bounds=check_bounds, interpret=interpret)
    if launch is not None:
        launch.run()


def plan_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_bounds: bool | None = None,
    interpret: bool = False,
) -> Launch | None:
    """Validate a write_kv call and return its launch unrun (None when there are no tokens)."""
    shape = validate_write_kv(key, value, k_cache, v_cache, slot_mapping,
                              check_bounds=resolve_checks(check_bounds))
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return None
    kernel = kernel_variant(_write_kv_kernel, interpret)
    _check_launchable(kernel, k_cache.device)
    row = shape.num_kv_heads * shape.head_dim
    block_hd = triton.next_power_of_2(row)
    budget = _INTERPRETER_TILE if is_interpreted(kernel) else _GPU_TILE
    block_t = min(max(1, budget // block_hd), triton.next_power_of_2(num_tokens))
    return Launch(
        kernel=kernel,
        grid=(triton.cdiv(num_tokens, block_t),),
        args=(key, value, k_cache, v_cache, slot_mapping,
              num_tokens,
              key.stride(0), key.stride(1), key.stride(2),
              value.stride(0), value.stride(1), value.stride(2),
              row),
        constexprs={"NUM_KV_HEADS": shape.num_kv_heads, "HEAD_DIM": shape.head_dim,
                    "BLOCK_T": block_t, "BLOCK_HD": block_hd},
        num_warps=4,
    )


def copy_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    check_bounds: bool | None = None,
    interpret: bool = False,
) -> None:
    """Copy whole blocks: dst_cache[dst_ids[i]] = src_cache[src_ids[i]] for every i.

    Mutates dst_cache at the blocks in dst_ids only; src_cache is only read (the two may be
    the same tensor when no block is both a source and a destination). Raises
    PagedLabError for invalid arguments (see `validate_copy_blocks`) before copying.
    """
    launch = plan_copy_blocks(src_cache, dst_cache, src_ids, dst_ids,
                              check_bounds=check_bounds, interpret=interpret)
    if launch is not None:
        launch.run()


def plan_copy_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    check_bounds: bool | None = None,
    interpret: bool = False,
) -> Launch | None:
    """Validate a copy_blocks call and return its launch unrun (None when there is no pair)."""
    src, _ = validate_copy_blocks(src_cache, dst_cache, src_ids, dst_ids,
                                  check_bounds=resolve_checks(check_bounds))
    num_pairs = src_ids.numel()
    if num_pairs == 0:
        return None
    kernel = kernel_variant(_copy_blocks_kernel, interpret)
    _check_launchable(kernel, src_cache.device)
    block_numel = src.block_size * src.num_kv_heads * src.head_dim
    budget = _INTERPRETER_TILE if is_interpreted(kernel) else _GPU_TILE
    block = min(budget, triton.next_power_of_2(block_numel))
    return Launch(
        kernel=kernel,
        grid=(num_pairs, triton.cdiv(block_numel, block)),
        args=(src_cache, dst_cache, src_ids, dst_ids,
              block_numel,
              src_cache.stride(0), dst_cache.stride(0)),
        constexprs={"BLOCK": block},
        num_warps=4,
    )


def torch_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """write_kv in plain torch (inputs already validated). Mutates the named slots only."""
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)


def torch_copy_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
) -> None:
    """copy_blocks in plain torch (inputs already validated). Mutates dst blocks only."""
    # index_select makes a copy first, so sources are read before any destination changes.
    dst_cache.index_copy_(0, dst_ids.long(), src_cache.index_select(0, src_ids.long()))
