"""Measurements of the live engine: swap against recompute, by block size (the paper's §7.3).

The paper compares vLLM's two ways of handling preemption across block sizes
(its Figure 19): swapping copies a preempted request's blocks to CPU memory
and back, and small blocks mean many small PCIe transfers, so swapping is
slow for them; recomputation re-runs the prompt and the tokens generated so
far as one prefill, whose cost does not depend on the block size, and which
the paper finds faster for small blocks and comparable for medium ones.

`swap_vs_recompute` runs one overloaded workload through real engines at
each block size: once in a pool roomy enough never to preempt (the
reference), once with `preemption: "recompute"` and once with `"swap"`, the
device pool holding the same number of tokens at every block size. It
reports what each run did and what it cost: wall time, preemptions, tokens
recomputed, blocks copied and the time spent copying, and whether every
request generated exactly the reference's tokens. Where the host pool is
ordinary memory on the same CPU (no GPU), a swap is a memory copy, not a
PCIe transfer: what this shows there is the per-block overhead, not the
bus.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step
from backend.paging.events import shared_swap_outs

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODES = ("recompute", "swap")

# Called after each run with (runs done, runs in all); False stops before the next.
Progress = Callable[[int, int], bool]


@dataclass(frozen=True, slots=True)
class PreemptionRun:
    """One engine run of the workload."""

    block_size: int
    mode: str                 # "roomy" (never preempts), "recompute" or "swap"
    num_blocks: int
    steps: int
    wall_ms: float            # the whole run: every add and step
    preemptions: int
    recomputed_tokens: int    # prefill tokens of requests preempted before
    recompute_ms: float       # their share of the prefill forwards' wall time
    swapped_blocks: int       # blocks copied out and in
    swap_ms: float            # wall time inside those copies
    same_tokens: bool         # every request generated the roomy run's tokens
    # Its decisions: (step, request) of each preemption, in order.
    preempted: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests all added at once: (prompt length, tokens to generate) each."""

    requests: tuple[tuple[int, int], ...]

    @staticmethod
    def overloaded(num_requests: int = 16, seed: int = 0) -> Workload:
        rng = random.Random(seed)
        return Workload(tuple((rng.randint(24, 64), rng.randint(32, 64))
                              for _ in range(num_requests)))

    @property
    def peak_tokens(self) -> int:
        return sum(p + n for p, n in self.requests)


def run_workload(workload: Workload, config: EngineConfig, *, kernel: str = "torch",
                 device: str = "auto", max_steps: int = 100_000) -> tuple[Engine, float]:
    """A fresh engine with every request added, stepped until all finish; its wall ms."""
    t0 = time.perf_counter()
    e = Engine(config, device=device, kernel=kernel, check_reference=False)
    for i, (prompt, new) in enumerate(workload.requests):
        e.apply(Add(f"r{i}", prompt_len=prompt, max_new_tokens=new))
    for _ in range(max_steps):
        if e.idle:
            break
        e.apply(Step(1))
    return e, (time.perf_counter() - t0) * 1e3


def _configs(block_size: int, num_blocks: int, roomy_blocks: int
             ) -> list[tuple[str, int, EngineConfig]]:
    """The three configurations run at one block size: (mode, device blocks, config)."""
    base = {"block_size": block_size, "seed": 0}
    out = [("roomy", roomy_blocks, EngineConfig.from_json({**base, "num_blocks": roomy_blocks}))]
    for mode in MODES:
        out.append((mode, num_blocks, EngineConfig.from_json({
            **base, "num_blocks": num_blocks, "preemption": mode,
            "num_cpu_blocks": roomy_blocks if mode == "swap" else 0})))
    return out


def warm_up(workload: Workload, block_size: int, *, kernel: str = "torch",
            device: str = "auto") -> None:
    """Run each configuration's code paths at `block_size` once, untimed.

    The first forwards of a shape, and the first preemptions, pay for allocations and
    start-up that later ones do not; without this the first block size timed reads
    several times slower than the same size timed later. Two copies of the workload's
    longest request in a pool that holds one of them (plus a block) preempt wherever the
    real run can, so prefill, decode, recompute and swap all run here first.
    """
    longest = max(workload.requests, key=sum)
    warm = Workload((longest, longest))
    num_blocks = -(-sum(longest) // block_size) + 1
    for _, _, config in _configs(block_size, num_blocks, 2 * num_blocks):
        run_workload(warm, config, kernel=kernel, device=device)


def swap_vs_recompute(block_sizes: Sequence[int] = BLOCK_SIZES, *,
                      workload: Workload | None = None, capacity_tokens: int = 512,
                      kernel: str = "torch", device: str = "auto",
                      progress: Progress | None = None) -> list[PreemptionRun]:
    """Roomy, recompute and swap runs at each block size (a device pool of about
    `capacity_tokens` token slots; a host pool as large as the workload's peak), each
    block size warmed up before its runs are timed, so that the order of the sizes does
    not change their figures."""
    workload = workload or Workload.overloaded()
    longest = max(p + n for p, n in workload.requests)
    out: list[PreemptionRun] = []
    total, done = len(block_sizes) * 3, 0
    for bs in block_sizes:
        # The same slots at every block size, and room for the longest request with a
        # block to spare (the views say so where it raised the pool).
        num_blocks = max(-(-capacity_tokens // bs), -(-longest // bs) + 1)
        roomy_blocks = -(-workload.peak_tokens // bs) + len(workload.requests)
        warm_up(workload, bs, kernel=kernel, device=device)
        runs: list[tuple[Engine, float, str, int]] = []
        stopped = False
        for mode, blocks, config in _configs(bs, num_blocks, roomy_blocks):
            e, ms = run_workload(workload, config, kernel=kernel, device=device)
            runs.append((e, ms, mode, blocks))
            done += 1
            if progress is not None and not progress(done, total):
                stopped = True
                break
        if len(runs) < 2:
            return out      # the reference alone compares nothing
        ref = runs[0][0]
        for e, ms, mode, blocks in runs:
            out.append(PreemptionRun(
                bs, mode, blocks, e.step, ms, e.manager.preemptions,
                e.runner.recompute_tokens, e.runner.recompute_s * 1e3,
                swap_copies(e),
                e.runner.swap_s * 1e3,
                all(e.requests[r].tokens == q.tokens for r, q in ref.requests.items()),
                tuple((ev.step, ev.request) for ev in e.events
                      if ev.kind == "preempt" and ev.request is not None)))
        if stopped:
            break
    return out


def swap_copies(engine: Engine) -> int:
    """The blocks an engine's swaps copied, out and in: a block its beams shared went
    out once (events.shared_swap_outs) and came back once (the others `share` it)."""
    events = engine.events
    groups = {rid: r.group for rid, r in engine.requests.items() if r.beam_width is not None}
    return (sum(1 for ev in events if ev.kind in ("swap_out", "swap_in"))
            - len(shared_swap_outs(events, groups)))

