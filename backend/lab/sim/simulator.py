"""Trace-driven replay of many requests through one KV allocation policy.

`simulate(trace, config)` replays a workload trace (backend.lab.workloads) with
continuous batching (the iteration model is in backend.lab.sim.replay) through

    paged   PagedLab's BlockManager: blocks of `block_size` slots taken as
            requests grow; preemption with recomputation when they run out
    max     one contiguous region of `max_len` slots per request
    pow2    one contiguous region of the next power of two of its final length
    oracle  one contiguous region of exactly its final length

and reports what `python -m backend simulate` writes to RESULT.json (CONTRACT.md):
the batch sizes the policy allowed and the time-averaged share of the KV
capacity in each state of the PagedAttention paper's Figure 2:

    token_states            slots holding a token
    reservation             contiguous: slots reserved for tokens the request
                            will still generate; paged: 0 (nothing is reserved
                            ahead) but, with a token budget, the slots of a
                            prompt's blocks whose chunks are not computed yet
    internal_fragmentation  contiguous: reserved slots beyond the final length;
                            paged: empty slots in allocated blocks
    external_fragmentation  contiguous: free slots in holes smaller than the
                            region the next waiting request needs (see
                            backend.lab.contiguous); paged: 0
    free                    the rest (for paged, the capacity % block_size
                            slots no block can use are free too)

Averages are over busy iterations (those with at least one running request):
an idle engine runs no iterations. `sweep` runs a grid of configurations on
every core; results depend only on the configurations, never on the workers.
`simulate_run` also returns the per-iteration timeline and each request's
preemptions. The scheduler budgets (max_num_seqs, max_num_batched_tokens,
watermark_blocks) have vLLM's meanings (backend.core.budgets); unset, the
replay is exactly the one without them.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np

from backend.core.budgets import SchedulerBudgets
from backend.core.checks import check_int
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.lab.contiguous import CONTIGUOUS_POLICIES, DEFAULT_MAX_LEN, next_pow2
from backend.lab.sim.contiguous import ContiguousPolicyMemory
from backend.lab.sim.paged import DEFAULT_WATERMARK, MAX_CAPACITY_TOKENS, PagedPolicy
from backend.lab.sim.replay import MemoryPolicy, Progress, ReplayTotals, replay
from backend.lab.sim.timeline import Timeline, TimelineRecorder
from backend.lab.workloads import Trace, make_trace

Policy = Literal["paged", "max", "pow2", "oracle"]
POLICIES: tuple[Policy, ...] = ("paged", "max", "pow2", "oracle")

# Defaults, chosen to resemble the paper's OPT-13B on one A100-40GB: about
# 12 GiB of KV at 800 KiB per token is some 15k token slots (15360 = 15 x 1024
# divides evenly by every power-of-two block size up to 1024).
DEFAULT_CAPACITY_TOKENS = 15360
DEFAULT_BLOCK_SIZE = 16
# A decode step of a 13B fp16 model reads its 26 GB of weights once: about
# 17 ms at an A100's 1.5 TB/s; with KV reads and overheads, 40 ms a step.
DEFAULT_ITERATION_S = 0.04
# Above what the default paged configuration serves on ShareGPT (about 2.3
# requests/s), so that every policy is memory-bound, as in the paper's Figure 2.
DEFAULT_RATE = 4.0
MAX_BLOCKS = 1 << 20
MEMORY_KEYS = ("token_states", "reservation", "internal_fragmentation",
               "external_fragmentation", "free")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One allocation policy and the machine it runs on."""

    policy: Policy = "paged"
    capacity_tokens: int = DEFAULT_CAPACITY_TOKENS
    block_size: int = DEFAULT_BLOCK_SIZE   # paged only
    max_len: int = DEFAULT_MAX_LEN         # the max policy's reservation
    iteration_s: float = DEFAULT_ITERATION_S
    watermark: float = DEFAULT_WATERMARK   # paged only: fraction of blocks kept free
    # Scheduler budgets (None: no limit); watermark_blocks, if set, replaces `watermark`.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    watermark_blocks: int | None = None    # paged only

    @property
    def budgets(self) -> SchedulerBudgets:
        return SchedulerBudgets(self.max_num_seqs, self.max_num_batched_tokens,
                                self.watermark_blocks)

    def validate(self) -> None:
        """Raise PagedLabError naming the first bad field."""
        if self.policy not in POLICIES:
            raise PagedLabError(f"policy must be one of {', '.join(POLICIES)}, "
                                f"got {self.policy!r}")
        check_int(self.capacity_tokens, "capacity_tokens", 1, MAX_CAPACITY_TOKENS)
        check_int(self.block_size, "block_size", 1, 256)
        check_int(self.max_len, "max_len", 1, MAX_CAPACITY_TOKENS)
        if not (isinstance(self.iteration_s, (int, float)) and math.isfinite(self.iteration_s)
                and self.iteration_s > 0):
            raise PagedLabError(f"iteration_s must be a positive number, "
                                f"got {self.iteration_s!r}")
        if not (isinstance(self.watermark, (int, float)) and 0 <= self.watermark < 1):
            raise PagedLabError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        self.budgets.check()
        if self.policy == "paged":
            blocks = self.capacity_tokens // self.block_size
            if blocks < 1:
                raise PagedLabError(
                    f"a capacity of {counted(self.capacity_tokens, 'token')} holds no "
                    f"block of {self.block_size} tokens")
            if blocks > MAX_BLOCKS:
                raise PagedLabError(
                    f"{self.capacity_tokens:,} tokens in blocks of {self.block_size} is "
                    f"{blocks:,} blocks; at most {MAX_BLOCKS:,} are supported")


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one replay measured. `to_json` is the RESULT.json object."""

    policy: str
    workload: str
    requests: int
    rate: float
    seed: int
    capacity_tokens: int
    block_size: int | None        # None for the contiguous policies
    max_len: int | None           # the max policy's reservation (capped at capacity), else None
    mean_batch_size: float
    max_batch_size: int
    preemptions: int
    memory: dict[str, float]      # time-averaged fractions, summing to 1
    iterations: int               # busy iterations
    iteration_s: float
    duration_s: float             # simulated time until the last request finished
    prompt_tokens: int
    output_tokens: int
    # Tokens computed again after preemptions: all a decoding victim held (prompt and
    # generated), the chunks computed so far of one preempted while prefilling.
    recomputed_tokens: int
    preempted_requests: int       # requests preempted at least once
    max_preemptions_per_request: int
    throughput_requests_per_s: float
    throughput_tokens_per_s: float  # output tokens
    mean_latency_s: float
    mean_normalized_latency_s: float  # mean of latency / output length (the paper's metric)
    time_scale: float             # the trace's gaps between arrivals were divided by this
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    watermark_blocks: int | None  # paged: the free blocks admission kept back; else None
    max_batched_tokens: int       # the most tokens (prefill + decode) one iteration ran
    # Busy iterations that ended with requests waiting for memory (the next in line did
    # not fit in what was free, or the iteration preempted), not for a budget.
    memory_wait_iterations: int
    wall_s: float = field(default=0.0, compare=False)  # real seconds the replay took

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def max_len_for(longest: int) -> int:
    """The max policy's reservation when none is given, for a trace whose longest
    request (prompt plus output) is `longest` tokens: the model's context length,
    DEFAULT_MAX_LEN (the paper's OPT models'), or for a trace with longer requests (the
    Azure traces run to 14k tokens) the next power of two that holds them, so that every
    request can run; at most MAX_CAPACITY_TOKENS."""
    return min(MAX_CAPACITY_TOKENS, max(DEFAULT_MAX_LEN, next_pow2(longest)))


def make_policy(config: SimConfig) -> MemoryPolicy:
    """A fresh memory policy for `config` (validated)."""
    config.validate()
    if config.policy == "paged":
        return PagedPolicy(config.capacity_tokens, config.block_size,
                           watermark=config.watermark, watermark_blocks=config.watermark_blocks)
    assert config.policy in CONTIGUOUS_POLICIES
    return ContiguousPolicyMemory(config.capacity_tokens, config.policy,
                                  max_len=config.max_len)


@dataclass(frozen=True, slots=True, eq=False)
class SimRun:
    """A result with what produced it over time: the timeline and each request's preemptions.

    Compared and hashed by identity (its arrays are not hashable); compare `result`s."""

    result: SimResult
    timeline: Timeline | None
    preemptions_per_request: np.ndarray   # int64, one entry per request of the trace
    victim_ages: np.ndarray               # per preemption: iterations since the victim's admission


def simulate(trace: Trace, config: SimConfig = SimConfig(), *,
             progress: Progress | None = None) -> SimResult:
    """Replay `trace` under `config`. Mutates nothing it is given.

    Raises PagedLabError for a bad config, or a capacity in which the trace's
    longest request could never run.
    """
    return simulate_run(trace, config, progress=progress, timeline=False).result


def simulate_run(trace: Trace, config: SimConfig = SimConfig(), *,
                 progress: Progress | None = None, timeline: bool = True) -> SimRun:
    """`simulate`, keeping the per-iteration timeline (if asked) and per-request figures."""
    start = time.perf_counter()
    policy = make_policy(config)
    dt = float(config.iteration_s)
    if len(trace) == 0:
        raise PagedLabError("a trace needs at least one request")
    if not float(trace.arrival_s[-1]) / dt < 2.0 ** 60:
        raise PagedLabError("the trace's arrivals lie too far in the future; raise the rate")
    arrival_it = np.ceil(trace.arrival_s / dt).astype(np.int64)
    recorder = TimelineRecorder() if timeline else None
    tot = replay(arrival_it, trace.prompt_len, trace.final_len, policy, progress,
                 budgets=config.budgets, timeline=recorder)
    if isinstance(policy, PagedPolicy):
        # The manager counts preemptions independently: a cross-check.
        assert policy.manager.preemptions == tot.preemptions
    tl = None
    if recorder is not None:
        tl = recorder.build(arrival_it, iteration_s=dt, capacity_tokens=config.capacity_tokens,
                            block_size=config.block_size if config.policy == "paged" else None)
    result = _result(trace, config, policy, tot, time.perf_counter() - start)
    assert tot.preemptions_per_request is not None
    return SimRun(result, tl, tot.preemptions_per_request,
                  np.asarray(tot.victim_ages, dtype=np.int64))


def _result(trace: Trace, config: SimConfig, policy: MemoryPolicy, tot: ReplayTotals,
            wall_s: float) -> SimResult:
    assert tot.finish_iteration is not None and tot.preemptions_per_request is not None
    dt = float(config.iteration_s)
    cap = config.capacity_tokens
    slot_its = tot.busy_iterations * cap
    if config.policy == "paged":
        # Blocks taken for prompt chunks not computed yet are reserved, not wasted.
        pending = tot.pending_prefill_sum
        parts = [tot.token_sum, pending, tot.allocated_sum - tot.token_sum - pending, 0]
    else:
        parts = [tot.token_sum, tot.committed_sum - tot.token_sum,
                 tot.allocated_sum - tot.committed_sum, tot.external_sum]
    parts.append(slot_its - sum(parts))
    assert min(parts) >= 0, parts
    memory = {k: v / slot_its for k, v in zip(MEMORY_KEYS, parts, strict=True)}

    n = len(trace)
    finish_s = (tot.finish_iteration + 1) * dt
    latency = finish_s - trace.arrival_s
    duration = float(finish_s.max())
    out_tokens = int(trace.output_len.sum())
    per_request = tot.preemptions_per_request
    return SimResult(
        policy=config.policy, workload=trace.workload, requests=n, rate=trace.rate,
        seed=trace.seed, capacity_tokens=cap,
        block_size=config.block_size if config.policy == "paged" else None,
        max_len=min(config.max_len, cap) if config.policy == "max" else None,
        mean_batch_size=tot.batch_sum / tot.busy_iterations,
        max_batch_size=tot.max_batch, preemptions=tot.preemptions, memory=memory,
        iterations=tot.busy_iterations, iteration_s=dt, duration_s=duration,
        prompt_tokens=int(trace.prompt_len.sum()), output_tokens=out_tokens,
        recomputed_tokens=tot.recomputed_tokens,
        preempted_requests=int((per_request > 0).sum()),
        max_preemptions_per_request=int(per_request.max()),
        throughput_requests_per_s=n / duration, throughput_tokens_per_s=out_tokens / duration,
        mean_latency_s=float(latency.mean()),
        mean_normalized_latency_s=float((latency / trace.output_len).mean()),
        time_scale=float(trace.time_scale), max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        watermark_blocks=(policy.watermark_blocks if isinstance(policy, PagedPolicy)
                          else None),
        max_batched_tokens=tot.max_batched_tokens,
        memory_wait_iterations=tot.memory_wait_iterations,
        wall_s=wall_s,
    )


def simulate_workload(workload: str, config: SimConfig = SimConfig(), *, requests: int = 1000,
                      rate: float = DEFAULT_RATE, seed: int = 0,
                      progress: Progress | None = None) -> SimResult:
    """Make the seeded trace, then `simulate` it."""
    return simulate(make_trace(workload, requests, rate, seed), config, progress=progress)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One configuration of a sweep (a picklable unit of work)."""

    workload: str
    requests: int
    rate: float
    seed: int
    config: SimConfig


def sweep_points(workload: str, policies: tuple[str, ...], block_sizes: tuple[int, ...],
                 rates: tuple[float, ...], *, requests: int, seed: int = 0,
                 base: SimConfig = SimConfig()) -> list[SweepPoint]:
    """The grid policies x block sizes x rates, in that nesting order (rates outermost).

    Block size only matters to the paged policy, so each contiguous policy
    appears once per rate.
    """
    if not (policies and block_sizes and rates):
        raise PagedLabError("a sweep needs at least one policy, block size and rate")
    points: list[SweepPoint] = []
    for rate in rates:
        for policy in policies:
            sizes = block_sizes if policy == "paged" else block_sizes[:1]
            for bs in sizes:
                cfg = replace(base, policy=policy, block_size=bs)  # type: ignore[arg-type]
                cfg.validate()
                points.append(SweepPoint(workload, requests, rate, seed, cfg))
    return points


def run_point(point: SweepPoint) -> SimResult:
    """Simulate one sweep point (module level, so worker processes can run it)."""
    return simulate_workload(point.workload, point.config, requests=point.requests,
                             rate=point.rate, seed=point.seed)


def sweep(points: list[SweepPoint], *, workers: int | None = None) -> list[SimResult]:
    """Results of `points`, in their order, computed on `workers` processes (default: all cores).

    Each point builds its own trace from its seed, so the results are the
    same whatever the number of workers.
    """
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise PagedLabError(f"workers must be >= 1, got {workers}")
    workers = min(workers, len(points))
    if workers <= 1:
        return [run_point(p) for p in points]
    # spawn, not fork: the caller may be a threaded app (Streamlit).
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return list(pool.map(run_point, points))
