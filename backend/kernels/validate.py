"""Argument checks of the kernel wrappers: every mistake is a PagedLabError naming
the problem, raised before anything is launched.

`validate_paged_attention` checks a paged-attention call (backend.kernels.attention);
`validate_write_kv` and `validate_copy_blocks` check the cache maintenance ops
(backend.kernels.cache_ops). The torch backend runs the same checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

from backend.core.errors import PagedLabError

# The dtypes the kernels accept, by the names a config uses.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}
SUPPORTED_DTYPES = tuple(TORCH_DTYPES.values())
MAX_HEAD_DIM = 256


class AttentionShape(NamedTuple):
    """Sizes of a validated paged-attention call."""

    num_tokens: int
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    max_blocks_per_seq: int


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats 'cuda' and 'cuda:<current>' as the same GPU."""
    if a == b:  # the usual answer, and the cheapest
        return True
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    ia = a.index if a.index is not None else torch.cuda.current_device()
    ib = b.index if b.index is not None else torch.cuda.current_device()
    return ia == ib


def require(cond: bool, message: str | Callable[[], str]) -> None:
    """Raise PagedLabError(message) unless `cond`.

    Messages that format shapes, dtypes or devices are lambdas: formatting them costs
    more than all the checks together, and a valid call (every call of a model step)
    needs none of them.
    """
    if not cond:
        raise PagedLabError(message() if callable(message) else message)


def _on_device_of(ref_name: str, ref: torch.device,
                  tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Every tensor is on `ref` (formatting devices only for the error)."""
    for name, t in tensors:
        if not same_device(t.device, ref):
            raise PagedLabError(f"{name} is on {t.device} but {ref_name} is on {ref}")


def call_signature(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   out: torch.Tensor | None, scale: float,
                   num_splits: int | None) -> tuple[object, ...] | None:
    """Everything `validate_paged_attention` reads of a call besides its metadata tensors:
    each tensor's type, shape, dtype, strides and device, and the scalars.

    Two calls with the same signature over the same (unmodified) metadata tensors get
    the same verdict without bounds checks, so a StepPlan keeps the verdict of its
    first layer for the others. None when an argument is not a tensor (validate that
    call in full: it gets the message).
    """
    if not (isinstance(query, torch.Tensor) and isinstance(k_cache, torch.Tensor)
            and isinstance(v_cache, torch.Tensor)
            and (out is None or isinstance(out, torch.Tensor))):
        return None
    # One flat tuple, written out: it is built on every layer of a step.
    return (scale, type(scale), num_splits, type(num_splits),
            query.shape, query.dtype, query.stride(), query.device,
            k_cache.shape, k_cache.dtype, k_cache.stride(), k_cache.device,
            v_cache.shape, v_cache.dtype, v_cache.stride(), v_cache.device,
            None if out is None else
            (out.shape, out.dtype, out.stride(), out.device))


def metadata_signature(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor) -> tuple[object, ...] | None:
    """What `validate_paged_attention` reads of the metadata tensors without bounds
    checks (their shape, dtype, strides and device, never their values); None when one
    is not a tensor. With `call_signature`, the whole of what such a verdict depends on.
    """
    if not (isinstance(block_tables, torch.Tensor) and isinstance(seq_lens, torch.Tensor)
            and isinstance(query_start_loc, torch.Tensor)):
        return None
    return (block_tables.shape, block_tables.dtype, block_tables.stride(), block_tables.device,
            seq_lens.shape, seq_lens.dtype, seq_lens.stride(), seq_lens.device,
            query_start_loc.shape, query_start_loc.dtype, query_start_loc.stride(),
            query_start_loc.device)


class Verdicts:
    """The signatures of calls that passed validation without bounds checks, kept for
    the process: a step's first layer with a batch shaped like one seen before skips
    the checks (they cost about as much as a small decode). Only passes are kept, so a
    bad call is refused every time, with its message. Bounded: past `limit` entries it
    starts again. Safe under concurrent sessions: one dict read or write at a time.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._passed: dict[tuple[object, ...], bool] = {}

    def check(self, signature: tuple[object, ...], validate: Callable[[], object]) -> None:
        """Run `validate` unless `signature` passed before; remember it if it passes."""
        if signature in self._passed:
            return
        validate()  # raises on a bad call: nothing is kept
        if len(self._passed) >= self.limit:
            self._passed.clear()
        self._passed[signature] = True

    def __len__(self) -> int:
        return len(self._passed)


def validate_paged_attention(
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
) -> AttentionShape:
    """Check a paged-attention call; raise PagedLabError naming the first problem found.

    Shape, dtype, device and stride checks read no tensor data. With `check_bounds`, the
    checks that must read query_start_loc, seq_lens and the used part of the block tables
    also run (a device-to-host copy on a GPU): q_len >= 1 per sequence, seq_len >= q_len,
    enough table columns, and every table entry a position needs inside the pool. Without
    them, a bad table entry makes the kernel read the wrong (or an invalid) address.
    Mutates nothing.
    """
    tensors = {"query": query, "k_cache": k_cache, "v_cache": v_cache,
               "block_tables": block_tables, "seq_lens": seq_lens,
               "query_start_loc": query_start_loc}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise PagedLabError(f"{name} must be a torch.Tensor, got {type(t)!r}")
    require(query.dim() == 3, lambda: "query must be [T, num_heads, head_dim], got shape "
            f"{tuple(query.shape)}")
    require(k_cache.dim() == 4, lambda: "k_cache must be [num_blocks, block_size, "
            f"num_kv_heads, head_dim], got shape {tuple(k_cache.shape)}")
    require(v_cache.shape == k_cache.shape, lambda: f"v_cache shape {tuple(v_cache.shape)} "
            f"differs from k_cache shape {tuple(k_cache.shape)}")
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    require(query.dtype in SUPPORTED_DTYPES, lambda: f"query dtype {query.dtype} is not "
            "supported; use float32, float16 or bfloat16")
    require(k_cache.dtype == query.dtype and v_cache.dtype == query.dtype,
            lambda: f"cache dtypes ({k_cache.dtype}, {v_cache.dtype}) must match the query "
            f"dtype {query.dtype}")
    require(num_tokens >= 1, "query has no tokens: every sequence needs at least one")
    require(1 <= head_dim <= MAX_HEAD_DIM,
            lambda: f"head_dim {head_dim} is outside 1..{MAX_HEAD_DIM}")
    require(cache_head_dim == head_dim, lambda: f"cache head_dim {cache_head_dim} differs "
            f"from the query head_dim {head_dim}")
    require(num_kv_heads >= 1 and num_heads % num_kv_heads == 0,
            lambda: f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    require(num_blocks >= 1 and block_size >= 1, lambda: "the cache has shape "
            f"{tuple(k_cache.shape)}: it needs at least one block of at least one slot")
    require(k_cache.is_contiguous() and v_cache.is_contiguous(),
            "k_cache and v_cache must be contiguous")
    require(query.stride(2) == 1, "query's last dimension (head_dim) must be contiguous")
    require(block_tables.dtype == torch.int32,
            lambda: f"block_tables must be int32, got {block_tables.dtype}")
    require(seq_lens.dtype == torch.int32, lambda: f"seq_lens must be int32, got "
            f"{seq_lens.dtype}")
    require(query_start_loc.dtype == torch.int32,
            lambda: f"query_start_loc must be int32, got {query_start_loc.dtype}")
    require(block_tables.dim() == 2, lambda: "block_tables must be [batch, "
            f"max_blocks_per_seq], got shape {tuple(block_tables.shape)}")
    num_seqs = block_tables.shape[0]
    require(num_seqs >= 1, "the batch is empty (block_tables has no rows)")
    require(block_tables.shape[1] >= 1, "block_tables has no columns")
    require(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    require(seq_lens.shape == (num_seqs,), lambda: f"seq_lens must have shape ({num_seqs},), "
            f"got {tuple(seq_lens.shape)}")
    require(query_start_loc.shape == (num_seqs + 1,), lambda: "query_start_loc must have "
            f"shape ({num_seqs + 1},), got {tuple(query_start_loc.shape)}")
    require(seq_lens.is_contiguous() and query_start_loc.is_contiguous(),
            "seq_lens and query_start_loc must be contiguous")
    require(num_tokens >= num_seqs, lambda: f"{num_tokens} query tokens cannot cover "
            f"{num_seqs} sequences of at least one token each")
    _on_device_of("query", query.device, tensors.items())
    require(isinstance(scale, (int, float)) and math.isfinite(scale),
            lambda: f"scale must be a finite number, got {scale!r}")
    if out is not None:
        require(isinstance(out, torch.Tensor) and out.shape == query.shape,
                lambda: f"out must have the query's shape {tuple(query.shape)}")
        require(out.dtype == query.dtype,
                lambda: f"out dtype {out.dtype} differs from query dtype {query.dtype}")
        require(same_device(out.device, query.device),
                lambda: f"out is on {out.device} but query is on {query.device}")
        require(out.stride(2) == 1, "out's last dimension must be contiguous")
    if num_splits is not None:
        require(isinstance(num_splits, int) and 1 <= num_splits <= 256,
                lambda: f"num_splits must be an int in 1..256, got {num_splits!r}")

    shape = AttentionShape(num_tokens, num_seqs, num_heads, num_kv_heads, head_dim, block_size,
                           num_blocks, block_tables.shape[1])
    if check_bounds:
        _check_lengths_and_tables(shape, block_tables, seq_lens, query_start_loc)
    return shape


def _check_lengths_and_tables(
    shape: AttentionShape,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    qsl = query_start_loc.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64)
    require(int(qsl[0]) == 0, f"query_start_loc[0] must be 0, got {int(qsl[0])}")
    require(int(qsl[-1]) == shape.num_tokens, f"query_start_loc[-1] is {int(qsl[-1])} but the "
             f"query has {shape.num_tokens} tokens")
    q_lens = qsl[1:] - qsl[:-1]
    if (b := _first(q_lens < 1)) is not None:
        raise PagedLabError(f"sequence {b} has q_len {int(q_lens[b])}; every sequence needs at "
                            "least one query token")
    if (b := _first(lens < q_lens)) is not None:
        raise PagedLabError(f"sequence {b} has seq_len {int(lens[b])} < its q_len "
                            f"{int(q_lens[b])}; seq_len counts the new tokens too")
    blocks_needed = (lens + shape.block_size - 1) // shape.block_size
    if (b := _first(blocks_needed > shape.max_blocks_per_seq)) is not None:
        raise PagedLabError(f"sequence {b} has seq_len {int(lens[b])}, which needs "
                            f"{int(blocks_needed[b])} blocks of {shape.block_size} slots, but "
                            f"block_tables has {shape.max_blocks_per_seq} columns")
    used_cols = int(blocks_needed.max())
    table = block_tables[:, :used_cols].to("cpu", torch.int64)
    used = torch.arange(used_cols)[None, :] < blocks_needed[:, None]
    bad = torch.nonzero(used & ((table < 0) | (table >= shape.num_blocks)))
    if bad.numel():
        b, j = (int(x) for x in bad[0])
        raise PagedLabError(f"block_tables[{b}, {j}] = {int(table[b, j])} is not a block of "
                            f"the pool (0..{shape.num_blocks - 1}); sequence {b} needs it for "
                            f"positions {j * shape.block_size}.."
                            f"{min(int(lens[b]), (j + 1) * shape.block_size) - 1}")


def _first(flags: torch.Tensor) -> int | None:
    """Index of the first True in a 1-D bool tensor, or None."""
    hits = torch.nonzero(flags).flatten()
    return int(hits[0]) if hits.numel() else None


# ----------------------------------------------------------------------------- cache ops


class CacheShape(NamedTuple):
    """Sizes of a validated cache: [num_blocks, block_size, num_kv_heads, head_dim]."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


def _check_cache(name: str, cache: torch.Tensor) -> CacheShape:
    require(isinstance(cache, torch.Tensor), lambda: f"{name} must be a torch.Tensor")
    require(cache.dim() == 4, lambda: f"{name} must be [num_blocks, block_size, "
            f"num_kv_heads, head_dim], got shape {tuple(cache.shape)}")
    require(cache.dtype in SUPPORTED_DTYPES, lambda: f"{name} dtype {cache.dtype} is not "
            "supported; use float32, float16 or bfloat16")
    require(cache.is_contiguous(), lambda: f"{name} must be contiguous")
    return CacheShape(*cache.shape)


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def validate_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_bounds: bool = True,
) -> CacheShape:
    """Check a write_kv call; raise PagedLabError naming the problem. Mutates nothing.

    With `check_bounds`, slot values are read (a device-to-host copy on a GPU): each must
    lie in 0..num_blocks*block_size-1 and appear once (two writes to one slot would race).
    """
    shape = _check_cache("k_cache", k_cache)
    _check_cache("v_cache", v_cache)
    require(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype,
            "k_cache and v_cache must have the same shape and dtype")
    for name, t in (("key", key), ("value", value)):
        if not (isinstance(t, torch.Tensor) and t.dim() == 3):
            raise PagedLabError(f"{name} must be a tensor [T, num_kv_heads, head_dim]")
        if tuple(t.shape[1:]) != (shape.num_kv_heads, shape.head_dim):
            raise PagedLabError(f"{name} has shape {tuple(t.shape)}; the cache holds "
                                f"[*, {shape.num_kv_heads}, {shape.head_dim}] per token")
        if t.dtype != k_cache.dtype:
            raise PagedLabError(f"{name} dtype {t.dtype} differs from the cache dtype "
                                f"{k_cache.dtype}")
    require(value.shape[0] == key.shape[0], lambda: f"key has {key.shape[0]} tokens but value "
            f"has {value.shape[0]}")
    require(isinstance(slot_mapping, torch.Tensor) and slot_mapping.dtype == torch.int64,
            "slot_mapping must be an int64 tensor")
    require(slot_mapping.shape == (key.shape[0],), lambda: "slot_mapping must have shape "
            f"({key.shape[0]},), got {tuple(slot_mapping.shape)}")
    require(slot_mapping.is_contiguous(), "slot_mapping must be contiguous")
    _on_device_of("k_cache", k_cache.device, (("key", key), ("value", value),
                                              ("v_cache", v_cache),
                                              ("slot_mapping", slot_mapping)))
    if check_bounds and slot_mapping.numel():
        slots = slot_mapping.cpu()
        num_slots = shape.num_blocks * shape.block_size
        bad = torch.nonzero((slots < 0) | (slots >= num_slots)).flatten()
        if bad.numel():
            i = int(bad[0])
            raise PagedLabError(f"slot_mapping[{i}] = {int(slots[i])} is outside the cache's "
                                f"slots 0..{num_slots - 1}")
        require(torch.unique(slots).numel() == slots.numel(),
                 "slot_mapping names a slot twice; each token needs its own slot")
    return shape


def validate_copy_blocks(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    *,
    check_bounds: bool = True,
) -> tuple[CacheShape, CacheShape]:
    """Check a copy_blocks call; raise PagedLabError naming the problem. Mutates nothing.

    With `check_bounds`, the ids are read (a device-to-host copy on a GPU): each in range
    of its cache, no destination twice, and, when both caches share storage, no block both
    a source and a destination (the result would depend on the order of the copies).
    """
    src = _check_cache("src_cache", src_cache)
    dst = _check_cache("dst_cache", dst_cache)
    require(src[1:] == dst[1:] and src_cache.dtype == dst_cache.dtype,
            lambda: f"src_cache {tuple(src_cache.shape)} {src_cache.dtype} and dst_cache "
            f"{tuple(dst_cache.shape)} {dst_cache.dtype} must have the same block shape and "
            "dtype")
    for name, ids in (("src_ids", src_ids), ("dst_ids", dst_ids)):
        if not (isinstance(ids, torch.Tensor) and ids.dtype in (torch.int32, torch.int64)
                and ids.dim() == 1):
            raise PagedLabError(f"{name} must be a 1-D int32 or int64 tensor")
        require(ids.is_contiguous(), f"{name} must be contiguous")
    require(src_ids.shape == dst_ids.shape, lambda: f"src_ids has {src_ids.numel()} ids but "
            f"dst_ids has {dst_ids.numel()}")
    _on_device_of("src_cache", src_cache.device, (("dst_cache", dst_cache),
                                                  ("src_ids", src_ids), ("dst_ids", dst_ids)))
    if check_bounds and src_ids.numel():
        s = src_ids.to("cpu", torch.int64)
        d = dst_ids.to("cpu", torch.int64)
        for name, ids, n in (("src_ids", s, src.num_blocks), ("dst_ids", d, dst.num_blocks)):
            bad = torch.nonzero((ids < 0) | (ids >= n)).flatten()
            if bad.numel():
                i = int(bad[0])
                raise PagedLabError(f"{name}[{i}] = {int(ids[i])} is not a block of its cache "
                                    f"(0..{n - 1})")
        require(torch.unique(d).numel() == d.numel(), "dst_ids names a block twice")
        if _shares_storage(src_cache, dst_cache):
            both = sorted(set(s.tolist()) & set(d.tolist()))
            require(not both, f"block {both[0] if both else ''} is both a source and a "
                     "destination in the same cache")
    return src, dst
