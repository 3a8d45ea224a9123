"""The paged K/V cache: per layer, one K and one V tensor over all physical blocks.

    k[layer]: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block * block_size + offset  ->  k[layer].view(-1, kvh, d)[slot]

The tensors are allocated once, at exactly num_blocks x bytes_per_block in
total; copy-on-write and moves copy block data inside them (moves through a
staging buffer the size of the moved blocks, since a permutation overlaps
itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.core.config import EngineConfig
from backend.kernels import KernelBackend
from backend.kernels.validate import TORCH_DTYPES


class KVCache:
    """K and V tensors for every layer, on one device."""

    def __init__(self, config: EngineConfig, device: torch.device,
                 fill: float | None = 0.0) -> None:
        self.config = config
        self.device = device
        self.dtype = TORCH_DTYPES[config.dtype]
        shape = (config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim)
        # Zero-filled by default; tests fill unwritten slots with NaN to prove the
        # kernels never read past a sequence's length.
        def make() -> torch.Tensor:
            t = torch.empty(shape, dtype=self.dtype, device=device)
            if fill is not None:
                t.fill_(fill)
            return t
        self.k: list[torch.Tensor] = [make() for _ in range(config.num_layers)]
        self.v: list[torch.Tensor] = [make() for _ in range(config.num_layers)]

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def copy_blocks(self, kernels: KernelBackend, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy whole blocks src[i] -> dst[i] in every layer. No dst may be a src."""
        if not src:
            return
        assert not set(src) & set(dst), "overlapping block copy; use move_blocks"
        s = torch.tensor(list(src), dtype=torch.int64, device=self.device)
        d = torch.tensor(list(dst), dtype=torch.int64, device=self.device)
        for cache in (*self.k, *self.v):
            kernels.copy_blocks(cache, cache, s, d)

    def move_blocks(self, kernels: KernelBackend, src: Sequence[int], dst: Sequence[int]) -> None:
        """Move block data src[i] -> dst[i] where sources and targets may overlap."""
        if not src:
            return
        n = len(src)
        s = torch.tensor(list(src), dtype=torch.int64, device=self.device)
        d = torch.tensor(list(dst), dtype=torch.int64, device=self.device)
        idx = torch.arange(n, dtype=torch.int64, device=self.device)
        staging = torch.empty((n, *self.k[0].shape[1:]), dtype=self.dtype, device=self.device)
        for cache in (*self.k, *self.v):
            kernels.copy_blocks(cache, staging, s, idx)
            kernels.copy_blocks(staging, cache, idx, d)

    def read_slots(self, layer: int,
                   slots: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [len(slots), num_kv_heads, head_dim] stored at the slots (copies)."""
        c = self.config
        idx = torch.tensor(list(slots), dtype=torch.int64, device=self.device)
        return (self.k[layer].view(-1, c.num_kv_heads, c.head_dim)[idx],
                self.v[layer].view(-1, c.num_kv_heads, c.head_dim)[idx])

    def read_slot(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value vectors [num_kv_heads, head_dim] stored at a slot."""
        k, v = self.read_slots(layer, [slot])
        return k[0], v[0]
