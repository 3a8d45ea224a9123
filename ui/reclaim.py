"""Ends the sessions of closed browser tabs: near the end of Streamlit's time for a
reconnect, or at once when the server's K/V limit needs their memory.

Streamlit keeps a disconnected session for `server.disconnectedSessionTTL`
seconds (two minutes) in case its tab reconnects, and with it that session's
engines and background runs. Two things went wrong with that:

- Its store of disconnected sessions drops an expired one only when another
  session connects or disconnects, and cannot close it after its window has
  passed (a lookup no longer finds it). On a quiet server a closed tab's
  engines stayed counted, and its background run kept one of the server's two
  slots, for as long as no one else came or went. `_reap_forever` ends such a
  session itself, before its window has quite passed (`_reap_after`).
- A tab that reloads leaves its old session holding its pool while the new one
  starts: a pool near the server's limit was refused for two minutes after a
  reload. The budget asks `end_gone` before it refuses: it ends the sessions,
  among those whose engines fill the server, that no browser is connected to.

Either way the ended session's engines are given back as they are collected, and
its background runs stop at their next progress report. Nothing is lost that a
reconnect would have found: a Playground session is saved after every
operation, and a tab that comes back gets a new session, which reopens it from
its address. A session with a browser connected is never ended.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

from streamlit import config
from streamlit.logger import get_logger
from streamlit.runtime import Runtime

from backend.sessions.budget import SERVER_BUDGET

_LOG = get_logger(__name__)
_lock = threading.Lock()
# A budget owner's Streamlit session id, while that session's state lives.
_sessions: dict[str, str] = {}
# When an owner's session was first seen with no browser connected (time.monotonic).
_gone_since: dict[str, float] = {}
_reaper: threading.Thread | None = None


def register(owner: str, session_id: str, lives_with: object) -> None:
    """Mutates: `owner`'s engines belong to the Streamlit session `session_id`, until
    `lives_with` (an object of that session's state) is collected."""
    global _reaper
    with _lock:
        _sessions[owner] = session_id
        start = _reaper is None and Runtime.exists()
        if start:
            ttl = float(config.get_option("server.disconnectedSessionTTL"))
            _reaper = threading.Thread(target=_reap_forever, args=(ttl,),
                                       name="pagedlab-reaper", daemon=True)
    weakref.finalize(lives_with, _forget, owner)
    SERVER_BUDGET.set_reclaimer(end_gone)
    if start and _reaper is not None:
        _reaper.start()


def _forget(owner: str) -> None:
    with _lock:
        _sessions.pop(owner, None)
        _gone_since.pop(owner, None)


def _end(runtime: Runtime, owner: str, why: str) -> bool:
    """End `owner`'s session, unless another thread did first; whether this one did.

    `clear_user_info_for_session` is Streamlit's thread-safe way to end a stored
    (disconnected) session: it marks the session so that no reconnect resumes it,
    and closes it on the server's event loop. PagedLab keeps no user info, so that
    is all it does here.
    """
    with _lock:
        session_id = _sessions.pop(owner, None)
        _gone_since.pop(owner, None)
    if session_id is None:
        return False
    _LOG.info("ending session %s: %s", session_id, why)
    runtime.clear_user_info_for_session(session_id)
    return True


def _no_browser(runtime: Runtime, owner: str) -> bool:
    with _lock:
        session_id = _sessions.get(owner)
    return session_id is not None and not runtime.is_active_session(session_id)


def end_gone(owners: frozenset[str]) -> bool:
    """End the sessions of `owners` that no browser is connected to; whether any was.
    Called by the budget from any session's script thread."""
    if not Runtime.exists():
        return False
    runtime = Runtime.instance()
    ended = False
    for owner in owners:
        if _no_browser(runtime, owner) and _end(runtime, owner,
                                                "the server's K/V limit needs its engines"):
            ended = True
    return ended


def _tick(ttl: float) -> float:
    """How often the reaper looks: eight times per window, every 10 s at most."""
    return max(0.5, min(10.0, ttl / 8))


def _reap_after(ttl: float) -> float:
    """How long a session must have been seen with no browser before it is ended.

    Streamlit's window runs from the disconnect, and the reaper sees it up to one
    tick later and ends it up to one tick after this: three ticks short of the
    window keeps the end inside it (about 90 to 110 s of a 120 s window).
    """
    return max(0.0, ttl - 3 * _tick(ttl))


def _reap_forever(ttl: float) -> None:
    """Every tick, end the sessions that have had no browser for `_reap_after(ttl)`."""
    tick, after = _tick(ttl), _reap_after(ttl)
    ended = False
    while True:
        time.sleep(tick)
        if ended:
            # Those ended last time are closed by now: collect their state, whose
            # engines and jobs sit in reference cycles.
            gc.collect()
        ended = _reap(Runtime.instance(), time.monotonic(), after)


def _reap(runtime: Runtime, now: float, after: float) -> bool:
    """End the sessions seen with no browser since `now - after` or before; whether any."""
    with _lock:
        owners = list(_sessions)
    ended = False
    for owner in owners:
        if not _no_browser(runtime, owner):
            with _lock:
                _gone_since.pop(owner, None)
            continue
        with _lock:
            since = _gone_since.setdefault(owner, now)
        if now - since >= after and _end(runtime, owner,
                                          f"no browser for {now - since:.0f} s"):
            ended = True
    return ended
