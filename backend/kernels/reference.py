"""Paged attention in plain torch, deliberately simple: the oracle.

`reference_paged_attention` is what every kernel (and every model step of the engine) is
compared against, so it does the obvious thing one sequence at a time: walk the block
table, gather the history into one contiguous [L, kvh, D] tensor, expand the KV heads for
grouped-query attention, and run ordinary causal attention in fp32. The torch backend's
fast path is backend.kernels.torch_path.
"""

from __future__ import annotations

import torch


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
