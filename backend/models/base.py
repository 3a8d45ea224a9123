"""What the engine needs from any model: `LanguageModel`.

TinyByteLM and SmolLM2 both satisfy it; the engine, its checks and snapshot
restore use nothing else.
"""

from __future__ import annotations

from typing import Protocol

import torch

from backend.kernels import KernelBackend, ReferenceCheck
from backend.models.batch import ContiguousOutput, ForwardBatch, ForwardOutput, PagedKV
from backend.models.tokenizer import TextCodec


class LanguageModel(Protocol):
    """A decoder over token ids 0..vocab_size - 1 that reads and writes K/V through PagedKV."""

    @property
    def device(self) -> torch.device: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None:
        """Generation stops after sampling it; None: never."""
        ...

    @property
    def codec(self) -> TextCodec:
        """Text <-> ids for this model."""
        ...

    @property
    def default_sampling(self) -> tuple[float | None, float | None]:
        """(temperature, top_p) where the config sets none; (None, None): plain sampling."""
        ...

    def forward(self, batch: ForwardBatch, cache: PagedKV, kernels: KernelBackend, *,
                check: bool = True, all_positions: bool = False) -> ForwardOutput:
        """Write the batch's new K/V at its slots, attend through its block tables.

        Logits [B, vocab] at each sequence's last new token ([T, vocab] at
        every new token with `all_positions`); `max_abs_err` compares the
        kernel with the plain reference when `check`.
        """
        ...

    def forward_contiguous(self, tokens: list[int], past: ContiguousOutput | None = None,
                           branches: list[int] | None = None) -> ContiguousOutput:
        """One sequence with no cache: logits, keys and values at every position of
        `tokens`. With `past` (an earlier output of this method, made without a past),
        `tokens` go on from the sequence it computed: they are at positions past.length
        onwards and attend to its keys and values too, and the output holds theirs
        alone. `branches` splits `tokens` into consecutive runs of those lengths, each
        its own continuation of the past (positions from past.length, attending to the
        past and to its own run alone), so several sequences with one prefix are
        computed in one pass: the same outputs as one call per run."""
        ...


def paged_attention_layer(kernels: KernelBackend, checker: ReferenceCheck, cache: PagedKV,
                          layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          batch: ForwardBatch, scale: float) -> torch.Tensor:
    """One layer's paged step, the same for every model: write the new tokens' K/V at
    their slots, attend through the block tables, and let `checker` compare the result
    with the plain reference."""
    kernels.write_kv(k, v, cache.k[layer], cache.v[layer], batch.slot_mapping)
    attn = kernels.paged_attention(q, cache.k[layer], cache.v[layer], batch.block_tables,
                                   batch.seq_lens, batch.query_start_loc, scale,
                                   plan=batch.plan)
    checker.layer(attn, q, cache.k[layer], cache.v[layer], batch.block_tables, batch.seq_lens,
                  batch.query_start_loc, scale)
    return attn
