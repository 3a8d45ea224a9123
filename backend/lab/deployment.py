"""The "real deployment" preset: Llama-3-8B on one H200 replaying an Azure trace.

Sizes come from the memory calculator: Llama-3-8B keeps 2 x 32 layers x 8 KV
heads x 128 x 2 bytes = 128 KiB of KV per token; an H200 (141 GB, about 140 GiB
as nvidia-smi counts it) less vLLM's 10% reserve and the 15 GiB of bf16 weights
leaves about 111 GiB, 909,659 token slots, which is 56,853 whole blocks of 16. The paged
policy replays the trace through PagedLab's own BlockManager at that size
(bookkeeping only: no K/V tensors), the contiguous ones through the arena.

Llama-3-8B's context is 8,192 tokens, so Orca (Max) reserves 8,192 slots per
request, and a request longer than the context (one in azure-conv, of 14,089
tokens) is left out, as a server refuses it.

Why the preset compresses time. At the recorded arrival times an H200 holds
every request of either trace with room to spare (azure-conv keeps about 30
requests running, 4% of the memory), so every policy batches the same: memory
is not what limits. Dividing the gaps between arrivals by `time_scale` (50 for
azure-conv, 400 for azure-code: about 280 and 1,000 requests per second) packs
them together until memory fills and requests wait for room, the regime of the
PagedAttention paper's Figure 13 (mean batched requests: Orca Max < Pow2 <
Oracle < vLLM). How much depends on the trace: azure-conv's requests wait in
most busy iterations under every policy, and the batches part widely;
azure-code's outputs are short (1.3% of a request's final tokens) and its
burst is served in a few hundred iterations, after which nobody waits, so
Pow2, Oracle and paged batch within a few percent of one another (more
compression changes that little).

Iteration time: a decode step reads the weights (15 GiB) and the cached K/V
(up to 111 GiB) at the H200's 4.8 TB/s: about 25 ms when the cache is full.
Only time_scale x iteration_s matters to the replay, so either sets the load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backend.core.errors import PagedLabError
from backend.lab.memory_calc import KVCapacity, kv_capacity
from backend.lab.sim.simulator import POLICIES, SimConfig
from backend.lab.traces import RECORDED, recorded_trace, replay_trace
from backend.lab.workloads import Trace

MODEL = "Llama-3-8B"
GPU = "H200"
GPU_GIB = 140.0
BLOCK_SIZE = 16
CONTEXT_LEN = 8192
ITERATION_S = 0.025
TIME_SCALES: dict[str, float] = {"azure-code": 400.0, "azure-conv": 50.0}


@dataclass(frozen=True, slots=True)
class Deployment:
    """One preset run's machine and trace."""

    workload: str
    capacity: KVCapacity       # the memory calculator's answer for Llama-3-8B on an H200
    time_scale: float
    trace: Trace               # the requests that fit the context, time compressed
    left_out: int              # requests longer than CONTEXT_LEN

    @property
    def capacity_tokens(self) -> int:
        return self.capacity.kv_tokens

    @property
    def num_blocks(self) -> int:
        return self.capacity.kv_tokens // BLOCK_SIZE

    def config(self, policy: str, **budgets: int | None) -> SimConfig:
        """The policy's SimConfig at this size (budgets: max_num_seqs, ... or None)."""
        cfg = SimConfig(policy, self.capacity_tokens, BLOCK_SIZE, CONTEXT_LEN,  # type: ignore[arg-type]
                        ITERATION_S, **budgets)  # type: ignore[arg-type]
        cfg.validate()
        return cfg

    def configs(self, policies: tuple[str, ...] = POLICIES, **budgets: int | None
                ) -> list[SimConfig]:
        return [self.config(p, **budgets) for p in policies]


def deployment_capacity() -> KVCapacity:
    """Reads only: Llama-3-8B's KV room on one H200 (bf16 weights and KV, 10% reserve)."""
    return kv_capacity(MODEL, GPU_GIB, request_len=CONTEXT_LEN, block_sizes=(BLOCK_SIZE,))


def deployment(workload: str, *, time_scale: float | None = None,
               requests: int | None = None) -> Deployment:
    """Reads only: the preset for `azure-code` or `azure-conv` (its own time scale by
    default; the first `requests` requests if given). Raises PagedLabError otherwise."""
    if workload not in RECORDED:
        raise PagedLabError(f"the deployment preset replays {' or '.join(RECORDED)}, "
                            f"not {workload!r}")
    full = recorded_trace(workload)
    if requests is not None:
        full = replay_trace(full, requests=requests)
    keep = full.final_len <= CONTEXT_LEN
    fits = Trace(full.workload, full.rate, 0, full.arrival_s[keep], full.prompt_len[keep],
                 full.output_len[keep])
    scale = TIME_SCALES[workload] if time_scale is None else time_scale
    trace = replay_trace(fits, time_scale=scale)
    return Deployment(workload, deployment_capacity(), trace.time_scale, trace,
                      int(np.count_nonzero(~keep)))
