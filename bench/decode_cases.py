"""What the kernel benchmarks share: one decode step's K/V in three layouts, and timers.

    paged      [num_blocks, block_size, kvh, D], blocks in a random order (tables look
               like [9, 2, 14])
    one block  block_size = context: one contiguous block per sequence
    dense      [B, kvh, L, D], what torch's scaled_dot_product_attention takes

Imported by bench/kernel.py and bench/torch_path.py (run as scripts, so this is found on
their sys.path, next to them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    """Heads, head size, block size and dtype of a decode case."""

    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str


@dataclass
class Case:
    """One decode step's tensors in all three layouts."""

    query: torch.Tensor
    paged: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # k, v, block tables
    one_block: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    dense: tuple[torch.Tensor, torch.Tensor]  # [B, kvh, L, D]
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor

    @property
    def kv_bytes(self) -> int:
        k = self.dense[0]
        return 2 * k.numel() * k.element_size()


def make_case(batch: int, context: int, shape: Shape, device: torch.device, *,
              one_block: bool = True) -> Case:
    """Random K/V for `batch` sequences of `context` tokens, laid out every way."""
    dtype = DTYPES[shape.dtype]
    bs, kvh, d = shape.block_size, shape.kv_heads, shape.head_dim
    per_seq = -(-context // bs)
    # Sequence-major contiguous K/V ([B, L, kvh, D]) is both the one-block layout and the
    # source of the other two; the tail of a partial last block stays zero.
    k1 = torch.zeros(batch, per_seq * bs, kvh, d, dtype=dtype, device=device)
    v1 = torch.zeros_like(k1)
    k1[:, :context].normal_()
    v1[:, :context].normal_()
    num_blocks = batch * per_seq
    perm = torch.randperm(num_blocks, device=device)
    kp = torch.empty(num_blocks, bs, kvh, d, dtype=dtype, device=device)
    vp = torch.empty_like(kp)
    kp[perm] = k1.view(num_blocks, bs, kvh, d)
    vp[perm] = v1.view(num_blocks, bs, kvh, d)
    table = perm.view(batch, per_seq).to(torch.int32)
    k_one = k1[:, :context].contiguous()
    v_one = v1[:, :context].contiguous()
    del k1, v1
    dense = (k_one.transpose(1, 2).contiguous(), v_one.transpose(1, 2).contiguous())
    one = None
    if one_block:
        one_table = torch.arange(batch, dtype=torch.int32, device=device)[:, None]
        one = (k_one, v_one, one_table)
    del k_one, v_one
    return Case(
        query=torch.randn(batch, shape.heads, d, dtype=dtype, device=device),
        paged=(kp, vp, table),
        one_block=one,
        dense=dense,
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
    )


def time_gpu(fn: Callable[[], object]) -> float:
    """Median microseconds of `fn` on the GPU, L2 flushed before each run (cold K/V)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def time_cpu(fn: Callable[[], object], reps: int = 5) -> float:
    """Fastest of a few runs in microseconds (the least disturbed by other work)."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples) * 1e6


def median_cpu(fn: Callable[[], object], reps: int = 5, *, clock: str = "wall") -> float:
    """Median microseconds of `reps` runs after one warm-up run.

    clock "wall": elapsed time; "cpu": this thread's CPU time, which leaves out the time
    the thread waits descheduled on a machine shared with other work (torch on one
    thread does all its work on the calling thread).
    """
    now = time.perf_counter if clock == "wall" else time.thread_time
    fn()
    samples = []
    for _ in range(reps):
        t0 = now()
        fn()
        samples.append(now() - t0)
    return statistics.median(samples) * 1e6


