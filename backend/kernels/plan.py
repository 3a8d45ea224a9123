"""One model step's batch metadata, shared by every layer's attention call.

A forward pass calls paged attention once per layer with the same block tables,
lengths and query offsets. What a kernel derives from them alone (the torch path's
gather slots and visibility mask, the index of its decode rows, its argument-check
verdict) is the same on every layer, so a `StepPlan` keeps it: layer 1 computes it
and layers 2..N read it back. The Triton backend takes the plan and has no use for
it yet: its per-launch tile map is cheap next to the kernel. The plan also carries
the host's copy of the lengths and offsets where the batch was built on the host, so
a kernel that needs them as Python ints (the torch path's prefill chunks) never reads
the device.

Contract: the three tensors are not modified while the plan is in use (a
ForwardBatch builds them for one step and only reads them). A call passes its plan
beside the tensors; a plan built over other tensors is not used (`covers`), so a
mismatched plan costs its benefit, never a wrong answer. A plan belongs to one
forward pass on one thread: it is not locked.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class StepPlan:
    """The metadata of one batch and what kernels derived from it (see the module)."""

    __slots__ = (
        "_memo",
        "block_tables",
        "query_start_loc",
        "query_starts_host",
        "seq_lens",
        "seq_lens_host",
    )

    def __init__(self, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 query_start_loc: torch.Tensor, *, seq_lens_host: Sequence[int] | None = None,
                 query_starts_host: Sequence[int] | None = None) -> None:
        """`seq_lens_host` and `query_starts_host`, when given, must hold the same values
        as `seq_lens` and `query_start_loc` (the lists those tensors were made from)."""
        self.block_tables = block_tables
        self.seq_lens = seq_lens
        self.query_start_loc = query_start_loc
        self.seq_lens_host = None if seq_lens_host is None else tuple(seq_lens_host)
        self.query_starts_host = None if query_starts_host is None else tuple(query_starts_host)
        self._memo: dict[Hashable, Any] = {}

    def __repr__(self) -> str:
        return (f"StepPlan(seqs={self.seq_lens.numel()}, "
                f"table_columns={self.block_tables.shape[-1]}, memo={len(self._memo)})")

    def covers(self, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               query_start_loc: torch.Tensor) -> bool:
        """Whether this plan was built over exactly these tensors (identity, not values)."""
        return (block_tables is self.block_tables and seq_lens is self.seq_lens
                and query_start_loc is self.query_start_loc)

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """`build()` the first time `key` is asked for, the kept value after.

        `key` names everything the value depends on besides the plan's tensors (a
        block size, a pool size, a dtype); the value is shared, so only read it.
        """
        try:
            value: T = self._memo[key]
        except KeyError:
            value = self._memo[key] = build()
        return value


def usable(plan: StepPlan | None, block_tables: torch.Tensor, seq_lens: torch.Tensor,
           query_start_loc: torch.Tensor) -> StepPlan | None:
    """`plan` if it covers these tensors, else None (the call computes everything itself)."""
    return plan if plan is not None and plan.covers(block_tables, seq_lens,
                                                    query_start_loc) else None
