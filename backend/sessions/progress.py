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
from collections.abc import Callable
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

    def begin(self, label: str, total: int = 0, *, stoppable: bool = True,
              unit: str = "iteration") -> None:
        """Mutates: an operation starts; a stop asked for before it does not apply to it."""
        with self._lock:
            self._state = WorkState(label, 0, total, False, stoppable, unit=unit)
            self._stop = False

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
            self._stop = False

    def request_stop(self) -> bool:
        """Mutates: ask the running operation to stop after its current iteration.

        False when nothing is running (the click came too late: nothing to stop) or what
        runs cannot be stopped.
        """
        with self._lock:
            if self._state is None or not self._state.stoppable:
                return False
            self._stop = True
            self._state = replace(self._state, stopping=True)
            return True

    def should_go(self) -> bool:
        with self._lock:
            return not self._stop

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
