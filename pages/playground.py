"""Playground: drive the live engine. Configure, add, grow, fork, finish, step, shuffle.

Export what is shown, or upload a snapshot to continue from its exact state.
"""

from __future__ import annotations

import streamlit as st

from ui import controls, exports, panels, session

engine = session.get_engine()

st.title("Playground")
st.caption("A real paged KV-cache allocator and paged-attention kernel. Each action below is "
           "one engine operation; every view shows the state it left.")
if st.session_state.get(session.PENDING):
    st.warning("The sidebar's settings differ from the running engine's: apply them there "
               "(this starts a new engine) or keep the current ones.")
controls.status_line()
# Read the engine under its lock: a second click's callback may be applying an
# operation in another thread, and the page must show a state from before or after it.
with engine.lock:
    controls.render()
    snap = session.current_snapshot(engine)
    panels.metrics(snap)
    st.subheader("Physical block pool")
    focus = panels.pool(snap)
    panels.tables_events_kernel(snap, focus, engine)

st.subheader("Export and import")
exports.downloads(snap, stem="playground", prefix="", run=session.get_history(),
                  run_help=f"The newest {session.MAX_HISTORY} operations at most, since the "
                           "engine was started or restored.")
exports.import_panel()
