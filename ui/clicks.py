"""Buttons that act through a callback, and the click that reaches no callback.

Streamlit runs a button's `on_click` only for a button this server session has
drawn. A page can outlive its server session: the server restarted, or the tab
was away longer than Streamlit keeps a disconnected session (two minutes). The
next click then reconnects as a new session, which knows no callback yet, so
the click would do nothing and say nothing; so would a click on a button that a
stopped run never drew. The button still reads as clicked when the page draws
it, so `button` tells such a click from one whose callback ran (callbacks run
before the page, and note their key), and `check`, after the page, says at the
top of the page (`slot`) that it did nothing and asks for it again.

The click is not replayed: in a new session the fields it would read (a picked
request, Steps) are seeded afresh, not the values the page showed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from backend.views.text import plain_md

_RAN = "clicks_ran"          # keys whose callbacks started since the last page began
_RAN_NOW = "clicks_ran_now"  # those of this run, taken by `slot`
_LOST = "lost_click"         # this run's click that reached no callback: its label


def slot() -> Any:
    """First on every page: take the callbacks this run made, and hold the place at the
    top of the page where `check` may warn (always drawn, so that the page's other
    elements keep their places, and expanders their state, either way)."""
    ss = st.session_state
    ss[_RAN_NOW] = ss.pop(_RAN, frozenset())
    ss.pop(_LOST, None)
    return st.empty()


def button(where: Any, label: str, *, key: str, on_click: Callable[..., None],
           args: tuple[Any, ...] = (), submit: bool = False, **kwargs: Any) -> None:
    """`where.button` (a form's submit button with `submit`) acting through `on_click`;
    a click whose callback did not run is noted for `check`."""
    def noted(*call_args: Any) -> None:
        # Noted before the callback runs: a callback that waits for the engine may see
        # its run superseded, after which it can no longer write session state.
        st.session_state[_RAN] = frozenset({*st.session_state.get(_RAN, ()), key})
        on_click(*call_args)

    draw = where.form_submit_button if submit else where.button
    if (draw(label, key=key, on_click=noted, args=args, **kwargs)
            and key not in st.session_state.get(_RAN_NOW, ())):
        st.session_state[_LOST] = label


def check(top: Any) -> None:
    """After the page: a click that reached no callback this run is said in `top`."""
    label = st.session_state.pop(_LOST, None)
    if label is not None:
        top.warning(plain_md(
            f"Your click on “{label}” did nothing: this page had lost its server session "
            "(the server restarted, or the tab was away too long), and a new session "
            "cannot act on a button it has not drawn yet. Below is the page as it is now; "
            "click again."))
