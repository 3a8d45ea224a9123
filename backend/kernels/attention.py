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

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from backend.errors import PagedLabError

LOG2E = 1.4426950408889634
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# A split shorter than this spends more on its partial write and the reduce than it gains.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


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


# ----------------------------------------------------------------------------- launch helpers

_VARIANTS: dict[int, Any] = {}


def kernel_variant(kernel: Any, interpret: bool) -> Any:
    """Return `kernel` to launch compiled (`interpret=False`) or in Triton's interpreter.

    Kernels are decorated once, at import: interpreted when TRITON_INTERPRET=1 was set
    then (no GPU), compiled otherwise. On a GPU machine a CPU run needs the interpreter,
    so the same Python source is wrapped in an `InterpretedFunction`. The reverse
    (compiling a kernel that was decorated for the interpreter) is not offered: a run that
    set TRITON_INTERPRET=1 asked for the interpreter, and gets it.
    """
    if not interpret or isinstance(kernel, InterpretedFunction):
        return kernel
    key = id(kernel)
    if key not in _VARIANTS:
        _VARIANTS[key] = InterpretedFunction(kernel.fn)
    return _VARIANTS[key]


def is_interpreted(kernel: Any) -> bool:
    """Whether launching `kernel` runs Triton's interpreter rather than compiled code."""
    return isinstance(kernel, InterpretedFunction)


@dataclass(frozen=True)
class Launch:
    """One fully resolved kernel launch: `run()` executes it, `compile_for_gpu` compiles it.

    Keeping the resolved arguments lets a machine without a GPU compile exactly the
    signature a GPU run would launch (see tests/test_kernels.py), and lets a benchmark
    time the launches alone, without validation.
    """

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 1

    def run(self) -> None:
        """Launch the kernel (the interpreter ignores num_warps / num_stages)."""
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps,
                               num_stages=self.num_stages)


_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.int32: "i32", torch.int64: "i64"}
_DIVISIBLE = [["tt.divisibility", 16]]


def compile_for_gpu(launch: Launch, *, arch: int = 90) -> Any:
    """Compile `launch` for an NVIDIA GPU of compute capability `arch` (90: Hopper).

    Needs no GPU: Triton lowers to PTX and runs its bundled ptxas. Arguments are
    specialised as the runtime does (16-byte aligned pointers and ints divisible by 16
    marked so, an int equal to 1 made constant), so the result matches what a GPU run
    compiles. Returns Triton's CompiledKernel (asm["ptx"], asm["cubin"], metadata.shared).
    Triton's own helpers are decorated for the interpreter or the compiler when
    triton.language is imported, so this works only where TRITON_INTERPRET was 0 then.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if isinstance(tl.standard._elementwise_max, InterpretedFunction):
        raise RuntimeError("compile_for_gpu needs a process where triton.language was imported "
                           "without TRITON_INTERPRET=1 (run it in a child process with "
                           "TRITON_INTERPRET=0)")
    fn = JITFunction(launch.kernel.fn)
    values = dict(zip(fn.arg_names, launch.args, strict=False))
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(fn.arg_names):
        value = launch.constexprs.get(name, values.get(name))
        if name in launch.constexprs or (type(value) is int and value == 1):
            signature[name] = "constexpr"
            constants[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = _DIVISIBLE
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = _DIVISIBLE
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"cannot specialise argument {name}={value!r}")
    source = ASTSource(fn, signature, constants, attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


@lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


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


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device (None for any other device)."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


# ----------------------------------------------------------------------------- validation


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
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    ia = a.index if a.index is not None else torch.cuda.current_device()
    ib = b.index if b.index is not None else torch.cuda.current_device()
    return ia == ib


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise PagedLabError(message)


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
        _require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)!r}")
    _require(query.dim() == 3, f"query must be [T, num_heads, head_dim], got shape "
             f"{tuple(query.shape)}")
    _require(k_cache.dim() == 4, "k_cache must be [num_blocks, block_size, num_kv_heads, "
             f"head_dim], got shape {tuple(k_cache.shape)}")
    _require(v_cache.shape == k_cache.shape, f"v_cache shape {tuple(v_cache.shape)} differs "
             f"from k_cache shape {tuple(k_cache.shape)}")
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    _require(query.dtype in SUPPORTED_DTYPES, f"query dtype {query.dtype} is not supported; "
             "use float32, float16 or bfloat16")
    _require(k_cache.dtype == query.dtype and v_cache.dtype == query.dtype,
             f"cache dtypes ({k_cache.dtype}, {v_cache.dtype}) must match the query dtype "
             f"{query.dtype}")
    _require(num_tokens >= 1, "query has no tokens: every sequence needs at least one")
    _require(1 <= head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} is outside 1..{MAX_HEAD_DIM}")
    _require(cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} differs from the "
             f"query head_dim {head_dim}")
    _require(num_kv_heads >= 1 and num_heads % num_kv_heads == 0,
             f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    _require(num_blocks >= 1 and block_size >= 1, f"the cache has shape {tuple(k_cache.shape)}: "
             "it needs at least one block of at least one slot")
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(),
             "k_cache and v_cache must be contiguous")
    _require(query.stride(2) == 1, "query's last dimension (head_dim) must be contiguous")
    _require(block_tables.dtype == torch.int32, f"block_tables must be int32, got "
             f"{block_tables.dtype}")
    _require(seq_lens.dtype == torch.int32, f"seq_lens must be int32, got {seq_lens.dtype}")
    _require(query_start_loc.dtype == torch.int32,
             f"query_start_loc must be int32, got {query_start_loc.dtype}")
    _require(block_tables.dim() == 2, f"block_tables must be [batch, max_blocks_per_seq], got "
             f"shape {tuple(block_tables.shape)}")
    num_seqs = block_tables.shape[0]
    _require(num_seqs >= 1, "the batch is empty (block_tables has no rows)")
    _require(block_tables.shape[1] >= 1, "block_tables has no columns")
    _require(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    _require(seq_lens.shape == (num_seqs,), f"seq_lens must have shape ({num_seqs},), got "
             f"{tuple(seq_lens.shape)}")
    _require(query_start_loc.shape == (num_seqs + 1,), f"query_start_loc must have shape "
             f"({num_seqs + 1},), got {tuple(query_start_loc.shape)}")
    _require(seq_lens.is_contiguous() and query_start_loc.is_contiguous(),
             "seq_lens and query_start_loc must be contiguous")
    _require(num_tokens >= num_seqs, f"{num_tokens} query tokens cannot cover {num_seqs} "
             "sequences of at least one token each")
    for name, t in tensors.items():
        _require(same_device(t.device, query.device), f"{name} is on {t.device} but query is "
                 f"on {query.device}")
    _require(isinstance(scale, (int, float)) and math.isfinite(scale),
             f"scale must be a finite number, got {scale!r}")
    if out is not None:
        _require(isinstance(out, torch.Tensor) and out.shape == query.shape,
                 f"out must have the query's shape {tuple(query.shape)}")
        _require(out.dtype == query.dtype, f"out dtype {out.dtype} differs from query dtype "
                 f"{query.dtype}")
        _require(same_device(out.device, query.device), f"out is on {out.device} but query is "
                 f"on {query.device}")
        _require(out.stride(2) == 1, "out's last dimension must be contiguous")
    if num_splits is not None:
        _require(isinstance(num_splits, int) and 1 <= num_splits <= 256,
                 f"num_splits must be an int in 1..256, got {num_splits!r}")

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
    _require(int(qsl[0]) == 0, f"query_start_loc[0] must be 0, got {int(qsl[0])}")
    _require(int(qsl[-1]) == shape.num_tokens, f"query_start_loc[-1] is {int(qsl[-1])} but the "
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


# ----------------------------------------------------------------------------- wrapper


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
    _require(block_q >= 1, f"config.block_m {config.block_m} is smaller than the group {group}")
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
        part_acc = torch.empty((shape.num_tokens, shape.num_heads, num_splits, shape.head_dim),
                               dtype=torch.float32, device=query.device)
        part_max = torch.empty((shape.num_tokens, shape.num_heads, num_splits),
                               dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
        part_strides = (*part_acc.stride()[:3], *part_max.stride()[:2])
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
        launches.append(Launch(
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
        ))
    return out, launches
