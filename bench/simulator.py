"""Benchmark: the simulator's cost against trace length (it should grow linearly).

Replays ShareGPT-like traces of 1k, 10k and 100k requests (by default) through
the paged policy and the contiguous ones, and prints wall time, microseconds
per request and per generated token, with the machine and date. A linear cost
shows as a flat "us/request" column.

    .venv/bin/python bench/simulator.py [--sizes 1000,10000,100000]
                                        [--policies paged,max,pow2,oracle] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from backend.lab.sim.simulator import POLICIES, SimConfig, simulate
from backend.lab.workloads import make_trace


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000",
                    help="comma-separated request counts (default 1000,10000,100000)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated policies (default all)")
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--out", help="also write the rows as JSON")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    policies = args.policies.split(",")

    info = machine()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"simulator benchmark, {when}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
          f"numpy {info['numpy']}")
    print(f"workload {args.workload} at {args.rate:g} requests/s, default config "
          f"(capacity {SimConfig().capacity_tokens} tokens, block size {SimConfig().block_size})")
    head = (f"{'policy':<7} {'requests':>9} {'tokens':>11} {'wall s':>8} {'us/request':>11} "
            f"{'ns/token':>9} {'batch':>6} {'preempt':>8} {'token share':>11}")
    print(head)
    print("-" * len(head))
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for n in sizes:
            trace = make_trace(args.workload, n, args.rate, 0)
            result = simulate(trace, SimConfig(policy=policy))
            tokens = result.output_tokens
            row = {"policy": policy, "requests": n, "output_tokens": tokens,
                   "wall_s": result.wall_s, "us_per_request": result.wall_s / n * 1e6,
                   "ns_per_token": result.wall_s / tokens * 1e9,
                   "mean_batch_size": result.mean_batch_size,
                   "preemptions": result.preemptions,
                   "token_states": result.memory["token_states"]}
            rows.append(row)
            print(f"{policy:<7} {n:>9} {tokens:>11} {row['wall_s']:>8.2f} "
                  f"{row['us_per_request']:>11.1f} {row['ns_per_token']:>9.1f} "
                  f"{row['mean_batch_size']:>6.1f} {row['preemptions']:>8} "
                  f"{row['token_states']:>11.1%}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"benchmark": "simulator", "date": when, "machine": info,
             "workload": args.workload, "rate": args.rate, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
