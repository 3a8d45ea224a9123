"""Long operations of a session: how far they are, and a stop asked for between two steps.

A `Work` is shared by every thread of one browser session. The thread that
applies an operation reports each iteration (`update`) and asks `should_go`
whether to go on; another thread, a second click's callback that Streamlit
runs while the first is still stepping (its fast reruns), calls
`request_stop` or reads `state`. None of these take the engine's lock,
which the applying thread holds for the whole operation: they take only the
Work's own small lock, held for a few assignments.

`tracker` makes the progress callback `playground.apply_or_recover` passes on
to the engine: a `step` reports each iteration and stops between two once a
stop is asked for, leaving a consistent engine whose result names the step
that ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class WorkState:
    """What a running operation is doing: a label, iterations done of total (0 of 0: unknown).

    `stoppable`: whether a stop asked for applies to it (a weight load runs to its end);
    `fraction`: how far an operation without iterations has come, when it says;
    `unit`: what it counts ("iteration" of a step, "token" of a grow).
    """

    label: str
    done: int
    total: int
    stopping: bool
    stoppable: bool = True
    fraction: float | None = None
    unit: str = "iteration"


class Work:
    """The one long operation a browser session may be running. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: WorkState | None = None
        self._stop = False
        # Why the last operation was asked to stop, when not by its own page's Stop.
        self._reason: str | None = None
        # Why the session was ended (`close`): every operation stops, at its first report.
        self._closed: str | None = None

    def begin(self, label: str, total: int = 0, *, stoppable: bool = True,
              unit: str = "iteration") -> None:
        """Mutates: an operation starts; a stop asked for before it does not apply to it
        (unless the session was closed)."""
        with self._lock:
            closed = self._closed is not None
            self._state = WorkState(label, 0, total, closed, stoppable, unit=unit)
            self._stop = closed
            self._reason = self._closed

    def report(self, label: str, fraction: float) -> None:
        """Mutates: an operation begun without iterations (a weight load) says where it is."""
        with self._lock:
            if self._state is not None:
                self._state = WorkState(label, 0, 0, False, self._state.stoppable,
                                        min(1.0, max(0.0, fraction)))

    def update(self, done: int, total: int) -> None:
        with self._lock:
            if self._state is not None:
                self._state = WorkState(self._state.label, done, total, self._stop,
                                        self._state.stoppable, unit=self._state.unit)

    def end(self) -> None:
        with self._lock:
            self._state = None
            self._stop = self._closed is not None

    def request_stop(self, reason: str | None = None) -> bool:
        """Mutates: ask the running operation to stop after its current iteration;
        `reason` says why, when it is not the page's own Stop (`stop_reason`).

        False when nothing is running (the click came too late: nothing to stop) or what
        runs cannot be stopped.
        """
        with self._lock:
            if self._state is None or not self._state.stoppable:
                return False
            self._stop = True
            self._reason = reason
            self._state = replace(self._state, stopping=True)
            return True

    def close(self, reason: str) -> None:
        """Mutates: the session is being ended, because `reason`: what runs stops after
        its current iteration, as with `request_stop`, and so does every operation that
        begins after (a click that was waiting behind it), at its first. For good: no
        tab comes back to an ended session."""
        with self._lock:
            self._closed = self._reason = reason
            self._stop = True
            if self._state is not None:
                self._state = replace(self._state, stopping=True)

    def should_go(self) -> bool:
        with self._lock:
            return not self._stop

    @property
    def stop_reason(self) -> str | None:
        """Why the last operation begun was stopped by another page, if it was; kept
        after it ends, for the line that reports it."""
        with self._lock:
            return self._reason

    @property
    def state(self) -> WorkState | None:
        """The running operation's state, or None when none runs."""
        with self._lock:
            return self._state


# What the caller's progress display is told after each iteration: (done, total).
# Returning False stops the step too (the display found the person went away).
Display = Callable[[int, int], bool]


def tracker(work: Work, display: Display | None = None) -> Callable[[int, int], bool]:
    """The engine's progress callback for `work`: record, display, and go on unless stopped."""

    def progress(done: int, total: int) -> bool:
        work.update(done, total)
        keep = display(done, total) if display is not None else True
        return keep and work.should_go()

    return progress


@dataclass(frozen=True, slots=True)
class Stopped:
    """An operation that another page was running on a saved session, asked to stop so
    that this page could open the session: where it was when asked, and whether it
    ended (and saved what it did) within the wait."""

    state: WorkState | None
    ended: bool


@dataclass(frozen=True, slots=True)
class _Run:
    """An operation running on a saved session: its Work, the browser and the tab
    (`holder`, saved.Tab's) running it, and an event set once it has ended and saved."""

    work: Work
    browser: str
    holder: str
    done: threading.Event


class SessionRuns:
    """The operations running on each saved session, across the server's browser sessions.

    A reload of the Playground during a Step N starts a new browser session, but
    Streamlit lets the old one's run go on after its page has gone: the new page
    would open the row as saved before the step, and the step, saving when done,
    would find the row taken and save itself as an unlisted copy. So the page that
    opens a session first stops what runs on it (its Stop, between two
    iterations) and waits until that run has saved (`stop_and_wait`); it then
    opens the state that run reached. A second tab opening the session does the
    same to the first tab's run, which goes on as a copy at its next save, as it
    would anyway. Only the runs of the tab that writes the row are stopped (their
    saves land in it): another browser opening a link gets a copy and leaves the
    owner's run alone, and so is a tab that lost the row, whose save becomes a copy.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, list[_Run]] = {}

    @contextmanager
    def running(self, sid: str | None, browser: str, holder: str,
                work: Work) -> Iterator[None]:
        """While an operation (its save included) runs on saved session `sid` (None: a
        session with no row yet, which no other page can open) in tab `holder`."""
        if sid is None:
            yield
            return
        run = _Run(work, browser, holder, threading.Event())
        with self._lock:
            self._runs.setdefault(sid, []).append(run)
        try:
            yield
        finally:
            with self._lock:
                runs = self._runs.get(sid, [])
                if run in runs:
                    runs.remove(run)
                if not runs:
                    self._runs.pop(sid, None)
            run.done.set()

    def stop_and_wait(self, sid: str, browser: str, holder: str | None, mine: Work,
                      timeout: float) -> Stopped | None:
        """Stop the operations that tab `holder` (the row's writer) of `browser` runs on
        `sid`, and wait up to `timeout` seconds for them to end and save; None if none
        runs (`mine`, this page's own, is left alone)."""
        def listed() -> list[_Run]:
            with self._lock:
                return [r for r in self._runs.get(sid, ()) if r.browser == browser
                        and r.holder == holder and r.work is not mine]

        runs = listed()
        if not runs:
            return None
        state = runs[0].work.state
        deadline = time.monotonic() + timeout
        while runs:
            if time.monotonic() >= deadline:
                return Stopped(state, False)
            # Asked again until it ends: a run listed before it began counting (its
            # Work's `begin` clears a stop asked earlier) would not hear a first ask.
            for r in runs:
                r.work.request_stop(OPENED_ELSEWHERE)
            runs[0].done.wait(min(STOP_POLL_S, max(0.0, deadline - time.monotonic())))
            # Listed afresh: a click that waited behind the stopped run starts its own,
            # which must not run on unseen either.
            runs = listed()
        return Stopped(state, True)


# How often stop_and_wait asks again while it waits.
STOP_POLL_S = 0.1

# What a run stopped by SessionRuns.stop_and_wait says on its own page, if it is still open.
OPENED_ELSEWHERE = "this session was opened in another tab, which goes on from here"

# One per server process: every browser session's runs are listed here.
SESSION_RUNS = SessionRuns()
