"""Benchmark: what restore's beam scoring costs, by state of the search.

Runs a beam search on a model, exports the state at a few points (the group still
running; every beam finished), and restores each snapshot with the scores checked
(an upload, `run --from`) and without (the app's own exports: a saved session
reopened). Prints per state: beams, running beams, forwards made by each restore,
and median wall times.

    .venv/bin/python bench/restore.py [--model smollm2-135m] [--width 4]
        [--max-new 24] [--repeat 3] [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from machine import cpu_name

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot

PROMPT = "Paged attention stores the KV cache in fixed-size blocks so that"


def states(model: str, width: int, max_new: int) -> dict[str, dict[str, Any]]:
    """Snapshots of one beam search: a third of the way in, and when it has ended."""
    e = Engine(EngineConfig.from_json({"num_blocks": 256, "block_size": 16, "model": model}),
               kernel="torch")
    e.apply(parse_op({"op": "add", "request": "B", "prompt": PROMPT, "beam_width": width,
                      "max_new_tokens": max_new}))
    out = {}
    e.apply(parse_op({"op": "step", "count": max_new // 3}))
    out["running"] = export_snapshot(e)
    while not e.idle:
        e.apply(parse_op({"op": "step"}))
    out["finished"] = export_snapshot(e)
    return out


def timed(snap: dict[str, Any], check: bool, repeat: int) -> tuple[float, int]:
    """Median wall ms of `repeat` restores, and the forwards each made."""
    times: list[float] = []
    totals: list[int] = []
    for _ in range(repeat):
        t = time.perf_counter()
        restore_engine(copy.deepcopy(snap), kernel="torch", check_scores=check,
                       progress=lambda n, total: totals.append(total))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), totals[-1] if totals else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {datetime.date.today()} {cpu_name()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{args.model}, beam width {args.width}, {args.max_new} new tokens, "
          f"medians of {args.repeat}")
    print("| state | beams | running | forwards checked | ms checked "
          "| forwards unchecked | ms unchecked | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, snap in states(args.model, args.width, args.max_new).items():
        beams = sum(1 for r in snap["requests"] if "beam_width" in r)
        running = sum(1 for r in snap["requests"] if r.get("status") == "running")
        ms_on, fw_on = timed(snap, True, args.repeat)
        ms_off, fw_off = timed(snap, False, args.repeat)
        rows.append({"state": name, "beams": beams, "running": running,
                     "forwards_checked": fw_on, "ms_checked": ms_on,
                     "forwards_unchecked": fw_off, "ms_unchecked": ms_off})
        print(f"| {name} | {beams} | {running} | {fw_on} | {ms_on:.0f} | {fw_off} "
              f"| {ms_off:.0f} | {ms_on / ms_off:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
