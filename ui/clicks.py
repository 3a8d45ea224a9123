"""Buttons that act through a callback, and the click that a new server session cannot act on.

Streamlit runs a button's `on_click` only for a button this server session has
drawn. A page can outlive its server session: the server restarted, or the tab
was away longer than Streamlit keeps a disconnected session (two minutes). The
next click then reconnects as a new session's first run, which knows no callback
yet, so the click would do nothing and say nothing. The button still reads as
clicked in that run: `button` notes it, and after the page `check` runs the page
again with a warning at its top (`show`) asking for the click again, on the page
as it now is (the Playground reopened from its saved state).

The click is not replayed: the fields it would read (a picked request, Steps)
are seeded afresh in a session's first run, not the values the page showed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from backend.views.text import plain_md

FIRST_RUN = "first_run"     # set by ui.resume.at_start on every run
_LOST = "lost_click"        # this run's lost click: the button's label
_NOTE = "lost_click_note"   # the warning `check` leaves for the next run


def first_run() -> bool:
    """Whether this run is its browser session's first (a load, a reload, a reconnect)."""
    return bool(st.session_state.get(FIRST_RUN))


def button(where: Any, label: str, *, key: str, on_click: Callable[..., None],
           args: tuple[Any, ...] = (), submit: bool = False, **kwargs: Any) -> None:
    """`where.button` (a form's submit button with `submit`) acting through `on_click`;
    a click that reached no callback is noted for `check`."""
    draw = where.form_submit_button if submit else where.button
    if draw(label, key=key, on_click=on_click, args=args, **kwargs) and first_run():
        st.session_state[_LOST] = label


def check() -> None:
    """After the page: if a click reached no callback this run, run the page again with
    the warning at its top."""
    label = st.session_state.pop(_LOST, None)
    if label is None:
        return
    st.session_state[_NOTE] = (
        f"Your click on “{label}” did nothing: this page had lost its server session "
        "(the server restarted, or the tab was away too long), and a new session cannot "
        "act on a button it has not drawn yet. Below is the page as it is now; click "
        "again.")
    st.rerun()


def show() -> None:
    """Before the page: the warning `check` left, once."""
    note = st.session_state.pop(_NOTE, None)
    if note is not None:
        st.warning(plain_md(note))
