"""`python -m backend simulate`: replay a synthetic trace through one allocation policy.

The flags and the RESULT.json fields are public (CONTRACT.md). Every value is
parsed and range-checked here rather than by argparse, so that bad input
always ends in exactly one line, `error: ...`, on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from backend.core.errors import PagedLabError
from backend.lab.sim.simulator import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY_TOKENS,
    DEFAULT_ITERATION_S,
    DEFAULT_RATE,
    MAX_CAPACITY_TOKENS,
    POLICIES,
    SimConfig,
    SimResult,
    simulate,
)
from backend.lab.workloads import WORKLOADS, make_trace

DEFAULT_REQUESTS = 1000
MAX_REQUESTS = 10_000_000
MIN_RATE = 1e-6
MAX_RATE = 1e6
MAX_SEED = 2**63 - 1


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `simulate` flags to `parser` (values are validated by `run_simulate`)."""
    parser.add_argument(
        "--workload", metavar="{sharegpt,alpaca}",
        help="length distribution: sharegpt (mean 161 prompt + 338 output tokens) or "
             "alpaca (19 + 58); required")
    parser.add_argument(
        "--policy", metavar="{paged,max,pow2,oracle}",
        help="paged: PagedLab's block manager (preempts and recomputes when full); "
             "max / pow2 / oracle: one contiguous region per request of 2048 slots / the "
             "next power of two of its final length / exactly its final length; required")
    parser.add_argument(
        "--requests", metavar="N",
        help=f"requests in the trace, 1..{MAX_REQUESTS} (default {DEFAULT_REQUESTS})")
    parser.add_argument(
        "--rate", metavar="R",
        help=f"Poisson arrival rate in requests per second (default {DEFAULT_RATE:g}: with "
             "sharegpt and the default capacity, enough to fill memory under every policy; "
             "alpaca's short requests need about 80)")
    parser.add_argument(
        "--capacity-tokens", metavar="T",
        help=f"KV capacity in token slots, 1..{MAX_CAPACITY_TOKENS} (default "
             f"{DEFAULT_CAPACITY_TOKENS}: about OPT-13B's KV room on a 40 GB A100)")
    parser.add_argument(
        "--block-size", metavar="B",
        help=f"tokens per block for the paged policy, 1..256 (default {DEFAULT_BLOCK_SIZE}; "
             "ignored by the contiguous policies)")
    parser.add_argument("--seed", metavar="S", help="trace seed, an integer >= 0 (default 0)")
    parser.add_argument(
        "--out", metavar="RESULT.json",
        help="write the result there (and a summary to stdout); without it the result "
             "JSON goes to stdout")
    parser.epilog = (
        f"Continuous batching at a fixed {DEFAULT_ITERATION_S * 1000:g} ms per iteration: "
        "every running request gains one token per iteration; arrivals are admitted first "
        "come, first served when memory allows. Progress goes to stderr.")


class _BadInputError(Exception):
    pass


def _int(value: str | None, flag: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        out = int(value, 10)
    except ValueError:
        raise _BadInputError(f"{flag} must be an integer, got {value!r}") from None
    if not low <= out <= high:
        raise _BadInputError(f"{flag} must be in {low}..{high}, got {out}")
    return out


def _rate(value: str | None) -> float:
    if value is None:
        return DEFAULT_RATE
    try:
        out = float(value)
    except ValueError:
        raise _BadInputError(
            f"--rate must be a number of requests per second, got {value!r}") from None
    if not (math.isfinite(out) and MIN_RATE <= out <= MAX_RATE):
        raise _BadInputError(
            f"--rate must be between {MIN_RATE:g} and {MAX_RATE:g} requests per second, "
            f"got {value}")
    return out


def _choice(value: str | None, flag: str, choices: tuple[str, ...]) -> str:
    if value is None:
        raise _BadInputError(f"{flag} is required: one of {', '.join(choices)}")
    if value not in choices:
        raise _BadInputError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
    return value


def summary(result: SimResult) -> str:
    """A few human-readable lines about a result."""
    mem = "  ".join(f"{k} {v:.1%}" for k, v in result.memory.items())
    bs = f", block size {result.block_size}" if result.block_size is not None else ""
    return (f"{result.policy} on {result.requests} {result.workload} requests at "
            f"{result.rate:g}/s, {result.capacity_tokens} token slots{bs}\n"
            f"batch: mean {result.mean_batch_size:.2f}, max {result.max_batch_size}; "
            f"preemptions {result.preemptions}; throughput "
            f"{result.throughput_requests_per_s:.3f} requests/s\n"
            f"memory: {mem}")


def run_simulate(args: argparse.Namespace) -> int:
    """Run the command for parsed `args`; returns the exit status (0, or 2 for bad input)."""
    try:
        workload = _choice(args.workload, "--workload", tuple(WORKLOADS))
        policy = _choice(args.policy, "--policy", POLICIES)
        requests = _int(args.requests, "--requests", DEFAULT_REQUESTS, 1, MAX_REQUESTS)
        rate = _rate(args.rate)
        capacity = _int(args.capacity_tokens, "--capacity-tokens", DEFAULT_CAPACITY_TOKENS,
                        1, MAX_CAPACITY_TOKENS)
        block_size = _int(args.block_size, "--block-size", DEFAULT_BLOCK_SIZE, 1, 256)
        seed = _int(args.seed, "--seed", 0, 0, MAX_SEED)
        config = SimConfig(policy=policy, capacity_tokens=capacity,  # type: ignore[arg-type]
                           block_size=block_size)
        config.validate()
        trace = make_trace(workload, requests, rate, seed)

        if args.out is not None and not Path(args.out).parent.is_dir():
            raise _BadInputError(f"cannot write {args.out}: its folder does not exist")
        shown = [0]  # tenths of the trace reported so far
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            # Only runs long enough to wonder about report progress.
            tenth = done * 10 // total
            if tenth > shown[0] and time.monotonic() - started > 1.0:
                shown[0] = tenth
                print(f"simulate: {done}/{total} requests finished ({done / total:.0%})",
                      file=sys.stderr, flush=True)

        result = simulate(trace, config, progress=progress)
    except (_BadInputError, PagedLabError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    payload: dict[str, Any] = result.to_json()
    text = json.dumps(payload, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(summary(result))
    return 0
