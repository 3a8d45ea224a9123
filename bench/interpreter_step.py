"""One engine model step with 32 running requests, under Triton's interpreter and with torch.

The Playground's CPU default is the Triton kernel run by Triton's interpreter. This times
what a click on "Step" costs the engine (`engine.apply(Step(1))`: one batched decode of
every running request, reference check included, as the app runs it) on the tiny model
(2 layers, 4 query heads, 2 KV heads, head_dim 16, float32), for two pools:

    block 4    1,024 blocks of 4 tokens (the default block size)
    block 16   256 blocks of 16 tokens (bench/app_render.py's pool)

Every request has a prompt of 100 tokens, so each step attends to about 100-130 tokens
per sequence. Each step is split into the kernel backend's calls (write_kv, attention),
the reference check (`reference_paged_attention`, per layer) and the rest of the model.
Timings are wall clock and process CPU time (torch on one thread, so CPU time is the
steadier figure on a shared machine), medians over `--runs` steps, repeated `--rounds`
times with the kernels interleaved.

    python bench/interpreter_step.py [--runs 9] [--rounds 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from machine import cpu_name

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step

GOAL_MS = 200.0
POOLS = {"block 4": (1024, 4), "block 16": (256, 16)}


@contextmanager
def timed_calls(engine: Engine, into: dict[str, float]) -> Iterator[None]:
    """Add the CPU seconds of the backend's write_kv / paged_attention and of the reference
    check to `into`, by wrapping them for the duration."""
    # The models check each layer through kernels.checks.ReferenceCheck, which
    # calls the reference by this module's name for it.
    import backend.kernels.checks as kernel_checks

    backend = engine.kernels
    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                into[label] += time.process_time() - c0

        setattr(owner, name, timed)

    wrap(backend, "write_kv", "write_kv")
    wrap(backend, "paged_attention", "attention")
    wrap(kernel_checks, "reference_paged_attention", "reference")
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            if owner is backend:
                delattr(owner, name)  # the instance attribute hid the class's method
            else:
                setattr(owner, name, original)


def make_engine(kernel: str, num_blocks: int, block_size: int, requests: int,
                prompt_len: int) -> Engine:
    engine = Engine(EngineConfig(num_blocks=num_blocks, block_size=block_size),
                    device="cpu", kernel=kernel)
    for i in range(requests):
        engine.apply(Add(f"r{i}", prompt_len=prompt_len))
    engine.apply(Step(1))  # admit and prefill every request
    assert len(engine.running) == requests, "the pool is too small for the requests"
    engine.apply(Step(1))  # warm: first decode
    return engine


def measure(engine: Engine, runs: int) -> dict[str, float]:
    """Median wall and CPU ms per step, and the mean CPU ms of each part."""
    walls: list[float] = []
    cpus: list[float] = []
    parts: dict[str, float] = defaultdict(float)
    with timed_calls(engine, parts):
        for _ in range(runs):
            w0, c0 = time.perf_counter(), time.process_time()
            engine.apply(Step(1))
            walls.append((time.perf_counter() - w0) * 1e3)
            cpus.append((time.process_time() - c0) * 1e3)
    assert engine.metrics().allocator.preemptions == 0
    result = {"wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus)}
    for label in ("write_kv", "attention", "reference"):
        result[f"{label}_ms"] = parts[label] * 1e3 / runs
    # From the mean, like the parts (the median step need not be the mean one).
    result["rest_ms"] = statistics.fmean(cpus) - sum(result[f"{k}_ms"] for k in
                                                     ("write_kv", "attention", "reference"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    # One thread: with other work on a small machine torch's pool waits on descheduled
    # workers, and the CPU-time figures then count spinning.
    torch.set_num_threads(1)

    steps = 2 + args.rounds * args.runs
    rows: list[dict[str, Any]] = []
    for pool, (num_blocks, block_size) in POOLS.items():
        engines: dict[str, Engine] = {}
        for kernel in ("triton", "torch"):
            need = args.requests * -(-(args.prompt_len + steps) // block_size)
            engines[kernel] = make_engine(kernel, max(num_blocks, need), block_size,
                                          args.requests, args.prompt_len)
        samples: dict[str, list[dict[str, float]]] = defaultdict(list)
        for _ in range(args.rounds):  # interleaved, so both see the same machine load
            for kernel, engine in engines.items():
                samples[kernel].append(measure(engine, args.runs))
        for kernel, engine in engines.items():
            keys = samples[kernel][0].keys()
            row: dict[str, Any] = {k: statistics.median(s[k] for s in samples[kernel])
                                   for k in keys}
            row.update(pool=pool, backend=engine.kernels.name,
                       num_blocks=engine.config.num_blocks, block_size=block_size,
                       requests=len(engine.running),
                       context=max(engine.request(r).num_tokens for r in engine.running))
            rows.append(row)
            print(f"  {pool:<9} {row['backend']:<19} cpu {row['cpu_ms']:8.1f} ms  "
                  f"wall {row['wall_ms']:8.1f} ms", file=sys.stderr, flush=True)

    info = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_name(), "python": platform.python_version(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "runs": args.runs, "rounds": args.rounds,
        "rows": rows,
    }
    print(f"# One model step, {args.requests} running requests, tiny model, float32 "
          f"({datetime.date.today().isoformat()})")
    print(f"# {info['cpu']}, Python {info['python']}, torch {info['torch']} (1 thread), "
          f"triton {info['triton']}; medians of {args.rounds} rounds x {args.runs} steps")
    print(f"{'pool':<10}{'backend':<20}{'context':>8}{'wall ms':>9}{'cpu ms':>9}"
          f"{'attn':>8}{'write':>8}{'ref':>8}{'rest':>8}")
    for r in rows:
        print(f"{r['pool']:<10}{r['backend']:<20}{r['context']:>8}{r['wall_ms']:>9.1f}"
              f"{r['cpu_ms']:>9.1f}{r['attention_ms']:>8.1f}{r['write_kv_ms']:>8.1f}"
              f"{r['reference_ms']:>8.1f}{r['rest_ms']:>8.1f}")
    print("(attn, write, ref, rest: CPU ms per step in the backend's paged_attention and "
          "write_kv, the reference check, and everything else)")
    for r in rows:
        if r["backend"] == "triton-interpreter":
            ok = r["wall_ms"] <= GOAL_MS and r["cpu_ms"] <= GOAL_MS
            print(f"goal {r['pool']}: interpreter step {r['wall_ms']:.1f} ms wall, "
                  f"{r['cpu_ms']:.1f} ms CPU (target <= {GOAL_MS:.0f} ms: "
                  f"{'met' if ok else 'NOT met'})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
