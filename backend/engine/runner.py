"""The model runner: the engine's model work on the K/V pools, as the scheduler decided it.

It owns what computes (the model, the kernels, the device K/V cache and, for
swap preemption, the host pool) and runs what the engine hands it: prefill
chunks and decode batches through the model's `forward`, whose write-K/V and
paged-attention kernels read and write the blocks the allocator chose, and
the block copies that copy-on-write, moves and swaps need. It decides
nothing and never touches the block tables; it reads them from the manager.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.kv_cache import KVCache
from backend.engine.request import Request
from backend.engine.results import KernelReport
from backend.engine.scheduler import Chunk
from backend.engine.swap import HOST, HostPool
from backend.kernels import select_kernels
from backend.models.base import LanguageModel
from backend.models.batch import ForwardBatch
from backend.models.registry import Unloaded, build_model
from backend.paging.block_manager import BlockManager

# Tensors that hold no memory: the K/V of an engine that keeps the books alone.
META = torch.device("meta")

# Most attention scores (query tokens x context tokens x heads) one prefill
# forward may hold; the plain reference materialises them all, in fp32.
PREFILL_BUDGET = 1 << 24

# One sequence of a forward: new tokens, first position, their slots, the block table.
Seq = tuple[list[int], int, list[int], list[int]]


class ModelRunner:
    """Model, kernels and K/V pools of one engine. Not thread-safe (the engine's lock)."""

    def __init__(self, config: EngineConfig, *, device: str, kernel: str,
                 check_reference: bool, kv_fill: float | None, weights: bool = True) -> None:
        """`weights=False`: the books alone (see Engine), the model `Unloaded` and the K/V
        pools on the meta device, which holds no memory."""
        self.config = config
        self.kernels = select_kernels(device, kernel)
        self.device = self.kernels.device
        self.check_reference = check_reference
        # A real model's weights load on first use (seconds) and are then shared.
        self.model: LanguageModel = build_model(config, self.device) if weights else Unloaded(
            config)
        kv_device = self.device if weights else META
        self.cache = KVCache(config, kv_device, fill=kv_fill)
        # The host pool that swap preemption copies K/V to (None: recompute).
        self.host = (HostPool(config, fill=None if kv_fill is None else 0.0,
                              device=HOST if weights else META)
                     if config.preemption == "swap" else None)
        self.kernel_report = KernelReport(self.kernels.name, str(self.device), None, None)
        self.prefill_tokens = 0      # prompt tokens computed so far, for the timeline
        # Recomputation after preemption: the prefill tokens of requests preempted
        # before, and their share of each prefill forward's wall time.
        self.recompute_tokens = 0
        self.recompute_s = 0.0
        self.swap_s = 0.0            # wall time spent copying K/V to and from the host pool

    def set_kernels(self, device: str, kernel: str) -> None:
        """Mutates: run the next model steps with another kernel on the same device."""
        kernels = select_kernels(device, kernel)
        if kernels.device != self.device:
            raise PagedLabError(f"this engine's tensors live on {self.device}; moving them to "
                                f"{kernels.device} needs a snapshot restore")
        self.kernels = kernels

    def prefill(self, work: list[Chunk], manager: BlockManager) -> None:
        """Batched forwards over each request's tokens [start, stop).

        Tokens before `start` are prefix-cache hits or earlier chunks: their
        K/V is already in the blocks, and the new tokens attend to it through
        the table. A request whose prompt is complete at `stop` gets its logits.
        Within one call, long ranges go in pieces: each attends to the K/V the
        pieces before it wrote, and one forward holds at most PREFILL_BUDGET
        query x context x head scores, so a long prompt costs more forwards,
        never unbounded memory.
        """
        heads = self.config.num_heads
        pending = [(req, start, stop) for req, start, stop in work if start < stop]
        while pending:
            seqs: list[Seq] = []
            piece_of: list[tuple[Request, int]] = []
            for req, start, end in pending:
                take = max(1, min(end - start, PREFILL_BUDGET // (end * heads)))
                if seqs and (len(seqs) + 1) * take * end * heads > PREFILL_BUDGET:
                    break
                stop = start + take
                seqs.append((req.tokens[start:stop], start, manager.slots_of(req.id, start, stop),
                             manager.block_table(req.id)))
                piece_of.append((req, stop))
            t0 = time.perf_counter()
            logits = self.forward(seqs)
            dt = time.perf_counter() - t0
            tokens = sum(len(s[0]) for s in seqs)
            again = sum(len(s[0]) for s, (req, _) in zip(seqs, piece_of, strict=True)
                        if req.num_preemptions)
            self.prefill_tokens += tokens
            if again:
                self.recompute_tokens += again
                self.recompute_s += dt * again / tokens
            done = {id(req): stop for req, stop in piece_of}
            for (req, stop), row in zip(piece_of, logits, strict=True):
                if stop == req.num_tokens:
                    req.logits = row
            pending = [(req, done.get(id(req), start), end) for req, start, end in pending
                       if done.get(id(req), start) < end]

    def decode(self, work: list[tuple[Request, int]], manager: BlockManager) -> None:
        """One batched forward of each request's newest token, written at `slot`."""
        seqs = [([r.tokens[-1]], r.num_tokens - 1, [slot], manager.block_table(r.id))
                for r, slot in work]
        for (req, _), row in zip(work, self.forward(seqs), strict=True):
            req.logits = row

    def forward(self, seqs: list[Seq]) -> list[torch.Tensor]:
        """The model over `seqs` in one batch; each sequence's logits at its last token."""
        batch = ForwardBatch.build(seqs, self.device)
        t0 = time.perf_counter()
        out = self.model.forward(batch, self.cache, self.kernels, check=self.check_reference)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        ms = (time.perf_counter() - t0) * 1e3
        self.kernel_report = KernelReport(self.kernels.name, str(self.device), out.max_abs_err,
                                          ms, len(seqs), int(batch.token_ids.numel()))
        return list(out.logits.cpu().unbind(0))

    # ---- block copies ------------------------------------------------------

    def copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy-on-write: whole device blocks src[i] -> dst[i]."""
        self.cache.copy_blocks(self.kernels, src, dst)

    def move_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """A remap: device block data src[i] -> dst[i], sources and targets overlapping."""
        self.cache.move_blocks(self.kernels, src, dst)

    def swap_out(self, device_blocks: Sequence[int], host_blocks: Sequence[int]) -> None:
        """The scheduler's KVMover: device blocks into the host pool."""
        assert self.host is not None
        t0 = time.perf_counter()
        self.host.copy_out(self.kernels, self.cache, device_blocks, host_blocks)
        self._synced(t0)

    def swap_in(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None:
        """The scheduler's KVMover: host blocks back into device blocks."""
        assert self.host is not None
        t0 = time.perf_counter()
        self.host.copy_in(self.kernels, self.cache, host_blocks, device_blocks)
        self._synced(t0)

    def _synced(self, t0: float) -> None:
        """Count a swap copy's time (on a GPU, once the copy has finished)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.swap_s += time.perf_counter() - t0
