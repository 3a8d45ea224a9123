"""Decode attention through the paged kernel: bandwidth, the cost of paging, and torch SDPA.

For each batch size and context length, one decode step (one new token per sequence)
attends to the whole context. The same K/V is laid out three ways:

    paged      [num_blocks, block_size, kvh, D], blocks in a random order (tables look
               like [9, 2, 14]); the Triton kernel looks each position up in the table
    one block  block_size = context: one contiguous block per sequence, same kernel;
               paged / one-block is the cost of paging itself
    SDPA       torch's scaled_dot_product_attention on [B, H, L, D] (enable_gqa)

Decode is memory-bound: the floor is the K/V bytes read divided by the memory bandwidth.
Bandwidth is reported as K/V bytes read per second, and as a fraction of a measured
device-to-device copy (bytes read + bytes written per second, the usual convention).

    python bench/kernel.py [--quick] [--device auto|cpu|cuda] [--out results.json] [--sweep]
                           [--batch 1 8 32 64] [--context 512 1024 4096 16384]
                           [--block-size 16] [--heads 32] [--kv-heads 8] [--head-dim 128]
                           [--dtype bfloat16]

On a CPU the Triton kernel runs in Triton's interpreter (its batched variant): the figures
then measure Python, not the kernel, and the run says so. bench/torch_path.py compares
the torch path with SDPA and the reference; bench/interpreter_step.py times a model step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import decode_cases
import torch
import torch.nn.functional as F
from decode_cases import DTYPES, Case, Shape, time_cpu, time_gpu

from backend.core.errors import PagedLabError
from backend.kernels import attention, select_kernels
from backend.kernels.torch_path import torch_paged_attention

CPU_WARNING = """\
!!! CPU run: the Triton kernel runs in Triton's INTERPRETER (Python, one program at a time).
!!! These numbers measure the interpreter and torch on this CPU, NOT kernel performance.
!!! Run on a CUDA GPU (bench/gpu_check.sh) for bandwidth figures."""


@dataclass
class Row:
    """One (batch, context) case."""

    batch: int
    context: int
    kv_bytes: int
    num_splits: int
    paged_us: float
    paged_gbps: float
    paged_frac_copy: float | None
    unsplit_us: float | None
    one_block_us: float | None
    paging_overhead: float | None
    sdpa_us: float | None
    sdpa_frac_copy: float | None
    identical_to_one_block: bool | None
    max_abs_err_vs_sdpa: float
    torch_path_us: float | None = None


def copy_bandwidth(device: torch.device, timer: Callable[[Callable[[], object]], float]) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written."""
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6) / 1e9


def make_case(batch: int, context: int, args: argparse.Namespace,
              device: torch.device) -> Case:
    return decode_cases.make_case(batch, context, Shape(args.heads, args.kv_heads,
                                                        args.head_dim, args.block_size,
                                                        args.dtype), device)


def planned(case: Case, layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor], scale: float,
            interpret: bool, num_splits: int | None = None,
            config: attention.AttentionConfig | None = None,
            ) -> tuple[torch.Tensor, Callable[[], None], int]:
    """Validate and allocate once, so the timed call is only the kernel launches."""
    k, v, table = layout
    out, launches = attention.plan_paged_attention(
        case.query, k, v, table, case.seq_lens, case.query_start_loc, scale,
        num_splits=num_splits, interpret=interpret, config=config)
    grid = launches[0].grid
    splits = grid[2] if len(grid) == 3 else 1  # the interpreter's batched kernel: 1-D grid

    def run() -> None:
        for launch in launches:
            launch.run()

    return out, run, splits


def bench_case(batch: int, context: int, args: argparse.Namespace, device: torch.device,
               copy_gbps: float, timer: Callable[[Callable[[], object]], float]) -> Row:
    case = make_case(batch, context, args, device)
    scale = args.head_dim ** -0.5
    interpret = device.type != "cuda"
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * case.query.element_size()

    out_paged, run_paged, splits = planned(case, case.paged, scale, interpret)
    paged_us = timer(run_paged)
    unsplit_us = None
    if splits > 1:
        unsplit_us = timer(planned(case, case.paged, scale, interpret, num_splits=1)[1])
    assert case.one_block is not None
    out_one, run_one, _ = planned(case, case.one_block, scale, interpret)
    one_us = timer(run_one)

    q = case.query[:, :, None, :]  # [B, H, 1, D]: the new token attends to all L keys

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, *case.dense, scale=scale, enable_gqa=True)

    sdpa_out = sdpa()[:, :, 0]
    sdpa_us = timer(sdpa)
    torch_us = None
    if device.type != "cuda":
        k, v, table = case.paged
        torch_us = timer(lambda: torch_paged_attention(case.query, k, v, table, case.seq_lens,
                                                       case.query_start_loc, scale))
    row = Row(
        batch=batch, context=context, kv_bytes=kv_bytes, num_splits=splits,
        paged_us=paged_us, paged_gbps=kv_bytes / (paged_us * 1e-6) / 1e9,
        paged_frac_copy=None, unsplit_us=unsplit_us, one_block_us=one_us,
        paging_overhead=paged_us / one_us - 1.0, sdpa_us=sdpa_us, sdpa_frac_copy=None,
        identical_to_one_block=bool(torch.equal(out_paged, out_one)),
        max_abs_err_vs_sdpa=float((out_paged.float() - sdpa_out.float()).abs().max()),
        torch_path_us=torch_us,
    )
    row.paged_frac_copy = row.paged_gbps / copy_gbps
    row.sdpa_frac_copy = kv_bytes / (sdpa_us * 1e-6) / 1e9 / copy_gbps
    return row


def sweep(args: argparse.Namespace, device: torch.device,
          timer: Callable[[Callable[[], object]], float]) -> list[dict[str, Any]]:
    """Time tile-size / warp / stage choices on the largest requested decode case."""
    batch, context = max(args.batch), min(args.context, key=lambda c: abs(c - 4096))
    case = make_case(batch, context, args, device)
    group = args.heads // args.kv_heads
    block_m = max(16, 1 << (group - 1).bit_length())
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * case.query.element_size()
    results: list[dict[str, Any]] = []
    for block_n in (32, 64, 128):
        for num_warps in (2, 4, 8):
            for num_stages in (2, 3, 4):
                config = attention.AttentionConfig(block_m, block_n, num_warps, num_stages)
                entry: dict[str, Any] = {"batch": batch, "context": context, **asdict(config)}
                try:
                    _, run, _ = planned(case, case.paged, args.head_dim ** -0.5, False,
                                        num_splits=1, config=config)
                    us = timer(run)
                    entry.update(us=us, gbps=kv_bytes / (us * 1e-6) / 1e9)
                except Exception as exc:  # an over-sized tile fails to compile or launch
                    entry.update(error=f"{type(exc).__name__}: {str(exc)[:120]}")
                results.append(entry)
    return results


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[Row], copy_gbps: float, cpu: bool) -> None:
    print(f"\ndevice-to-device copy: {copy_gbps:.0f} GB/s (read + write)")
    head = (f"{'batch':>5} {'ctx':>6} {'KV MiB':>8} {'split':>5} {'paged us':>9} {'GB/s':>7} "
            f"{'%copy':>6} {'unsplit':>8} {'1-blk us':>9} {'paging':>7} {'sdpa us':>9} "
            f"{'%copy':>6} {'same':>4}")
    if cpu:
        head += f" {'torch us':>9}"
    print(head)
    for r in rows:
        line = (f"{r.batch:>5} {r.context:>6} {r.kv_bytes / 2**20:>8.1f} {r.num_splits:>5} "
                f"{r.paged_us:>9.1f} {r.paged_gbps:>7.1f} "
                f"{fmt(100 * r.paged_frac_copy if r.paged_frac_copy else None, '5.1f'):>6} "
                f"{fmt(r.unsplit_us, '8.1f'):>8} {fmt(r.one_block_us, '9.1f'):>9} "
                f"{fmt(100 * r.paging_overhead if r.paging_overhead is not None else None, '+6.1f'):>7} "  # noqa: E501
                f"{fmt(r.sdpa_us, '9.1f'):>9} "
                f"{fmt(100 * r.sdpa_frac_copy if r.sdpa_frac_copy else None, '5.1f'):>6} "
                f"{'yes' if r.identical_to_one_block else 'NO':>4}")
        if cpu:
            line += f" {fmt(r.torch_path_us, '9.1f'):>9}"
        print(line)
    print("paging = paged / one-block - 1; same = paged output bit-identical to one-block; "
          "unsplit = the paged kernel forced to one split, when the heuristic split")


def goals(rows: list[Row]) -> list[str]:
    """The decode target: batch 64, 4k context."""
    lines = []
    for r in rows:
        if (r.batch, r.context) == (64, 4096) and r.paged_frac_copy is not None:
            bw_ok = r.paged_frac_copy >= 0.80
            paging_ok = r.paging_overhead is not None and r.paging_overhead <= 0.05
            lines.append(f"goal batch 64 x 4k: {100 * r.paged_frac_copy:.1f}% of copy bandwidth "
                         f"(target >= 80%: {'met' if bw_ok else 'NOT met'}); paging costs "
                         f"{100 * (r.paging_overhead or 0):+.1f}% (target <= 5%: "
                         f"{'met' if paging_ok else 'NOT met'})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--out", type=Path, help="write all results as JSON here")
    parser.add_argument("--sweep", action="store_true",
                        help="GPU: also time tile sizes / warps / stages on the largest case")
    parser.add_argument("--batch", type=int, nargs="+")
    parser.add_argument("--context", type=int, nargs="+")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--dtype", choices=list(DTYPES))
    args = parser.parse_args(argv)

    try:
        backend = select_kernels(args.device, "triton")
    except PagedLabError as exc:  # e.g. --device cuda on a machine without a GPU
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = backend.device
    gpu = device.type == "cuda"
    # GPU defaults are the decode target; the CPU's keep the interpreter under a minute.
    defaults: dict[str, Any] = (
        {"batch": [1, 8, 32, 64], "context": [512, 1024, 4096, 16384], "block_size": 16,
         "heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"} if gpu else
        {"batch": [1, 4], "context": [64, 256], "block_size": 16, "heads": 4, "kv_heads": 2,
         "head_dim": 32, "dtype": "float32"})
    if args.quick:
        defaults.update({"batch": [1, 64], "context": [1024, 4096]} if gpu else
                        {"batch": [2], "context": [128]})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.heads % args.kv_heads:
        parser.error("--heads must be a multiple of --kv-heads")

    timer = time_gpu if gpu else time_cpu
    if not gpu:
        print(CPU_WARNING)
        # With another process on a small machine, every parallel torch op waits at a
        # barrier for a descheduled worker (milliseconds per op); one thread is steadier.
        torch.set_num_threads(1)
    torch.manual_seed(0)
    info: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(device),
        "backend": backend.name,
        "gpu": torch.cuda.get_device_name(device) if gpu else None,
        "sm_count": attention.sm_count(device),
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shape": {k: getattr(args, k) for k in ("block_size", "heads", "kv_heads", "head_dim",
                                                 "dtype")},
        "copy_gbps": copy_bandwidth(device, timer),
        "rows": [],
        "sweep": [],
        "note": None if gpu else CPU_WARNING,
    }

    def save() -> None:  # after every case, so a run cut short still leaves its results
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(info, indent=2) + "\n")

    rows: list[Row] = []
    for batch in args.batch:
        for context in args.context:
            row = bench_case(batch, context, args, device, info["copy_gbps"], timer)
            rows.append(row)
            info["rows"].append(asdict(row))
            save()
            print(f"  batch {batch:>3} context {context:>6}: paged {row.paged_us:9.1f} us "
                  f"({row.num_splits} split), one block {row.one_block_us:9.1f} us, "
                  f"sdpa {row.sdpa_us:9.1f} us", file=sys.stderr, flush=True)
            if gpu:
                torch.cuda.empty_cache()  # the next case's three layouts need the room
    if args.sweep and gpu:
        info["sweep"] = sweep(args, device, timer)
        save()

    print(f"\nsummary: {info['backend']} on {info['gpu'] or info['cpu']}; torch {info['torch']}, "
          f"triton {info['triton']}; {args.dtype}, {args.heads} q heads, {args.kv_heads} kv "
          f"heads, head_dim {args.head_dim}, block size {args.block_size}")
    sweep_rows = info["sweep"]
    if sweep_rows:
        ok = [s for s in sweep_rows if "us" in s]
        print(f"\nsweep at batch {sweep_rows[0]['batch']}, context {sweep_rows[0]['context']} "
              f"(num_splits 1), fastest first:")
        for s in sorted(ok, key=lambda s: s["us"])[:6]:
            print(f"  block_n {s['block_n']:>3} warps {s['num_warps']} stages "
                  f"{s['num_stages']}: {s['us']:8.1f} us {s['gbps']:7.0f} GB/s")
        print(f"  ({len(sweep_rows) - len(ok)} of {len(sweep_rows)} configs did not run)")
    print_table(rows, info["copy_gbps"], cpu=not gpu)
    for line in goals(rows):
        print(line)
    if not gpu:
        print(CPU_WARNING)
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
