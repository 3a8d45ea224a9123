"""Values kept in session state for one engine: a result, a note, a question asked beside
it, forgotten once the session shows another engine.

Held by a weak reference, so that a kept value never keeps a replaced engine (its K/V
pool) alive. Imports nothing of the app's, so that ui/store.py, below ui/session.py, can
use it too.
"""

from __future__ import annotations

import weakref
from typing import Any

import streamlit as st

from backend.engine.engine import Engine


def keep_result(key: str, engine: Engine, value: Any) -> None:
    """Keep `value`, computed on `engine`, under `key` until that engine is replaced."""
    st.session_state[key] = (weakref.ref(engine), value)


def kept_result(key: str, engine: Engine) -> Any:
    """What `keep_result` kept under `key` for `engine`, else None.

    A result computed on an engine the session has since replaced (a new session, a
    reset, a restore, new settings, another device) is forgotten: its step or operation count may
    match the new engine's, yet it describes other requests, even another model.
    """
    kept = st.session_state.get(key)
    if kept is None:
        return None
    ref, value = kept
    if ref() is not engine:
        del st.session_state[key]
        return None
    return value
