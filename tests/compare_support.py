"""Starting the "Contiguous vs paged" page in AppTest on one of its tabs.

Only the open tab is drawn (pages/compare.py), so a test opens the tab whose
fields it sets: by the address, as a link would (`start`), or as a click on
the tab does (`open_tab`).
"""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.compare import TAB_KEY, TABS

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "compare.py")
SEED, MAPS, SIMULATOR, DEPLOYMENT, BLOCK_SIZE, SWAP, SHARING, CALCULATOR = TABS


def start(tab: str = SEED, *, timeout: float = 120) -> AppTest:
    """The page on `tab`, opened by its address (`?tab=...`)."""
    at = AppTest.from_file(PAGE, default_timeout=timeout)
    if tab != SEED:
        at.query_params[TAB_KEY] = tab
    at.run()
    assert not at.exception
    return at


def open_tab(at: AppTest, tab: str) -> AppTest:
    """`at` after a click on `tab` (fields set and not yet run go with it)."""
    at.session_state[TAB_KEY] = tab
    # The browser's address follows the click; AppTest's would go on sending the old tab.
    if tab == SEED:
        at.query_params.pop(TAB_KEY, None)
    else:
        at.query_params[TAB_KEY] = tab
    at.run()
    assert not at.exception
    return at


def text(at: AppTest) -> str:
    """Everything the page says in markdown, captions, alerts and code blocks."""
    parts = [e.value for kind in ("markdown", "caption", "success", "warning", "info", "code")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)
