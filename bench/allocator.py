"""Block-manager throughput on a synthetic trace, at pools of 10^3 to 10^6 blocks.

The trace keeps the pool about 80% full: requests arrive with prompts of
8..64 tokens, grow by one token at a time (decode), fork now and then, and
finish; prefix caching is on and prompts share a few common prefixes, so
hits, cached blocks and evictions all happen. Each pool size replays the same
number of operations, so if every operation is O(1) per block touched the
cost per operation stays flat as the pool grows. Wall time per operation also
moves with the memory hierarchy (a pool of a million blocks does not fit in
the CPU's caches), so a second pass counts Python function calls per
operation, a measure of work that caches do not affect.

    python bench/allocator.py [--ops 200000] [--sizes 1000,10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import platform
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.errors import OutOfBlocksError
from backend.paging.block_manager import BlockManager

BLOCK_SIZE = 16
PREFIXES = [[random.Random(i).randrange(256) for _ in range(48)] for i in range(8)]


def run(num_blocks: int, num_ops: int, allocation: str, seed: int = 0,
        count_calls: bool = False) -> dict[str, float]:
    rng = random.Random(seed)
    m = BlockManager(num_blocks, BLOCK_SIZE, allocation=allocation,  # type: ignore[arg-type]
                     seed=seed, record_events=False)
    append_one = getattr(m, "append_one", None)
    live: list[str] = []
    pos: dict[str, int] = {}
    counts = {"allocate": 0, "append": 0, "fork": 0, "free": 0}
    next_id = 0
    # Warm the pool to about 80% occupancy outside the timed region, so each size
    # is measured in its steady state.
    target = int(0.8 * num_blocks)

    def add() -> None:
        nonlocal next_id
        next_id += 1
        sid = f"r{next_id}"
        prompt = PREFIXES[rng.randrange(len(PREFIXES))][: rng.randrange(8, 48)]
        prompt = prompt + [rng.randrange(256) for _ in range(rng.randrange(1, 16))]
        try:
            m.allocate(sid, prompt)
        except OutOfBlocksError:
            return
        live.append(sid)
        pos[sid] = len(live) - 1
        counts["allocate"] += 1

    def remove(i: int) -> None:
        sid = live[i]
        last = live.pop()
        if i < len(live):
            live[i] = last
            pos[last] = i
        del pos[sid]
        m.free(sid)
        counts["free"] += 1

    while num_blocks - m.num_free_blocks < target:
        add()
    for k in counts:
        counts[k] = 0
    profiler = cProfile.Profile() if count_calls else None
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    for _ in range(num_ops):
        used = num_blocks - m.num_free_blocks
        r = rng.random()
        if r < 0.70 and live:
            sid = live[rng.randrange(len(live))]
            try:
                # The engine's decode call (append_one); append for an older manager.
                if append_one is not None:
                    append_one(sid, rng.randrange(256))
                else:
                    m.append(sid, [rng.randrange(256)])
                counts["append"] += 1
            except OutOfBlocksError:
                remove(pos[sid])
        elif r < 0.75 and live and used < target:
            next_id += 1
            child = f"r{next_id}"
            m.fork(live[rng.randrange(len(live))], child)
            live.append(child)
            pos[child] = len(live) - 1
            counts["fork"] += 1
        elif used < target or not live:
            add()
        else:
            remove(rng.randrange(len(live)))
    elapsed = time.perf_counter() - t0
    calls = 0.0
    if profiler is not None:
        profiler.disable()
        calls = sum(row[1] for row in pstats.Stats(profiler).stats.values()) / num_ops
    m.check_integrity()
    return {"num_blocks": num_blocks, "allocation": allocation, "ops": num_ops,
            "seconds": elapsed, "ops_per_s": num_ops / elapsed,
            "us_per_op": elapsed / num_ops * 1e6, "calls_per_op": calls, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# block manager, {args.ops} ops per pool, block size {BLOCK_SIZE}")
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{datetime.date.today()}")
    print(f"{'blocks':>9} {'mode':>7} {'ops/s':>10} {'us/op':>7} {'calls/op':>9} "
          f"{'alloc':>7} {'append':>7} {'fork':>6} {'free':>7}")
    rows = []
    for allocation in ("fifo", "random"):
        for n in sizes:
            row = run(n, args.ops, allocation)
            row["calls_per_op"] = run(n, min(args.ops, 20_000), allocation,
                                      count_calls=True)["calls_per_op"]
            rows.append(row)
            print(f"{n:>9} {allocation:>7} {row['ops_per_s']:>10.0f} {row['us_per_op']:>7.2f} "
                  f"{row['calls_per_op']:>9.2f} {row['allocate']:>7} {row['append']:>7} "
                  f"{row['fork']:>6} {row['free']:>7}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
