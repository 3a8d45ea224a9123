"""The torch kernel path against torch's SDPA on contiguous K/V and against the reference.

For each batch size and context length, one decode step (one new token per sequence)
attends to the whole context, timed four ways in the same run:

    sdpa       torch's scaled_dot_product_attention on [B, kvh, L, D] laid out
               contiguously (enable_gqa): the floor a paged layout is measured against
    torch      the torch backend's paged_attention (`select_kernels(device, "torch")`)
               over the same K/V in shuffled blocks, validation included, bounds checks
               off (the kernel path's default), as a model step calls it: one StepPlan
               per step, built as ForwardBatch.build builds it, shared by the step's
               layers; the figure is a step's time over its layers (the shape's layer
               count). `torch 1st` is one call with a fresh plan: a step's first layer,
               or a call with no plan. On a CPU with the compiled operator built
               (backend.kernels.native), its decodes run that operator.
    gather     the same calls with the operator turned off (native.turned_off): each
               layer gathers its K/V into contiguous buffers for SDPA, as on a CPU
               without a compiler (on a GPU, the same as torch)
    reference  reference_paged_attention, the per-sequence oracle

Goals (issue 14): torch within 2x of sdpa at every decode shape, and never slower than
the reference. Three shape sets: a realistic one (32 query / 8 KV heads, head_dim 128,
block 16, 32 layers), SmolLM2-135M's (9 / 3 heads, head_dim 64, block 16, 30 layers)
and the tiny model's (4 / 2 heads, head_dim 16, block 4, 2 layers). Each round times
every variant once (median of a few calls); ratios are taken within a round and the
median over rounds is reported, so both sides of a ratio saw the same machine load. On a
CPU the clock is the thread's CPU time by default (`--clock wall` for elapsed time):
on a small machine shared with other work, elapsed time mostly measures the others.

    python bench/torch_path.py [--device auto|cpu|cuda] [--quick] [--rounds 3]
                               [--batch 1 8 32] [--context 64 256 1024 4096]
                               [--dtype float32] [--clock cpu|wall] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from decode_cases import Shape, make_case, median_cpu, time_gpu
from machine import cpu_name

from backend.core.errors import PagedLabError
from backend.kernels import StepPlan, native, reference_paged_attention, select_kernels

# (heads, KV heads, head_dim, block size, layers): an 8B Llama-shaped layer, the
# pretrained model PagedLab ships (SmolLM2-135M-Instruct) and the Playground's tiny model.
SHAPES = {"realistic": (32, 8, 128, 16, 32), "smollm2": (9, 3, 64, 16, 30),
          "tiny": (4, 2, 16, 4, 2)}
RATIO_GOAL = 2.0
# The reference walks every sequence's blocks in Python: past this many tokens in a batch
# a call takes seconds, so it is timed once per round instead of a few times.
REFERENCE_SLOW_TOKENS = 32 * 1024


def bench_case(batch: int, context: int, shape: Shape, layers: int, device: torch.device,
               rounds: int, timer: Callable[[Callable[[], object], int], float]
               ) -> dict[str, Any]:
    case = make_case(batch, context, shape, device, one_block=False)
    scale = shape.head_dim ** -0.5
    k, v, table = case.paged
    backend = select_kernels(device.type, "torch")
    q4 = case.query[:, :, None, :]  # [B, H, 1, D]: the new token attends to all L keys
    host_lens = [context] * batch
    host_starts = list(range(batch + 1))

    out = torch.empty_like(case.query)

    def new_plan() -> StepPlan:
        return StepPlan(table, case.seq_lens, case.query_start_loc, seq_lens_host=host_lens,
                        query_starts_host=host_starts)

    def call(plan: StepPlan) -> torch.Tensor:
        return backend.paged_attention(case.query, k, v, table, case.seq_lens,
                                       case.query_start_loc, scale, out=out,
                                       check_bounds=False, plan=plan)

    def reference() -> torch.Tensor:
        return reference_paged_attention(case.query, k, v, table, case.seq_lens,
                                         case.query_start_loc, scale)

    err = float((call(new_plan()).float() - F.scaled_dot_product_attention(
        q4, *case.dense, scale=scale, enable_gqa=True)[:, :, 0].float()).abs().max())
    reps = 5 if batch * context <= 8 * 4096 else 3
    ref_reps = 3 if batch * context <= REFERENCE_SLOW_TOKENS else 1
    # A sample is a step of `layers` calls where that stays short; a long case's sample
    # is its first layer and one more (its per-layer work hardly depends on the plan).
    per_sample = layers if batch * context <= 8 * 1024 else 2
    times: dict[str, list[float]] = {"sdpa": [], "torch": [], "torch_first": [],
                                     "gather": [], "reference": []}
    for _ in range(rounds):
        times["sdpa"].append(timer(sdpa_n(per_sample, q4, case.dense, scale), reps) /
                             per_sample)
        times["torch"].append(timer(step_n(per_sample, new_plan, call), reps) / per_sample)
        times["torch_first"].append(timer(step_n(1, new_plan, call), reps))
        with native.turned_off():
            times["gather"].append(timer(step_n(per_sample, new_plan, call), reps) /
                                   per_sample)
        times["reference"].append(timer(reference, ref_reps))

    def ratio(a: str, b: str) -> float:
        """Median over rounds of a's time over b's in the same round."""
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    return {
        "batch": batch, "context": context, "layers": layers, "kv_mib": case.kv_bytes / 2**20,
        **{f"{name}_us": statistics.median(ts) for name, ts in times.items()},
        "torch_over_sdpa": ratio("torch", "sdpa"),
        "torch_first_over_sdpa": ratio("torch_first", "sdpa"),
        "gather_over_sdpa": ratio("gather", "sdpa"),
        "torch_over_reference": ratio("torch", "reference"),
        "torch_first_over_reference": ratio("torch_first", "reference"),
        "max_abs_err_vs_sdpa": err,
    }


def sdpa_n(n: int, q4: torch.Tensor, dense: tuple[torch.Tensor, torch.Tensor],
           scale: float) -> Callable[[], None]:
    """`n` SDPA calls over the contiguous K/V (a step's layers)."""
    def run() -> None:
        for _ in range(n):
            F.scaled_dot_product_attention(q4, *dense, scale=scale, enable_gqa=True)
    return run


def step_n(n: int, new_plan: Callable[[], StepPlan],
           call: Callable[[StepPlan], torch.Tensor]) -> Callable[[], None]:
    """`n` paged calls sharing one fresh plan (a step's layers)."""
    def run() -> None:
        plan = new_plan()
        for _ in range(n):
            call(plan)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="CPU runs: thread CPU time (default) or elapsed time")
    parser.add_argument("--out", type=Path, help="write all results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.context = [1, 32], [64, 1024]
    try:
        device = select_kernels(args.device, "torch").device
    except PagedLabError as exc:  # --device cuda on a machine without a GPU
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gpu = device.type == "cuda"
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if not gpu:
        # One thread: with other work on a small machine, every parallel torch op waits
        # at a barrier for a descheduled worker; the ratios are steadier this way.
        torch.set_num_threads(1)

    def timer(fn: Callable[[], object], reps: int) -> float:
        return time_gpu(fn) if gpu else median_cpu(fn, reps, clock=args.clock)

    torch.manual_seed(0)
    info: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(device), "gpu": torch.cuda.get_device_name(device) if gpu else None,
        "cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "dtype": dtype, "rounds": args.rounds, "clock": "gpu" if gpu else args.clock,
        "native_operator": None if gpu else native.status().reason,
        "rows": [],
    }
    for name in args.shapes:
        heads, kv_heads, head_dim, block_size, layers = SHAPES[name]
        shape = Shape(heads, kv_heads, head_dim, block_size, dtype)
        for batch in args.batch:
            for context in args.context:
                # Under inference mode, as the models run their forward pass (every
                # variant: outside it each torch op also pays for autograd's bookkeeping).
                with torch.inference_mode():
                    row = {"shape": name, **bench_case(batch, context, shape, layers,
                                                       device, args.rounds, timer)}
                info["rows"].append(row)
                print(f"  {name} batch {batch:>3} context {context:>5}: torch "
                      f"{row['torch_over_sdpa']:.2f}x sdpa, "
                      f"{row['torch_over_reference']:.2f}x reference",
                      file=sys.stderr, flush=True)
                if gpu:
                    torch.cuda.empty_cache()
                if args.out:  # after every case, so a run cut short keeps its results
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(info, indent=2) + "\n")

    print(f"\nsummary: torch path on {info['gpu'] or info['cpu']}, torch {info['torch']} "
          f"({info['threads']} threads), {dtype}, {info['clock']} clock; medians of "
          f"{args.rounds} rounds "
          f"({datetime.date.today().isoformat()})")
    if not gpu:
        print(f"native decode operator: {info['native_operator']}")
    print(f"{'shape':<10}{'batch':>6}{'ctx':>6}{'KV MiB':>8}{'sdpa us':>10}{'torch us':>10}"
          f"{'1st us':>9}{'gath us':>9}{'ref us':>11}{'torch/sdpa':>11}{'1st/sdpa':>9}"
          f"{'gath/sdpa':>10}{'torch/ref':>10}"
          f"{'1st/ref':>8}{'err':>9}")
    for r in info["rows"]:
        print(f"{r['shape']:<10}{r['batch']:>6}{r['context']:>6}{r['kv_mib']:>8.1f}"
              f"{r['sdpa_us']:>10.1f}{r['torch_us']:>10.1f}{r['torch_first_us']:>9.1f}"
              f"{r['gather_us']:>9.1f}{r['reference_us']:>11.1f}{r['torch_over_sdpa']:>11.2f}"
              f"{r['torch_first_over_sdpa']:>9.2f}{r['gather_over_sdpa']:>10.2f}"
              f"{r['torch_over_reference']:>10.2f}"
              f"{r['torch_first_over_reference']:>8.2f}{r['max_abs_err_vs_sdpa']:>9.1e}")
    for name in args.shapes:
        rows = [r for r in info["rows"] if r["shape"] == name]
        worst = max(rows, key=lambda r: r["torch_over_sdpa"])
        print(f"goal torch <= {RATIO_GOAL:.0f}x sdpa, {name}: worst "
              f"{worst['torch_over_sdpa']:.2f}x (batch {worst['batch']}, context "
              f"{worst['context']}): "
              f"{'met' if worst['torch_over_sdpa'] <= RATIO_GOAL else 'NOT met'}")
        # Never slower than the reference: every call, a step's first layer included.
        slowest = max(rows, key=lambda r: max(r["torch_over_reference"],
                                              r["torch_first_over_reference"]))
        ratio = max(slowest["torch_over_reference"], slowest["torch_first_over_reference"])
        print(f"goal torch never slower than the reference, {name}: worst {ratio:.2f}x "
              f"(batch {slowest['batch']}, context {slowest['context']}): "
              f"{'met' if ratio <= 1.0 else 'NOT met'}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
