"""Ends the sessions of closed browser tabs when the server's K/V limit needs their memory.

Streamlit keeps a disconnected session for two minutes in case its tab
reconnects, and with it that session's engines, which the server's K/V budget
goes on counting. A tab that reloads is such a case: its new session starts
while the old one still holds its pool, so a pool near the server's limit was
refused for two minutes after a reload. The budget asks `end_gone` first: it
ends the sessions, among those whose engines fill the server, that no browser
is connected to, and their engines are given back as they are collected.

Nothing is lost that a reconnect would have found: a Playground session is saved
after every operation, and a tab that comes back gets a new session, which
reopens it from its address. A tab that is still open is never ended.
"""

from __future__ import annotations

import threading
import weakref

from streamlit.runtime import Runtime

from backend.sessions.budget import SERVER_BUDGET

_lock = threading.Lock()
# A budget owner's Streamlit session id, while that session's state lives.
_sessions: dict[str, str] = {}


def register(owner: str, session_id: str, lives_with: object) -> None:
    """Mutates: `owner`'s engines belong to the Streamlit session `session_id`, until
    `lives_with` (an object of that session's state) is collected."""
    with _lock:
        _sessions[owner] = session_id
    weakref.finalize(lives_with, _forget, owner)
    SERVER_BUDGET.set_reclaimer(end_gone)


def _forget(owner: str) -> None:
    with _lock:
        _sessions.pop(owner, None)


def end_gone(owners: frozenset[str]) -> bool:
    """End the sessions of `owners` that no browser is connected to; whether any was.

    Called from any session's script thread. `clear_user_info_for_session` is
    Streamlit's thread-safe way to end a stored (disconnected) session: it marks
    the session so that no reconnect resumes it, and closes it on the server's
    event loop. PagedLab keeps no user info, so that is all it does here.
    """
    if not Runtime.exists():
        return False
    runtime = Runtime.instance()
    ended = False
    for owner in owners:
        with _lock:
            session_id = _sessions.get(owner)
        if session_id is None or runtime.is_active_session(session_id):
            continue
        with _lock:
            if _sessions.pop(owner, None) is None:
                continue        # another session's claim ended it meanwhile
        runtime.clear_user_info_for_session(session_id)
        ended = True
    return ended
