"""Benchmark: swap against recompute by block size, on the live engine (the paper's §7.3).

Runs backend.engine.measure.swap_vs_recompute: one overloaded workload (all
requests added at once into a pool of about --capacity token slots) at each
block size, in a roomy pool (the reference), with preemption "recompute" and
with preemption "swap", and prints per run: steps, wall time, preemptions,
recomputed tokens and their share of prefill time, blocks swapped and the
time inside the copies, and whether every request generated the reference's
tokens. Repeats --repeat times and reports medians of the times.

    .venv/bin/python bench/swap_recompute.py [--block-sizes 1,2,4,...]
        [--requests 16] [--capacity 512] [--repeat 3] [--kernel torch] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from backend.engine.measure import BLOCK_SIZES, PreemptionRun, Workload, swap_vs_recompute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-sizes", default=",".join(map(str, BLOCK_SIZES)))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=512, help="device pool token slots")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernel", default="torch", choices=["auto", "triton", "torch"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.block_sizes.split(",")]
    rounds: list[list[PreemptionRun]] = [
        swap_vs_recompute(sizes, workload=Workload.overloaded(args.requests),
                          capacity_tokens=args.capacity, kernel=args.kernel)
        for _ in range(args.repeat)]
    print(f"# {datetime.date.today()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, torch {torch.__version__}, "
          f"kernel {args.kernel}, {args.requests} requests, {args.capacity} slots, "
          f"medians of {args.repeat}")
    print("| block | mode | steps | wall ms | preempt | recomputed tok | recompute ms "
          "| swapped blocks | swap ms | us/block | same tokens |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = []
    for i, first in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        wall = statistics.median(r.wall_ms for r in same)
        rec = statistics.median(r.recompute_ms for r in same)
        swap = statistics.median(r.swap_ms for r in same)
        per = f"{swap * 1e3 / first.swapped_blocks:.1f}" if first.swapped_blocks else ""
        print(f"| {first.block_size} | {first.mode} | {first.steps} | {wall:.0f} | "
              f"{first.preemptions} | {first.recomputed_tokens} | {rec:.1f} | "
              f"{first.swapped_blocks} | {swap:.2f} | {per} | "
              f"{all(r.same_tokens for r in same)} |")
        rows.append({**asdict(first), "wall_ms": wall, "recompute_ms": rec, "swap_ms": swap})
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
