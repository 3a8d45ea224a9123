"""Benchmark: the simulator's cost against trace length, and at deployment scale.

Default mode: replays ShareGPT-like traces of 1k, 10k and 100k requests (by
default) through the paged policy and the contiguous ones, and prints wall time,
microseconds per request and per generated token, with the machine and date. A
linear cost shows as a flat "us/request" column.

--deployment: the real-deployment preset (backend.lab.deployment: Llama-3-8B on
one H200, 909,659 token slots in 56,853 blocks of 16) replaying each whole Azure
trace, at the preset's time scale and as recorded (time scale 1), through every
policy with the per-iteration timeline recorded (as the page does); prints the
cost per request and per token, the mean batch and whether the paper's Figure 13
ordering (Orca Max < Pow2 < Oracle < paged) holds.

    .venv/bin/python bench/simulator.py [--sizes 1000,10000,100000]
                                        [--policies paged,max,pow2,oracle] [--out FILE.json]
    .venv/bin/python bench/simulator.py --deployment [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from backend.lab import deployment as dep
from backend.lab.sim.simulator import POLICIES, SimConfig, simulate, simulate_run
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
    ap.add_argument("--deployment", action="store_true",
                    help="the Azure traces at deployment scale instead (see above)")
    ap.add_argument("--out", help="also write the rows as JSON")
    args = ap.parse_args()
    if args.deployment:
        return deployment_bench(args.out)
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


def deployment_bench(out: str | None) -> int:
    info = machine()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cap = dep.deployment_capacity()
    print(f"simulator at deployment scale, {when}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
          f"numpy {info['numpy']}")
    print(f"{dep.MODEL} on one {dep.GPU}: {cap.kv_tokens:,} token slots, "
          f"{cap.kv_tokens // dep.BLOCK_SIZE:,} blocks of {dep.BLOCK_SIZE}, "
          f"{dep.ITERATION_S * 1000:g} ms per iteration, timelines recorded")
    head = (f"{'trace':<11} {'scale':>6} {'policy':<7} {'requests':>8} {'wall s':>7} "
            f"{'us/request':>10} {'ns/token':>9} {'iterations':>10} {'batch':>7} "
            f"{'preempt':>7} {'token share':>11}")
    print(head)
    print("-" * len(head))
    rows: list[dict[str, Any]] = []
    for workload in dep.TIME_SCALES:
        for scale in (dep.TIME_SCALES[workload], 1.0):
            d = dep.deployment(workload, time_scale=scale)
            batches = []
            for policy in ("max", "pow2", "oracle", "paged"):
                run = simulate_run(d.trace, d.config(policy), timeline=True)
                r = run.result
                tokens = r.prompt_tokens + r.output_tokens
                row = {"trace": workload, "time_scale": scale, "policy": policy,
                       "requests": r.requests, "wall_s": r.wall_s,
                       "us_per_request": r.wall_s / r.requests * 1e6,
                       "ns_per_token": r.wall_s / tokens * 1e9, "iterations": r.iterations,
                       "mean_batch_size": r.mean_batch_size, "preemptions": r.preemptions,
                       "token_states": r.memory["token_states"]}
                rows.append(row)
                batches.append(r.mean_batch_size)
                print(f"{workload:<11} {scale:>6g} {policy:<7} {r.requests:>8} "
                      f"{r.wall_s:>7.2f} {row['us_per_request']:>10.1f} "
                      f"{row['ns_per_token']:>9.2f} {r.iterations:>10} "
                      f"{r.mean_batch_size:>7.1f} {r.preemptions:>7} "
                      f"{row['token_states']:>11.1%}", flush=True)
            if max(batches) - min(batches) < 1e-9:
                verdict = "all equal: memory is not the limit"
            elif all(a < b for a, b in itertools.pairwise(batches)):
                verdict = "holds"
            else:
                verdict = "does not hold"
            print(f"  Figure 13 ordering (max < pow2 < oracle < paged): {verdict}")
    if out:
        Path(out).write_text(json.dumps(
            {"benchmark": "simulator-deployment", "date": when, "machine": info,
             "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
