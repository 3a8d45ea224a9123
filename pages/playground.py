"""Playground: drive the live engine. Configure, add, grow, fork, finish, step, shuffle.

Export what is shown (also as a scenario file), upload a snapshot to continue
from its exact state, and reopen or delete this browser's saved sessions. The
address names this session once it has state (ui/store.py).
"""

from __future__ import annotations

import streamlit as st

from ui import controls, exports, panels, progress, resume, session, store

st.title("Playground")
st.caption("A real paged KV-cache allocator and paged-attention kernel. Each action below is "
           "one engine operation; every view shows the state it left.")
if st.session_state.get(session.PENDING):
    st.warning("The sidebar's settings differ from the running engine's: apply them there "
               "(this starts a new engine) or keep the current ones.")
engine = session.get_engine()
# Read the engine under its lock: a second click's callback may be applying an
# operation in another thread, and the page must show a state from before or after
# it. While it runs, the wait shows its progress and a Stop button.
with progress.engine_lock(engine, "page", progress.get_work()) as waited:
    waited.finish()
    # What the operation waited for wrote, and the engine, which it may have replaced.
    session.collect()
    engine = session.get_engine()
    with engine.lock:
        store.write_address()
        controls.status_line()
        store.notes()
        controls.render()
        snap = session.current_snapshot(engine)
        panels.metrics(snap)
        st.subheader("Physical block pool")
        focus = panels.pool(snap)
        panels.tables_events_kernel(snap, focus, engine)
        st.subheader("Export and import")
        exports.downloads(snap, stem="playground", prefix="", run=session.get_history(),
                          run_help=f"The newest {session.MAX_HISTORY} operations at most, "
                                   "since the engine was started or restored.")
        exports.scenario_download(session.get_oplog(), engine.config, snap,
                                  session.get_history())

exports.import_panel()
st.subheader("Sessions")
store.sessions_panel(resume.open_other, session.new_session)
