"""Server-side time of a Playground re-render, with the engine step measured apart.

Drives the real app through Streamlit's AppTest (the script runs exactly as
under `streamlit run`, and its output is serialized to protobuf), with the
torch kernel on the CPU (`--kernel triton`: the Triton kernel in Triton's
interpreter, the Playground's CPU default; bench/interpreter_step.py times its
engine step alone, split into kernel, reference check and model):

    step+render  click "Step" and re-run the page: one batched decode of every
                 running request, then every view redrawn
    render       re-run the page with no action (views only)
    engine step  `engine.apply(Step(1))` alone, on the same engine

Two pools: 32 running requests over 256 blocks of 16 (the goal: a step
re-renders in at most 150 ms of server time), and 64 requests over 4,096 blocks
(the grid drawn a page of 1,024 blocks at a time). `--timeline-open` measures
with the Timeline's *Chart, latencies and downloads* section open, which draws
two more charts on every run.

    python bench/app_render.py [--runs 15] [--kernel torch|triton] [--timeline-open]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
import torch  # noqa: E402
from machine import cpu_name  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from backend.engine.engine import Engine  # noqa: E402
from backend.engine.ops import Add, Step  # noqa: E402

APP = str(ROOT / "app.py")


def setup(num_blocks: int, block_size: int, requests: int, prompt_len: int,
          kernel: str = "torch", timeline_open: bool = False) -> AppTest:
    """The app with `kernel`, the given pool, and `requests` running requests."""
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.segmented_control(key="dev_kernel").set_value(kernel).run()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(num_blocks).run()
    at.sidebar.number_input(key="cfg_block_size").set_value(block_size).run()
    engine: Engine = at.session_state["engine"]
    expected = "torch" if kernel == "torch" else "triton-interpreter"
    assert engine.config.num_blocks == num_blocks and engine.kernels.name == expected
    for i in range(requests):
        engine.apply(Add(f"r{i}", prompt_len=prompt_len))
    assert len(engine.running) == requests, "the pool is too small for the requests"
    # The section runs its content only while open (on_change="rerun").
    at.session_state["tl_open"] = timeline_open
    at.run()
    assert not at.exception
    return at


def timed(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(label: str, at: AppTest, runs: int) -> list[tuple[str, str, list[float]]]:
    engine: Engine = at.session_state["engine"]
    for _ in range(2):                                  # warm caches and lazy imports
        at.button(key="btn_step").click().run()
    step_render = timed(lambda: at.button(key="btn_step").click().run(), runs)
    assert not at.exception and not at.error, [e.value for e in at.error]
    render = timed(at.run, runs)
    engine_step = timed(lambda: engine.apply(Step(1)), runs)
    used = engine.metrics().allocator.used_blocks
    assert len(engine.running) > 0 and engine.metrics().allocator.preemptions == 0
    state = (f"{len(engine.running)} running, {used}/{engine.config.num_blocks} blocks used, "
             f"{len(engine.events)} events")
    return [(label, state, step_render), (label, "render only", render),
            (label, "engine step only", engine_step)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--kernel", choices=["torch", "triton"], default="torch")
    parser.add_argument("--timeline-open", action="store_true",
                        help="with the Timeline's chart section open")
    args = parser.parse_args()
    st.set_option("client.showErrorDetails", "full")
    rows = []
    # 32 requests grow to 8 blocks of 16 (all 256) at 128 tokens: the prompt leaves room
    # for every timed step, so no preemption muddles the figures.
    steps = 2 + 2 * args.runs
    prompt_len = min(100, 128 - steps)
    rows += measure("32 requests / 256 blocks",
                    setup(256, 16, 32, prompt_len, args.kernel, args.timeline_open), args.runs)
    rows += measure("64 requests / 4096 blocks",
                    setup(4096, 16, 64, 500, args.kernel, args.timeline_open), args.runs)

    print(f"# Playground re-render, server side ({datetime.date.today().isoformat()})")
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} "
          f"{platform.release()}, Python {platform.python_version()}, torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), streamlit "
          f"{st.__version__}, kernel {args.kernel} on cpu, {args.runs} runs each"
          + (", Timeline chart section open" if args.timeline_open else ""))
    print(f"{'pool':<28}{'what':<56}{'median ms':>10}{'p90 ms':>9}")
    for label, what, ms in rows:
        p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) >= 2 else ms[0]
        print(f"{label:<28}{what:<56}{statistics.median(ms):>10.1f}{p90:>9.1f}")
    print("(first row of each pool: click Step and re-render; 'render only' re-runs the page "
          "without an action)")


if __name__ == "__main__":
    main()
