"""The browser's history: whether a run is the browser's Back or Forward, and the rule
PagedLab adds to Streamlit's entries (assets/history.js): one entry per thing the person
does, so that one Back goes back over one click."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.runtime.scriptrunner import get_script_run_ctx

from ui.a11y import PLAYING
from ui.paths import PAGES

SCRIPT = Path(__file__).resolve().parents[1] / "assets" / "history.js"


def script() -> str:
    """assets/history.js with PLAYING and the pages' url paths (ui.paths.PAGES: every
    other address only opens one of them) filled in, to run in the page's own document
    (ui.a11y.install)."""
    return (SCRIPT.read_text(encoding="utf-8").replace("__PLAYING__", json.dumps(PLAYING))
            .replace("__PAGES__", json.dumps(list(PAGES))))


def went_back_or_forward() -> bool:
    """Whether this run is the browser's Back or Forward opening an entry of its history
    (the address is then the entry's, not one the page wrote or a link gave)."""
    ctx = get_script_run_ctx()
    return ctx is not None and ctx.is_history_navigation
