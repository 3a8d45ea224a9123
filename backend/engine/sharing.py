"""Figure 15 measured on the engine: block memory saved by parallel sampling and beam search.

Each (kind, width, prompt) is one run of a fresh Engine with prefix caching
off, so every shared block is shared by a fork: `add` with `n` (the samples
fork the prompt's blocks) or with `beam_width` (the engine's beam search forks,
copies on write and drops beams on the model's log-probabilities). After
every step of the run we count

    used      distinct device blocks the running sequences hold (paging, shared)
    unshared  the sum of their block-table lengths: the blocks the same run
              needs if every sequence holds its own copy of all its tokens

and report saved = 1 - sum(used) / sum(unshared) over all steps of all
prompts, the time average of the paper's Figure 15 (OPT-13B on Alpaca:
parallel sampling 6.1%-9.8%, beam search 37.6%-55.2% for n / width 2, 4, 6).
The "unshared" run is the same run counted another way: the sequences,
their lengths and their lifetimes are the measured ones, only the sharing is
taken away. The prompts are the short instructions in
assets/prompts/instructions.json, given to a real model through its chat
template and to tiny-byte as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from backend.core.config import TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.core.sharing import PAPER_SAVINGS, SharingKind, SharingResult, SharingTrace
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step
from backend.models.registry import codec_for

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "instructions.json"
MAX_STEPS = 10_000
# Called after each run with (runs done, runs in all); False stops before the next.
RunProgress = Callable[[int, int], bool]


@cache
def instruction_prompts() -> tuple[str, ...]:
    """The shipped instruction prompts, in file order."""
    data = json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
    prompts = data["prompts"]
    assert isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)
    return tuple(prompts)


def run_sharing(kind: SharingKind, width: int, prompt: str, *, model: str = TINY_BYTE,
                block_size: int = 16, max_new_tokens: int = 32, seed: int = 0,
                kernel: str = "torch") -> SharingTrace:
    """One engine run of `width` samples or beams of `prompt`, counted after every step."""
    if kind not in PAPER_SAVINGS:
        raise PagedLabError(f"kind must be 'parallel' or 'beam', got {kind!r}")
    settings = {"block_size": block_size, "prefix_caching": False, "seed": seed,
                "max_new_tokens": max_new_tokens}
    # Room for every sequence's own copy, so that nothing is ever preempted: a
    # preemption would change what is shared, not only when.
    tokens = 4 * len(prompt.encode()) + 64 + max_new_tokens
    blocks = width * (-(-tokens // block_size) + 1) + 1
    config = EngineConfig.for_model(model, **settings, num_blocks=blocks)
    # A real model is given the instruction through its chat template.
    text: dict[str, Any] = ({"prompt": prompt} if config.model == TINY_BYTE
                            else {"messages": (("user", prompt),)})
    add = Add("Q", **text, n=width if kind == "parallel" else None,
              beam_width=width if kind == "beam" else None)
    engine = Engine(config, kernel=kernel, check_reference=False)
    engine.apply(add)
    m = engine.manager
    steps = used = unshared = peak_used = peak_unshared = 0
    for _ in range(MAX_STEPS):
        if not engine.running:
            break
        engine.apply(Step())
        live = [engine.requests[rid] for rid in engine.running]
        if not live:
            break
        held = m.num_blocks - m.num_free_blocks
        own = sum(m.blocks_for(r.num_tokens) for r in live)
        steps += 1
        used += held
        unshared += own
        peak_used = max(peak_used, held)
        peak_unshared = max(peak_unshared, own)
    assert m.preemptions == 0, "the pool was sized so that nothing is preempted"
    return SharingTrace(steps, used, unshared, m.cow_copies, peak_used, peak_unshared)


def measure_sharing(kind: SharingKind, widths: Sequence[int] = (2, 4, 6),
                    prompts: Sequence[str] | None = None, *, model: str = TINY_BYTE,
                    block_size: int = 16, max_new_tokens: int = 32,
                    progress: RunProgress | None = None,
                    kernel: str = "torch") -> list[SharingResult]:
    """Saved fractions for each width over `prompts` (default: the shipped instructions).

    Returns the widths measured in full; `progress` returning False stops after
    the run it was called for (the width being measured is then left out).
    """
    prompts = list(prompts if prompts is not None else instruction_prompts())
    if not prompts:
        raise PagedLabError("the sharing measurement needs at least one prompt")
    low, high = PAPER_SAVINGS[kind]
    total_runs = len(widths) * len(prompts)
    done = 0
    out: list[SharingResult] = []
    for width in widths:
        total: SharingTrace | None = None
        for prompt in prompts:
            t = run_sharing(kind, width, prompt, model=model, block_size=block_size,
                            max_new_tokens=max_new_tokens, kernel=kernel)
            total = t if total is None else total + t
            done += 1
            if progress is not None and not progress(done, total_runs) and done < total_runs:
                return out
        assert total is not None
        out.append(SharingResult(kind, width, block_size, len(prompts), total.saved_fraction,
                                 total, low, high))
    return out


RECORDED_FILE = PROMPTS_FILE.parents[1] / "measured" / "sharing-smollm2.json"


def results_json(results: Sequence[SharingResult], **meta: object) -> dict[str, Any]:
    """`results` and how they were measured, as bench/sharing_engine.py records them."""
    return {**meta, "results": [
        {"kind": r.kind, "n": r.n, "block_size": r.block_size, "prompts": r.requests,
         "steps": r.trace.steps, "used_block_steps": r.trace.used_block_steps,
         "unshared_block_steps": r.trace.unshared_block_steps,
         "cow_copies": r.trace.cow_copies, "peak_used_blocks": r.trace.peak_used_blocks,
         "peak_unshared_blocks": r.trace.peak_unshared_blocks} for r in results]}


def recorded_results(path: Path = RECORDED_FILE) -> tuple[dict[str, Any], list[SharingResult]]:
    """The measurement bench/sharing_engine.py recorded: (how it ran, results).

    The saved fractions are re-derived from the recorded block counts.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for row in data["results"]:
        trace = SharingTrace(int(row["steps"]), int(row["used_block_steps"]),
                             int(row["unshared_block_steps"]), int(row["cow_copies"]),
                             int(row["peak_used_blocks"]), int(row["peak_unshared_blocks"]))
        low, high = PAPER_SAVINGS[row["kind"]]
        out.append(SharingResult(row["kind"], int(row["n"]), int(row["block_size"]),
                                 int(row["prompts"]), trace.saved_fraction, trace, low, high))
    meta = {k: v for k, v in data.items() if k != "results"}
    return meta, out


def mean_prompt_tokens(model: str) -> float:
    """The shipped prompts' mean length in `model`'s tokens, as `run_sharing` gives them
    (a real model's chat template, system prompt included; tiny-byte's bytes)."""
    if model == TINY_BYTE:
        lengths = [len(p.encode()) for p in instruction_prompts()]
    else:
        codec = codec_for(model)
        lengths = [len(codec.encode(codec.render_chat([{"role": "user", "content": p}])))
                   for p in instruction_prompts()]
    return sum(lengths) / len(lengths)
