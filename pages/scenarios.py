"""Scenarios: a guided story per claim of the PagedAttention text, stepped on a real engine.

Narration beside the same views as the Playground; Back, Next, Play, Reset, a
slider over every step taken, a link that opens the same step, downloads of
what is shown, and "continue from here" into the Playground.
"""

# ruff: noqa: E402 (the page hands a fresh server's first run to app.py before its imports)
from __future__ import annotations

import streamlit as st

from ui import entry

# First, before the slow imports below: a fresh server's /scenarios (ui/entry.py).
entry.through_app()

from backend.views.text import plain_md
from ui import control_run, exports, panels, sidebar, tour, tour_link, tour_widgets

tour.init()
run, frame = tour_link.sync()
# The scenario's own config, not the Playground's pool fields (they would change
# nothing here); the kernel fields, which apply to this run too.
sidebar.scenario(run.scenario.config, run.engine)
snap = frame.snapshot
# Only the newest state has a live engine behind it (not after a step stopped part-way).
latest = frame.step == run.taken and run.engine_at_newest

st.title("Scenarios", anchor=False)
st.caption("Each scenario is a short story told on a real engine: every step is one engine "
           "operation, and every number the narration promises is checked against what the "
           "engine shows. The scenario runs on its own engine with its own pool settings (in the "
           "sidebar); it uses the sidebar's kernel.")
tour_widgets.messages()
tour_widgets.picker(run)
# A scenario's name and description are a file's text, shown as written (not Markdown).
st.header(plain_md(run.title), anchor=False)
st.markdown(plain_md(run.scenario.description))
tour_widgets.controls(run)
# Where Play's long steps show their bar, by the controls (Next's shows at the top).
play_bar = st.empty()

story, numbers = st.columns([1, 1], gap="large")
with story:
    tour_widgets.narration(run, frame)
    control_run.scenario_panel(frame.control, run.control_problem, snap, run.engine)
with numbers:
    panels.metrics(snap)
tour_widgets.step_bar(run)
# The grid keeps its cells their size, so it takes the page's width rather than a column's.
st.header("Physical block pool", anchor=False, help=panels.HELP["pool"])
focus = panels.pool(snap, prefix="tour_")
tour_widgets.arena(frame)

panels.tables_events_kernel(
    snap, focus, run.engine if latest else None, prefix="tour_",
    to_newest=f"view step {run.taken}" if run.engine_at_newest else None,
    start="press Next" if run.can_advance else None)

st.header("Download this step", anchor=False)
exports.downloads(snap, stem=run.key if run.key != tour.UPLOAD else "scenario", prefix="tour_",
                  run=run.snapshots(),
                  run_help="The same files as `python -m backend run --snapshots DIR`.")
tour.finish(run, play_bar)
