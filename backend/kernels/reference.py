"""Paged attention in plain torch: a deliberately simple oracle and a vectorized fast path.

`reference_paged_attention` is what every kernel (and every model step of the engine) is
compared against, so it does the obvious thing one sequence at a time: walk the block
table, gather the history into one contiguous [L, kvh, D] tensor, expand the KV heads for
grouped-query attention, and run ordinary causal attention in fp32.

`torch_paged_attention` computes the same thing for the whole batch at once (the torch
backend's CPU path): gather K/V through the padded block tables, pad the queries to
[B, Q, H, D], and run masked attention in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal grouped-query attention of the packed new tokens, as float32 [T, H, D].

    Inputs as for the kernel (see `backend.kernels.attention`), assumed valid. Reads
    only; never writes the caches.
    """
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=torch.float32,
                      device=query.device)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        num_blocks = -(-seq_len // block_size)
        # Logical block j of the sequence lives in physical block block_tables[b, j].
        physical = block_tables[b, :num_blocks].tolist()
        keys = torch.cat([k_cache[p] for p in physical])[:seq_len].float()  # [L, kvh, D]
        values = torch.cat([v_cache[p] for p in physical])[:seq_len].float()
        keys = keys.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        values = values.repeat_interleave(group, dim=1)

        q = query[q_start:q_end].float()  # [q_len, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
        # Query i sits at position seq_len - q_len + i and sees keys 0..that position.
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        hidden = k_pos[None, :] > q_pos[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


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
    """The same attention, vectorized over the batch; returns `out` in the query's dtype.

    Inputs assumed valid. Decodes (q_len 1) and prefill chunks are batched separately so a
    long prefill does not pad every decode to its length. Writes only `out`.
    """
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    qsl = query_start_loc.long()
    q_lens = qsl[1:] - qsl[:-1]
    lens = seq_lens.long()
    is_decode = q_lens == 1
    for subset in (is_decode, ~is_decode):
        seqs = torch.nonzero(subset).flatten()
        if seqs.numel():
            _attend(query, k_cache, v_cache, block_tables[seqs], lens[seqs], qsl[:-1][seqs],
                    q_lens[seqs], scale, out)
    return out


def _attend(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lens: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    device = query.device
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = int(lens.max())
    max_q = int(q_lens.max())
    num_cols = -(-max_len // block_size)

    # Gather K/V through the tables; columns past a sequence's last block are padding and
    # may hold anything (-1 included), so they are pointed at block 0 and masked below.
    cols = torch.arange(num_cols, device=device)
    used = cols[None, :] * block_size < lens[:, None]
    table = torch.where(used, block_tables[:, :num_cols].long(), 0)
    k_pos = torch.arange(max_len, device=device)
    in_seq = (k_pos[None, :] < lens[:, None])[:, :, None, None]  # [B, L, 1, 1]
    # Slots past a sequence's length (the tail of its last block, the blocks standing in
    # for padding) hold whatever was there before, NaN included; masking alone would
    # still let 0 * NaN through, so they are zeroed.
    keys = torch.where(in_seq, k_cache[table].flatten(1, 2)[:, :max_len].float(), 0.0)
    values = torch.where(in_seq, v_cache[table].flatten(1, 2)[:, :max_len].float(), 0.0)

    rows = torch.arange(max_q, device=device)
    row_valid = rows[None, :] < q_lens[:, None]
    tok = torch.where(row_valid, q_starts[:, None] + rows[None, :], 0)  # [B, Q]
    q = query[tok]  # [B, Q, H, D]

    # Padded rows get position >= seq_len - 1, so each row sees at least one key (no NaN).
    q_pos = lens[:, None] - q_lens[:, None] + rows[None, :]
    visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos < lens[:, None, None])

    o = F.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible[:, None],
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # [B, H, Q, D]
    o = o.transpose(1, 2)[row_valid]  # [sum q_len, H, D], in token order per sequence
    out[tok[row_valid]] = o.to(out.dtype).reshape(-1, num_heads, head_dim)
