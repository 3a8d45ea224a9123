"""A browser session's memo of what a state's views cost to build.

A rerun that changes no state (a request picked, a panel opened, a highlight)
used to rebuild the block grid's frame, the text layouts and the event log
from the same snapshot: a tenth of a second or more of a CPU at a few hundred
blocks. The history hands out the same snapshot's parts each time (a new dict
over the same lists: backend/sessions/history.py), so those parts' identities,
with the count of its events, name the state; the memo keeps them alive, so no
id is reused while an entry holds it. A snapshot built anew (another device's,
a scenario frame) is simply another state.

Views are pure functions of the snapshot and the arguments given, so an entry is
right for as long as it is kept. What they return is drawn as it is: Streamlit
copies a chart's spec before it adds to it, apart from filling in a legend's blank
title, which gives the same spec each time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import streamlit as st

T = TypeVar("T")

_KEY = "view_memo"
# Entries per view: the live state, a past one, and a focus or page or two.
_PER_VIEW = 4


def state_token(snap: dict[str, Any]) -> tuple[int, ...]:
    """What names a snapshot's state: its parts' identities and its count of events.

    The events are left out by identity: the history slices them anew for every
    snapshot it hands out; they only ever grow, so their count tells them apart."""
    return (*(id(v) for k, v in snap.items() if k != "events"), len(snap["events"]))


def memo(view: str, snap: dict[str, Any], args: Hashable, build: Callable[[], T]) -> T:
    """`build()`, or what it returned before for the same `view`, state and `args`."""
    memos: dict[str, list[tuple[tuple[int, ...], Hashable, list[Any], Any]]] = \
        st.session_state.setdefault(_KEY, {})
    entries = memos.setdefault(view, [])
    token = state_token(snap)
    for i, (t, a, _, value) in enumerate(entries):
        if t == token and a == args:
            entries.insert(0, entries.pop(i))
            return value  # type: ignore[no-any-return]
    value = build()
    # The parts are kept so that their ids cannot be given to other objects meanwhile.
    entries.insert(0, (token, args, [v for k, v in snap.items() if k != "events"], value))
    del entries[_PER_VIEW:]
    return value
