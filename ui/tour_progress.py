"""The Scenarios page's bar for a long step, and for the clicks that wait behind it.

A scenario's `step` or `grow` runs under a time limit (TourRun.step_time_limit_s).
While it runs, its own run draws a bar saying how far it is and how much of the
limit it has used, with a Stop button: a Next click's at the top of the page
(what a callback draws goes there), Play's in a placeholder the page keeps under
its controls. A click meanwhile starts a new run, whose callback waits for the
scenario's lock (ui.tour.held) and shows the same bar from the same record
(`Timed`), so the page says what it is waiting for; a Stop, a Reset or another
scenario sets the record's flag first, and the step stops between two
iterations (TourRun.advance ends the run at the step before). Streamlit's
control exceptions go through ui.progress.Shown, as on the Playground
(ui/progress.py), whose Step N has the same kind of bar.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from backend.core.words import counted
from backend.views.control import NOT_PERTURBED
from backend.views.text import plain_md
from ui.progress import POLL_S, SHOW_AFTER_S, STEP_STOP_KEY, Shown, SlotBar, floating_spinner

# The Stop buttons' keys start with STEP_STOP_KEY, then say whose bar (the stepping
# run's or a waiting run's) and number it: one run may wait more than once, and two
# buttons of one key in one run would be an error.
_BARS = itertools.count(1)
# A bar redrawn at most this often: a torch step may run thousands of iterations a
# second, and each redraw is a message to the browser.
REDRAW_S = 0.1
# A bar whose step's iterations are all done says it waits for the control run once
# that has taken this long (a quick control is not worth a change of words).
CONTROL_SAID_AFTER_S = 1.0


@dataclass(slots=True)
class Timed:
    """A scenario step under way, as its bar shows it. Written by the stepping thread
    (`moved`) and read by waiting ones: each field is one assignment, so a reader sees
    an old count at worst."""

    label: str              # plain text: "Step 2, step x1500"
    unit: str               # "iteration" or "token"
    limit_s: float
    # A control run follows the step (TourRun.control, not stopped): only then is the
    # time after its last iteration the control's.
    has_control: bool = False
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    total: int = 0
    # Set by a Stop click, a Reset or another scenario picked, from the run they start
    # (without the lock, which the step holds): the step stops between two iterations.
    stop: threading.Event = field(default_factory=threading.Event)
    # The keys of the Stop buttons drawn for this step: a click on one of them stops
    # this step only, never a later one.
    keys: list[str] = field(default_factory=list)
    # When the step's last iteration was done: the control run's share of the step
    # (the same operation on the control engine, which reports every iteration as
    # the last, under a time limit of its own) runs from then.
    all_done: float | None = None

    def moved(self, done: int, total: int) -> bool:
        """TourRun.advance's progress callback: False once a stop was asked."""
        self.done, self.total = done, total
        if done >= total and self.all_done is None:
            self.all_done = time.monotonic()
        return not self.stop.is_set()

    def text(self) -> str:
        # Whole seconds, rounded up (a bar shown after 0.3 s never says "0 s"), and
        # never past the limit, which stops the step between two iterations.
        now = time.monotonic()
        if (self.has_control and self.all_done is not None
                and now - self.all_done >= CONTROL_SAID_AFTER_S):
            elapsed = min(math.ceil(now - self.all_done), math.ceil(self.limit_s))
            return plain_md(f"{self.label}: all {counted(self.total, self.unit)} done; its "
                            f"control run (the same operation {NOT_PERTURBED}): {elapsed} s of "
                            f"the {self.limit_s:g} s limit")
        elapsed = min(math.ceil(now - self.started), math.ceil(self.limit_s))
        return plain_md(f"{self.label}: {counted(self.done, self.unit)} of {self.total:,} "
                        f"done, {elapsed} s of the {self.limit_s:g} s limit")


class TimedBar:
    """A bar showing a Timed, with a Stop button under it, at `where` (a placeholder;
    None: the page, which from a callback is its top, where it floats: SlotBar). In a
    placeholder it is drawn once the step has run SHOW_AFTER_S (quicker ones would only
    flicker); floating, at once (it shows only after SHOW_AFTER_S). Redrawn at most every
    REDRAW_S. `whose` goes into its button's key (STEP_STOP_KEY)."""

    def __init__(self, shown: Shown, whose: str, on_stop: Callable[[Timed], None],
                 where: DeltaGenerator | None = None) -> None:
        self.shown = shown
        self.whose = whose
        self.on_stop = on_stop
        self._where = where
        self._bar = SlotBar(shown, st if where is None else where)
        self._drawn = 0.0
        # A step of one iteration or none (an add, whose prefill through a real model
        # takes seconds) has no count for a bar, which would show only once it was
        # done: a spinner with its label says what it does instead, as the
        # Playground's does, while it runs or while a click waits for it.
        self._spinner = ExitStack()
        self._spinning = False

    def show(self, step: Timed) -> None:
        now = time.monotonic()
        if step.total <= 1:
            if not self._spinning:
                self._spinning = True
                self._spinner.enter_context(
                    floating_spinner(self.shown, plain_md(f"{step.label}…"), self._where))
            return
        if now - step.started < SHOW_AFTER_S and not self._bar.floating:
            return
        if self._bar.drawn and now - self._drawn < REDRAW_S:
            return
        self._drawn = now

        def stop_button() -> None:
            # The click's callback runs in the run it starts, before that run waits for
            # the lock, unless another callback of that run waits first: then
            # acquire_showing finds the click by its key.
            key = f"{STEP_STOP_KEY}{self.whose}_{next(_BARS)}"
            step.keys.append(key)
            self.shown.call(st.button, "Stop this step", key=key, on_click=self.on_stop,
                            args=(step,),
                            help="Stop after the current iteration (or token, for a grow): "
                                 "the run then ends at the step before this one, and Reset "
                                 "runs the scenario again from step 0.")

        self._bar.show(min(1.0, step.done / step.total), step.text(), stop_button)

    def clear(self) -> None:
        self._spinner.close()
        self._spinning = False
        self._bar.clear()


@contextmanager
def stepping(step: Timed, on_stop: Callable[[Timed], None],
             where: DeltaGenerator | None = None
             ) -> Iterator[tuple[Shown, Callable[[int, int], bool]]]:
    """While `step` runs in this thread: its bar at `where`, whose Stop button calls
    `on_stop`, and the progress callback that moves both. The caller calls the Shown's
    `finish` once it has updated the scenario's state."""
    shown = Shown()
    bar = TimedBar(shown, "step", on_stop, where)
    # A floating bar (or spinner), before the first iteration: it may take seconds.
    bar.show(step)

    def move(done: int, total: int) -> bool:
        going = step.moved(done, total)
        bar.show(step)
        return going

    try:
        yield shown, move
    finally:
        bar.clear()


def acquire_showing(lock: threading.Lock, current: Callable[[], Timed | None],
                    shown: Shown, *, stop: bool = False) -> None:
    """Take `lock`. While another run holds it, show the bar of `current()`'s step (a
    Timed, or None when nothing is stepping) at the top of the page, with a Stop
    button of its own; with `stop`, stop each step seen instead of waiting it out."""
    if lock.acquire(blocking=False):
        return
    bar: TimedBar | None = None
    shown_for: Timed | None = None
    got = False
    try:
        while not (got := lock.acquire(timeout=POLL_S)):
            step = current()
            if step is None:
                continue
            if stop or _stop_clicked(step, shown):
                # A Stop click's own callback may not have run yet: Streamlit runs a
                # run's callbacks one after another, and an earlier one may be waiting
                # here. The click is in this run's widget values all the same.
                step.stop.set()
            if bar is None or step is not shown_for:
                # A later step: its own bar, whose button stops that step only.
                if bar is not None:
                    bar.clear()
                bar, shown_for = TimedBar(shown, "wait", _stop_only), step
            bar.show(step)
        if bar is not None:
            bar.clear()
    except BaseException:
        # Nothing that goes wrong while drawing may leave the lock taken for good.
        if got:
            lock.release()
        raise


def _stop_only(step: Timed) -> None:
    """A waiting bar's Stop callback: that bar's step, nothing else."""
    step.stop.set()


def _stop_clicked(step: Timed, shown: Shown) -> bool:
    """Whether this run was started by a click on one of `step`'s Stop buttons (a
    button's value is True for the run its click starts)."""
    return any(shown.call(st.session_state.get, key) is True for key in list(step.keys))
