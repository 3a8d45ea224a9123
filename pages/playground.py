"""Playground: drive the live engine. Configure, add, grow, fork, finish, step, shuffle.

Its timeline (ui/timeline.py) charts the run row by row and can show the
state after a past step in the views. Export what is shown (also as a scenario
file), upload a snapshot to continue from its exact state, and reopen or delete
this browser's saved sessions. The address names this session once it has
state (ui/store.py).
"""

# ruff: noqa: E402 (the page hands a fresh server's first run to app.py before its imports)
from __future__ import annotations

import streamlit as st

from ui import entry

# First, before the slow imports below: a fresh server's /playground (ui/entry.py).
entry.through_app()

from backend.views.text import plain_md
from ui import (
    control_run,
    controls,
    engine_actions,
    exports,
    panels,
    progress,
    resume,
    session,
    store,
    timeline,
    whatif,
)

st.title("Playground", anchor=False)
st.caption("A real paged KV-cache allocator and paged-attention kernel. Each action below is "
           "one engine operation; every view shows the state it left.")
if st.session_state.get(session.PENDING):
    st.warning("The sidebar's settings differ from the running engine's: apply them there "
               "(this starts a new engine) or keep the current ones.")
if st.session_state.get(session.FIELDS_PROBLEM):
    # Said here too: the sidebar says it under its last field, often out of sight.
    problem = "; ".join(st.session_state[session.FIELDS_PROBLEM].splitlines())
    st.warning(plain_md(f"The sidebar's settings are not applied: {problem}. The engine "
                        "keeps its current ones."))
engine = session.get_engine()
# Read the engine under its lock: a second click's callback may be applying an
# operation in another thread, and the page must show a state from before or after
# it. While it runs, the wait shows its progress and a Stop button.
with progress.engine_lock(engine, "page", progress.get_work()) as waited:
    waited.finish()
    # What the operation waited for wrote, and the engine, which it may have replaced.
    session.collect(sidebar_drawn=True)
    engine = session.get_engine()
    with engine.lock:
        store.write_address()
        controls.status_line()
        store.notes()
        controls.render()
        snap = session.current_snapshot(engine)
        # A row picked on the timeline shows its step's kept state; the engine is only read.
        past = timeline.banner(timeline.picked(engine, session.get_history()),
                               session.get_history())
        shown, prefix = (snap, "") if past is None else (past, timeline.PAST_PREFIX)
        panels.metrics(shown)
        st.header("Physical block pool", anchor=False)
        focus = panels.pool(shown, prefix)
        to_newest = "go back to the live state"
        panels.tables_events_kernel(shown, focus, engine if past is None else None, prefix,
                                    to_newest=to_newest)
        control_run.playground_panel(engine, session.get_oplog(), snap)
        whatif.panel(engine, None if past is None else int(past["step"]), to_newest)
        st.header("Timeline", anchor=False, help=timeline.HELP)
        timeline.section(engine, session.get_history())
        st.header("Export and import", anchor=False)
        if past is not None:
            st.caption(f"Showing the past: the snapshot, grid and tables below are of step "
                       f"{past['step']}'s state, as shown above; the run's zip and *Session "
                       "as a scenario* hold the whole session.")
        # What is shown: a picked past step's state, or the live one.
        exports.downloads(shown, stem="playground", prefix=prefix, run=session.get_history(),
                          run_help=f"The newest {session.MAX_HISTORY} operations at most, "
                                   "since the engine was started or restored.")
        exports.scenario_download(session.get_oplog(), engine.config, snap,
                                  session.get_history())

exports.import_panel()
st.header("Sessions", anchor=False)
store.sessions_panel(session.get_engine(), resume.open_other, engine_actions.new_session,
                     resume.delete_other)
