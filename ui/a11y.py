"""Keyboard and screen-reader help that Streamlit's elements do not give by themselves.

`install` puts assets/a11y.js in the page once per run (the script itself runs once
per browser tab): it keeps the keyboard focus on the page when a control it was on
becomes disabled or goes away, and reads out the results drawn in the containers
named by READ_OUT when they change. `STYLE` is the page's style for the same ends.
"""

from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

SCRIPT = Path(__file__).resolve().parents[1] / "assets" / "a11y.js"

# Keys (as endings, so that a page's prefix is covered) of the containers whose new
# text a screen reader is told: the result of the last action, a scenario step's
# narration, what a timeline pick shows, the inspected block and the translated
# address. When one action changes
# several, only the first in this order is read: it is that action's own result. A key
# may be followed by "--N", a number that makes the same words said again new.
READ_OUT = ("status_line", "tour_messages", "tour_narration", "tl_banner", "focus_said",
            "tr_said")

# The hidden container that holds the script (a script draws nothing, but Streamlit
# gives every element a place in the page's flow; hidden, it takes none).
HOLDER = "pagedlab_a11y"

# The keyboard focus's outline: the page's ink, 15:1 on white.
FOCUS_RING = "#1F2328"

STYLE = (
    # A focus ring that shows: Streamlit's is the primary colour at half strength,
    # about 2:1 on white, below WCAG's 3:1 for a control's outline.
    f":focus-visible {{ outline: 2px solid {FOCUS_RING} !important; outline-offset: 2px; }}"
    # The holder and the wrapper Streamlit puts around it, which would still take the
    # page's gap between elements.
    f" .st-key-{HOLDER}, [data-testid='stLayoutWrapper']:has(> .st-key-{HOLDER})"
    " { display: none; }"
    # Sections are h2 under the page's h1 (no level skipped), drawn as Streamlit draws
    # an h3, which they were: its size, in the page and in the sidebar, and spacing.
    " h2 { font-size: 1.75rem !important; padding: 0.75rem 0 1rem !important; }"
    " [data-testid='stSidebar'] h2 { font-size: 1.125rem !important; }"
)


def script() -> str:
    """assets/a11y.js with READ_OUT filled in."""
    return SCRIPT.read_text(encoding="utf-8").replace("__READ_OUT__", json.dumps(READ_OUT))


def install() -> None:
    """The page's style and the script, in a hidden place at the top of the page.

    Together, so that the style comes with the page's first elements: style alone
    Streamlit sends outside the page's elements, where it arrives after them (the
    headings drawn at h2's size, then shrunk; the page drawn 16 px lower, then
    raised)."""
    with st.container(key=HOLDER):
        st.html(f"<style>{STYLE}</style><script>{script()}</script>",
                unsafe_allow_javascript=True)
