"""The host block pool that `preemption: "swap"` copies preempted requests' K/V into.

vLLM v0's swap preemption, in miniature: when the scheduler must free device
blocks and the victim's blocks fit in the host pool, each of its blocks is
copied to a host block (real tensors in host memory) and the device blocks
are released; when there is room again the request gets device blocks back
(its cached leading blocks may be prefix hits), the host copies are copied
into the new ones and the host blocks are freed. Nothing is recomputed: the
request resumes from the same K/V and the same pending logits, so it
generates what it would have with room to spare.

A beam group is swapped as one unit, and its beams share host blocks as they
shared device blocks: a device block two beams hold is copied once, to one host
block whose reference count is 2, and comes back as one device block that both
hold again (vLLM v0 maps a sequence group's blocks so). A device block that
requests outside the unit share stays on the device for them, and the unit
takes its own copy, as vLLM does for a block shared across sequence groups. On
a CPU the copies go through the kernels' block-copy path (the one copy-on-write
uses); from a GPU the blocks are gathered by index on the device and cross to
the host in one transfer per layer and tensor.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from backend.core.config import EngineConfig
from backend.engine.kv_cache import KVCache
from backend.engine.request import Request
from backend.kernels import KernelBackend

HOST = torch.device("cpu")


def sharing_problem(first: tuple[str, int], other: tuple[str, int],
                    requests: dict[str, Request], tables: dict[str, list[int]],
                    bs: int) -> str | None:
    """Why two swapped requests, each with the position where its host table holds one
    block, could not share that block, in words; or None. A beam group's swap-out
    shares blocks only between beams of the group, at one position, after the same host
    blocks (a leading run of their tables, as on the device), where their tokens agree
    through it (its K/V is one prefix's) and fill it alike. Restore refuses a snapshot
    with such a block; the engine's integrity check, a state with one."""
    (a, i), (b, j) = first, other
    ra, rb = requests[a], requests[b]
    if ra.beam_width is None or rb.beam_width is None or ra.group != rb.group:
        return "only beams of one group share host blocks"
    if i != j:
        return f"it is block {i} of one table and block {j} of the other"
    if tables[a][:i] != tables[b][:i]:
        return "their tables differ before it (beams share the leading blocks of their tables)"
    end = i * bs + bs
    fa, fb = min(ra.num_computed, end), min(rb.num_computed, end)
    if fa != fb:
        return "they fill it differently"
    if ra.tokens[:fa] != rb.tokens[:fb]:
        return "their tokens differ before its end, so its K/V cannot be both's"
    return None


@dataclass(slots=True)
class HostBlock:
    """One block of the host pool: held by swapped requests (the beams of one group that
    shared its device block), or free."""

    id: int
    ref_count: int = 0
    num_filled: int = 0

    @property
    def state(self) -> str:
        return "used" if self.ref_count else "free"


class HostPool:
    """Host blocks, their K/V tensors and the swapped requests' host tables.

    Invariants: a block is in `free_ids` exactly when its ref count is 0; a used
    block is in as many tables as its ref count, at one position of each, and
    more than one only where beams of one group hold it. A swap-out takes the
    lowest free ids (a heap), so the pool's state follows from its tables alone
    and a snapshot restores it exactly without a queue order.
    """

    def __init__(self, config: EngineConfig, *, fill: float | None = 0.0,
                 device: torch.device = HOST) -> None:
        """`fill`: the host K/V's first value, None to leave it unwritten (see KVCache);
        `device`: the meta device for an engine that keeps the books alone."""
        self.num_blocks = config.num_cpu_blocks
        self.block_size = config.block_size
        self.blocks = [HostBlock(i) for i in range(self.num_blocks)]
        self.free_ids: list[int] = list(range(self.num_blocks))   # a heap
        self.tables: dict[str, list[int]] = {}
        self.cache = KVCache(replace(config, num_blocks=max(1, self.num_blocks)), device,
                             fill=fill)
        self.swap_outs = 0
        self.swap_ins = 0

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def take(self, request_id: str, device_table: Sequence[int], filled: Sequence[int],
             copied: dict[int, int]) -> list[int]:
        """Mutates: host blocks for a request whose device blocks `device_table` hold
        `filled` tokens each. `copied` maps the device blocks this swap-out has already
        given host blocks (an earlier beam's of the unit) to them: such a block shares
        its host block, the others take free ones and are added to `copied`. Returns
        the request's host table; the caller copies the blocks new to `copied`."""
        assert request_id not in self.tables
        table = []
        for d, n in zip(device_table, filled, strict=True):
            b = copied.get(d)
            if b is None:
                b = copied[d] = heapq.heappop(self.free_ids)
                self.blocks[b].num_filled = n
            block = self.blocks[b]
            assert block.num_filled == n
            block.ref_count += 1
            table.append(b)
        self.tables[request_id] = table
        return table

    def release(self, request_id: str) -> list[int]:
        """Mutates: a swapped request lets go of its host blocks, each freed when no beam
        of its group holds it any longer; returns its table."""
        table = self.tables.pop(request_id)
        for b in table:
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                block.num_filled = 0
                heapq.heappush(self.free_ids, b)
        return table

    def restore(self, tables: dict[str, list[int]], filled: dict[int, int]) -> None:
        """Mutates: the state with these tables (checked by the caller) and fill counts."""
        self.tables = {rid: list(t) for rid, t in tables.items()}
        holders = Counter(b for t in tables.values() for b in t)
        for block in self.blocks:
            block.ref_count = holders[block.id]
            block.num_filled = filled.get(block.id, 0)
        self.free_ids = sorted(set(range(self.num_blocks)) - set(holders))

    def copy_out(self, kernels: KernelBackend, device_cache: KVCache, src: Sequence[int],
                 dst: Sequence[int]) -> None:
        """Copy device blocks src[i] into host blocks dst[i], every layer."""
        self._copy(kernels, device_cache, self.cache, src, dst)

    def copy_in(self, kernels: KernelBackend, device_cache: KVCache, src: Sequence[int],
                dst: Sequence[int]) -> None:
        """Copy host blocks src[i] into device blocks dst[i], every layer."""
        self._copy(kernels, self.cache, device_cache, src, dst)

    @staticmethod
    def _copy(kernels: KernelBackend, source: KVCache, target: KVCache, src: Sequence[int],
              dst: Sequence[int]) -> None:
        if not src:
            return
        if source.device == target.device:
            # One device: the same block-copy kernel copy-on-write uses.
            s = torch.tensor(list(src), dtype=torch.int64, device=source.device)
            d = torch.tensor(list(dst), dtype=torch.int64, device=target.device)
            for a, b in zip((*source.k, *source.v), (*target.k, *target.v), strict=True):
                kernels.copy_blocks(a, b, s, d)
            return
        # Across devices: gather on the source side, one transfer, scatter on the target.
        s = torch.tensor(list(src), dtype=torch.int64, device=source.device)
        d = torch.tensor(list(dst), dtype=torch.int64, device=target.device)
        for a, b in zip((*source.k, *source.v), (*target.k, *target.v), strict=True):
            b[d] = a[s].to(target.device)
