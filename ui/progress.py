"""Progress on the Playground's long operations, and a Stop button that works while they run.

How a click reaches a running step: Streamlit runs a click's callback before
the page, in the session's script thread; a second click meanwhile makes it
stop that run and start another at once (fast reruns, Streamlit's default),
whose callbacks run in a new thread while the first is still stepping. So the
step's own run draws a bar and a "Stop stepping" button at the top of the
page (what a callback draws goes there), and the Stop button's callback, in
the new run, only sets a flag in the session's `Work`, without the engine's
lock, which the step holds; the step reads the flag after each iteration and
stops between two. Any run that needs the engine meanwhile (the page, another
click) waits for the lock showing the same bar and a Stop button of its own.

Streamlit stops a superseded run by raising a control exception from its next
Streamlit call, which inside a progress callback would cross the engine. So
every call made while the engine works goes through `Shown.call`, which keeps
the exception and stops drawing; `Shown.finish` raises it once the operation
and its bookkeeping are done. A rerun requested that way (fast reruns off)
also stops the step, since the click behind it cannot run before the step ends.

A superseded run also cannot touch `st.session_state` any more (each access
raises the same exception), so what an operation writes there once the engine
has changed goes through `ui.state_writes.Queued`, performed by whichever run
gets there first: the operation's own, or the next.
"""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import streamlit as st
from streamlit.runtime.scriptrunner import RerunException, StopException

from backend.core.words import counted
from backend.engine.engine import Engine
from backend.engine.ops import Add, Grow, Op, Shuffle, Step
from backend.sessions.progress import Work, WorkState, tracker
from backend.views.text import plain_md

WORK = "work"
POLL_S = 0.2
# A step shows its bar once it has run this long: quicker ones would only flicker.
SHOW_AFTER_S = 0.3
# The keys of the Stop buttons beside a bar start so: the Playground's, the Scenarios
# page's.
STOP_KEY = "btn_stop_"
STEP_STOP_KEY = "tour_stop_"
# A bar drawn at `st` (from a callback, the top of the page) floats over the page's top
# instead of taking a place in its flow: drawn in the flow, it pushed every control 107 px
# down as a step began and back as it ended, so a click aimed during a step landed on
# the control above; and a page scrolled down never showed it. Its box's key starts so.
FLOAT_KEY = "pagedlab_float_"
_FLOATS = itertools.count(1)


def _float_key() -> str:
    """A new floating box's key (each box of a run needs its own)."""
    return f"{FLOAT_KEY}{next(_FLOATS)}"


# The style PAGE_STYLE_SCRIPT keeps in the document's head, once per browser tab: in
# the page's flow, a callback's first element would replace it (what a callback draws
# goes over the page's first elements).
# - Streamlit's own Stop, in its running indicator, is hidden: a run here applies an
#   operation under the engine's lock, or draws the page. Pressed while an operation
#   ran, it ended the page's run but not the operation, which went on to its end
#   behind a page left blank (or frozen at the bar) until the next click. PagedLab's
#   own Stop, beside every bar, stops a long operation between two iterations.
# - A floating bar shows only once its operation has run SHOW_AFTER_S: it is drawn as
#   the operation starts (the first iteration of a real model's step takes seconds),
#   and a quicker one is gone before it would show.
PAGE_STYLE = (
    "[data-testid='stStatusWidget'] button { display: none; }"
    f" [data-testid='stLayoutWrapper']:has(> [class*='st-key-{FLOAT_KEY}'])"
    " { position: fixed; top: 4.25rem; z-index: 999991;"
    " width: min(40rem, calc(100vw - 2rem)); box-sizing: border-box;"
    " padding: 0.75rem 1rem; background: #FFFFFF; border: 1px solid #8C8C8C;"
    " border-radius: 0.5rem; box-shadow: 0 4px 16px rgba(0, 0, 0, 0.18);"
    f" visibility: hidden; animation: pagedlab-float 0s linear {SHOW_AFTER_S}s forwards; }}"
    " @keyframes pagedlab-float { to { visibility: visible; } }")
PAGE_STYLE_SCRIPT = (
    "(() => { if (document.getElementById('pagedlab-page-style')) return;"
    " const style = document.createElement('style'); style.id = 'pagedlab-page-style';"
    f" style.textContent = {json.dumps(PAGE_STYLE)}; document.head.appendChild(style); }})();")


def get_work() -> Work:
    """This browser session's Work (created by `ui.session.init`)."""
    work: Work = st.session_state[WORK]
    return work


def request_stop() -> None:
    """Callback of every Stop button: ask the running operation to stop; no engine lock."""
    get_work().request_stop()


class Shown:
    """Streamlit calls made while an operation runs: control exceptions are kept for later."""

    def __init__(self) -> None:
        self.deferred: BaseException | None = None

    @property
    def rerun_asked(self) -> bool:
        return isinstance(self.deferred, RerunException)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, unless this run was superseded (then nothing is drawn)."""
        if self.deferred is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except (StopException, RerunException) as exc:
            self.deferred = exc
            return None

    def exit(self, manager: Any) -> None:
        """Leave a context manager entered through `call`, even when this run was
        superseded: left open, Streamlit's spinner generator would be closed by the
        garbage collector instead, whose StopException lands in the server log."""
        try:
            manager.__exit__(None, None, None)
        except (StopException, RerunException) as exc:
            if self.deferred is None:
                self.deferred = exc

    def finish(self) -> None:
        """Raise what Streamlit raised meanwhile, now that the engine is done."""
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            raise deferred


def _bar_text(state: WorkState) -> str:
    """The bar's text, as plain text: labels quote request ids, which may hold Markdown."""
    if state.stopping:
        text = f"{state.label}: stopping after {state.unit} {state.done:,} of {state.total:,}…"
    elif state.fraction is not None:
        text = state.label
    elif state.total:
        text = f"{state.label}: {state.unit} {state.done:,} of {state.total:,}"
    else:
        text = f"{state.label}…"
    return plain_md(text)


def _stop_button(where: str) -> None:
    st.button("Stop stepping", key=f"{STOP_KEY}{where}", on_click=request_stop,
              help="Stop after the current iteration: the steps already taken stay, and the "
                   "engine is consistent.")


class SlotBar:
    """A progress bar in a placeholder of its own at `where` (`st`, the page; or a
    placeholder), with what `under` draws beneath it (a Stop button), drawn on the
    first `show` and moved by the later ones. Every Streamlit call goes through
    `shown`, so a superseded run draws nothing more and raises nothing. At `st` it
    floats over the page's top, and shows once SHOW_AFTER_S has passed (FLOAT_KEY)."""

    def __init__(self, shown: Shown, where: Any = st) -> None:
        self.shown = shown
        self.where = where
        self._slot: Any = None
        self._bar: Any = None

    @property
    def drawn(self) -> bool:
        return self._slot is not None

    @property
    def floating(self) -> bool:
        return self.where is st

    def show(self, fraction: float, text: str, under: Callable[[], None] | None = None) -> None:
        if self._slot is None:
            self._slot = self.shown.call(self.where.empty)
            key = _float_key() if self.floating else None
            box = None if self._slot is None else self.shown.call(self._slot.container, key=key)
            if box is None:
                return
            with box:
                self._bar = self.shown.call(st.progress, fraction, text=text)
                if under is not None:
                    under()
        elif self._bar is not None:
            self.shown.call(self._bar.progress, fraction, text=text)

    def clear(self) -> None:
        if self._slot is not None:
            self.shown.call(self._slot.empty)
            self._slot = self._bar = None


class Bar:
    """A progress bar with a Stop button, drawn on first use (see SHOW_AFTER_S)."""

    def __init__(self, shown: Shown, where: str, *, stoppable: bool) -> None:
        self.shown = shown
        self.where = where
        self.stoppable = stoppable
        self._bar = SlotBar(shown)

    def show(self, state: WorkState) -> None:
        if state.fraction is not None:
            fraction = state.fraction
        else:
            fraction = min(1.0, state.done / state.total) if state.total else 0.0
        stop = self.stoppable and state.stoppable
        self._bar.show(fraction, _bar_text(state),
                       (lambda: self.shown.call(_stop_button, self.where)) if stop else None)

    def clear(self) -> None:
        self._bar.clear()


class _Line:
    """The runs waiting for one engine's lock, in the order they came.

    A threading.Lock serves its waiters in no particular order; clicks must act in the
    order they were made: a waiting click that a later click superseded acts on the
    engine before that later one, whose page then shows both (see ui/operations.py).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # (thread id, ticket) per place.
        self._waiting: deque[tuple[int, object]] = deque()

    @contextmanager
    def place(self) -> Iterator[Callable[[float], bool]]:
        """A place at the end of the line, for the block; yields `turn(timeout)`: whether
        this place is first, waiting at most `timeout` seconds for it to be. A thread
        already first goes first again (the engine's lock is re-entrant too)."""
        me = threading.get_ident()
        ticket = (me, object())
        with self._cond:
            self._waiting.append(ticket)

        def turn(timeout: float) -> bool:
            with self._cond:
                return self._cond.wait_for(lambda: self._waiting[0][0] == me, timeout)

        try:
            yield turn
        finally:
            with self._cond:
                self._waiting.remove(ticket)
                self._cond.notify_all()


# One line per engine; weak, so a line goes with its engine.
_LINES: weakref.WeakKeyDictionary[Engine, _Line] = weakref.WeakKeyDictionary()
_LINES_LOCK = threading.Lock()


def _line(engine: Engine) -> _Line:
    with _LINES_LOCK:
        line = _LINES.get(engine)
        if line is None:
            line = _LINES[engine] = _Line()
        return line


@contextmanager
def engine_lock(engine: Engine, where: str, work: Work) -> Iterator[Shown]:
    """Hold `engine`'s lock, after the runs of this process that asked for it earlier
    through here. While another run holds it or is ahead, show what the holder is
    doing, with a Stop button (keyed by `where`), until it lets go.

    Yields the Shown of that display: the caller calls its `finish` once it has
    done what it holds the lock for (a callback applies its click's operation
    first, even when a newer run has superseded this one meanwhile).
    """
    shown = Shown()
    bar = None
    with _line(engine).place() as turn:
        def acquired(timeout: float) -> bool:
            return turn(timeout) and engine.lock.acquire(timeout=timeout)

        if not acquired(0):
            bar = Bar(shown, where, stoppable=True)
            while not acquired(POLL_S):
                state = work.state
                if state is not None:
                    bar.show(state)
        try:
            if bar is not None:
                bar.clear()
            yield shown
        finally:
            engine.lock.release()


def iterations_of(op: Op) -> int:
    """How many iterations (a step's) or tokens (a grow's) `op` runs, known before it
    runs; 0 for an operation without either."""
    return op.count if isinstance(op, Step) else op.tokens if isinstance(op, Grow) else 0


def unit_of(op: Op) -> str:
    """What `iterations_of(op)` counts, for a bar's "N of M" line."""
    return "token" if isinstance(op, Grow) else "iteration"


def label_of(op: Op) -> str:
    """What an operation is doing, in words, for its bar or spinner."""
    match op:
        case Step():
            return f"Stepping the batch ({op.count:,} iterations)"
        case Add():
            return f"Adding request {op.request}: prefilling its prompt through the model"
        case Grow():
            return f"Growing {op.request} by {counted(op.tokens, 'token')}, one model step each"
        case Shuffle():
            return "Moving every used block and its K/V"
    return f"Applying {op.op}"


@contextmanager
def floating_spinner(shown: Shown, text: str, where: Any = None) -> Iterator[None]:
    """A spinner saying `text` (plain text) for the block, over the page's top as a
    floating bar is (FLOAT_KEY): in the page's flow it pushed every control down while
    it showed. With `where`, a placeholder of the page's own (a scenario's play keeps
    one under its controls), in that placeholder instead. Drawn through `shown`, so a
    superseded run draws nothing more."""
    slot = shown.call(st.empty) if where is None else where
    box = None if slot is None else shown.call(
        slot.container, key=_float_key() if where is None else None)
    spinner = None
    if box is not None:
        spinner = st.spinner(text)
        with box:       # entered there, it draws there
            shown.call(spinner.__enter__)
        if shown.deferred is not None:
            spinner = None     # its generator ended with the exception: nothing to leave
    try:
        yield
    finally:
        if spinner is not None:
            shown.exit(spinner)
        if slot is not None:
            shown.call(slot.empty)


@contextmanager
def working(op: Op, work: Work) -> Iterator[tuple[Shown, Callable[[int, int], bool]]]:
    """While `op` runs: the engine's progress callback, and the Shown its display uses.

    A `step` of several iterations or a `grow` of several tokens gets a bar and a
    Stop button, drawn as it starts (its first iteration may take seconds; the bar
    shows once it has run SHOW_AFTER_S), anything else a spinner with its label
    (Streamlit shows it after half a second). The caller calls `shown.finish()`
    after its bookkeeping.
    """
    label = label_of(op)
    shown = Shown()
    total = iterations_of(op)
    work.begin(label, total, unit=unit_of(op))
    bar = Bar(shown, "step", stoppable=True)
    if total > 1 and (state := work.state) is not None:
        bar.show(state)

    def display(done: int, total: int) -> bool:
        state = work.state
        if state is not None:
            bar.show(state)
        # A rerun asked while stepping (fast reruns off) waits for the step: stop it.
        return not shown.rerun_asked

    try:
        # Plain text: an id such as ![x](http://...) must not make the browser fetch
        # anything.
        with (floating_spinner(shown, plain_md(f"{label}…")) if total <= 1
              else nullcontext()):
            yield shown, tracker(work, display)
    finally:
        work.end()
        bar.clear()


@contextmanager
def restoring(text: str) -> Iterator[tuple[Shown, Callable[[int, int], None]]]:
    """A bar for a restore (K/V recomputed from the tokens, one forward at a time) and
    the callback that moves it; the caller calls the Shown's `finish`.

    `text` says what is restored (plain text: it may quote a file name)."""
    shown = Shown()
    label = plain_md(text)
    bar = shown.call(st.progress, 0.0, text=label)

    def moved(done: int, total: int) -> None:
        if bar is not None and total:
            shown.call(bar.progress, done / total,
                       text=plain_md(f"{text}: forward {done:,} of {total:,}"))

    try:
        yield shown, moved
    finally:
        if bar is not None:
            shown.call(bar.empty)
