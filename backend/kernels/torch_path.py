"""Paged attention in vectorized torch: the torch backend's path, fast on a CPU.

On a CPU with PagedLab's compiled operator loaded (backend.kernels.native), every
decode row (a decode-only batch, or the decode rows of a mixed batch) goes to it: one
call reads K/V through the tables with no gather. What follows is the route for
everything else: prefill chunks, GPUs, and decodes where the operator is not built or
is turned off.

Each sequence's K/V is gathered once, token rows through the block tables, into a
contiguous buffer that torch's scaled_dot_product_attention reads as [n, kvh, L, D]
(a transposed view, no second copy; grouped-query attention natively)::

    slot[b, p] = table[b, p // block_size] * block_size + p % block_size   (p < seq_len)
    slot[b, p] = slot[b, 0]                                                 (p >= seq_len)

Positions past a sequence's length (the tail of its last block, table padding) are
redirected to its first slot instead of masked after the fact: they are hidden from
the softmax by the attention mask, and what they read is that sequence's own finite
K/V, never a stale or NaN slot (0 * NaN would leak through the P @ V product).

A decode-only batch (every q_len 1, which T == batch proves from the shapes alone) is
computed without reading anything back to the host. A batch with prefill chunks needs
the query start offsets and lengths as Python ints: from its plan's host lists where the
batch was built on the host (the engine's always is), else read once per plan (or per
call without a plan). It then runs its decodes batched like the above and each prefill
chunk on its own with a bottom-right causal mask. Decodes gather about
GATHER_BYTES of K/V at a time, so long contexts stay in bounded memory and the buffer
SDPA reads is still warm in the CPU's caches: groups of whole sequences while one fits,
else slices of positions of every sequence, each attended with its log-sum-exp and all
merged exactly at the end. On a CPU the gather buffers are kept per thread and reused: a
fresh multi-MiB tensor on every call costs page faults that take longer than the gather
itself (10x for 32 MiB here), and the same few MiB gathered into again stay in cache.

Given the step's `StepPlan` (backend.kernels.plan), what depends only on the tables and
lengths (the slots, the mask, which rows are decodes, the host's offsets) is computed on
the first layer and reused by the others, on a CPU with the gather buffers and the views
of them SDPA reads: per layer, a decode is then the two gathers, SDPA and the copy into
`out` (four torch calls besides SDPA where there were twelve). The gathers
stay per layer, since each layer has its own K/V: they are what paging costs over a
contiguous cache. With the lengths on the host, a decode gathers up to the longest
sequence rather than the tables' capacity, and a batch of equal lengths needs no mask.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

from backend.core.errors import PagedLabError
from backend.kernels import native
from backend.kernels.plan import StepPlan, usable

# K and V gathered per group or slice. Measured on a 2-core EPYC with 1 MiB of L2 a
# core (docs/BENCHMARKS.md): 4 MiB ran batched decodes of SmolLM2's and the 8B shape
# up to 1.9x faster than 16 MiB, whose buffers SDPA read back from memory, while much
# smaller slices cost more in per-slice calls than they saved.
GATHER_BYTES = 4 << 20
# A slice of positions covers at least this many: below it, a batch of many long
# sequences pays more in per-slice calls than the smaller buffers save.
SLICE_MIN_POSITIONS = 64
# Larger gathers (one very long sequence) get a fresh buffer rather than pinning its
# memory to the thread.
SCRATCH_MAX_BYTES = 64 << 20
_scratch = threading.local()

# The CPU flash-attention kernel that public SDPA dispatches to, which also returns each
# row's log-sum-exp: what merging slices of positions needs. Private to torch, so its
# absence (another torch) falls back to whole sequences per gather.
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@lru_cache(maxsize=64)
def _positions(length: int, block_size: int, wide: bool, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, their table column, their offset in the block) for 0..length-1, the
    offsets int64 if `wide` else int32 (the table's dtype).

    Cached per shape: a decode step asks for the same length on every layer. The tensors
    are shared, so they are only ever read.
    """
    pos = torch.arange(length, device=device)
    offset = (pos % block_size).to(torch.int64 if wide else torch.int32)
    return pos, torch.div(pos, block_size, rounding_mode="floor"), offset


def _slots(tables: torch.Tensor, lens: torch.Tensor, length: int, block_size: int,
           num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [n, length], visible [n, length]) of each sequence's positions 0..length-1."""
    wide = num_slots >= 2**31  # block * block_size would overflow int32
    pos, col, offset = _positions(length, block_size, wide, tables.device)
    ids = tables.index_select(1, col)
    slots = torch.add(offset, ids.long() if wide else ids, alpha=block_size)
    visible = pos < lens[:, None]
    return torch.where(visible, slots, slots[:, :1]), visible


def _buffer(which: int, numel: int, like: torch.Tensor) -> torch.Tensor | None:
    """A reused flat buffer of `numel` elements of `like`'s dtype, on a CPU (else None).

    One per (which, dtype, inference mode) per thread, grown as needed; a gather's result
    never outlives the call that made it, so reuse is safe.
    """
    if like.device.type != "cpu":
        return None  # the CUDA caching allocator reuses memory already
    buffers: dict[tuple[int, torch.dtype, bool], torch.Tensor] = \
        _scratch.__dict__.setdefault("buffers", {})
    key = (which, like.dtype, torch.is_inference_mode_enabled())
    buf = buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=like.dtype)
        if numel * like.element_size() <= SCRATCH_MAX_BYTES:
            buffers[key] = buf
    return buf[:numel]


def _gather(cache: torch.Tensor, flat_slots: torch.Tensor, n: int, which: int) -> torch.Tensor:
    """Rows `flat_slots` ([n * L], sequence-major) of the cache as [n, kvh, L, D] (a view
    of one contiguous copy)."""
    _, _, kvh, d = cache.shape
    rows = cache.view(-1, kvh * d)
    buf = _buffer(which, flat_slots.numel() * kvh * d, cache)
    if buf is None:
        gathered = rows.index_select(0, flat_slots)
    else:
        gathered = torch.index_select(rows, 0, flat_slots,
                                      out=buf.view(flat_slots.numel(), kvh * d))
    return gathered.view(n, -1, kvh, d).transpose(1, 2)


class _Gather(NamedTuple):
    """Where a batch's decode reads: slots [n, L] (flat: [n * L]) and the mask [n, L]
    (as [n, 1, 1, L]: SDPA's shape; None when every sequence is L long) of each
    sequence's positions 0..L-1."""

    slots: torch.Tensor
    flat: torch.Tensor
    visible: torch.Tensor
    mask: torch.Tensor | None


class _Ready(NamedTuple):
    """A CPU decode batch that one gather covers, made ready once per plan for every
    layer: where it reads and its mask (as in _Gather), the two buffers it gathers into
    ([n * L, kvh * D]) and the [n, kvh, L, D] views of them that SDPA reads."""

    flat: torch.Tensor
    mask: torch.Tensor | None
    row: int  # kvh * D: one token's K (or V) across its heads
    gqa: bool
    k_rows: torch.Tensor
    v_rows: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def _ready(g: _Gather, num_heads: int, k_cache: torch.Tensor) -> _Ready | None:
    """`g` made ready for a CPU step's layers, or None if it needs more than one gather."""
    n, length = g.slots.shape
    _, _, kvh, d = k_cache.shape
    if _gathers(n, length, 2 * kvh * d * k_cache.element_size()) != 1:
        return None
    rows = []
    for which in (0, 1):
        buf = _buffer(which, n * length * kvh * d, k_cache)
        assert buf is not None  # on a CPU
        rows.append(buf.view(n * length, kvh * d))
    k_rows, v_rows = rows
    return _Ready(g.flat, g.mask, kvh * d, num_heads != kvh, k_rows, v_rows,
                  k_rows.view(n, length, kvh, d).transpose(1, 2),
                  v_rows.view(n, length, kvh, d).transpose(1, 2))


def _gathers(n: int, length: int, per_position: int) -> int:
    """How many gathers a decode of n sequences of `length` positions takes on a CPU:
    1, or more (groups of sequences), or 0 for slices of positions (see _decode)."""
    if length * per_position > GATHER_BYTES and _FLASH_WITH_LSE is not None:
        return 0
    return -(-n // _group_size(length, per_position))


def _group_size(length: int, per_position: int) -> int:
    """Whole sequences of `length` positions one gather takes (at least one)."""
    return max(1, GATHER_BYTES // (length * per_position))


def _gather_plan(tables: torch.Tensor, lens: torch.Tensor, block_size: int, num_slots: int,
                 host_lens: Sequence[int] | None = None) -> _Gather:
    """The slots and mask of a decode batch. With the lengths on the host, L is the
    longest of them and equal lengths need no mask; without, L is the tables' capacity
    (reading the lengths would be a device-to-host copy on a GPU)."""
    if host_lens:
        length = max(host_lens)
        uniform = min(host_lens) == length
    else:
        length, uniform = tables.shape[1] * block_size, False
    slots, visible = _slots(tables, lens, length, block_size, num_slots)
    return _Gather(slots, slots.view(-1), visible,
                   None if uniform else visible[:, None, None, :])


def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            tables: torch.Tensor, lens: torch.Tensor, scale: float,
            plan: StepPlan | None = None, rows_key: str = "all",
            host_lens: Sequence[int] | None = None) -> torch.Tensor:
    """One new token per sequence: query [n, H, D] -> [n, H, D].

    Gathers at most about GATHER_BYTES at a time: whole sequences in groups while one
    sequence fits, else (on a CPU) slices of positions of every sequence, merged by
    their log-sum-exp. With `plan`, the slots and mask are the plan's for `rows_key`
    (which of its sequences `tables` holds; `host_lens`, their lengths if known).
    """
    n, num_heads, _ = query.shape
    num_blocks, block_size, kvh, d = k_cache.shape
    num_slots = num_blocks * block_size
    cpu = query.device.type == "cpu"

    def where() -> _Gather:
        return _gather_plan(tables, lens, block_size, num_slots, host_lens)

    if plan is None:
        g = where()
    else:
        g = plan.memo(("decode", rows_key, block_size, num_slots), where)
        # The common CPU case, with what every layer shares made once: two gathers into
        # the plan's buffers and SDPA on their views.
        ready = plan.memo(("ready", rows_key, k_cache.shape, k_cache.dtype, num_heads,
                           torch.is_inference_mode_enabled()),
                          lambda: _ready(g, num_heads, k_cache) if cpu else None)
        if ready is not None:
            torch.index_select(k_cache.view(-1, ready.row), 0, ready.flat, out=ready.k_rows)
            torch.index_select(v_cache.view(-1, ready.row), 0, ready.flat, out=ready.v_rows)
            return F.scaled_dot_product_attention(
                query.unsqueeze(2), ready.k, ready.v, attn_mask=ready.mask, scale=scale,
                enable_gqa=ready.gqa).squeeze(2)  # [n, H, 1, D] -> [n, H, D]
    length = g.slots.shape[1]
    per_position = 2 * kvh * d * k_cache.element_size()
    gqa = num_heads != kvh
    if cpu and _gathers(n, length, per_position) == 0:
        width = max(SLICE_MIN_POSITIONS, GATHER_BYTES // (n * per_position))
        cut = _slices(g, lens, width, query.dtype) if plan is None else plan.memo(
            ("slices", rows_key, block_size, num_slots, width, query.dtype),
            lambda: _slices(g, lens, width, query.dtype))
        return _decode_slices(query, k_cache, v_cache, cut, scale)
    group = _group_size(length, per_position)
    if n <= group:  # the common case: the whole batch in one gather, no slicing
        o = F.scaled_dot_product_attention(
            query.unsqueeze(2), _gather(k_cache, g.flat, n, 0), _gather(v_cache, g.flat, n, 1),
            attn_mask=g.mask, scale=scale, enable_gqa=gqa)  # [n, H, 1, D]
        return o.squeeze(2)
    outs = []
    for b0 in range(0, n, group):
        rows = slice(b0, b0 + group)
        part = g.slots[rows]
        flat = part.reshape(-1)
        o = F.scaled_dot_product_attention(
            query[rows, :, None, :], _gather(k_cache, flat, part.shape[0], 0),
            _gather(v_cache, flat, part.shape[0], 1),
            attn_mask=None if g.mask is None else g.mask[rows],
            scale=scale, enable_gqa=gqa)  # [g, H, 1, D]
        outs.append(o[:, :, 0])
    return torch.cat(outs)


class _Slices(NamedTuple):
    """A decode cut into slices of `width` positions of every sequence: each slice's
    slots (flat, [n * width]), the additive mask [n, L] in the query's dtype, and which
    sequences end before each slice ([C, n, 1, 1])."""

    width: int
    flats: list[torch.Tensor]
    mask: torch.Tensor
    ended: torch.Tensor


def _slices(g: _Gather, lens: torch.Tensor, width: int, dtype: torch.dtype) -> _Slices:
    slots = g.slots
    length = slots.shape[1]
    # The kernel takes an additive mask in the query's dtype.
    mask = torch.zeros(g.visible.shape, dtype=dtype, device=slots.device)
    mask.masked_fill_(~g.visible, float("-inf"))
    starts = torch.arange(0, length, width, device=slots.device)
    return _Slices(width, [slots[:, p0:p0 + width].reshape(-1) for p0 in range(0, length, width)],
                   mask, (starts[:, None] >= lens[None, :])[:, :, None, None])


def _decode_slices(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cut: _Slices, scale: float) -> torch.Tensor:
    """Attention over `cut.width` positions of every sequence at a time, merged exactly
    once all are done: out = sum_c w_c o_c / sum_c w_c with w_c = exp(lse_c), a softmax
    over the slices' log-sum-exps."""
    assert _FLASH_WITH_LSE is not None
    n = query.shape[0]
    q = query[:, :, None, :]
    outs, lses = [], []
    for c, flat in enumerate(cut.flats):
        cols = slice(c * cut.width, (c + 1) * cut.width)
        o, lse = _FLASH_WITH_LSE(q, _gather(k_cache, flat, n, 0), _gather(v_cache, flat, n, 1),
                                 0.0, False, attn_mask=cut.mask[:, None, None, cols],
                                 scale=scale)  # [n, H, 1, D], [n, H, 1]
        outs.append(o)
        lses.append(lse)
    # A sequence that ends before a slice has all its positions there masked; the kernel
    # then reports lse 0 (and o 0), so that slice's weight is forced to zero. Position 0
    # is in the first slice, so every row keeps one finite weight.
    weights = torch.softmax(torch.stack(lses).float().masked_fill(cut.ended, float("-inf")), 0)
    merged = (torch.stack(outs).float() * weights[..., None]).sum(0)  # [n, H, 1, D]
    return merged[:, :, 0].to(query.dtype)


def _prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             table: torch.Tensor, seq_len: int, scale: float,
             plan: StepPlan | None = None, seq: int = 0) -> torch.Tensor:
    """One sequence's chunk of q_len tokens, query [q_len, H, D], against seq_len keys.

    With `plan`, the slots and mask are kept there for sequence `seq` of the batch.
    """
    q_len, num_heads, _ = query.shape
    num_blocks, block_size, kvh, _ = k_cache.shape
    num_slots = num_blocks * block_size

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.full((1,), seq_len, dtype=torch.int64, device=query.device)
        slots, _ = _slots(table[None], lens, seq_len, block_size, num_slots)
        # Bottom-right causal: query i sits at position seq_len - q_len + i.
        pos = _positions(seq_len, block_size, False, query.device)[0]
        q_pos = pos[seq_len - q_len:]
        return slots, pos[None, :] <= q_pos[:, None]  # [1, seq_len], [q_len, seq_len]

    slots, visible = build() if plan is None else \
        plan.memo(("prefill", seq, block_size, num_slots), build)
    o = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None], _gather(k_cache, slots.view(-1), 1, 0),
        _gather(v_cache, slots.view(-1), 1, 1),
        attn_mask=visible, scale=scale, enable_gqa=num_heads != kvh)  # [1, H, q_len, D]
    return o[0].transpose(0, 1)


def torch_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    plan: StepPlan | None = None,
) -> torch.Tensor:
    """Causal grouped-query paged attention, vectorized; returns `out` in the query's dtype.

    Inputs as for the kernels (backend.kernels.attention), assumed valid. `plan` is the
    step's StepPlan over these tables and lengths, or None. Reads the host only for a
    batch with prefill chunks whose plan has no host offsets (once per plan, or per call
    without one). Writes only `out`.
    """
    plan = usable(plan, block_tables, seq_lens, query_start_loc)
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    num_tokens, num_seqs = query.shape[0], block_tables.shape[0]
    op = native.decode_op() if query.device.type == "cpu" else None
    if num_tokens == num_seqs:  # q_len >= 1 each, so all are 1: token b is sequence b
        if op is not None:
            _native_decode(op, query, k_cache, v_cache, block_tables, seq_lens, scale, out)
        else:
            out.copy_(_decode(query, k_cache, v_cache, block_tables, seq_lens, scale, plan,
                              host_lens=None if plan is None else plan.seq_lens_host))
        return out
    mixed = _mixed(block_tables, seq_lens, query_start_loc, plan) if plan is None else \
        plan.memo("mixed", lambda: _mixed(block_tables, seq_lens, query_start_loc, plan))
    if mixed.decode_tokens is not None:
        assert mixed.decode_tables is not None and mixed.decode_lens is not None
        q = query.index_select(0, mixed.decode_tokens)
        if op is not None:
            o = torch.empty_like(q)
            _native_decode(op, q, k_cache, v_cache, mixed.decode_tables, mixed.decode_lens,
                           scale, o)
        else:
            o = _decode(q, k_cache, v_cache, mixed.decode_tables, mixed.decode_lens, scale,
                        plan, "decodes", mixed.decode_host_lens)
        out.index_copy_(0, mixed.decode_tokens, o.to(out.dtype))
    for b, start, end, seq_len in mixed.prefills:
        out[start:end] = _prefill(query[start:end], k_cache, v_cache, block_tables[b],
                                  seq_len, scale, plan, b)
    return out


def _native_decode(op: Callable[..., None], query: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                   scale: float, out: torch.Tensor) -> None:
    """A decode batch (query [n, H, D]) by the compiled operator, written into `out`.

    The operator checks every length and block id it uses before it reads through
    them, so a table the caller did not bounds-check can make it refuse, never read
    outside the caches; its refusal is a PagedLabError like the validators'.
    """
    try:
        op(query, k_cache, v_cache, tables, lens, float(scale), out)
    except RuntimeError as exc:
        raise PagedLabError(str(exc).split("\n")[0]) from None


class _Mixed(NamedTuple):
    """How a batch with prefill chunks splits: its decode rows, and each chunk's rows."""

    decode_tokens: torch.Tensor | None  # the decodes' token rows (None: no decode)
    decode_tables: torch.Tensor | None
    decode_lens: torch.Tensor | None
    decode_host_lens: list[int] | None
    prefills: list[tuple[int, int, int, int]]  # (sequence, first row, end row, seq_len)


def _mixed(block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
           plan: StepPlan | None) -> _Mixed:
    num_seqs = block_tables.shape[0]
    if plan is not None and plan.query_starts_host is not None and \
            plan.seq_lens_host is not None:
        starts, lens = list(plan.query_starts_host), list(plan.seq_lens_host)
    else:
        host = torch.cat([query_start_loc, seq_lens]).tolist()  # the one host read
        starts, lens = host[:num_seqs + 1], host[num_seqs + 1:]
    decodes = [b for b in range(num_seqs) if starts[b + 1] - starts[b] == 1]
    prefills = [(b, starts[b], starts[b + 1], lens[b]) for b in range(num_seqs)
                if starts[b + 1] - starts[b] > 1]
    if not decodes:
        return _Mixed(None, None, None, None, prefills)
    device = block_tables.device
    seqs = torch.tensor(decodes, device=device)
    return _Mixed(torch.tensor([starts[b] for b in decodes], device=device),
                  block_tables.index_select(0, seqs), seq_lens.index_select(0, seqs),
                  [lens[b] for b in decodes], prefills)
