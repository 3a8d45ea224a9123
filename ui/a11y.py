"""Keyboard and screen-reader help that Streamlit's elements do not give by themselves.

`install` puts assets/a11y.js in the page once per run (the script itself runs once
per browser tab): it keeps the keyboard focus on the page when a control it was on
becomes disabled or goes away, and reads out the results drawn in the containers
named by READ_OUT when they change (`said` draws one). `play_state` tells it that a
scenario is playing. `STYLE` is the page's style for the same ends.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

SCRIPT = Path(__file__).resolve().parents[1] / "assets" / "a11y.js"

# Keys (as endings, so that a page's prefix is covered) of the containers whose new
# text a screen reader is told: the result of the last action, a scenario step's
# narration, what a timeline pick shows, the inspected block, the translated address,
# a save's note (the tab became a copy, a save failed), a Delete's question, and on the
# Contiguous vs paged page a section's refusal and its result (`said`). When one action
# changes several, only the first in this order is read: it is that action's own
# result. A key may be followed by "--N", a number that makes the same words said
# again new.
READ_OUT = ("status_line", "tour_messages", "tour_narration", "tl_banner", "focus_said",
            "tr_said", "store_note", "delete_asked", "refused", "result")

# The key of the tab bar whose tabs each draw only themselves (ui.compare.TAB_KEY): a
# change of its open tab is read as a change of page, whose first drawing is not news.
TAB_KEY = "tab"

# A hidden container drawn while a scenario plays (`play_state`): a play's runs follow each
# other with hardly a pause, at times none the browser sees, so while it is drawn the
# script reads what changed as soon as it is drawn, not only when a run ends.
PLAYING = "pagedlab_playing"
# What of READ_OUT a play says, in the order it is read: the only news while it plays
# and in the first drawing after it stops.
PLAY_SAYS = ("tour_narration", "tour_messages")

# The hidden container that holds the script (a script draws nothing, but Streamlit
# gives every element a place in the page's flow; hidden, it takes none).
HOLDER = "pagedlab_a11y"

# The keyboard focus's outline: the page's ink, 15:1 on white.
FOCUS_RING = "#1F2328"
# Rows kept on one line (a saved session's line and its Open and Delete), whose keys
# start with this: Streamlit lets such a row scroll sideways, which clips the focus
# ring of the button at its end.
UNCLIPPED_ROW = "pagedlab_row_"

STYLE = (
    # A focus ring that shows: Streamlit's is the primary colour at half strength,
    # about 2:1 on white, below WCAG's 3:1 for a control's outline.
    f":focus-visible {{ outline: 2px solid {FOCUS_RING} !important; outline-offset: 2px; }}"
    f" [class*='st-key-{UNCLIPPED_ROW}'] {{ overflow: visible !important; }}"
    # The holder and the play's mark, and the wrappers Streamlit puts around them, which
    # would still take the page's gap between elements.
    f" .st-key-{HOLDER}, [data-testid='stLayoutWrapper']:has(> .st-key-{HOLDER}),"
    f" [class*='st-key-{PLAYING}'],"
    f" [data-testid='stLayoutWrapper']:has(> [class*='st-key-{PLAYING}'])"
    " { display: none; }"
    # The sidebar's collapse button: where there is a pointer, Streamlit hides it
    # (visibility) until the pointer is over the sidebar, which also keeps the keyboard
    # from reaching it. Transparent instead, it takes the focus, and shows while it has
    # it. (On a touch screen or a narrow window Streamlit shows it always.)
    " @media (hover: hover) and (min-width: 577px) {"
    " [data-testid='stSidebar']:not([data-collapsed='true'])"
    " [data-testid='stSidebarCollapseButton'] { visibility: visible !important; opacity: 0; }"
    " [data-testid='stSidebar']:hover [data-testid='stSidebarCollapseButton'],"
    " [data-testid='stSidebar'] [data-testid='stSidebarCollapseButton']:focus-within"
    " { opacity: 1; } }"
    # A collapsed sidebar is moved off the page, its controls still in the Tab order:
    # Tab went from the expand button into an unseen sidebar. Hidden once it has slid
    # away (a visibility transition waits its duration only on the way out).
    " [data-testid='stSidebar'][data-collapsed='true'] { visibility: hidden;"
    " transition: visibility 0.3s; }"
    # Sections are h2 under the page's h1 (no level skipped), drawn as Streamlit draws
    # an h3, which they were: its size, in the page and in the sidebar, and spacing.
    " h2 { font-size: 1.75rem !important; padding: 0.75rem 0 1rem !important; }"
    " [data-testid='stSidebar'] h2 { font-size: 1.125rem !important; }"
)


def script() -> str:
    """assets/a11y.js with READ_OUT, TAB_KEY, PLAYING and PLAY_SAYS filled in."""
    return (SCRIPT.read_text(encoding="utf-8").replace("__READ_OUT__", json.dumps(READ_OUT))
            .replace("__TAB_KEY__", json.dumps(TAB_KEY))
            .replace("__PLAYING__", json.dumps(PLAYING))
            .replace("__PLAY_SAYS__", json.dumps(PLAY_SAYS)))


def install(*more: str) -> None:
    """The page's style, the script and the scripts `more`, in a hidden place at the
    top of the page.

    Together, so that the style comes with the page's first elements: style alone
    Streamlit sends outside the page's elements, where it arrives after them (the
    headings drawn at h2's size, then shrunk; the page drawn 16 px lower, then
    raised). One element holds them all: each element takes a place in the page's
    flow, hidden or not, and its wrappers the gap between elements."""
    scripts = "".join(f"<script>{text}</script>" for text in (script(), *more))
    with st.container(key=HOLDER):
        st.html(f"<style>{STYLE}</style>{scripts}", unsafe_allow_javascript=True)


def play_state(playing: bool) -> None:
    """Mark this run's page as a scenario's play, or not (see PLAYING). Drawn on every
    run of the page, before the narration it is for, under one of two keys, so that it
    keeps its place, and the elements after it theirs, as a play starts and stops."""
    with st.container(key=PLAYING if playing else f"{PLAYING}_not"):
        st.html("<span></span>")


def said(name: str, ending: str) -> DeltaGenerator:
    """A container for a result that assets/a11y.js reads out when a run changes it.

    `ending` is one of READ_OUT (its place there says which of several changes is read);
    `name` tells this container from others with the same ending. The same words drawn
    again are not news: a refusal that still stands is not read again after another
    field changed (its section's new result is).
    """
    if ending not in READ_OUT:
        raise ValueError(f"{ending!r} is not one of READ_OUT")
    return st.container(key=f"{name}_{ending}")


def refused(text: str) -> DeltaGenerator:
    """`said` for a refusal of `text`, keyed by its words: two refusals in one run (an
    upload's and the Run button's) need keys of their own, and the same refusal drawn
    again is the same container, not news."""
    return said(f"r{zlib.crc32(text.encode()):08x}", "refused")
