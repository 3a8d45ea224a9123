"""Benchmark: Figure 15 measured on the engine (block memory saved by sharing).

Runs backend.engine.sharing.measure_sharing for parallel sampling and beam
search at n / width 2, 4, 6 over the shipped instruction prompts, and prints
the saved fraction per (kind, n) beside the paper's range. With --out it
writes the results as JSON (the Contiguous vs paged page shows
assets/measured/sharing-smollm2.json, written by this script).

    .venv/bin/python bench/sharing_engine.py [--model smollm2-135m] [--block-size 16]
        [--max-new-tokens 64] [--prompts 16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from backend.core.words import counted
from backend.engine.sharing import instruction_prompts, measure_sharing, results_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(instruction_prompts()))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = list(instruction_prompts()[:args.prompts])
    started = time.perf_counter()
    results = []
    for kind in ("parallel", "beam"):
        results += measure_sharing(kind, (2, 4, 6), prompts, model=args.model,
                                   block_size=args.block_size,
                                   max_new_tokens=args.max_new_tokens)
    seconds = time.perf_counter() - started
    threads = counted(torch.get_num_threads(), "thread")
    machine = f"{platform.processor() or platform.machine()}, {threads}"
    print(f"# {datetime.date.today()} {machine}; {args.model}, block {args.block_size}, "
          f"max_new_tokens {args.max_new_tokens}, {len(prompts)} prompts, {seconds:.0f} s")
    print("kind      n  saved   paper        steps  cow  peak used/unshared")
    for r in results:
        print(f"{r.kind:<9} {r.n}  {100 * r.saved_fraction:5.1f}%  "
              f"{100 * r.paper_low:.1f}-{100 * r.paper_high:.1f}%  {r.trace.steps:6d} "
              f"{r.trace.cow_copies:4d}  {r.trace.peak_used_blocks}/"
              f"{r.trace.peak_unshared_blocks}")
    if args.out is not None:
        data = results_json(results, model=args.model, max_new_tokens=args.max_new_tokens,
                            machine=machine, date=str(datetime.date.today()),
                            seconds=round(seconds, 1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
