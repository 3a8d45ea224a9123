"""PagedLab: navigation over the pages, the shared sidebar, one engine per browser session.

Each browser session's Playground is saved after every operation and reopened by
its address on a reload or a restarted server (ui/store.py, ui/resume.py).

    streamlit run app.py
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import streamlit as st

from ui import paths  # imports nothing: the pages' addresses

# The icon is drawn (backend.views.grid.icon_pixels, saved as this file), not a
# :material/...: name: the browser would fetch that from Google. Set before the
# navigation, which would otherwise give the page its first page's material icon.
ICON = Path(__file__).resolve().parent / "assets" / "icon.png"
st.set_page_config(page_title="PagedLab", page_icon=ICON, layout="wide")

# One line per page. Each url_path differs from its file's name on purpose: Streamlit's
# legacy pages/ handling (still consulted on a server's first run, and on every AppTest
# rerun) would otherwise run pages/NAME.py by itself, without this script's session
# setup and sidebar. That handling finds a page only by file name, so pages/lab.py,
# tour.py and fragmentation.py exist for it: each just runs this script.
# Their url paths come from ui/paths.py, which ui/start.py and the history script read too.
PAGES = [
    st.Page("pages/playground.py", title="Playground", icon=":material/science:",
            url_path=paths.PLAYGROUND),
    st.Page("pages/scenarios.py", title="Scenarios", icon=":material/auto_stories:",
            url_path=paths.SCENARIOS),
    st.Page("pages/compare.py", title="Contiguous vs paged", icon=":material/compare:",
            url_path=paths.COMPARE),
]


def _open_playground() -> None:
    st.switch_page(PAGES[0])


# Streamlit serves the default page at "/" and nowhere else: were the Playground the
# default, its own address /lab would be "Page not found". So the default is this
# hidden page, which opens the Playground at /lab; an unknown address lands here too.
HOME = st.Page(_open_playground, title="PagedLab", url_path="home", default=True,
               visibility="hidden")

# The pages' file names, which a person may well type (and which a fresh server's first
# run resolves by itself: ui/entry.py), open the pages at their addresses, with the
# link's query (a scenario and its step).
def _opener(target: st.Page) -> Callable[[], None]:
    def open_page() -> None:
        st.switch_page(target, query_params=st.query_params.to_dict())
    return open_page


# Titles written out, not read from the pages: a process that multiprocessing spawns
# from a server (the simulator's sweep) runs this file bare, where a Page has no title.
ALIASES = [st.Page(_opener(target), title=title, url_path=name, visibility="hidden")
           for target, (name, title) in zip(PAGES, (
               ("playground", "Playground"), ("scenarios", "Scenarios"),
               ("compare", "Contiguous vs paged")), strict=True)]

# The navigation reaches the browser before anything slow runs. Until it does, a
# fresh server's sidebar lists the raw file names of pages/ ("app, compare,
# fragmentation, …"), and the first run's imports of torch, Triton and the backend
# take seconds, its first engine longer.
page = st.navigation([HOME, *PAGES, *ALIASES])
# Each page its own browser title ("Scenarios · PagedLab"): one title for all three left a
# screen reader's tab list and the browser's history unable to tell them apart. (Run bare,
# as by a process spawned from the server, a page has no title: see ALIASES.)
title = getattr(page, "title", "PagedLab")
st.set_page_config(page_title=title if title == "PagedLab" else f"{title} · PagedLab")

from ui import start  # noqa: E402  (slow: see above)

start.run(page)
