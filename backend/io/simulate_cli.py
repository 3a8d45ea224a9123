"""`python -m backend simulate`: replay a trace through one allocation policy.

The trace is synthetic (sharegpt, alpaca), recorded (azure-code, azure-conv: the
Azure LLM inference trace 2023 in assets/traces/) or a CSV file of one's own
(backend.lab.traces says its format). The flags and the RESULT.json fields are
public (CONTRACT.md). Every value is parsed and range-checked here rather than
by argparse, so that bad input always ends in exactly one line, `error: ...`,
on stderr and exit status 2; a trace file is read whole (at most
MAX_TRACE_BYTES) and checked before anything is replayed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from backend.core.budgets import MAX_BUDGET
from backend.core.checks import check_int, int_requirement, write_it_as
from backend.core.errors import PagedLabError
from backend.core.words import percent
from backend.io.json_input import path_arg, read_bounded, same_file
from backend.io.report import out, say
from backend.lab.contiguous import DEFAULT_MAX_LEN
from backend.lab.sim.simulator import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY_TOKENS,
    DEFAULT_ITERATION_S,
    DEFAULT_RATE,
    MAX_CAPACITY_TOKENS,
    POLICIES,
    SimConfig,
    SimResult,
    max_len_for,
    simulate,
)
from backend.lab.traces import (
    DEFAULT_REQUESTS,
    MAX_TIME_SCALE,
    MAX_TRACE_BYTES,
    RECORDED,
    WORKLOAD_NAMES,
    parse_trace_csv,
    recorded_trace,
    replay_trace,
    workload_trace,
)
from backend.lab.workloads import Trace

MAX_REQUESTS = 10_000_000
MIN_RATE = 1e-6
MAX_RATE = 1e6
MAX_SEED = 2**63 - 1


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `simulate` flags to `parser` (values are validated by `run_simulate`)."""
    parser.add_argument(
        "--workload", metavar="{sharegpt,alpaca,azure-code,azure-conv,TRACE.csv}",
        # Required here, not in run_simulate, so that the usage line shows it so.
        required=True,
        help="sharegpt (mean 161 prompt + 338 output tokens) or alpaca (19 + 58): synthetic, "
             "Poisson arrivals; azure-code (8,819 requests, 2,048 + 28) or azure-conv "
             "(19,366, 1,155 + 211): the Azure LLM inference trace 2023, arrivals and "
             "lengths as recorded; or a CSV file with columns TIMESTAMP,ContextTokens,"
             f"GeneratedTokens (at most {MAX_TRACE_BYTES >> 20} MiB)")
    parser.add_argument(
        "--policy", metavar="{paged,max,pow2,oracle}", required=True,
        help="paged: PagedLab's block manager (preempts and recomputes when full); "
             "max / pow2 / oracle: one contiguous region per request of --max-len slots / "
             "the next power of two of its final length / exactly its final length (each "
             "capped at the capacity)")
    parser.add_argument(
        "--requests", metavar="N",
        help=f"synthetic: requests in the trace, 1..{MAX_REQUESTS} (default "
             f"{DEFAULT_REQUESTS}); recorded or CSV: replay only the first N (default all)")
    parser.add_argument(
        "--rate", metavar="R",
        help=f"synthetic: Poisson arrival rate in requests per second (default "
             f"{DEFAULT_RATE:g}: with sharegpt and the default capacity, enough to fill "
             "memory under every policy; alpaca's short requests need about 80); recorded "
             "or CSV: rescale the arrivals so that their mean rate is R (default as recorded)")
    parser.add_argument(
        "--time-scale", metavar="F",
        help="divide the gaps between arrivals by F (F > 1 compresses time, default 1); "
             "not with --rate")
    parser.add_argument(
        "--capacity-tokens", metavar="T",
        help=f"KV capacity in token slots, 1..{MAX_CAPACITY_TOKENS} (default "
             f"{DEFAULT_CAPACITY_TOKENS}: about OPT-13B's KV room on a 40 GB A100)")
    parser.add_argument(
        "--block-size", metavar="B",
        help=f"tokens per block for the paged policy, 1..256 (default {DEFAULT_BLOCK_SIZE}; "
             "ignored by the contiguous policies)")
    parser.add_argument(
        "--max-len", "--max_len", dest="max_len", metavar="L",
        help=f"max policy: the slots reserved per request, the model's context length, "
             f"1..{MAX_CAPACITY_TOKENS} (default {DEFAULT_MAX_LEN}, or for a trace with "
             "longer requests the next power of two that holds its longest; ignored by "
             "the other policies)")
    parser.add_argument("--seed", metavar="S",
                        help="synthetic trace seed, an integer >= 0 (default 0)")
    parser.add_argument(
        "--max-num-seqs", "--max_num_seqs", dest="max_num_seqs", metavar="N",
        help="scheduler: at most N requests run in one iteration (default: no limit)")
    parser.add_argument(
        "--max-num-batched-tokens", "--max_num_batched_tokens", dest="max_num_batched_tokens",
        metavar="T",
        help="scheduler: at most T tokens (prefill + decode) per iteration; decodes go "
             "first and longer prompts are prefilled in chunks (default: no limit)")
    parser.add_argument(
        "--watermark-blocks", "--watermark_blocks", dest="watermark_blocks", metavar="W",
        help="paged: admit a request only if W blocks stay free after it (default: 1%% of "
             "the pool, vLLM's default)")
    parser.add_argument(
        "--out", metavar="RESULT.json", type=path_arg,
        help="write the result there (and a summary to stdout); without it the result "
             "JSON goes to stdout")
    parser.epilog = (
        f"Continuous batching at a fixed {DEFAULT_ITERATION_S * 1000:g} ms per iteration: "
        "every running request gains one token per iteration; arrivals are admitted first "
        "come, first served when memory and the scheduler budgets allow. Progress goes to "
        "stderr.")


class _BadInputError(Exception):
    pass


def _int(value: str | None, flag: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        # ASCII digits only: int() also takes "1_000" and other scripts' digits ("١٠").
        if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
            raise ValueError(value)
        out: object = int(value, 10)
    except ValueError:
        out = value  # not a number: the check quotes it as given
        whole = _whole_in(value, low, high)
        if whole is not None:
            raise _BadInputError(f"{flag} must be {int_requirement(low, high)}, got "
                                 f"{value!r}{write_it_as(whole)}") from None
    return check_int(out, flag, low, high)


def _whole_in(value: str, low: int, high: int) -> int | None:
    """The whole number in low..high that `value` writes with a decimal point or an
    exponent ("1e3", "1000.0"), read exactly (a float would take 1000.00000000000001 for
    1000); else None."""
    if not any(c in value for c in ".eE") or not _FLOAT.fullmatch(value.strip()):
        return None
    try:
        d = Decimal(value.strip())
    except InvalidOperation:
        return None
    if not (d.is_finite() and low <= d <= high and d == d.to_integral_value()):
        return None
    return int(d)


_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)",
                    re.IGNORECASE)


def _float(value: str | None, flag: str, what: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    try:
        # float() also takes "1_0" and other scripts' digits: a number is written in ASCII.
        if not _FLOAT.fullmatch(value.strip()):
            raise ValueError(value)
        out = float(value)
    except ValueError:
        raise _BadInputError(f"{flag} must be {what}, got {value!r}") from None
    if not (math.isfinite(out) and low <= out <= high):
        raise _BadInputError(f"{flag} must be between {low:g} and {high:g}, got {value}")
    return out


def _optional_int(value: str | None, flag: str, low: int) -> int | None:
    return None if value is None else _int(value, flag, 0, low, MAX_BUDGET)


def _trace(args: argparse.Namespace) -> tuple[Trace, int]:
    """The trace `--workload` names, prefixed and rescaled by the flags, and the longest
    request (prompt plus output) of the whole trace it was cut from."""
    workload = args.workload
    rate = _float(args.rate, "--rate", "a number of requests per second", MIN_RATE, MAX_RATE)
    scale = _float(args.time_scale, "--time-scale", "a number", 1e-6, MAX_TIME_SCALE)
    if rate is not None and scale is not None:
        raise _BadInputError("--rate and --time-scale both set the arrival rate: give one")
    seed = _int(args.seed, "--seed", 0, 0, MAX_SEED)
    if workload in WORKLOAD_NAMES and workload not in RECORDED:
        requests = _int(args.requests, "--requests", DEFAULT_REQUESTS, 1, MAX_REQUESTS)
        trace = workload_trace(workload, requests=requests, rate=rate, seed=seed,
                               time_scale=scale)
        return trace, int(trace.final_len.max())
    if workload in RECORDED:
        recorded = recorded_trace(workload)
    elif workload.lower().endswith(".csv") or "/" in workload or Path(workload).is_file():
        data = read_bounded(Path(workload), "trace", MAX_TRACE_BYTES)
        recorded = parse_trace_csv(data, workload)
    else:
        raise _BadInputError(f"--workload must be one of {', '.join(WORKLOAD_NAMES)} or a "
                             f"path to a CSV trace, got {workload!r}")
    n = len(recorded)
    prefix = None
    if args.requests is not None:
        prefix = _int(args.requests, "--requests", 0, 1, MAX_REQUESTS)
        if prefix > n:
            raise _BadInputError(f"--requests must be at most {n:,}, the requests "
                                 f"{recorded.workload} holds, got {prefix:,}")
    return (replay_trace(recorded, requests=prefix, rate=rate, time_scale=scale),
            int(recorded.final_len.max()))


def _choice(value: str, flag: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _BadInputError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
    return value


def summary(result: SimResult) -> str:
    """A few human-readable lines about a result."""
    mem = "  ".join(f"{k} {percent(v)}" for k, v in result.memory.items())
    bs = f", block size {result.block_size}" if result.block_size is not None else ""
    scaled = f" (time / {result.time_scale:g})" if result.time_scale != 1 else ""
    return (f"{result.policy} on {result.requests} {result.workload} requests at "
            f"{result.rate:g}/s{scaled}, {result.capacity_tokens} token slots{bs}\n"
            f"batch: mean {result.mean_batch_size:.2f}, max {result.max_batch_size}; "
            f"preemptions {result.preemptions} ({result.preempted_requests} requests, at most "
            f"{result.max_preemptions_per_request} each); throughput "
            f"{result.throughput_requests_per_s:.3f} requests/s\n"
            f"memory: {mem}")


def run_simulate(args: argparse.Namespace) -> int:
    """Run the command for parsed `args`; returns the exit status (0, or 2 for bad input)."""
    try:
        policy = _choice(args.policy, "--policy", POLICIES)
        capacity = _int(args.capacity_tokens, "--capacity-tokens", DEFAULT_CAPACITY_TOKENS,
                        1, MAX_CAPACITY_TOKENS)
        block_size = _int(args.block_size, "--block-size", DEFAULT_BLOCK_SIZE, 1, 256)
        max_len = _int(args.max_len, "--max-len", DEFAULT_MAX_LEN, 1, MAX_CAPACITY_TOKENS)
        config = SimConfig(policy=policy, capacity_tokens=capacity,  # type: ignore[arg-type]
                           block_size=block_size, max_len=max_len,
                           max_num_seqs=_optional_int(args.max_num_seqs, "--max-num-seqs", 1),
                           max_num_batched_tokens=_optional_int(
                               args.max_num_batched_tokens, "--max-num-batched-tokens", 1),
                           watermark_blocks=_optional_int(args.watermark_blocks,
                                                          "--watermark-blocks", 0))
        config.validate()
        # Before the trace is read: as `run` refuses an --out over its scenario, the
        # result would replace the CSV it came from (a workload's name is no file).
        if (args.out is not None and args.workload not in WORKLOAD_NAMES
                and same_file(Path(args.out), Path(args.workload))):
            raise _BadInputError(f"--out {str(args.out)!r} is the trace file itself: the result "
                                 "would replace it; name another file")
        trace, longest = _trace(args)
        if args.max_len is None:
            # A recorded trace's requests run past 2,048 tokens: the max policy reserves
            # what the whole trace's longest needs, as the page's field defaults to (a
            # context length is the deployment's, not the prefix's), not a refusal.
            config = replace(config, max_len=max_len_for(longest))

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
        say("error", str(e))
        return 2
    payload: dict[str, Any] = result.to_json()
    text = json.dumps(payload, indent=2) + "\n"
    if args.out is None:
        out(text)
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as e:
        say("error", f"cannot write {args.out}: {e.strerror or e}")
        return 2
    out(summary(result) + "\n")
    return 0
