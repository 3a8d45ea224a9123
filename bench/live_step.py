"""Benchmark: the live engine's step cost, with and without the scheduler's budgets.

A batch of requests is added and decoded; each timed step is one iteration
of continuous batching (plan, prefill chunks, one batched decode). Budgets
on: max_num_seqs, max_num_batched_tokens (long prompts prefilled in chunks)
and a watermark; with --swap, preemption "swap" in a pool small enough to
use it. Prints the median and p90 wall time per step and how many of the
step's milliseconds were the model's forwards, so the scheduler's own share
shows.

    .venv/bin/python bench/live_step.py [--requests 32] [--steps 40] [--kernel torch]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step

BUDGETS = {"max_num_seqs": 64, "max_num_batched_tokens": 256, "watermark_blocks": 4}
# (config, device pool as a fraction of --blocks): the tight pools preempt.
CASES: dict[str, tuple[dict[str, Any], float]] = {
    "no budgets": ({}, 1.0),
    "budgets": (BUDGETS, 1.0),
    "budgets, tight pool, recompute": (BUDGETS, 0.7),
    "budgets, tight pool, swap": ({**BUDGETS, "preemption": "swap", "num_cpu_blocks": 512},
                                  0.7),
}


def run(case: dict[str, Any], requests: int, steps: int, kernel: str, num_blocks: int
        ) -> tuple[list[float], list[float], int]:
    e = Engine(EngineConfig.from_json({"num_blocks": num_blocks, "block_size": 16, **case}),
               kernel=kernel, check_reference=False)
    for i in range(requests):
        e.apply(Add(f"r{i}", prompt_len=64 + (i * 37) % 192))
    forward = e.runner.forward
    spent: list[float] = []

    def timed(seqs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return forward(seqs)
        finally:
            spent.append(time.perf_counter() - t0)

    e.runner.forward = timed  # type: ignore[method-assign]
    wall, model = [], []
    for _ in range(steps):
        spent.clear()
        t0 = time.perf_counter()
        e.apply(Step(1))
        wall.append((time.perf_counter() - t0) * 1e3)
        model.append(sum(spent) * 1e3)
    return wall, model, e.manager.preemptions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kernel", default="torch", choices=["auto", "triton", "torch"])
    parser.add_argument("--blocks", type=int, default=512,
                        help="device pool blocks of 16 (the tight pools get 70%%)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {datetime.date.today()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, torch {torch.__version__}, "
          f"kernel {args.kernel}, tiny-byte, {args.requests} requests, {args.blocks} blocks "
          f"of 16, {args.steps} steps")
    print("| case | blocks | median ms/step | p90 ms/step | model ms (median) "
          "| outside the model | preemptions |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    run({}, 2, 2, args.kernel, args.blocks)      # warm-up
    for name, (case, share) in CASES.items():
        blocks = int(args.blocks * share)
        wall, model, preempted = run(case, args.requests, args.steps, args.kernel, blocks)
        med, p90 = statistics.median(wall), sorted(wall)[int(0.9 * (len(wall) - 1))]
        mm = statistics.median(model)
        print(f"| {name} | {blocks} | {med:.2f} | {p90:.2f} | {mm:.2f} | {med - mm:.2f} "
              f"| {preempted} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
