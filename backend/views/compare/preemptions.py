"""Why the paged simulator preempts as often as it does: numbers and words from one run.

Every preemption in the replay is the same event (backend.lab.sim.replay): a
decoding request's next token starts a new block and no block is free. Under
vLLM's rules (running requests before waiting ones; the victim is the most
recently admitted; it goes back to the head of the queue and returns as soon as
its blocks fit with the watermark kept free), while a queue waits each finish
frees blocks that admission hands straight to the queue's head until only the
watermark is left. If the batch grows through the watermark before the next
finish, the newest request is pushed out about once per finish (an overloaded
trace); if finishes come sooner, only where they lag. These functions say which
with the run's own figures, and tell that mechanism only where the run's count
bears it out.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

from backend.core.words import counted, joined, percent
from backend.lab.sim.simulator import SimResult, SimRun
from backend.views.compare.deployment import rate_text
from backend.views.describe import MAX_LISTED

# What the watermark table's "recomputed tokens" column counts.
RECOMPUTED_HELP = ("Tokens computed again after preemptions: every token a preempted "
                   "request held, prompt and generated (of one preempted while its prompt "
                   "was prefilled in chunks, the chunks done), prefilled again on its return.")


def preemption_note(results: Sequence[SimResult]) -> str:
    """What the preemption bars show, said for these runs: why only paged memory
    preempts, and whether this paged run did (or that no run here was paged)."""
    paged = next((r for r in results if r.policy == "paged"), None)
    if paged is None:
        # Its bars are all zero: said as such, with the policy that would show some.
        return ("No contiguous policy preempts: a contiguous region is sized for the final "
                "length up front, so it never runs out while growing. Paged memory, not "
                "among these runs, grows block by block and, when it runs out, sends the "
                "newest request back to be recomputed: add it to the policies to see it.")
    said = ("Only paged memory preempts: a contiguous region is sized for the final length "
            "up front, so it never runs out while growing; paged memory grows block by "
            "block and, when it runs out, sends the newest request back to be recomputed")
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
    return (bars + text).properties(title="Preemptions per request", height=220,
                                    description=_histogram_description(df))


def _histogram_description(df: pd.DataFrame) -> str:
    """'Preemptions per request, 1,000 requests by how often each was preempted: 0 times
    950, once 40, ...' (the first MAX_LISTED bars, then the last)."""
    def bar(times: int, requests: int) -> str:
        return f"{'once' if times == 1 else counted(times, 'time')} {requests:,}"

    bars = [bar(int(t), int(n)) for t, n in zip(df["times preempted"], df["requests"],
                                                 strict=True)]
    told = (joined(bars) if len(bars) <= MAX_LISTED else
            ", ".join(bars[:MAX_LISTED - 1]) + f", ... and {bars[-1]}")
    return (f"Preemptions per request: {counted(int(df['requests'].sum()), 'request')} by "
            f"how many times each was preempted, {told}.")


def _share(x: float) -> str:
    """A share as `percent` writes it, but never "0.0%" for something that happened."""
    return "under 0.1%" if 0 < x < 0.0005 else percent(x)


def _per_finish(p: int, n: int) -> str:
    """Preemptions per finished request, at a precision that keeps a rare one visible:
    '0.94 preemptions per finished request', 'one preemption per 149 finished requests'."""
    if p >= 0.1 * n:
        return f"{p / n:.2f} preemptions per finished request"
    return f"one preemption per {counted(round(n / p), 'finished request')}"


def _iterations(x: float) -> str:
    return "less than one iteration" if x < 1 else f"about {counted(round(x), 'iteration')}"


def _finishes(every: float) -> str:
    """How often a request finished, in busy iterations."""
    if every >= 1:
        return f"a request finished every {every:,.1f} iterations on average"
    return f"{1 / every:,.1f} requests finished per iteration on average"


def _mechanism(run: SimRun) -> str:
    """Why the preemptions came as often as they did: the watermark's headroom against the
    time between finishes, told only where the run's own counts bear it out."""
    r = run.result
    n, p = r.requests, r.preemptions
    assert r.block_size is not None
    grow = r.mean_batch_size / r.block_size        # new blocks the batch needs per iteration
    growth = (f"a batch of {r.mean_batch_size:,.0f} requests needs about {grow:,.1f} new "
              "blocks per iteration")
    every = r.iterations / n                       # busy iterations per finished request
    said = (f"Requests arrived at {rate_text(r.rate)}/s and finished at "
            f"{rate_text(r.throughput_requests_per_s)}/s")
    tl = run.timeline
    if tl is None or not len(tl):
        return said + f". Here {growth}, with {_per_finish(p, n)}."
    queued = float((tl.columns["waiting"] > 0).mean())
    hit = int(np.count_nonzero(tl.columns["preemptions"]))
    fell = (f"The {counted(p, 'preemption')} fell in {hit:,} of the {r.iterations:,} busy "
            f"iterations: {_per_finish(p, n)}.")
    said += f"; a queue waited in {_share(queued)} of the iterations. "
    per = p / n
    wm = r.watermark_blocks or 0
    if wm == 0:
        return (said + "No block is kept back (a watermark of 0): admission hands out free "
                "blocks until the head of the queue no longer fits, so a preemption comes "
                f"whenever the batch's growth ({growth}) uses up what is left before a "
                f"finish frees more; {_finishes(every)}. {fell}")
    lasts = wm / grow
    watermark = ("While a queue waits, every finish frees blocks that admission hands "
                 "straight to its head until only the watermark is left, and "
                 f"{growth}, so the watermark lasts {_iterations(lasts)}")
    # The watermark's headroom against the gap between finishes sets the count: used up
    # first, about one preemption per finish while a queue waits; outlasting the gap, only
    # where finishes lag. Said only when the run's count agrees, within a factor of two.
    if lasts < every and queued / 2 <= per <= 2 * queued:
        return (said + watermark + f", and {_finishes(every)}: the watermark runs out "
                "first, and the newest request is pushed out again, about once per finish "
                f"while a queue waits. {fell}")
    if lasts >= every and per < queued / 2:
        return (said + watermark + f", while {_finishes(every)}: a finish usually frees "
                "blocks before the watermark is used up, so preemptions came only where "
                f"finishes lagged. {fell}")
    return said + f"Here {growth}. {fell}"


def preemption_story(run: SimRun) -> str:
    """Markdown: what triggered this paged run's preemptions and how they are spread."""
    r = run.result
    n, p = r.requests, r.preemptions
    if r.block_size is None:
        return ("Contiguous memory never preempts: each region is sized for the request's "
                "final length when it is admitted.")
    blocks = r.capacity_tokens // r.block_size
    wm = r.watermark_blocks or 0
    kept = (f"with {wm:,} of {blocks:,} blocks kept free (the watermark)" if wm else
            "(no block is kept free: a watermark of 0)")
    if p == 0:
        room = (f"admission kept {wm:,} of {blocks:,} blocks free, and that was enough "
                "room to grow into" if wm else
                "admission kept no block back (a watermark of 0), yet a finish always "
                "freed blocks in time")
        return (f"**No preemption.** The running requests always found a free block for "
                f"their next token: {room}.")
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
        f"the queue, to be readmitted as soon as its blocks fit {kept}. "
        + _mechanism(run) + "\n\n"
        f"They fall on some requests more than others: {never:,} were never preempted, "
        f"{r.preempted_requests:,} at least once, {worst}; "
        "half the victims had been (re)admitted at most "
        f"{counted(int(np.median(ages)), 'iteration')} before. " + work_lost(r) + " The "
        "count is right for these rules; a larger watermark, or a rate the memory can "
        "sustain, trades a little batch for far fewer.")


def work_lost(r: SimResult) -> str:
    """What the preemptions cost in computation: the tokens whose K/V was dropped and
    computed again, as a share of every token computed (each prompt and output token once,
    plus these again)."""
    total = r.prompt_tokens + r.output_tokens + r.recomputed_tokens
    chunks = ("; one preempted part way through its prompt's chunks loses the chunks done"
              if r.max_num_batched_tokens is not None else "")
    return (f"The work lost is {counted(r.recomputed_tokens, 'token')} computed again "
            f"({_share(r.recomputed_tokens / total)} of the {total:,} computed in all, "
            "counting each prompt and output token once plus these): a preempted request's "
            "K/V is dropped, so every token it held, prompt and generated, is prefilled "
            f"again when it returns{chunks}.")


def watermark_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """One row per watermark: preemptions, requests hit, recomputed tokens, batch, throughput."""
    return pd.DataFrame([{
        "watermark blocks": r.watermark_blocks, "preemptions": r.preemptions,
        "requests preempted": r.preempted_requests,
        "most per request": r.max_preemptions_per_request,
        "recomputed tokens": r.recomputed_tokens, "mean batch": round(r.mean_batch_size, 2),
        "requests/s": round(r.throughput_requests_per_s, 3),
    } for r in results])


def watermark_sentence(results: Sequence[SimResult]) -> str:
    """What keeping more blocks free did, read from the runs (sorted by watermark): the
    preemptions and recomputation at the smallest and largest, and the mean batch, which
    a larger watermark may leave as it was."""
    runs = sorted(results, key=lambda r: r.watermark_blocks or 0)
    if len(runs) < 2:
        return ""
    low, high = runs[0], runs[-1]
    def same(r: SimResult) -> bool:
        return round(r.mean_batch_size, 2) == round(low.mean_batch_size, 2)
    if all(same(r) for r in runs):
        batch = f"and the mean batch stayed at {low.mean_batch_size:.2f}"
    elif same(high):
        # The ends alike, a size between not: "from 46.52 to 46.52" would hide it.
        between = ", ".join(f"{r.mean_batch_size:.2f} at {r.watermark_blocks:,} blocks"
                            for r in runs if not same(r))
        batch = (f"and the mean batch was {low.mean_batch_size:.2f} at both ends, "
                 f"{between} between")
    else:
        # The largest watermark that left the batch as it was, when every one below it did.
        kept = [r for r in runs[1:-1] if same(r)]
        still = (f" (still {low.mean_batch_size:.2f} at {kept[-1].watermark_blocks:,} blocks)"
                 if kept and all(same(r) for r in runs[:runs.index(kept[-1])]) else "")
        batch = (f"and the mean batch went from {low.mean_batch_size:.2f} to "
                 f"{high.mean_batch_size:.2f}{still}")
    return (f"The same trace through paged memory, keeping more blocks free at admission: "
            f"from {low.watermark_blocks:,} to {high.watermark_blocks:,} blocks, "
            f"{counted(low.preemptions, 'preemption')} became {high.preemptions:,} and "
            f"{low.recomputed_tokens:,} recomputed tokens {high.recomputed_tokens:,}, "
            f"{batch}.")
