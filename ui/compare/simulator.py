"""The trace simulator: `python -m backend simulate` on the page, every policy on one trace.

The workload is synthetic, one of the Azure traces, or an uploaded CSV (ui.compare.sim_inputs);
the scheduler budgets are vLLM's; runs are cached server-wide (ui.compare.sim_runs), shared
with the block-size section.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.lab.contiguous import DEFAULT_MAX_LEN
from backend.lab.sim.paged import admits
from backend.lab.sim.simulator import MAX_CAPACITY_TOKENS, POLICIES, SimConfig, SimRun, max_len_for
from backend.lab.traces import RECORDED
from backend.lab.workloads import Trace
from backend.views.compare import frames as views
from backend.views.compare import preemptions
from backend.views.text import plain_md
from ui import layout, numbers
from ui.bars import Advance
from ui.compare import SYNTHETIC_NOTE, background, label, panel, refuse
from ui.compare.sim_inputs import (
    AZURE_DATASET,
    PAGE_MAX_REQUESTS,
    SPLITWISE_CITATION,
    TraceChoice,
    trace_inputs,
)
from ui.compare.sim_results import comparison, preemption_section, timeline_section
from ui.compare.sim_runs import run_cached
from ui.numbers import Fields

SIM_STATE = "cmp_sim_last"   # the last simulator run: its parameters and runs
SIM_JOB = "cmp_sim_job"      # a run at work (ui/compare/background.py)
MARKS_JOB = "cmp_sim_marks_job"   # the watermark sweep at work
# The recorded traces' credit with the paper cited in full (the license asks for both).
TRACE_NOTE = ("The Azure traces are the Azure LLM inference trace 2023, replayed with the "
              f"arrivals and lengths Microsoft Azure recorded and shared in its {AZURE_DATASET}, "
              f"described in {SPLITWISE_CITATION} The files and their license ship with "
              "PagedLab, in assets/traces/.")


def recorded_run(trace_key: tuple[Any, ...]) -> bool:
    """Whether a run's trace (its TraceChoice key) is one of the recorded Azure traces."""
    return trace_key[0] == "recorded" and trace_key[1] in RECORDED


def _budget_inputs(f: Fields) -> dict[str, int | None]:
    """vLLM's scheduler knobs in `f`'s group; an empty field is no limit (the watermark:
    1% of the pool)."""
    with panel("Scheduler budgets (vLLM's max_num_seqs, max_num_batched_tokens, watermark)",
               "cmp_sim_budgets_open"):
        c = st.columns(3)
        seqs = f.number(
            c[0], "max_num_seqs", 1, 1 << 20, None, step=1, key="cmp_sim_max_num_seqs",
            placeholder="no limit", help="At most this many requests run in one iteration.")
        tokens = f.number(
            c[1], "max_num_batched_tokens", 1, 1 << 24, None, step=1,
            key="cmp_sim_max_num_batched_tokens", placeholder="no limit",
            help="At most this many tokens per iteration, prefill and decode together. "
                 "Decodes go first; a longer prompt is prefilled in chunks over several "
                 "iterations.")
        watermark = f.number(
            c[2], "watermark_blocks (paged)", 0, 1 << 20, None, step=1,
            key="cmp_sim_watermark_blocks",
            placeholder="1% of the pool",
            help="A request is admitted only if this many blocks stay free after its "
                 "prompt's blocks are taken (vLLM v0's default: 1% of the blocks).")
    return {"max_num_seqs": None if seqs is None else int(seqs),
            "max_num_batched_tokens": None if tokens is None else int(tokens),
            "watermark_blocks": None if watermark is None else int(watermark)}


def _watermarks(last: dict[str, Any]) -> None:
    """The paged run again with larger watermarks: what keeping more blocks free did to
    preemptions, recomputation and the mean batch."""
    paged = [c for c in last["configs"] if c.policy == "paged"]
    if not paged or not any(r.result.preemptions for r in last["runs"]):
        return
    cfg = paged[0]
    blocks = cfg.capacity_tokens // cfg.block_size
    marks = sorted({int(f * blocks) for f in (0.01, 0.02, 0.05, 0.1)}
                   | {cfg.watermark_blocks if cfg.watermark_blocks is not None
                      else int(cfg.watermark * blocks)})
    listed = ", ".join(f"{m:,}" for m in marks)
    if st.button(f"Replay paged memory with watermarks of {listed} blocks",
                 key="cmp_sim_watermarks"):
        configs = [replace(cfg, watermark_blocks=w) for w in marks]
        trace_key, trace = last["trace_key"], last["trace"]
        # Kept with the run it extends (`last`): a new run meanwhile gets none of it.
        background.begin(MARKS_JOB, last, lambda advance: run_cached(
            trace_key, trace, configs, advance), "Simulating...",
            f"watermarks of {listed} blocks")

    def record(job: background.Job) -> None:
        job.inputs["watermarks"] = [r.result for r in job.result]

    background.take(MARKS_JOB, record, refuse)
    if last.get("watermarks"):
        # Counts with thousands separators, as the sentences beside them write them.
        counts = st.column_config.NumberColumn(format="localized")
        st.dataframe(preemptions.watermark_frame(last["watermarks"]), hide_index=True,
                     key="cmp_sim_watermark_table",
                     column_config={c: counts for c in ("watermark blocks", "preemptions",
                                                        "requests preempted")}
                     | {"recomputed tokens": st.column_config.NumberColumn(
                         format="localized", help=preemptions.RECOMPUTED_HELP)})
        said = preemptions.watermark_sentence(last["watermarks"])
        if said:      # none for one watermark (a pool so small that every share is 0)
            st.caption(said)


def _replay(choice: TraceChoice, configs: list[SimConfig], advance: Advance
            ) -> tuple[Trace, list[SimRun]]:
    """The trace built and replayed under each config: a background job's work."""
    trace = choice.build()
    return trace, run_cached(choice.key, trace, configs, advance)


def _record(job: background.Job) -> None:
    trace, ran = job.result
    st.session_state[SIM_STATE] = {**job.inputs, "runs": ran, "trace": trace}


def _refuse_keeping_last(message: str | Exception) -> None:
    """A refusal that leaves the earlier run on screen (it may have taken minutes), said
    to be from before these parameters, never as if it answered them."""
    if SIM_STATE in st.session_state:
        st.session_state[SIM_STATE]["refused_after"] = True
    refuse(message)


def simulator_section() -> None:
    st.markdown(
        "`python -m backend simulate` on this page: a trace replayed through each "
        "allocation policy with continuous batching. Synthetic traces have Poisson arrivals "
        "and lengths shaped like ShareGPT or Alpaca; the Azure traces and a CSV of your own "
        f"replay recorded arrivals and lengths. The page runs up to {PAGE_MAX_REQUESTS:,} "
        "requests; the command line handles 100k.")
    # Two fields a line where the page is narrow (beside the sidebar in a 1024 px window):
    # four in a row cut the workload's name ("sharegpt (syn").
    layout.wrap_below("cmp_sim_fields", [200, 200, 200, 200])
    with st.container(key="cmp_sim_fields"), numbers.fields() as f:
        choice = trace_inputs("cmp_sim", f)
        # A recorded trace's requests run to 14k tokens: its own defaults (and widget keys),
        # so that every policy can hold its longest request and the max policy reserves
        # enough.
        # Within the fields' own range, however long an uploaded trace's longest request
        # (a default past it would be refused before the person typed anything).
        # A trace whose requests all fit the usual 2,048 keeps the usual fields, and what
        # was typed in them.
        longest = choice.longest if choice is not None else None
        cap0, len0, suffix = 15360, DEFAULT_MAX_LEN, ""
        if longest is not None and max_len_for(longest) > DEFAULT_MAX_LEN:
            len0 = max_len_for(longest)
            cap0, suffix = min(MAX_CAPACITY_TOKENS, 4 * len0), f"_{len0}"
        c = st.columns(4)
        capacity = f.number(c[0], "Capacity (token slots)", 1, MAX_CAPACITY_TOKENS, cap0, step=1024,
                            key=f"cmp_sim_capacity{suffix}")
        block_size = c[1].selectbox("Block size (paged)", SWEEP_BLOCK_SIZES, index=4,
                                    key="cmp_sim_block_size", persist_state="session")
        max_len = f.number(c[2], "Max reservation (max policy)", 1, MAX_CAPACITY_TOKENS, len0,
                           key=f"cmp_sim_max_len{suffix}",
                           help="The slots the max policy reserves per request (the "
                                "model's context length).")
        budgets = _budget_inputs(f)
        policies = st.multiselect("Policies", list(POLICIES), default=list(POLICIES),
                                  key="cmp_sim_policies",
                                  persist_state="session", format_func=label)
    if suffix and longest is not None:
        start = (f"This trace's longest request holds {longest:,} tokens: Capacity and Max "
                 f"reservation start at {cap0:,} and {len0:,} for it")
        own = " (fields of its own: the usual ones keep what was typed in them)."
        if admits(cap0, int(block_size), longest, budgets["watermark_blocks"]):
            st.caption(f"{start}, so that every policy can hold it{own}")
        elif admits(cap0, int(block_size), longest, 0):
            # The largest capacity, less the paged policy's watermark, is still too small.
            st.caption(f"{start}, the largest the fields take, but the paged policy's "
                       f"watermark keeps too many of its blocks of {block_size} free for it: "
                       f"set watermark_blocks (Scheduler budgets) to 0{own}")
        else:
            st.caption(f"{start}, the largest the fields take, which the paged policy's "
                       f"blocks of {block_size} cannot hold it in: the run says what would{own}")
    if st.button("Run simulation", type="primary", key="cmp_sim_run"):
        if not policies:
            _refuse_keeping_last("Choose at least one policy.")
        elif choice is None:
            # The uploader still shows a file it refused: say so, not "upload one".
            held = st.session_state.get("cmp_sim_upload") is not None
            _refuse_keeping_last("The uploaded trace was refused (the reason is under the "
                                 "uploader): upload a corrected file." if held else
                                 "Upload a trace first.")
        else:
            ordered = [p for p in views.POLICY_ORDER if p in policies]
            try:
                configs = [SimConfig(p, int(capacity), int(block_size),  # type: ignore[arg-type]
                                     int(max_len), max_num_seqs=budgets["max_num_seqs"],
                                     max_num_batched_tokens=budgets["max_num_batched_tokens"],
                                     watermark_blocks=budgets["watermark_blocks"])
                           for p in ordered]
                for cfg in configs:
                    cfg.validate()
            except PagedLabError as e:
                _refuse_keeping_last(e)
            else:
                background.begin(
                    SIM_JOB, {"label": choice.label, "capacity": int(capacity),
                              "budgets": budgets, "trace_key": choice.key, "configs": configs},
                    lambda advance: _replay(choice, configs, advance), "Simulating...",
                    choice.label)
    background.take(SIM_JOB, _record, _refuse_keeping_last)
    last: dict[str, Any] | None = st.session_state.get(SIM_STATE)
    if last is None:
        st.caption("Choose the parameters and press Run simulation.")
        return
    runs: list[SimRun] = last["runs"]
    set_budgets = ", ".join(f"{k} {v:,}" for k, v in last["budgets"].items() if v is not None)
    # Plain text: an uploaded trace's label is its file's name.
    before = ", from before the refused parameters" if last.get("refused_after") else ""
    st.caption(plain_md(f"Last run{before}: {last['label']}, {last['capacity']:,} token slots"
                        + (f", {set_budgets}" if set_budgets else "") + "."))
    comparison(runs, "cmp_sim")
    preemption_section(runs, "cmp_sim")
    _watermarks(last)
    timeline_section(runs, "cmp_sim", "simulate")
    st.info(SYNTHETIC_NOTE)
    if recorded_run(last["trace_key"]):   # credited where its figures are, not beside others
        st.caption(TRACE_NOTE)
