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
  reload. The budget asks `end_gone` before it refuses: it ends sessions that no
  browser is connected to, as few as will do, when together they hold the room.

Either way the ended session's engines are given back as they are collected, and
its background runs stop at their next progress report. So does an operation its
tab left running (a Step N of thousands of iterations): it runs in the session's
script thread, which Streamlit stops only at its next drawing, and a drawing's
stop cannot tell a closed tab from a second click (after which the step goes on).
The session's `Work` is closed instead: the step ends after its current iteration,
as a Stop button would end it, and is saved as far as it got, and a click that
was waiting behind it stops at its first iteration. A tab that reconnects
after that gets a new session: the Playground reopens its saved session (saved
after every operation) from its address, while a Scenarios position and a
*Contiguous vs paged* run in progress are lost, as they would have been at the
end of the window. A session with a browser connected is not ended; one whose
tab reconnects in the instant between the check and the end keeps its browser
but is no longer resumed after its next disconnect.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import deque

from streamlit import config
from streamlit.logger import get_logger
from streamlit.runtime import Runtime

from backend.sessions.budget import SERVER_BUDGET
from backend.sessions.progress import Work

_LOG = get_logger(__name__)
_lock = threading.Lock()
# A budget owner's Streamlit session id, while that session's state lives.
_sessions: dict[str, str] = {}
# When an owner's session was first seen with no browser connected (time.monotonic).
_gone_since: dict[str, float] = {}
# An owner's session's Work: what its operation in progress is asked to stop through.
_works: dict[str, weakref.ref[Work]] = {}
# Owners whose session state was collected. Appended by a finalizer, which runs inside
# whatever allocation starts a collection, in any thread, maybe one holding `_lock`:
# so it takes no lock, and every locked section drains this first.
_forgotten: deque[str] = deque()
_reaper: threading.Thread | None = None


def _drain() -> None:
    """Drop the owners whose state was collected. Call with `_lock` held."""
    while _forgotten:
        owner = _forgotten.popleft()
        _sessions.pop(owner, None)
        _gone_since.pop(owner, None)
        _works.pop(owner, None)


def register(owner: str, session_id: str, work: Work) -> None:
    """Mutates: `owner`'s engines belong to the Streamlit session `session_id`, until
    `work` (that session's Work, in its state) is collected; ending the session asks
    `work` to stop what it runs."""
    global _reaper
    # AppTest stands a mock in for the runtime during each run: nothing to reap there.
    served = Runtime.exists() and not config.get_option("global.appTest")
    with _lock:
        _drain()
        _sessions[owner] = session_id
        _works[owner] = weakref.ref(work)
        start = served and _reaper is None
        if start:
            ttl = float(config.get_option("server.disconnectedSessionTTL"))
            _reaper = threading.Thread(target=_reap_forever, args=(ttl,),
                                       name="pagedlab-reaper", daemon=True)
    weakref.finalize(work, _forgotten.append, owner)
    SERVER_BUDGET.set_reclaimer(end_gone)
    if start and _reaper is not None:
        _reaper.start()


def _no_browser(runtime: Runtime, owner: str) -> bool:
    with _lock:
        _drain()
        session_id = _sessions.get(owner)
    return session_id is not None and not runtime.is_active_session(session_id)


def _end(runtime: Runtime, owner: str, why: str) -> bool:
    """End `owner`'s session, unless another thread did first or its tab has just come
    back; whether this call did.

    `clear_user_info_for_session` is Streamlit's thread-safe way to end a stored
    (disconnected) session: it marks the session so that no reconnect resumes it,
    and closes it on the server's event loop. PagedLab keeps no user info, so that
    is all it does here.
    """
    with _lock:
        _drain()
        session_id = _sessions.get(owner)
        if session_id is None or runtime.is_active_session(session_id):
            return False
        del _sessions[owner]
        _gone_since.pop(owner, None)
        ref = _works.pop(owner, None)
    _LOG.info("ending session %s: %s", session_id, why)
    runtime.clear_user_info_for_session(session_id)
    work = None if ref is None else ref()
    # Unless the tab came back in the meantime (it keeps its session, see the module).
    if work is not None and not runtime.is_active_session(session_id):
        # Between two iterations, as a Stop click would, and every operation that was
        # waiting behind it at its first: the line each leaves is read by no one, but
        # the saved session holds the state reached.
        work.close("its tab was closed")
    return True


def end_gone(held: dict[str, int], shortfall: int) -> frozenset[str]:
    """The budget's reclaimer: end sessions that no browser is connected to, whose bytes
    cover `shortfall`; none if all of them would not. `held` is the bytes each other
    owner holds. Returns the owners ended."""
    if not Runtime.exists() or config.get_option("global.appTest"):
        return frozenset()
    return _end_enough(Runtime.instance(), held, shortfall)


def _end_enough(runtime: Runtime, held: dict[str, int], shortfall: int) -> frozenset[str]:
    """As few sessions as will do: the smallest one that covers `shortfall` alone, or
    else the largest first until they do. Stops when those left no longer could (a tab
    came back, or another thread ended one first)."""
    gone = sorted((nbytes, owner) for owner, nbytes in held.items()
                  if _no_browser(runtime, owner))
    alone = [(nbytes, owner) for nbytes, owner in gone if nbytes >= shortfall]
    order = alone[:1] + [g for g in reversed(gone) if g not in alone[:1]]
    left = sum(nbytes for nbytes, _ in gone)
    ended: set[str] = set()
    freed = 0
    for nbytes, owner in order:
        if freed >= shortfall or freed + left < shortfall:
            break
        left -= nbytes
        if _end(runtime, owner, "the server's K/V limit needs its engines"):
            ended.add(owner)
            freed += nbytes
    return frozenset(ended)


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
    """Every tick, end the sessions that have had no browser for `_reap_after(ttl)`.
    A tick that fails is logged and the next one tries again."""
    tick, after = _tick(ttl), _reap_after(ttl)
    ended: frozenset[str] = frozenset()
    while True:
        time.sleep(tick)
        try:
            if ended:
                # Those ended last time are closed by now: collect their state, whose
                # engines and jobs sit in reference cycles.
                gc.collect()
            ended = frozenset()
            if Runtime.exists():
                ended = _reap(Runtime.instance(), time.monotonic(), after)
        except Exception:
            _LOG.exception("ending the sessions of closed tabs failed; trying again")


def _reap(runtime: Runtime, now: float, after: float) -> frozenset[str]:
    """End the sessions seen with no browser since `now - after` or before; the owners
    ended."""
    with _lock:
        _drain()
        owners = list(_sessions)
    ended: set[str] = set()
    for owner in owners:
        browser = not _no_browser(runtime, owner)
        with _lock:
            _drain()
            if browser or owner not in _sessions:
                _gone_since.pop(owner, None)
                continue
            since = _gone_since.setdefault(owner, now)
        if now - since >= after and _end(runtime, owner, f"no browser for {now - since:.0f} s"):
            ended.add(owner)
            # Told at once, so that a failure later in this tick loses no such word.
            SERVER_BUDGET.ending(frozenset({owner}))
    return frozenset(ended)
