"""The block-size trade-off on a trace: tail waste against block-table entries.

A request holding t tokens in blocks of B slots occupies ceil(t / B) blocks,
so its last block has ceil(t / B) * B - t empty slots (tail waste, at most
B - 1) and its block table has ceil(t / B) entries. Over its life a request
holds prompt + 1, prompt + 2, ..., final tokens (one per iteration, the
simulator's model), so the time-averaged tail waste of a trace is

    sum over requests and iterations of (ceil(t / B) * B - t)
    ---------------------------------------------------------   (share of allocated slots)
    sum over requests and iterations of  ceil(t / B) * B

computed in closed form: with q, r = divmod(n, B),
sum_{t=1..n} ceil(t / B) * B = B*B*q*(q+1)/2 + r*(q+1)*B. The result depends
on the lengths only, not on scheduling: it is what the block size costs
each request, before preemption or batching enter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backend.core.checks import check_int
from backend.core.errors import PagedLabError
from backend.lab.workloads import make_trace

SWEEP_BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class BlockSizePoint:
    """What one block size costs over a set of requests."""

    block_size: int
    tail_waste_share: float      # time-averaged empty share of allocated slots
    mean_tail_slots: float       # empty slots in a request's last block at its final length
    mean_table_entries: float    # block-table entries of a request at its final length
    max_table_entries: int
    mean_live_entries: float     # table entries averaged over every iteration of every request


def _ceil_sum(n: np.ndarray, b: int) -> np.ndarray:
    """sum_{t=1..n} ceil(t / b) * b, elementwise, exact in int64."""
    q, r = np.divmod(n, b)
    return b * b * q * (q + 1) // 2 + r * (q + 1) * b


def block_size_sweep(prompt_len: np.ndarray, final_len: np.ndarray,
                     block_sizes: tuple[int, ...] = SWEEP_BLOCK_SIZES) -> list[BlockSizePoint]:
    """Reads only: one point per block size for requests living prompt + 1 .. final tokens.

    Raises PagedLabError for empty or inconsistent lengths or a bad block size.
    """
    p = np.asarray(prompt_len, dtype=np.int64)
    f = np.asarray(final_len, dtype=np.int64)
    if p.size == 0 or p.shape != f.shape:
        raise PagedLabError("the sweep needs one prompt and one final length per request")
    if p.min() < 1 or (f <= p).any():
        raise PagedLabError("every request needs a prompt >= 1 and at least one output token")
    if not block_sizes:
        raise PagedLabError("the sweep needs at least one block size")
    tokens = (f * (f + 1) - p * (p + 1)) // 2       # sum of t over prompt+1 .. final
    lifetimes = f - p
    out: list[BlockSizePoint] = []
    for b in block_sizes:
        check_int(b, "a block size", 1, 256)
        allocated = _ceil_sum(f, b) - _ceil_sum(p, b)
        entries = -(-f // b)
        out.append(BlockSizePoint(
            block_size=b,
            tail_waste_share=float((allocated - tokens).sum() / allocated.sum()),
            mean_tail_slots=float((entries * b - f).mean()),
            mean_table_entries=float(entries.mean()),
            max_table_entries=int(entries.max()),
            mean_live_entries=float(allocated.sum() / b / lifetimes.sum()),
        ))
    return out


def trace_block_sweep(workload: str, requests: int, seed: int = 0,
                      block_sizes: tuple[int, ...] = SWEEP_BLOCK_SIZES) -> list[BlockSizePoint]:
    """Reads only: `block_size_sweep` over a seeded workload trace (arrivals do not matter)."""
    t = make_trace(workload, requests, 1.0, seed)
    return block_size_sweep(t.prompt_len, t.final_len, block_sizes)
