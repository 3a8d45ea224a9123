"""ui/reclaim.py: which closed tabs' sessions are ended, and when.

The real Streamlit runtime is driven by the browser tests (a reload near the
server's limit, a closed tab's long run on a quiet server). Here a stand-in for
the two runtime calls the module makes sets each session's connection by hand, to
check the timing and the choice without waiting minutes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from streamlit.runtime import Runtime
from streamlit.testing.v1 import AppTest

from backend.sessions.progress import Work
from ui import reclaim


class _Sessions:
    """Streamlit's two answers the module uses: is a session connected, and end it."""

    def __init__(self) -> None:
        self.connected: set[str] = set()
        self.ended: list[str] = []

    def is_active_session(self, session_id: str) -> bool:
        return session_id in self.connected

    def clear_user_info_for_session(self, session_id: str) -> None:
        self.ended.append(session_id)


class _State(Work):
    """A session's Work, in a reference cycle as the real session states are."""

    def __init__(self) -> None:
        super().__init__()
        self.me = self


@pytest.fixture
def sessions() -> Iterator[tuple[_Sessions, Runtime, list[_State]]]:
    reclaim._sessions.clear()
    reclaim._gone_since.clear()
    reclaim._works.clear()
    fake = _Sessions()
    states: list[_State] = []
    for owner in ("a", "b", "c"):
        states.append(_State())
        reclaim.register(owner, f"sid-{owner}", states[-1])
    yield fake, cast("Runtime", cast("Any", fake)), states
    reclaim._sessions.clear()
    reclaim._gone_since.clear()
    reclaim._works.clear()


def test_the_window_is_kept_and_the_end_falls_inside_it() -> None:
    assert reclaim._reap_after(120) == 90 and reclaim._tick(120) == 10
    for ttl in (1, 2, 10, 60, 120, 600, 3600):
        tick, after = reclaim._tick(ttl), reclaim._reap_after(ttl)
        # Seen up to a tick late, ended up to a tick after `after`: inside the window.
        assert after + 2 * tick < ttl or after == 0


def test_a_session_is_ended_after_its_time_with_no_browser_and_never_with_one(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    fake, runtime, _ = sessions
    fake.connected = {"sid-a", "sid-c"}
    assert reclaim._reap(runtime, now=0.0, after=90.0) == frozenset()
    # The tab of c closes at 30 s, and b's, gone from the start, is ended at 90 s.
    fake.connected = {"sid-a"}
    assert reclaim._reap(runtime, now=30.0, after=90.0) == frozenset()
    assert reclaim._reap(runtime, now=89.0, after=90.0) == frozenset()
    assert reclaim._reap(runtime, now=90.0, after=90.0) == {"b"}
    # c comes back at 100 s: its clock starts again when it leaves once more.
    fake.connected = {"sid-a", "sid-c"}
    assert reclaim._reap(runtime, now=100.0, after=90.0) == frozenset()
    fake.connected = {"sid-a"}
    assert reclaim._reap(runtime, now=150.0, after=90.0) == frozenset()
    assert reclaim._reap(runtime, now=239.0, after=90.0) == frozenset()
    assert reclaim._reap(runtime, now=240.0, after=90.0) == {"c"}
    assert fake.ended == ["sid-b", "sid-c"]
    assert reclaim._reap(runtime, now=1e6, after=90.0) == frozenset()   # a: connected


def test_an_ended_session_s_operation_in_progress_is_asked_to_stop(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    """A closed tab's Step N ran on in its script thread after its session was ended,
    saving nothing and keeping its pool, for as long as its iterations took."""
    fake, runtime, (a, b, c) = sessions
    for work in (a, b, c):
        work.begin("Stepping the batch (10000 iterations)", 10_000)
    fake.connected = {"sid-a"}
    assert reclaim._reap(runtime, now=0.0, after=90.0) == frozenset()
    assert b.should_go() and c.should_go()
    # b's and c's windows end; a is connected: its step goes on.
    assert reclaim._reap(runtime, now=90.0, after=90.0) == {"b", "c"}
    assert not b.should_go() and b.stop_reason == "its tab was closed"
    assert not c.should_go()
    assert a.should_go() and a.stop_reason is None
    # A click that was waiting behind b's step (for the engine's lock) begins once it
    # ends: it stops too, at its first iteration.
    b.end()
    b.begin("Stepping the batch (10000 iterations)", 10_000)
    assert not b.should_go() and b.stop_reason == "its tab was closed"
    # The server's K/V limit ends one the same way.
    fake.connected = set()
    assert reclaim._end_enough(runtime, {"a": 100}, 50) == {"a"}
    assert not a.should_go() and a.stop_reason == "its tab was closed"


def test_a_tab_back_just_as_its_session_is_ended_keeps_its_step(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    """The end and a reconnect may cross: the session then keeps its browser (see the
    module), and its step is not stopped as if its tab had closed."""
    _, _, (a, _, _) = sessions

    class Returning(_Sessions):
        def clear_user_info_for_session(self, session_id: str) -> None:
            super().clear_user_info_for_session(session_id)
            self.connected.add(session_id)      # the tab reconnects meanwhile

    back = Returning()
    a.begin("Stepping the batch (10000 iterations)", 10_000)
    assert reclaim._end(cast("Runtime", cast("Any", back)), "a", "test")
    assert back.ended == ["sid-a"]
    assert a.should_go() and a.stop_reason is None


def test_the_limit_ends_as_few_gone_sessions_as_make_the_room_and_none_if_they_cannot(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    fake, runtime, _ = sessions
    fake.connected = {"sid-a"}
    held = {"a": 500, "b": 100, "c": 300}
    assert reclaim._end_enough(runtime, held, 401) == frozenset()    # b + c hold 400
    assert fake.ended == []
    assert reclaim._end_enough(runtime, held, 80) == {"b"}           # the smallest that does
    assert reclaim._end_enough(runtime, held, 250) == {"c"}
    assert reclaim._end_enough(runtime, held, 1) == frozenset()      # none left
    assert fake.ended == ["sid-b", "sid-c"]


def test_without_one_that_makes_the_room_alone_the_largest_go_first(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    fake, runtime, _ = sessions
    held = {"a": 100, "b": 300, "c": 200}
    assert reclaim._end_enough(runtime, held, 450) == {"b", "c"}
    assert fake.ended == ["sid-b", "sid-c"]


def test_a_session_collected_while_the_modules_lock_is_held_does_not_deadlock(
        sessions: tuple[_Sessions, Runtime, list[_State]]) -> None:
    """The finalizer that forgets an owner runs inside whatever allocation starts a
    collection, in whatever thread: one holding the module's lock must not wait on
    itself forever."""
    _, _, states = sessions
    states.clear()                         # a, b and c's states: garbage, in cycles
    done = threading.Event()

    def collect_under_the_lock() -> None:
        with reclaim._lock:
            gc.collect()
        done.set()

    thread = threading.Thread(target=collect_under_the_lock, daemon=True)
    thread.start()
    assert done.wait(timeout=30), "deadlocked: a finalizer waited on the held lock"
    with reclaim._lock:
        reclaim._drain()
        assert reclaim._sessions == {}


def test_no_reaper_runs_under_apptest() -> None:
    """AppTest stands a mock in for the runtime during each run: a reaper started there
    died when the mock went, with a warning against whichever test ran then."""
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"),
                           default_timeout=180).run()
    assert not at.exception
    assert reclaim._reaper is None
    assert reclaim._sessions, "the session was registered all the same"
