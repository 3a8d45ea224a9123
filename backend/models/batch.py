"""What every model's forward pass takes and returns: the packed batch and its outputs.

A model reads and writes K/V through `PagedKV`, the per-layer cache tensors
(the engine's KVCache is one), so models depend on no engine code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from backend.kernels.plan import StepPlan


class PagedKV(Protocol):
    """Per layer, K and V over all physical blocks: [num_blocks, block_size, kv_heads, D]."""

    @property
    def k(self) -> Sequence[torch.Tensor]: ...

    @property
    def v(self) -> Sequence[torch.Tensor]: ...


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """A packed batch: sequence b's new tokens are rows query_start_loc[b]:[b+1].

    The new tokens' slots are already allocated; their K/V is written by the
    forward pass before attention reads it.
    """

    token_ids: torch.Tensor        # [T] int64
    positions: torch.Tensor        # [T] int64
    slot_mapping: torch.Tensor     # [T] int64
    block_tables: torch.Tensor     # [B, max_blocks] int32, -1 padded
    seq_lens: torch.Tensor         # [B] int32: context length including the new tokens
    query_start_loc: torch.Tensor  # [B + 1] int32
    # The same metadata for the kernels, with the host's lists: built once, read by every
    # layer's attention call (backend.kernels.plan).
    plan: StepPlan | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.numel())

    @staticmethod
    def build(seqs: list[tuple[list[int], int, list[int], list[int]]],
              device: torch.device) -> ForwardBatch:
        """From (new token ids, position of the first one, slots, block table) per sequence."""
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        width = max(len(table) for _, _, _, table in seqs)
        tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
        for b, (new, start, seq_slots, table) in enumerate(seqs):
            assert len(new) == len(seq_slots) >= 1
            tokens.extend(new)
            positions.extend(range(start, start + len(new)))
            slots.extend(seq_slots)
            starts.append(starts[-1] + len(new))
            seq_lens.append(start + len(new))
            tables[b, : len(table)] = torch.tensor(table, dtype=torch.int32)

        def t(x: list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype, device=device)

        block_tables, lens, offsets = (tables.to(device), t(seq_lens, torch.int32),
                                       t(starts, torch.int32))
        return ForwardBatch(
            token_ids=t(tokens, torch.int64), positions=t(positions, torch.int64),
            slot_mapping=t(slots, torch.int64), block_tables=block_tables,
            seq_lens=lens, query_start_loc=offsets,
            plan=StepPlan(block_tables, lens, offsets, seq_lens_host=seq_lens,
                          query_starts_host=starts),
        )


@dataclass(frozen=True, slots=True)
class ForwardOutput:
    logits: torch.Tensor           # [B, vocab] float32: at each sequence's last new token
    max_abs_err: float | None      # largest |kernel - reference| over layers, if checked


@dataclass(frozen=True, slots=True)
class ContiguousOutput:
    logits: torch.Tensor           # [L, vocab] float32, at every position
    keys: list[torch.Tensor]       # per layer [L, num_kv_heads, head_dim]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        """The positions it holds."""
        return int(self.logits.shape[0])
