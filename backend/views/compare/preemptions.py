"""Why the paged simulator preempts as often as it does: numbers and words from one run.

Every preemption in the replay is the same event (backend.lab.sim.replay): a
decoding request's next token starts a new block and no block is free. Under
vLLM's rules (running requests before waiting ones; the victim is the most
recently admitted; it goes back to the head of the queue and returns as soon as
its blocks fit with the watermark kept free) an overloaded trace preempts about
once per finished request: each finish frees blocks that admission hands
straight to the queue's head until only the watermark is left, and the batch
grows through the watermark in a few iterations. These functions say so with
the run's own figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

from backend.core.words import counted, percent
from backend.lab.sim.simulator import SimResult, SimRun


def preemption_note(results: Sequence[SimResult]) -> str:
    """What the preemption bars show, said for these runs: why only paged memory
    preempts, and whether this paged run did."""
    said = ("Only paged memory preempts: a contiguous region is sized for the final length "
            "up front, so it never runs out while growing; paged memory grows block by "
            "block and, when it runs out, sends the newest request back to be recomputed")
    paged = next((r for r in results if r.policy == "paged"), None)
    if paged is None:
        return said + "."
    if not paged.preemptions:
        return said + ". In this run it never ran out (below: why)."
    return said + " (below: what sets each preemption off, and whom they hit)."


def preemption_counts(run: SimRun) -> pd.DataFrame:
    """How many requests were preempted 0, 1, 2, ... times."""
    counts = np.bincount(run.preemptions_per_request)
    return pd.DataFrame({"times preempted": np.arange(len(counts)), "requests": counts})


def preemption_histogram(df: pd.DataFrame) -> alt.LayerChart:
    """Bars of requests per number of preemptions, each labelled with its count."""
    base = alt.Chart(df).encode(x=alt.X("times preempted:O", title="times a request was "
                                        "preempted", axis=alt.Axis(labelAngle=0)))
    bars = base.mark_bar(color="#1f4e8c").encode(
        y=alt.Y("requests:Q", title="requests"), tooltip=["times preempted:O", "requests:Q"])
    text = base.mark_text(baseline="bottom", dy=-3).encode(y="requests:Q",
                                                           text="requests:Q")
    return (bars + text).properties(title="Preemptions per request", height=220)


def preemption_story(run: SimRun) -> str:
    """Markdown: what triggered this paged run's preemptions and how they are spread."""
    r = run.result
    n, p = r.requests, r.preemptions
    if r.block_size is None:
        return ("Contiguous memory never preempts: each region is sized for the request's "
                "final length when it is admitted.")
    blocks = r.capacity_tokens // r.block_size
    watermark = f"{r.watermark_blocks:,} of {blocks:,} blocks"
    if p == 0:
        return (f"**No preemption.** The running requests always found a free block for "
                f"their next token: admission kept {watermark} free, and that was enough "
                "room to grow into.")
    tl = run.timeline
    queued = float((tl.columns["waiting"] > 0).mean()) if tl is not None and len(tl) else 0.0
    grow = r.mean_batch_size / r.block_size          # new blocks the batch needs per iteration
    lasts = (r.watermark_blocks or 0) / grow if grow else 0.0
    ages = run.victim_ages
    never = n - r.preempted_requests
    most = r.max_preemptions_per_request
    at_most = int((run.preemptions_per_request == most).sum())
    if most > 1:
        worst = f"{counted(at_most, 'request')} as many as {most:,} times"
    else:
        worst = "each of them once" if at_most > 1 else "once"
    return (
        f"**Why {p:,} preemptions for {n:,} requests.** Every one is the same event: a "
        "running request's next token starts a new block and no block is free. The "
        "scheduler follows vLLM's rules: running requests are served before waiting ones, "
        "the victim is the most recently admitted request, and it goes back to the head of "
        f"the queue, to be readmitted as soon as its blocks fit with {watermark} kept free "
        f"(the watermark). Requests arrived at {r.rate:.2f}/s and finished at "
        f"{r.throughput_requests_per_s:.2f}/s, so a queue waited in {queued:.0%} of the "
        "iterations: every finish frees blocks that admission hands straight to the head of "
        f"the queue until only the watermark is left, and a batch of {r.mean_batch_size:.0f} "
        f"requests needs {grow:.1f} new blocks per iteration, so the watermark lasts about "
        f"{lasts:.0f} iterations before the newest request is pushed out again: "
        f"{p / n:.2f} preemptions per finished request.\n\n"
        f"They fall on some requests more than others: {never:,} were never preempted, "
        f"{r.preempted_requests:,} at least once, {worst}; "
        f"half the victims had been (re)admitted at most {int(np.median(ages)):,} iterations "
        f"before. The work lost is {r.recomputed_tokens:,} generated tokens recomputed "
        f"({percent(r.recomputed_tokens / max(1, r.output_tokens))} of the output). The count is "
        "right for these rules; a larger watermark, or a rate the memory can sustain, "
        "trades a little batch for far fewer.")


def watermark_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """One row per watermark: preemptions, requests hit, recomputed tokens, batch, throughput."""
    return pd.DataFrame([{
        "watermark blocks": r.watermark_blocks, "preemptions": r.preemptions,
        "requests preempted": r.preempted_requests,
        "most per request": r.max_preemptions_per_request,
        "recomputed tokens": r.recomputed_tokens, "mean batch": round(r.mean_batch_size, 2),
        "requests/s": round(r.throughput_requests_per_s, 3),
    } for r in results])
