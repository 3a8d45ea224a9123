"""The real-deployment preset's words and its Figure 13 chart (no Streamlit)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import altair as alt
import pandas as pd

from backend.core.words import percent
from backend.lab import deployment as dep
from backend.lab.sim.simulator import SimResult
from backend.views.compare.frames import PAPER_SYSTEMS, POLICY_ORDER


def preset_sentence(d: dep.Deployment) -> str:
    """Markdown: the machine, the memory and the trace the preset replays."""
    cap = d.capacity
    left = (f"; {d.left_out:,} request{'s' if d.left_out != 1 else ''} longer than the "
            f"{dep.CONTEXT_LEN:,}-token context left out" if d.left_out else "")
    return (
        f"**{dep.MODEL} on one {dep.GPU}.** {cap.bytes_per_token:,} bytes of KV per token "
        f"(2 x {cap.model.num_layers} layers x {cap.model.num_kv_heads} KV heads x "
        f"{cap.model.head_dim} x 2 bytes); of {cap.gpu_bytes / 2**30:g} GiB, a 10% reserve "
        f"and {cap.weight_bytes / 2**30:.1f} GiB of bf16 weights leave "
        f"{cap.kv_bytes / 2**30:.1f} GiB: **{d.capacity_tokens:,} token slots, "
        f"{d.num_blocks:,} blocks of {dep.BLOCK_SIZE}**. Orca (Max) reserves the "
        f"{dep.CONTEXT_LEN:,}-token context per request. The trace: {d.workload}, "
        f"{len(d.trace):,} requests{left}, arrivals compressed {d.time_scale:g} times "
        f"(mean {d.trace.rate:,.0f} requests/s), {dep.ITERATION_S * 1000:g} ms per "
        "iteration.")


def figure13_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """policy, system (the paper's names), mean batched requests, in the paper's order."""
    by = {r.policy: r for r in results}
    return pd.DataFrame([{"policy": p, "system": PAPER_SYSTEMS[p],
                          "mean batched requests": by[p].mean_batch_size}
                         for p in POLICY_ORDER if p in by])


def figure13_holds(results: Sequence[SimResult]) -> bool:
    """Whether Orca Max < Pow2 < Oracle < paged in mean batched requests (all four run)."""
    df = figure13_frame(results)
    values = df["mean batched requests"].tolist()
    return len(values) == 4 and all(a < b for a, b in pairwise(values))


def figure13_sentence(results: Sequence[SimResult]) -> str:
    """'Mean batched requests: Orca (Max) 109.3 < ...' and whether the direction holds."""
    df = figure13_frame(results)
    parts = [f"{s} {v:,.1f}" for s, v in zip(df["system"], df["mean batched requests"],
                                              strict=True)]
    if len(parts) < 4:
        return "Mean batched requests: " + ", ".join(parts) + "."
    verdict = ("the direction of the paper's Figure 13" if figure13_holds(results)
               else "NOT the direction of the paper's Figure 13")
    return "Mean batched requests: " + " < ".join(parts) + f": {verdict}."


def figure13_chart(df: pd.DataFrame) -> alt.LayerChart:
    """One bar per system, labelled with its mean batch (the paper's Figure 13 layout)."""
    order = df["system"].tolist()
    base = alt.Chart(df).encode(x=alt.X("system:N", sort=order, title=None,
                                        axis=alt.Axis(labelAngle=0)))
    bars = base.mark_bar(color="#1f4e8c").encode(
        y=alt.Y("mean batched requests:Q", title="mean batched requests"),
        tooltip=["system:N", alt.Tooltip("mean batched requests:Q", format=",.1f")])
    text = base.mark_text(baseline="bottom", dy=-3).encode(
        y="mean batched requests:Q", text=alt.Text("mean batched requests:Q", format=",.1f"))
    return (bars + text).properties(title="Mean batched requests (cf. the paper's Figure 13)",
                                    height=260)


def length_note(d: dep.Deployment) -> str:
    """Why paged memory's gain over Orca (Oracle) is as large as it is on this trace."""
    t = d.trace
    share = float(t.output_len.sum() / t.final_len.sum())
    max_fit = d.capacity_tokens // dep.CONTEXT_LEN
    return (
        f"On {d.workload} the outputs are {percent(share)} of the tokens a request holds when it "
        f"finishes (prompts {t.prompt_len.mean():,.0f} tokens on average, outputs "
        f"{t.output_len.mean():,.0f}). Orca (Oracle) reserves exactly the final length, so "
        "what paged memory saves over it is the output not generated yet plus the holes "
        "between regions: the longer the outputs, the larger the gap. Orca (Max) reserves "
        f"the whole {dep.CONTEXT_LEN:,}-token context and fits {max_fit:,} requests at "
        "most; Pow2 rounds each final length up to a power "
        "of two. Once memory is full the mean batch is set by what fits; once the burst is "
        "served, the last long outputs run almost alone (see the timeline).")
