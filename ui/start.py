"""What every run of app.py does once its navigation is sent: the session, the
sidebar and the page.

Kept apart from app.py so that its imports (torch, Triton, the backend: seconds on a
server's first run) come after the navigation reaches the browser.
"""

from __future__ import annotations

import torch
from streamlit.navigation.page import StreamlitPage

# Imported before anything compiles a Triton kernel: on a machine without a GPU it
# switches Triton to its interpreter (TRITON_INTERPRET must be set first).
import backend.kernels  # noqa: F401
from ui import (
    a11y,
    clicks,
    entry,
    history,
    numbers,
    paths,
    progress,
    resume,
    session,
    sidebar,
    store,
    tour,
)

# One thread per torch op: the server runs many sessions' steps side by side on a small
# CPU, where torch's per-op thread pool spins waiting for its threads and a busy machine
# makes a step ten or more times slower (docs/BENCHMARKS.md, SmolLM2). Sessions already
# run in parallel threads; the pool would only contend with them.
torch.set_num_threads(1)


def run(page: StreamlitPage) -> None:
    """Set up this browser session, draw the shared sidebar, then run `page`."""
    session.init()
    numbers.mark_unreadable()
    # Before the sidebar is drawn: reopening a session sets the sidebar's fields.
    resume.at_start()
    if page.url_path == paths.PLAYGROUND:
        # The session the address names is the Playground's (other pages keep it only
        # in passing).
        resume.follow_history()
    if page.url_path != paths.SCENARIOS:
        tour.left_page()
    sidebar.render()
    store.write_cookie()
    a11y.install(history.script(), progress.PAGE_STYLE_SCRIPT)
    with entry.app_page():
        top = clicks.slot()
        page.run()
        clicks.check(top)
