"""Benchmark: top-p sampling over a real model's logits, candidates first against a full sort.

Collects the logits SmolLM2 gives while a few requests decode, then times the
nucleus (the tokens top-p keeps) found two ways over the same rows: among the
`NUCLEUS_CANDIDATES` most likely tokens where they hold it (`sampling._nucleus`, what
the engine runs) and by one stable sort of the whole 49,152-token vocabulary (the
rule itself, which `_nucleus` falls back to). Prints per (temperature, top-p): how
often the candidates held the nucleus, and the median ms per token of each way; the
two give the same set on every row (checked here, and in tests/test_model_config.py).

    .venv/bin/python bench/sampling.py [--model smollm2-135m] [--steps 16]
        [--repeat 5] [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from machine import cpu_name

from backend.core.config import EngineConfig
from backend.engine import prompts, sampling
from backend.engine.engine import Engine
from backend.engine.ops import parse_op

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "Paged attention stores the KV cache in fixed-size blocks so that")
SETTINGS = ((0.2, 0.9), (1.0, 0.9), (1.0, 0.95))   # SmolLM2's own first


def logit_rows(model: str, steps: int) -> list[torch.Tensor]:
    """Every row of logits the engine samples from while PROMPTS decode `steps` tokens."""
    rows: list[torch.Tensor] = []
    draw = prompts.sample_token

    def keep(logits: torch.Tensor, *args: object, **kwargs: object) -> int:
        rows.append(logits.detach().to("cpu", torch.float64).clone())
        return draw(logits, *args, **kwargs)  # type: ignore[arg-type]

    prompts.sample_token = keep   # type: ignore[assignment]
    try:
        e = Engine(EngineConfig.from_json({"model": model, "num_blocks": 64}), kernel="torch")
        for i, text in enumerate(PROMPTS):
            e.apply(parse_op({"op": "add", "request": f"R{i}", "prompt": text}))
        e.apply(parse_op({"op": "step", "count": steps}))
    finally:
        prompts.sample_token = draw   # type: ignore[assignment]
    return rows


def whole_sort(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus by one stable sort of the whole vocabulary."""
    kept, _ = sampling._kept(torch.softmax(scores, dim=0), top_p)
    return sampling._only(scores, kept)


def per_token_ms(way: object, rows: list[torch.Tensor], top_p: float, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for r in rows:
            way(r, top_p)  # type: ignore[operator]
        times.append((time.perf_counter() - t) / len(rows) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    raw = logit_rows(args.model, args.steps)
    print(f"# {datetime.date.today()} {cpu_name()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{args.model}, {len(raw)} logit rows, {sampling.NUCLEUS_CANDIDATES} candidates, "
          f"medians of {args.repeat}")
    print("| temperature | top-p | candidates held it | ms, candidates first "
          "| ms, whole sort | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    results = []
    for temperature, top_p in SETTINGS:
        rows = [r / temperature for r in raw]
        for r in rows:
            assert torch.equal(sampling._nucleus(r, top_p), whole_sort(r, top_p))
        held = sum(float(torch.topk(torch.softmax(r, 0), sampling.NUCLEUS_CANDIDATES)
                         .values.sum()) >= top_p + sampling._NUCLEUS_MARGIN for r in rows)
        fast = per_token_ms(sampling._nucleus, rows, top_p, args.repeat)
        slow = per_token_ms(whole_sort, rows, top_p, args.repeat)
        results.append({"temperature": temperature, "top_p": top_p, "rows": len(rows),
                        "held": held, "ms_candidates": fast, "ms_whole_sort": slow})
        print(f"| {temperature:g} | {top_p:g} | {held}/{len(rows)} | {fast:.2f} "
              f"| {slow:.2f} | {slow / fast:.1f}x |")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
