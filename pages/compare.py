"""Contiguous vs paged: the fragmentation lab, the trace simulator and the memory calculator.

Runs inside app.py's navigation or alone (`streamlit run pages/compare.py`); it needs
no engine and keeps its own widget state under the `cmp_` prefix, the open tab under
`tab` (also the address's parameter). Only the open tab's section is drawn.
"""

# ruff: noqa: E402 (the imports of ui/ follow the search-path fix and the hand-over below)
from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run pages/compare.py` puts only pages/ on the search path; the backend
# and ui/ live beside it. (Under app.py the repository root is already there.)
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st

from ui import entry

# First, before the slow imports below: a fresh server's /compare (ui/entry.py).
entry.through_app()

from ui import layout, sidebar
from ui.compare import TAB_KEY, TABS
from ui.compare.block_size import block_size_section
from ui.compare.calculator import calculator_section
from ui.compare.deployment import deployment_section
from ui.compare.maps import maps_section
from ui.compare.preemption import preemption_section
from ui.compare.seed import seed_section
from ui.compare.sharing import sharing_section
from ui.compare.simulator import simulator_section
from ui.numbers import section

SECTIONS = [seed_section, maps_section, simulator_section, deployment_section,
            block_size_section, preemption_section, sharing_section, calculator_section]

# ---- the page ---------------------------------------------------------------------------

# What the tabs run on; the Playground's pool and kernel fields would change nothing here.
sidebar.compare()
st.title("Contiguous vs paged", anchor=False)
st.caption(
    "Why paging? Systems that reserve one contiguous region per request keep only 20.4% to "
    "38.2% of the KV memory they hold for actual token states (the PagedAttention paper, "
    "Figure 2); paging keeps 96.3%, 2.5 to 4.7 times that share, so the same memory batches "
    "more requests at once. Here is that effect on the same workloads, small and large. "
    "The paper names the contiguous systems after Orca, a serving system that reserves one "
    "region per request: Orca (Max) reserves a fixed maximum length, Orca (Pow2) the "
    "smallest power of two that holds the request's final length, Orca (Oracle) exactly that "
    "length, as if known in advance; vLLM is the paged one.")
# Eight tabs fit one line on a wide page; beside the sidebar in a 1024 px window they
# take two, every name in view (the sidebar's notes call the tabs by these names).
layout.wrap_tabs("cmp_tabs")
with st.container(key="cmp_tabs"):
    # Only the open tab is drawn: each builds its own charts and tables (a second or
    # more of a CPU for some), so drawing all eight made every field's change wait for
    # all of them. The address names the open tab (`?tab=Sharing`), so a link or a
    # reload opens it; a name no tab has is dropped from the address.
    tabs = st.tabs(list(TABS), key=TAB_KEY, bind="query-params")
for tab, draw in zip(tabs, SECTIONS, strict=True):
    if tab.open:
        with tab:
            # A number out of its field's range stops that section under its fields,
            # saying which.
            section(draw)
