"""The Scenarios page's state: one scenario run per browser session, its link and its play.

Everything the page remembers lives in one `TourState` under
`st.session_state["tour"]`, set up by `init()`: the run (its own engine, never
the Playground's, and a frame per state it passed through), the viewed step,
whether it is playing, the scenario a person uploaded, and the link last
written to the address bar. The controls that change it, and the drawing,
are in ui.tour_widgets.

Play: each play run draws the page, waits the chosen time, moves one step on
and asks Streamlit for a rerun, until the last step or a refused one. A click
on Pause (or Next, Back, the slider, Reset, another scenario) starts a new run
at once (Streamlit's fast reruns), whose callback turns play off, so at most
the one step already under way is taken after the click.

One change at a time: that step and the click's run may overlap, so a step
taken and the view moved to it happen under the state's lock (`held`), which
every callback and `sync` take too. A click never applies a step beside
another on the same engine, and a page drawn after a Pause shows the step the
play reached, not the one before it with "2 applied so far". The same click may
carry the slider and the address of the step the play just left (the browser had
not yet drawn the next): neither moves the view back.

The link in the address bar, and `sync`, which each run of the page starts with, are
in ui.tour_link.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from backend.core.errors import PagedLabError
from backend.engine.ops import describe_op
from backend.io.scenario import Scenario
from backend.sessions.playground import Settings
from backend.sessions.tour import Frame, TourRun, shipped_paths, shipped_scenario
from ui import session, tour_progress
from ui.progress import Shown, iterations_of, unit_of
from ui.state_writes import Queued
from ui.tour_progress import Timed

TOUR = "tour"
UPLOAD = "upload"            # the key of a scenario a person uploaded
PLAYGROUND_PAGE = "pages/playground.py"
WIDGET_DEFAULTS: dict[str, object] = {"tour_speed": 1.0}

MessageKind = Literal["error", "info", "success"]


# The address's parameters: the scenario, the viewed step and, when steps past the view
# were taken, how many ("applied"), so that a reload takes them again.
Link = tuple[str | None, str | None, str | None]


@dataclass(slots=True)
class TourState:
    run: TourRun | None = None
    view: int = 0
    playing: bool = False
    # The steps the play moved the view from, until a page drawn after them is
    # complete: a click meanwhile may carry the slider at one of them, from before the
    # browser got the newer pages (on a slow machine, several steps behind), which is
    # no choice of the person's (see `slid_to`).
    left_by_play: frozenset[int] = frozenset()
    # "Seconds per step" as the page last drew it: a run whose speed differs is the
    # speed's change, whatever old slider value the browser sent with it (`slid_to`).
    speed_drawn: float | None = None
    # (scenario, step, applied) as last written to the address bar; None before the
    # first write.
    url: Link | None = None
    # The links written before `url`, newest last (WRITTEN_KEPT of them): a click may
    # carry the address from before the browser got the newer ones (a key held on the
    # slider, a Pause during a fast play), which is no link a person opened (see
    # `_apply_link`).
    written: tuple[Link, ...] = ()
    # The address a Back or Forward brought, until a run applies it: the run that brought
    # it may wait for a step, and a click meanwhile (Stop this step) replaces it with a
    # run that carries the same address without the mark (Streamlit drops it on a
    # widget's interaction).
    back_to: Link | None = None
    uploaded: tuple[str, Scenario] | None = None    # (title, scenario)
    # The upload's name in the address (`upload_link`): its entries in the browser's
    # history are its own, and one of a file since replaced is known as such.
    upload_name: str | None = None
    messages: list[tuple[MessageKind, str]] = field(default_factory=list)  # shown once
    goto_playground: bool = False
    # The step under way, while one runs (its bar's record, for the runs that wait).
    stepping: Timed | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def upload_link(data: bytes) -> str:
    """An uploaded file's `scenario` in the address: UPLOAD and a digest of its bytes,
    so that an entry of another file's (one replaced since) is not taken for this one."""
    return f"{UPLOAD}-{hashlib.sha256(data).hexdigest()[:12]}"


def init() -> None:
    """Set up this session's scenario state. Guarded: sets only what is missing."""
    ss = st.session_state
    if TOUR not in ss:
        ss[TOUR] = TourState()
    for key, value in WIDGET_DEFAULTS.items():
        if key not in ss:
            ss[key] = value


# The state whose lock this thread holds (`held`): read from here, not from session
# state, which raises in a run Streamlit superseded while it waited for the lock; a
# click that waited behind a step still acts, even when a later click came meanwhile.
_HELD = threading.local()


def state() -> TourState:
    t: TourState | None = getattr(_HELD, "state", None)
    if t is None:
        t = st.session_state[TOUR]
    return t


@contextmanager
def held(*, stop: bool = False) -> Iterator[TourState]:
    """This session's scenario state, with its lock held (see the module doc). While
    another run holds it stepping, that step's bar shows here (ui/tour_progress.py);
    with `stop` (a click that throws the run away: Reset, another scenario, an
    upload), every step seen meanwhile is stopped instead of waited out."""
    t = state()
    if getattr(_HELD, "state", None) is t:
        # The lock is no RLock: a second hold in this thread would wait for itself.
        raise RuntimeError("the scenario state's lock is already held by this thread")
    shown = Shown()
    tour_progress.acquire_showing(t.lock, lambda: t.stepping, shown, stop=stop)
    outer, _HELD.state = getattr(_HELD, "state", None), t
    try:
        yield t
    finally:
        _HELD.state = outer
        t.lock.release()
    # What Streamlit raised while this run waited, now that the click has acted.
    shown.finish()


def left_page() -> None:
    """This tab opened another page: a play of the Scenarios page stops where it is. It
    went on when the page was next opened, and a Back to a step it had shown found it
    further on, that entry rewritten to its newer step."""
    t: TourState | None = st.session_state.get(TOUR)
    if t is not None:
        t.playing = False


def stop_step(step: Timed) -> None:
    """A Stop button's callback: stop `step` (that bar's, not whichever step runs by the
    time the click is heard) and the play, if one is on: a click that lands just as the
    step ends should not let the play go on."""
    step.stop.set()
    state().playing = False


def one_at_a_time(callback: Callable[..., None]) -> Callable[..., None]:
    """A control's callback, run with the state's lock held."""
    @functools.wraps(callback)
    def locked(*args: object) -> None:
        with held():
            callback(*args)
    return locked


def say(kind: MessageKind, text: str) -> None:
    state().messages.append((kind, text))


def first_stem() -> str:
    return next(iter(shipped_paths()))


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What starting a run needs from session state, read before a control waits for
    the state's lock (see `state`); its writes go through `queued`."""

    settings: Settings
    owner: str
    queued: Queued

    @staticmethod
    def read() -> LoadContext:
        return LoadContext(session.get_settings(), session.get_owner(), session.queued())


def load(key: str, ctx: LoadContext | None = None) -> bool:
    """Start a fresh run of the scenario `key` (a shipped stem or UPLOAD); False if refused.

    With `ctx` (a control's, read before it waited) nothing here touches session state:
    the picker and the views' selections are queued, written before they are drawn.
    """
    t = state()
    live = ctx is None
    ctx = ctx or LoadContext.read()
    s = ctx.settings
    try:
        if key == UPLOAD:
            assert t.uploaded is not None
            title, scenario = t.uploaded
        else:
            scenario = shipped_scenario(key)
            title = scenario.name
        t.run = TourRun(scenario, key, title, device=s.device, kernel=s.kernel,
                        owner=ctx.owner, replacing=t.run)
    except PagedLabError as exc:
        say("error", f"Cannot start that scenario: {exc}")
        return False
    t.view = 0
    t.playing = False
    # The views' selections were of the old run's requests and blocks (a block id past
    # the new pool would be refused as if just typed).
    writes = {"tour_pick": key, **session.view_defaults("tour_")}
    if live:
        st.session_state.update(writes)
    else:
        for name, value in writes.items():
            ctx.queued.put(name, value)
    return True


# ---- each rerun, before drawing -------------------------------------------------------

def finish(run: TourRun, slot: DeltaGenerator) -> None:
    """After drawing: take the next step if playing (a long one with its bar in `slot`,
    a placeholder the page keeps by its controls)."""
    t = state()
    if not t.playing:
        # This page, its slider at the view, is complete: any slider value from now on
        # is the person's.
        t.left_by_play = frozenset()
        return
    time.sleep(float(st.session_state.get("tour_speed") or 1.0))
    with held():
        if not t.playing or t.run is not run:
            return      # paused (or another scenario opened) during the wait: no step
        before = t.view
        shown = Shown()
        if t.view < run.taken:
            t.view += 1
        else:
            frame, shown = advance(run, slot)
            if frame is not None:
                t.view = run.taken
            else:
                t.playing = False
        if t.view != before:
            t.left_by_play |= {before}
    shown.finish()
    st.rerun()


def advance(run: TourRun, where: DeltaGenerator | None = None) -> tuple[Frame | None, Shown]:
    """`run.advance()` with a bar while a long `step` or `grow` runs, drawn at `where`
    (ui/tour_progress.py). Called with the state's lock held.

    The caller updates the state, then calls the Shown's `finish`: Streamlit may
    have superseded this run meanwhile, and what it raised is raised only then."""
    if not run.can_advance:
        return None, Shown()
    op = run.scenario.steps[run.taken].op
    step = Timed(f"Step {run.taken + 1}, {describe_op(op)}",
                 unit_of(op), run.step_time_limit_s,
                 has_control=run.control is not None and run.control.stopped_at is None,
                 # Known before the first iteration: a bar at the page's top is drawn
                 # at once.
                 total=iterations_of(op))
    t = state()
    with tour_progress.stepping(step, stop_step, where) as (shown, move):
        t.stepping = step       # what a click that waits for the lock shows meanwhile
        try:
            frame = run.advance(move)
        finally:
            t.stepping = None
    return frame, shown


def slid_to(value: int, *, speed_changed: bool = False) -> None:
    """The slider moved to step `value`: view it, and stop playing.

    A slider at a step the play left since the page was last complete is the
    browser's old value sent with another click (a Pause): the view stays at the
    step the play reached. (A drag back to such a step during a play only stops it;
    a second drag, on the complete page, moves the view.) A slider sent with a new
    speed (`speed_changed`) is not the person's either, who changes one input at a
    time: it is the browser's value from a page the play has since redrawn, sent
    along with the speed's change, and the play goes on at the new speed.
    """
    t = state()
    if speed_changed:
        return
    t.playing = False
    if value not in t.left_by_play:
        t.view = value
