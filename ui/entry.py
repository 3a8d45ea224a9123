"""Page scripts run through app.py, whichever way Streamlit reaches them.

A server's first run goes through Streamlit's legacy pages/ lookup before
app.py's st.navigation is known (see app.py): that lookup finds a page by its
file name, so on a fresh server /playground or /scenarios would run
pages/playground.py by itself, without app.py's session set-up and sidebar,
and show a traceback. Each page script calls `through_app` first: run that
way, it runs app.py instead, whose navigation opens the page by its address.
"""

from __future__ import annotations

import runpy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

APP = Path(__file__).resolve().parents[1] / "app.py"

# How many app.py page runs this thread is inside (a page script runs in its session's
# script thread, nested in app.py's `page.run()`).
_inside = threading.local()


@contextmanager
def app_page() -> Iterator[None]:
    """app.py runs its navigation's page inside this."""
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1


def through_app() -> None:
    """First thing in a page script: a run that app.py did not start runs app.py instead.

    A page started by itself (`streamlit run pages/compare.py`) runs as it is.
    """
    if getattr(_inside, "depth", 0):
        return
    ctx = get_script_run_ctx()
    if ctx is None or Path(ctx.main_script_path).resolve() != APP:
        return
    runpy.run_path(str(APP), run_name="__main__")
    st.stop()
