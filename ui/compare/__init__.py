"""The "Contiguous vs paged" page's sections, one module each (pages/compare.py lays them out).

Each section keeps its widget state under the `cmp_` prefix; the frames, charts and
tables they draw come from backend.views.compare. What two sections share lives here;
the simulator's parts are sim_inputs (the trace), sim_runs (running with one progress bar,
a server-wide cache) and sim_results (what a run shows), used by simulator and deployment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from backend.core.words import sentence
from backend.lab.sim.simulator import SimResult
from backend.views.compare import frames as views
from backend.views.text import plain_md
from ui import a11y

# The page's tabs, in order. TAB_KEY holds the open one and is the address's parameter
# (`/fragmentation?tab=Sharing`): only the open tab is drawn (pages/compare.py).
TAB_KEY = "tab"
TABS = ("The seed's example", "One workload, two memories", "Trace simulator",
        "Real deployment", "Block size", "Swap or recompute", "Sharing", "Memory calculator")

SYNTHETIC_NOTE = ("Our numbers come from PagedLab's simulator on synthetic or recorded traces "
                  "(arrivals and lengths only, a fixed time per iteration), not from the "
                  "paper's testbed (a real model serving real request datasets on a real "
                  "GPU): compare the ordering and the size of the gaps, not the digits.")


def panel(title: str, key: str) -> Any:
    """A collapsible panel (st.expander) that opens as it was left, also after another tab.

    Only the open tab is drawn, and Streamlit forgets the state of a widget a run did
    not draw: a panel opened, then another tab and back, came back closed. Its state
    is copied to a key of the page's own when it changes (a rerun of the tab), and
    given back as the panel's initial state.
    """
    ss = st.session_state
    kept = f"{key}_kept"

    def note() -> None:
        ss[kept] = bool(ss.get(key))

    return st.expander(title, expanded=bool(ss.get(kept, False)), key=key, on_change=note)


def label(policy: str) -> str:
    return views.POLICY_LABELS[policy]


def refuse(message: str | Exception) -> None:
    """A section's refusal as one error line, shown as plain text: a message may quote a
    file name, which must not render as Markdown (or fetch what it names). It starts
    with a capital, like the page's per-field messages, unless it starts with a name.
    Read out to a screen reader when it is new (ui/a11y.py)."""
    text = sentence(str(message))
    with a11y.refused(text):
        st.error(plain_md(text))


def breakdown(results: Sequence[SimResult], key: str) -> None:
    """The time-averaged breakdown, a column per policy, every column in view beside the
    sidebar in a 1024 px window: the measures' 150 px and four policies of 100 px fit
    there. A wider page's room goes equally to the columns that are not pinned; the
    measures are, so the policies alone grow, each wide enough for its long name
    ("contiguous, next power of two") on a 1400 px page. Each header's tooltip names
    its policy in full, and the paper's system for it (the cells say "Orca" alone)."""
    df = views.breakdown_table(results)
    col = st.column_config.Column
    # Every row in view, none behind a scrollbar (Streamlit's default height shows ten).
    st.dataframe(df, hide_index=True, key=key, width="stretch", height=35 * (len(df) + 1) + 3,
                 column_config={
                     "measure": col(width=150, pinned=True),
                     **{c: col(width=100, help=f"{label(c)}; in the paper: "
                                                f"{views.PAPER_SYSTEMS[c]}")
                        for c in df.columns if c != "measure"}})
    st.caption(views.HELD_NOTE)


def in_percent(df: pd.DataFrame, column: str, label: str | None = None,
               help: str | None = None) -> tuple[pd.DataFrame, Any]:
    """`df` with `column` (shares in 0..1) in percent, and its column config: one decimal,
    as the section's sentences write it. Streamlit's "percent" format drops trailing
    zeros, so one column would read "0%", "0.11%" and "21.4%"."""
    # As `percent` writes a share: one short of the whole never reads "100.0%".
    pct = df[column] * 100
    shown = df.assign(**{column: pct.mask((pct >= 99.95) & (pct < 100), 99.9)})
    return shown, st.column_config.NumberColumn(label, help=help, format="%.1f%%")
