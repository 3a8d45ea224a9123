"""A tiny seeded decoder-only transformer over bytes, attending through the paged cache.

Vocabulary 256 (one token per byte), RMSNorm, rotary position embeddings,
grouped-query attention and a SwiGLU MLP. The weights are drawn from a seeded
generator, so the text it writes is nonsense; but every key and value it
stores is a real function of the tokens before it, which is what makes prefix
sharing, copy-on-write and block moves checkable: a wrong block shows up as a
different number.

`forward` runs a packed batch (decode tokens and prefill chunks together)
whose attention reads K/V through block tables with the selected kernel.
`forward_contiguous` is the plain recomputation of one sequence with no
paging at all: the reference the engine's outputs are checked against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from backend.core.config import EngineConfig
from backend.kernels import KernelBackend, ReferenceCheck
from backend.kernels.validate import TORCH_DTYPES
from backend.models.base import paged_attention_layer
from backend.models.batch import ContiguousOutput, ForwardBatch, ForwardOutput, PagedKV
from backend.models.tokenizer import ByteCodec

VOCAB_SIZE = 256
ROPE_THETA = 10_000.0
RMS_EPS = 1e-6


class TinyByteLM:
    """The model. Weights are a pure function of (config, seed)."""

    vocab_size = VOCAB_SIZE
    eos_token_id: int | None = None   # it never stops by itself
    codec = ByteCodec()
    default_sampling: tuple[float | None, float | None] = (None, None)

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.dtype = TORCH_DTYPES[config.dtype]
        g = torch.Generator().manual_seed(config.seed)
        d, hd = config.hidden_size, config.head_dim
        h, kvh = config.num_heads, config.num_kv_heads
        ff = 2 * d

        def w(fan_in: int, *shape: int) -> torch.Tensor:
            # Drawn in float32 on the CPU so every device and dtype starts from
            # the same numbers, then cast.
            x = torch.randn(*shape, generator=g) / math.sqrt(fan_in)
            return x.to(device=device, dtype=self.dtype)

        self.embed = w(1, VOCAB_SIZE, d)
        self.layers = [
            {
                "attn_norm": torch.ones(d, device=device, dtype=self.dtype),
                "wq": w(d, d, h * hd), "wk": w(d, d, kvh * hd), "wv": w(d, d, kvh * hd),
                "wo": w(h * hd, h * hd, d),
                "mlp_norm": torch.ones(d, device=device, dtype=self.dtype),
                "w_gate": w(d, d, ff), "w_up": w(d, d, ff), "w_down": w(ff, ff, d),
            }
            for _ in range(config.num_layers)
        ]
        self.final_norm = torch.ones(d, device=device, dtype=self.dtype)
        self.lm_head = w(d, d, VOCAB_SIZE)
        half = hd // 2
        self.inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(half, device=device,
                                                            dtype=torch.float32) / half))
        self.scale = 1.0 / math.sqrt(hd)

    # ---- building blocks ----------------------------------------------------

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (xf * weight.float()).to(self.dtype)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate pairs (i, i + half) of every head by position x frequency."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        cos = angles.cos()[:, None, :]
        sin = angles.sin()[:, None, :]
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(self.dtype)

    def _qkv(self, layer: dict[str, torch.Tensor], x: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        n = x.shape[0]
        h = self._rms_norm(x, layer["attn_norm"])
        q = (h @ layer["wq"]).view(n, c.num_heads, c.head_dim)
        k = (h @ layer["wk"]).view(n, c.num_kv_heads, c.head_dim)
        v = (h @ layer["wv"]).view(n, c.num_kv_heads, c.head_dim)
        return self._rope(q, positions), self._rope(k, positions), v

    def _finish_layer(self, layer: dict[str, torch.Tensor], x: torch.Tensor,
                      attn: torch.Tensor) -> torch.Tensor:
        x = x + attn.reshape(x.shape[0], -1).to(self.dtype) @ layer["wo"]
        h = self._rms_norm(x, layer["mlp_norm"])
        return x + (F.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return (self._rms_norm(x, self.final_norm) @ self.lm_head).float()

    # ---- the two forward passes --------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKV, kernels: KernelBackend, *,
                check: bool = True, all_positions: bool = False) -> ForwardOutput:
        """Write the new tokens' K/V into their slots and attend through the tables.

        Logits at each sequence's last new token, or at every new token with
        `all_positions`.
        """
        x = self.embed[batch.token_ids]
        checker = ReferenceCheck(check, self.device)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, batch.positions)
            attn = paged_attention_layer(kernels, checker, cache, i, q, k, v, batch, self.scale)
            x = self._finish_layer(layer, x, attn)
        if not all_positions:
            x = x[batch.query_start_loc[1:].long() - 1]
        return ForwardOutput(self._logits(x), checker.max_abs_err())

    @torch.inference_mode()
    def forward_contiguous(self, tokens: list[int], past: ContiguousOutput | None = None,
                           branches: list[int] | None = None) -> ContiguousOutput:
        """One sequence, no cache, no paging: plain causal attention over all tokens
        (after `past`'s, in `branches`: see base.Model)."""
        c = self.config
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        positions = branch_positions(len(tokens), past, branches, self.device)
        x = self.embed[ids]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        group = c.num_heads // c.num_kv_heads
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            keys.append(k)
            values.append(v)
            k, v = with_past(past, i, k, v)
            # [heads, L, D] in float32, GQA by repeating each kv head for its group.
            qf = q.float().transpose(0, 1)
            kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
            vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
            attn = causal_attention(qf, kf, vf, self.scale, branches)
            x = self._finish_layer(layer, x, attn.transpose(0, 1).to(self.dtype))
        return ContiguousOutput(self._logits(x), keys, values)


# Most attention scores (rows x keys x heads) one chunk of the contiguous pass holds.
SCORE_BUDGET = 1 << 24


def branch_positions(length: int, past: ContiguousOutput | None, branches: list[int] | None,
                     device: torch.device) -> torch.Tensor:
    """The positions of `length` tokens after `past`: each branch starts where the past
    ends."""
    start = 0 if past is None else past.length
    if branches is None:
        return torch.arange(start, start + length, device=device)
    if sum(branches) != length or min(branches, default=1) < 1:
        raise ValueError(f"branches {branches} do not split {length} tokens")
    return torch.cat([torch.arange(start, start + n, device=device) for n in branches])


def with_past(past: ContiguousOutput | None, layer: int, k: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`layer`'s keys and values over the whole sequence: `past`'s, then the new ones."""
    if past is None:
        return k, v
    return torch.cat((past.keys[layer], k)), torch.cat((past.values[layer], v))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     branches: list[int] | None = None) -> torch.Tensor:
    """Plain causal attention of queries [heads, L, D] over keys [heads, P + L, D]: the
    queries are the last L positions, each seeing the P keys before them and the keys
    of its own branch up to itself (`branches`: the lengths of consecutive runs of the
    L, each its own continuation of the P; None: one run). In row chunks, so memory
    stays bounded."""
    heads, length, _ = q.shape
    offset = k.shape[1] - length
    rows = max(1, SCORE_BUDGET // (heads * k.shape[1]))
    if rows >= length and offset == 0 and branches is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    runs = [length] if branches is None else branches
    branch = torch.repeat_interleave(torch.arange(len(runs), device=q.device),
                                     torch.tensor(runs, device=q.device))
    index = torch.arange(length, device=q.device)
    out = torch.empty_like(q)
    for start in range(0, length, rows):
        stop = min(length, start + rows)
        # Keys past `stop` are never seen: later rows of its branch, or other branches.
        # (SDPA's own is_causal aligns a wider key range at its start, not its end.)
        own = ((branch[None, :stop] == branch[start:stop, None])
               & (index[None, :stop] <= index[start:stop, None]))
        keep = torch.cat((own.new_ones(stop - start, offset), own), dim=1)
        out[:, start:stop] = F.scaled_dot_product_attention(
            q[:, start:stop], k[:, :offset + stop], v[:, :offset + stop], attn_mask=keep,
            scale=scale)
    return out
