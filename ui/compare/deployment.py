"""Real deployment: Llama-3-8B on one H200 replaying a whole Azure trace, every policy."""

from __future__ import annotations

from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.lab import deployment as dep
from backend.lab.sim.simulator import SimRun
from backend.lab.traces import MAX_TIME_SCALE
from backend.views.compare import deployment as views
from ui import a11y, numbers
from ui.bars import Advance
from ui.compare import background, refuse
from ui.compare.sim_results import comparison, preemption_section, timeline_section
from ui.compare.sim_runs import reused, run_cached
from ui.compare.simulator import TRACE_NOTE

DEPLOY_STATE = "cmp_dep_last"
DEPLOY_JOB = "cmp_dep_job"   # a replay at work (ui/compare/background.py)


def _record(job: background.Job) -> None:
    ran_workload, ran_scale = job.inputs
    runs, cached = job.result
    st.session_state[DEPLOY_STATE] = {"workload": ran_workload, "scale": ran_scale,
                                      "runs": runs, "reused": cached}


def _refused(exc: PagedLabError) -> None:
    st.session_state.pop(DEPLOY_STATE, None)
    refuse(exc)


def deployment_section() -> None:
    st.markdown(
        "The simulator at serving scale: real model shapes, a real GPU's memory and a whole "
        "production trace, replayed through PagedLab's own block manager (bookkeeping "
        "only: no K/V tensors at this size) and the contiguous arena. At the recorded "
        "arrival times an H200 holds every request of either trace with room to spare, so "
        "every policy batches the same. Compressing time packs the arrivals together until "
        "memory fills and requests wait for room, the regime of the paper's Figure 13; how "
        "often they waited under each policy, and so how far apart the policies' batches "
        "could go, depends on the trace, and the line under a replay's chart says both.")
    c = st.columns(3)
    with numbers.fields() as f:
        workload = c[0].selectbox("Trace", list(dep.TIME_SCALES), index=1, key="cmp_dep_trace",
                                  persist_state="session")
        scale = float(f.number(
            c[1], "Time scale", 0.01, MAX_TIME_SCALE, dep.TIME_SCALES[workload], step=10.0,
            key=f"cmp_dep_scale_{workload}",
            help="The gaps between arrivals are divided by this. The preset's own: "
                 + ", ".join(f"{w} {s:g}" for w, s in dep.TIME_SCALES.items()) + "."))
    # The replay's bar goes right under the button's row: drawn where the job is taken,
    # under the preset's paragraph and the trace's credit, it was out of view in an
    # 800 px window, and the button seemed to do nothing for the replay's 40 s.
    bar = st.empty()
    try:
        d = dep.deployment(workload, time_scale=scale)
    except PagedLabError as e:
        refuse(e)
        return
    st.markdown(views.preset_sentence(d))
    # Credited wherever its figures are shown, a replay or not (its license asks for it).
    st.caption(TRACE_NOTE)
    # Its label wraps in a third of a narrow page (cut to "Replay the whole …" at 800 px).
    if c[2].button("Replay the whole trace", type="primary", key="cmp_dep_run", wrap=True):
        key, trace, configs = ("deployment", workload, scale), d.trace, d.configs()

        def replay(advance: Advance) -> tuple[list[SimRun], int]:
            # Counted first: a run this or another session made is taken from the
            # server's cache, and the time the page states is the one it took then.
            cached = reused(key, configs)
            return run_cached(key, trace, configs, advance), cached

        background.begin(DEPLOY_JOB, (workload, scale), replay,
                         "Simulating...", f"{workload}, time / {views.as_typed(scale)}")
    background.take(DEPLOY_JOB, _record, _refused, bar)
    last: dict[str, Any] | None = st.session_state.get(DEPLOY_STATE)
    if last is None:
        # No time is promised: it depends on the server and its load (the bar shows
        # progress, and the result says how long the replays took).
        st.caption(f"Press Replay the whole trace: {len(d.configs())} policies, "
                   f"{counted(len(d.trace), 'request')} each; a bar shows "
                   "their progress.")
        return
    runs = last["runs"]
    results = [r.result for r in runs]
    wall = sum(r.wall_s for r in results)
    cached = last["reused"]
    took = (f"the four replays took {wall:.1f} s on this server" if not cached else
            "the four replays had run on this server before (in this session or another) "
            f"and are shown from its cache; they took {wall:.1f} s then"
            if cached == len(runs) else
            f"the four replays took {wall:.1f} s on this server, {cached} of them when "
            "they ran before (in this session or another; shown from its cache)")
    st.caption(f"Last run: {last['workload']}, time / {views.as_typed(last['scale'])}; "
               f"{took}.")
    # Read out when a run's results are drawn (ui/a11y.py), before the comparison's.
    with a11y.said("cmp_dep_fig13", "result"):
        st.markdown("**" + views.figure13_sentence(results) + "**")
        waits = views.figure13_waits(results)
        if waits:       # why the bars lie close: plain text, the ranking alone in bold
            st.markdown(waits)
    st.altair_chart(views.figure13_chart(views.figure13_frame(results)), width="stretch",
                    key="cmp_dep_fig13")
    st.markdown(views.length_note(dep.deployment(last["workload"], time_scale=last["scale"]),
                                  runs))
    comparison(runs, "cmp_dep", paper_ticks=False, batch_chart=False)
    preemption_section(runs, "cmp_dep")
    timeline_section(runs, "cmp_dep", f"deployment-{last['workload']}")
