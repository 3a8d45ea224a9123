"""What a simulator run shows: the policy comparison, why paged memory preempted, and the
timeline per iteration with its CSV and Parquet downloads. Shared by the trace simulator and
the real-deployment preset (each passes its own key prefix)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from backend.io.export import to_csv, to_parquet
from backend.lab.sim.simulator import SimRun
from backend.views.compare import charts, preemptions
from backend.views.compare import frames as views
from backend.views.compare.timeline import timeline_chart, timeline_frame
from ui import a11y
from ui.compare import breakdown, label


def comparison(runs: Sequence[SimRun], prefix: str, *, paper_ticks: bool = True,
               batch_chart: bool = True) -> None:
    """Batch sizes, token shares, preemptions, the memory breakdown and the metrics table.
    `batch_chart` False leaves out the mean batch chart: a page that drew its own (the
    deployment's Figure 13) would show the same four bars twice."""
    results = [r.result for r in runs]
    metrics = views.policy_metrics(results)
    # Read out when a run's results are drawn (ui/a11y.py).
    with a11y.said(prefix, "result"):
        st.markdown(views.batch_gain_sentence(results))
    # Of the memory held, as the paper's Figure 2 (it has no free share), so that its
    # ticks compare like with like; the breakdown below counts the free memory too.
    shares = charts.policy_bars(metrics, views.HELD_ROW, "Token states of memory held",
                                percent=True,
                                paper_field="paper token states" if paper_ticks else None)
    preempted = charts.policy_bars(metrics, "preemptions", "Preemptions", integer=True)
    a, b = st.columns(2)
    if batch_chart:
        a.altair_chart(charts.policy_bars(metrics, "mean batch size", "Mean batch size"),
                       width="stretch", key=f"{prefix}_batch_chart")
        b.altair_chart(shares, width="stretch", key=f"{prefix}_token_chart")
        a, b = st.columns(2)
        a.altair_chart(preempted, width="stretch", key=f"{prefix}_preempt_chart")
        note = b
    else:
        a.altair_chart(shares, width="stretch", key=f"{prefix}_token_chart")
        b.altair_chart(preempted, width="stretch", key=f"{prefix}_preempt_chart")
        note = st.container()
    ticks = ("Red ticks: the paper's Figure 2 token-state shares for the same kinds of "
             "system, beside our token-state shares of the memory that is not free (free "
             "slots left out, external fragmentation kept in, as Figure 2 counts it). ")
    note.caption((ticks if paper_ticks else "") + preemptions.preemption_note(results))
    st.altair_chart(charts.breakdown_bars(views.memory_long(results)), width="stretch",
                    key=f"{prefix}_breakdown_chart")
    st.caption(views.STATES_NOTE)
    idle = views.free_memory_note(results)
    if idle:
        st.caption(idle)
    breakdown(results, f"{prefix}_table")
    st.dataframe(metrics, hide_index=True, key=f"{prefix}_metrics", column_order=[
        "policy", "requests/s", "normalized latency (s/token)", "iterations", "preemptions"],
        # The two columns count different spans: requests/s is over the whole run, from
        # the first arrival's time 0 to the last finish, idle iterations included (a
        # person dividing the requests by "iterations" got another figure).
        column_config={"requests/s": st.column_config.NumberColumn(
                           format="%.3f", help="the requests replayed divided by the run's "
                           "whole length, from time 0 to the last request's finish, idle "
                           "iterations included"),
                       "normalized latency (s/token)": st.column_config.NumberColumn(
                           format="%.4f", help="the mean over requests of each one's time "
                           "from arrival to its last token, divided by its output tokens: the "
                           "paper's measure"),
                       # Counts with thousands separators, as the page's text writes them.
                       "iterations": st.column_config.NumberColumn(
                           format="localized", help="the iterations that ran a batch; one "
                           "with nothing to run (every request so far finished, the next "
                           "not arrived) is not counted"),
                       "preemptions": st.column_config.NumberColumn(format="localized")})


def preemption_section(runs: Sequence[SimRun], prefix: str) -> None:
    """The paged run's preemptions: what triggers them and how they spread over requests."""
    paged = [r for r in runs if r.result.policy == "paged"]
    if not paged:
        return
    run = paged[0]
    st.header("Paged memory's preemptions", anchor=False)
    st.markdown(preemptions.preemption_story(run))
    if run.result.preemptions:
        df = preemptions.preemption_counts(run)
        a, b = st.columns([3, 2])
        a.altair_chart(preemptions.preemption_histogram(df), width="stretch",
                       key=f"{prefix}_preempt_hist")
        b.dataframe(df, hide_index=True, key=f"{prefix}_preempt_counts")


@functools.lru_cache(maxsize=4)
def _frame(run: SimRun) -> pd.DataFrame:
    # Runs are immutable and cached server-wide: identity is a fine key.
    assert run.timeline is not None
    return timeline_frame(run.timeline)


def _csv(run: SimRun) -> bytes:
    return to_csv(_frame(run))


def _parquet(run: SimRun) -> bytes:
    return to_parquet(_frame(run))


def timeline_section(runs: Sequence[SimRun], prefix: str, stem: str) -> None:
    """One policy's timeline (chosen here) and its downloads, every iteration in them."""
    with_tl = [r for r in runs if r.timeline is not None and len(r.timeline)]
    if not with_tl:
        return
    st.header("Timeline, iteration by iteration", anchor=False)
    names = [r.result.policy for r in with_tl]
    policy = st.selectbox("Policy", names, index=names.index("paged") if "paged" in names
                          else 0, key=f"{prefix}_tl_policy", persist_state="session",
                          format_func=label)
    run = with_tl[names.index(policy)]
    df = _frame(run)
    st.altair_chart(timeline_chart(df, paged=run.result.block_size is not None),
                    key=f"{prefix}_tl_chart")
    last = int(df["iteration"].iloc[-1]) + 1
    idle = (f"; the other {last - len(df):,} of its {last:,} iterations were idle (nothing "
            "to run), drawn as such" if last > len(df) else "")
    st.caption(
        f"{len(df):,} busy iterations of {run.result.iteration_s * 1000:g} ms{idle}. "
        "Requests running and waiting; the memory (used, cached and free blocks for paged "
        "memory, cached is 0 as the traces carry no token ids to share; slots for "
        "contiguous memory); prompt and decode tokens processed; preemptions. The "
        "downloads hold every busy iteration.")
    a, b = st.columns(2)
    file = f"{stem}-{policy}-timeline"
    a.download_button("Timeline (CSV)", data=functools.partial(_csv, run),
                      file_name=f"{file}.csv", mime="text/csv", on_click="ignore",
                      key=f"{prefix}_tl_csv", icon=":material/download:", width="stretch")
    b.download_button("Timeline (Parquet)", data=functools.partial(_parquet, run),
                      file_name=f"{file}.parquet", mime="application/vnd.apache.parquet",
                      on_click="ignore", key=f"{prefix}_tl_parquet",
                      icon=":material/download:", width="stretch")
