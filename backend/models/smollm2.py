"""SmolLM2-135M-Instruct: a pretrained llama over the paged cache.

The llama decoder layer, as Hugging Face's LlamaForCausalLM computes it:

    h   = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   n = rms(x)
    out = h + down(silu(gate(m)) * up(m))                                        m = rms(h)

RMSNorm in float32 with the file's epsilon, rotary embeddings over the halves
(i, i + head_dim / 2) with base 100000 (gguf_loader undoes llama.cpp's row
permutation), grouped-query attention (9 query heads share 3 KV heads of 64),
and the output head tied to the token embedding.

`LlamaWeights` holds the dequantized tensors: loaded once per process per
(device, dtype) by backend.models.registry and shared read-only by every
engine. `SmolLM2` is one engine's view of them; its `forward` runs a packed
batch (prefill chunks and decodes together) layer by layer through the same
kernels as TinyByteLM: write_kv into the new tokens' slots, then
paged_attention reading every earlier token back through the block tables.
`forward_contiguous` is the plain recomputation with no paging at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.core.config import EngineConfig, ModelDims
from backend.kernels import KernelBackend, ReferenceCheck
from backend.kernels.validate import TORCH_DTYPES
from backend.models.base import paged_attention_layer
from backend.models.batch import ContiguousOutput, ForwardBatch, ForwardOutput, PagedKV
from backend.models.gguf_loader import GGUFModel
from backend.models.tiny_byte import branch_positions, causal_attention, with_past
from backend.models.tokenizer import TextCodec


@dataclass(frozen=True, slots=True)
class LlamaLayer:
    attn_norm: torch.Tensor   # [d]
    wq: torch.Tensor          # [H * D, d]   (F.linear layout: [out, in])
    wk: torch.Tensor          # [KVH * D, d]
    wv: torch.Tensor          # [KVH * D, d]
    wo: torch.Tensor          # [d, H * D]
    mlp_norm: torch.Tensor    # [d]
    w_gate: torch.Tensor      # [ff, d]
    w_up: torch.Tensor        # [ff, d]
    w_down: torch.Tensor      # [d, ff]


@dataclass(frozen=True, slots=True)
class LlamaWeights:
    """A llama's weights on one device in one dtype. Never written after loading."""

    dims: ModelDims
    dtype: torch.dtype
    device: torch.device
    rope_theta: float
    rms_eps: float
    embed: torch.Tensor       # [vocab, d]; also the output head (tied)
    layers: tuple[LlamaLayer, ...]
    final_norm: torch.Tensor

    @staticmethod
    def from_gguf(model: GGUFModel, dtype: torch.dtype, device: torch.device) -> LlamaWeights:
        """Move the file's float32 tensors to `device` in `dtype` (no copy for float32 on CPU)."""
        t = model.tensors

        def w(name: str) -> torch.Tensor:
            return torch.from_numpy(t[name]).to(device=device, dtype=dtype)

        layers = tuple(
            LlamaLayer(
                attn_norm=w(f"blk.{i}.attn_norm.weight"), wq=w(f"blk.{i}.attn_q.weight"),
                wk=w(f"blk.{i}.attn_k.weight"), wv=w(f"blk.{i}.attn_v.weight"),
                wo=w(f"blk.{i}.attn_output.weight"), mlp_norm=w(f"blk.{i}.ffn_norm.weight"),
                w_gate=w(f"blk.{i}.ffn_gate.weight"), w_up=w(f"blk.{i}.ffn_up.weight"),
                w_down=w(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(model.dims.num_layers)
        )
        return LlamaWeights(model.dims, dtype, device, model.rope_theta, model.rms_eps,
                            w("token_embd.weight"), layers, w("output_norm.weight"))

    @property
    def num_bytes(self) -> int:
        tensors = [self.embed, self.final_norm,
                   *(x for layer in self.layers for x in (
                       layer.attn_norm, layer.wq, layer.wk, layer.wv, layer.wo, layer.mlp_norm,
                       layer.w_gate, layer.w_up, layer.w_down))]
        return sum(x.numel() * x.element_size() for x in tensors)


class SmolLM2:
    """One engine's model: shared weights, the tokenizer, the engine's config."""

    # The model card's suggestion (temperature 0.2, top_p 0.9), for configs that set none.
    default_sampling: tuple[float | None, float | None] = (0.2, 0.9)

    def __init__(self, config: EngineConfig, weights: LlamaWeights, codec: TextCodec) -> None:
        dims = weights.dims
        assert config.dims == dims, "the config names another model"
        assert TORCH_DTYPES[config.dtype] == weights.dtype
        self.config = config
        self.weights = weights
        self.codec = codec
        self.device = weights.device
        self.dtype = weights.dtype
        self.vocab_size = dims.vocab_size
        self.eos_token_id = codec.eos_token_id
        half = dims.head_dim // 2
        # As transformers computes it: base ** (2i / D) in float32.
        self.inv_freq = 1.0 / (weights.rope_theta ** (
            torch.arange(0, dims.head_dim, 2, dtype=torch.int64).to(
                device=self.device, dtype=torch.float32) / dims.head_dim))
        assert self.inv_freq.numel() == half
        self.scale = 1.0 / math.sqrt(dims.head_dim)

    # ---- building blocks ----------------------------------------------------

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.weights.rms_eps)
        return weight * xf.to(self.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x * cos + rotate_half(x) * sin over [T, heads, D], cos/sin [T, 1, D]."""
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
        return (x * cos + rotated * sin).to(self.dtype)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _qkv(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.weights.dims
        n = x.shape[0]
        h = self._rms_norm(x, layer.attn_norm)
        q = F.linear(h, layer.wq).view(n, d.num_heads, d.head_dim)
        k = F.linear(h, layer.wk).view(n, d.num_kv_heads, d.head_dim)
        v = F.linear(h, layer.wv).view(n, d.num_kv_heads, d.head_dim)
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def _finish_layer(self, layer: LlamaLayer, x: torch.Tensor,
                      attn: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attn.reshape(x.shape[0], -1).to(self.dtype), layer.wo)
        h = self._rms_norm(x, layer.mlp_norm)
        return x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up),
                            layer.w_down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._rms_norm(x, self.weights.final_norm), self.weights.embed).float()

    # ---- the two forward passes --------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKV, kernels: KernelBackend, *,
                check: bool = True, all_positions: bool = False) -> ForwardOutput:
        """Write the new tokens' K/V into their slots and attend through the tables.

        Logits at each sequence's last new token ([B, vocab]), or at every new
        token with `all_positions` ([T, vocab], for tests).
        """
        w = self.weights
        x = w.embed[batch.token_ids]
        cos, sin = self._cos_sin(batch.positions)
        checker = ReferenceCheck(check, self.device)
        for i, layer in enumerate(w.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
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
        d = self.weights.dims
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        cos, sin = self._cos_sin(branch_positions(len(tokens), past, branches, self.device))
        x = self.weights.embed[ids]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        group = d.num_heads // d.num_kv_heads
        for i, layer in enumerate(self.weights.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            keys.append(k)
            values.append(v)
            k, v = with_past(past, i, k, v)
            qf = q.float().transpose(0, 1)
            kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
            vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
            attn = causal_attention(qf, kf, vf, self.scale, branches)
            x = self._finish_layer(layer, x, attn.transpose(0, 1).to(self.dtype))
        return ContiguousOutput(self._logits(x), keys, values)
