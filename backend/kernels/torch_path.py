"""Paged attention in vectorized torch: the torch backend's path, fast on a CPU.

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
computed without reading anything back to the host. A batch with prefill chunks reads
the query start offsets and lengths once, then runs its decodes batched like the above
and each prefill chunk on its own with a bottom-right causal mask. Sequences are taken
in groups of about GATHER_BYTES of gathered K/V, so long contexts stay in bounded
memory and the buffer SDPA reads is still warm in the CPU's caches.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

GATHER_BYTES = 8 << 20


@lru_cache(maxsize=64)
def _positions(length: int, block_size: int, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, their table column, their offset in the block) for 0..length-1.

    Cached per shape: a decode step asks for the same length on every layer. The tensors
    are shared, so they are only ever read.
    """
    pos = torch.arange(length, device=device)
    return pos, torch.div(pos, block_size, rounding_mode="floor"), pos % block_size


def _slots(tables: torch.Tensor, lens: torch.Tensor, length: int, block_size: int,
           num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [n, length], visible [n, length]) of each sequence's positions 0..length-1."""
    pos, col, offset = _positions(length, block_size, tables.device)
    ids = tables.index_select(1, col)
    if num_slots >= 2**31:  # block * block_size would overflow int32
        ids = ids.long()
    slots = torch.add(offset.to(ids.dtype), ids, alpha=block_size)
    visible = pos < lens[:, None]
    return torch.where(visible, slots, slots[:, :1]), visible


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows `slots` [n, L] of the cache as [n, kvh, L, D] (a view of one contiguous copy)."""
    _, _, kvh, d = cache.shape
    n, length = slots.shape
    rows = cache.view(-1, kvh * d).index_select(0, slots.reshape(-1))
    return rows.view(n, length, kvh, d).transpose(1, 2)


def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            tables: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One new token per sequence: query [n, H, D] -> [n, H, D], in groups of sequences."""
    n, num_heads, _ = query.shape
    num_blocks, block_size, kvh, d = k_cache.shape
    length = tables.shape[1] * block_size  # capacity: no host read of the lengths
    per_seq = 2 * length * kvh * d * k_cache.element_size()
    group = max(1, GATHER_BYTES // per_seq)
    outs = []
    for b0 in range(0, n, group):
        b1 = min(n, b0 + group)
        slots, visible = _slots(tables[b0:b1], lens[b0:b1], length, block_size,
                                num_blocks * block_size)
        o = F.scaled_dot_product_attention(
            query[b0:b1, :, None, :], _gather(k_cache, slots), _gather(v_cache, slots),
            attn_mask=visible[:, None, None, :], scale=scale,
            enable_gqa=num_heads != kvh)  # [g, H, 1, D]
        outs.append(o[:, :, 0])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             table: torch.Tensor, seq_len: int, scale: float) -> torch.Tensor:
    """One sequence's chunk of q_len tokens, query [q_len, H, D], against seq_len keys."""
    q_len, num_heads, _ = query.shape
    num_blocks, block_size, kvh, _ = k_cache.shape
    lens = torch.full((1,), seq_len, dtype=torch.int64, device=query.device)
    slots, _ = _slots(table[None], lens, seq_len, block_size, num_blocks * block_size)
    # Bottom-right causal: query i sits at position seq_len - q_len + i.
    pos = _positions(seq_len, block_size, query.device)[0]
    q_pos = pos[seq_len - q_len:]
    visible = pos[None, :] <= q_pos[:, None]  # [q_len, seq_len]
    o = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None], _gather(k_cache, slots), _gather(v_cache, slots),
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
) -> torch.Tensor:
    """Causal grouped-query paged attention, vectorized; returns `out` in the query's dtype.

    Inputs as for the kernels (backend.kernels.attention), assumed valid. Reads the host
    only for a batch with prefill chunks (once). Writes only `out`.
    """
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    num_tokens, num_seqs = query.shape[0], block_tables.shape[0]
    if num_tokens == num_seqs:  # q_len >= 1 each, so all are 1: token b is sequence b
        out.copy_(_decode(query, k_cache, v_cache, block_tables, seq_lens, scale))
        return out
    host = torch.cat([query_start_loc, seq_lens]).tolist()  # the one host read
    starts, lens = host[:num_seqs + 1], host[num_seqs + 1:]
    decodes = [b for b in range(num_seqs) if starts[b + 1] - starts[b] == 1]
    if decodes:
        seqs = torch.tensor(decodes, device=query.device)
        toks = torch.tensor([starts[b] for b in decodes], device=query.device)
        o = _decode(query.index_select(0, toks), k_cache, v_cache,
                    block_tables.index_select(0, seqs), seq_lens.index_select(0, seqs), scale)
        out.index_copy_(0, toks, o.to(out.dtype))
    for b in range(num_seqs):
        start, end = starts[b], starts[b + 1]
        if end - start > 1:
            out[start:end] = _prefill(query[start:end], k_cache, v_cache, block_tables[b],
                                      lens[b], scale)
    return out
