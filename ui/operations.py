"""One operation at a time on a browser session's engine.

One operation at a time: Streamlit may run a second click's callback while
the first is still running (fast reruns), so `apply` holds the engine's lock
from building the operation to saving its result, and the page holds it
while it reads the state; so does anything that replaces the engine
(ui/engine_actions.py, ui/restore.py). Whoever waits for the lock shows what the holder is
doing (ui/progress.py). An operation that fails half-way is undone by
rebuilding the engine from the snapshot before it.

Stopped runs: a run Streamlit has superseded raises from its next session-state
access, which after a step would lose its bookkeeping. So an operation reads
what it needs first (`OpSession.read`), and what it writes once the engine has
changed is queued (ui.session.QUEUED, a ui.state_writes.Queued) and written by
`session.collect`: at once, or by the next run (`session.init`, the page after
the engine's lock).

Progress: a `step` of several iterations shows a bar and a "Stop stepping"
button while it runs, and stops between two iterations when asked; other
operations and restores show a spinner saying what they do.

Saving: after every change the session is saved in the store (ui/store.py,
backend/sessions/saved.py): its snapshot, settings, history and log.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Grow, Op, Step
from backend.engine.results import OpResult
from backend.io.snapshot import export_snapshot
from backend.sessions import saved
from backend.sessions.budget import SERVER_BUDGET
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Settings, apply_or_recover, has_state
from backend.sessions.progress import SESSION_RUNS, Work
from backend.sessions.summary import summarize
from ui import progress, state_writes, store
from ui.labels import op_refusal
from ui.progress import Shown
from ui.session import (
    ENGINE,
    FLASH,
    GENERATION,
    HISTORY,
    OPLOG,
    SETTINGS,
    STEP_PICK,
    TIMELINE_PICK,
    FlashKind,
    collect,
    flash,
    flash_number,
    flash_of,
    get_engine,
    get_history,
    get_oplog,
    get_owner,
    get_settings,
    queued,
    snapshot_now,
)


@dataclass(frozen=True, slots=True)
class OpSession:
    """What an operation works with, read from session state before it changes anything:
    afterwards this run may no longer read there (see state_writes.Queued)."""

    engine: Engine
    settings: Settings
    history: History
    oplog: OpLog
    owner: str
    tab: saved.Tab
    queued: state_writes.Queued
    # How many times the session's engine or settings were replaced (`replace`).
    generation: int
    # The number of the last status-line message when this was read (see `flash`), and
    # those of the messages this operation has put since.
    seen_flash: int = 0
    mine: set[int] = field(default_factory=set, compare=False)

    @staticmethod
    def read() -> OpSession:
        q = queued()
        seen = max(flash_number(st.session_state.get(FLASH)), flash_number(q.last(FLASH)))
        return OpSession(get_engine(), get_settings(), get_history(), get_oplog(),
                         get_owner(), store.get_tab(), q,
                         st.session_state.get(GENERATION, 0), seen)

    def save(self, live: saved.Live, snapshot: dict[str, Any], *,
             op: dict[str, Any] | None = None, whole: bool = False) -> None:
        """Save `live` after a change; what the save says is queued for store.NOTE.

        A session that never had state has no row yet and gets none for this.
        """
        if self.tab.id is None and not has_state(live.engine):
            return
        self.queued.put(store.NOTE, saved.save(self.tab, live, snapshot, op=op, whole=whole))

    def replace(self, live: saved.Live) -> OpSession:
        """Make `live` the session's engine, settings, history and log; returns the session
        that results. Call with this engine's lock held.

        The writes are queued (see state_writes.Queued), and the new session is recorded as
        this engine's successor: a run that waited for this engine's lock follows it
        there (`holding_current`) without reading session state. `live.engine` may be
        this engine itself, with other settings (a kernel switch on the same device).
        """
        q = self.queued
        q.put(ENGINE, live.engine)
        q.put(SETTINGS, live.settings)
        q.put(HISTORY, live.history)
        q.put(OPLOG, live.oplog)
        q.put(GENERATION, self.generation + 1)
        after = dataclasses.replace(self, engine=live.engine, settings=live.settings,
                                    history=live.history, oplog=live.oplog,
                                    generation=self.generation + 1)
        with _SUCCESSORS_LOCK:
            _SUCCESSORS[self.engine] = _Successor(weakref.ref(live.engine), live.settings,
                                                  live.history, live.oplog,
                                                  self.generation + 1)
        if live.engine is not self.engine:
            # Streamlit keeps this run's state, the old engine with it, until the session's
            # next run: other sessions should not be refused for memory it is giving back.
            SERVER_BUDGET.retire(self.engine)
        return after

    def detach(self) -> None:
        """The next save starts a new row under a new id; the current row stays, listed."""
        self.tab.start_anew()
        self.queued.put(store.NOTE, None)

    def flash(self, kind: FlashKind, text: str) -> None:
        """Set the status line. Messages of other operations of this session that ended
        while this one waited its turn stay above it (at most MAX_EARLIER): a click
        that waited behind a Step N would otherwise hide what the Step N did."""
        prev = self.queued.last(FLASH)
        earlier: tuple[tuple[FlashKind, str], ...] = ()
        if prev is not None and prev[2] > self.seen_flash:
            earlier = prev[3] if prev[2] in self.mine else (*prev[3], (prev[0], prev[1]))
        message = flash_of(kind, text, earlier[-MAX_EARLIER:])
        self.mine.add(message[2])
        self.queued.put(FLASH, message)


@dataclass(frozen=True, slots=True)
class _Successor:
    """`OpSession.replace`'s record: the new session, its engine held weakly. After a
    kernel switch on the same device it is the very engine the record is filed under,
    which a strong reference would keep alive, K/V and all, after its session ended.
    The owner, tab and write queue are the browser session's own, as the waiting run
    read them (the queue holds the new engine until its writes land)."""

    engine: weakref.ReferenceType[Engine]
    settings: Settings
    history: History
    oplog: OpLog
    generation: int


# The session that replaced an engine (`OpSession.replace`), by the engine it replaced.
# Weak both ways: once no run holds the old engine, its entry goes with it. Engines are
# never shared between browser sessions, so neither are entries.
_SUCCESSORS: weakref.WeakKeyDictionary[Engine, _Successor] = weakref.WeakKeyDictionary()
_SUCCESSORS_LOCK = threading.Lock()


def _successor(sess: OpSession) -> OpSession | None:
    """The session that replaced `sess`'s engine, if one did."""
    with _SUCCESSORS_LOCK:
        record = _SUCCESSORS.get(sess.engine)
    new = None if record is None else record.engine()
    if record is None or new is None:
        # A new engine that is gone belonged to a session that ended: nothing to follow.
        return None
    return dataclasses.replace(sess, engine=new, settings=record.settings,
                               history=record.history, oplog=record.oplog,
                               generation=record.generation)


# Tries at taking the current engine's lock while other runs keep replacing it.
MAX_WAITS = 8


@contextmanager
def holding_current(where: str, work: Work, shown: list[Shown]) -> Iterator[OpSession | None]:
    """Hold the lock of the session's current engine; yields the session it belongs to.

    The session is read before waiting. Another run may replace the engine while this
    one waits for the lock (a real model's weight load holds it for seconds): then
    this one follows the replacement's record (`OpSession.replace`) to the new engine,
    waits for its lock instead, and acts on it. Nothing after the wait reads session
    state, so a click whose run a later click superseded while it waited still acts
    (its reads would raise: see state_writes.Queued). Yields None if the engine kept being
    replaced. Each wait's display is appended to `shown`, for the caller to finish
    after its bookkeeping (see ui/progress.py).
    """
    sess = OpSession.read()
    for attempt in range(MAX_WAITS):
        with progress.engine_lock(sess.engine, f"{where}{attempt}", work) as waited:
            shown.append(waited)
            after = _successor(sess)
            if after is None or after.generation <= sess.generation:
                yield sess
                return
            if after.engine is sess.engine:
                # Other settings for the same engine (a kernel switch on the same
                # device changes the engine in place).
                yield after
                return
        sess = after
    yield None


# How many messages of operations that ended while another waited stay above its own.
MAX_EARLIER = 3

REPLACED_TOO_OFTEN = "The engine kept being replaced while this waited; try again."


# Builds a click's operation on the engine it will run on. Reads no session state: it
# runs after the wait for the engine's lock (see `apply`).
MakeOp = Callable[[Engine], Op]
# Queues what a click writes once its operation is applied (see state_writes.Queued).
AfterOp = Callable[[OpResult, state_writes.Queued], None]
# Run with the engine's lock held before the operation is built: the session it then
# runs on (see `apply`).
First = Callable[[OpSession, Work, list[Shown]], OpSession]


def apply(prepare: Callable[[], MakeOp], after: AfterOp | None = None,
          first: First | None = None) -> None:
    """Build and apply one operation; a refusal becomes the page's error message.

    `prepare` reads the click's fields (session state) before anything waits, and
    returns what builds the operation once this run holds the engine's lock: a click
    that waited behind another operation still acts, even if a later click has
    superseded its run meanwhile. `after` queues the click's writes for an applied
    operation. `first`, with the lock held, may replace the engine before the operation
    (engine_actions.applying_first); the operation then runs on the new one, under its
    lock.

    The engine validates before it changes anything, so after a refusal the
    state is exactly as it was. Anything else is a failure half-way: the engine
    is rebuilt in the state before the operation and the page says so. A
    `step` of several iterations, or a `grow` of several tokens, shows its
    progress and may be stopped between two (then the result's op is the one
    that ran). After an applied operation the session is saved.
    """
    try:
        make_op = prepare()
    except PagedLabError as exc:
        flash("error", f"Refused: {op_refusal(str(exc))}")
        return
    shown: list[Shown] = []
    work = progress.get_work()
    tab = store.get_tab()
    # Listed as running on the tab's saved session from before it waits for the engine
    # until it has saved, so that a page opening that session meanwhile (this one
    # reloaded) stops it and opens what it reached: a click waiting behind a Step N is
    # listed before the Step N ends, so no gap between the two lets that page through.
    with SESSION_RUNS.running(tab.id, tab.browser, tab.holder, work), \
            holding_current("wait", work, shown) as sess:
        if sess is None:
            flash("error", REPLACED_TOO_OFTEN)
        else:
            held = sess.engine
            if first is not None:
                sess = first(sess, work, shown)
            if sess.engine is held:
                result = _apply_held(sess, work, make_op, shown)
            else:
                # The new engine's lock too: a run that read it from session state (the
                # replacement's writes are queued, and the next run may perform them)
                # must not read it while the operation changes it.
                with progress.engine_lock(sess.engine, "new", work) as waited:
                    shown.append(waited)
                    result = _apply_held(sess, work, make_op, shown)
            if result is not None and after is not None:
                after(result, sess.queued)
    collect()
    # Only now that the operation and its bookkeeping are done: see ui/progress.py.
    for s in shown:
        s.finish()


def _apply_held(sess: OpSession, work: Work, make_op: MakeOp,
                shown: list[Shown]) -> OpResult | None:
    """`apply` with the engine's lock held: no session state, only `sess`."""
    engine = sess.engine
    try:
        before = snapshot_now(engine, sess.history)
        op = make_op(engine)
    except PagedLabError as exc:
        sess.flash("error", f"Refused: {op_refusal(str(exc))}")
        return None
    with progress.working(op, work) as (working, callback):
        shown.append(working)

        def until_idle(done: int, total: int) -> bool:
            # A Step N ends once nothing runs, waits or is swapped out: the iterations
            # left would only add empty rows to the timeline.
            return callback(done, total) and not engine.idle

        try:
            applied = apply_or_recover(engine, op, before, sess.settings, sess.owner, until_idle)
        except PagedLabError as exc:
            sess.flash("error", f"Refused: {op_refusal(str(exc))}")
            return None
    if applied.result is None:
        sess.replace(saved.Live(applied.engine, sess.settings, sess.history, sess.oplog))
        sess.flash("error", f"The operation failed half-way ({applied.failure}); the engine "
                            f"was put back to the state before it, step {applied.engine.step}.")
        return None
    result = applied.result
    logged = sess.oplog.append(result.op)
    snapshot = export_snapshot(engine)
    sess.history.record(snapshot)
    sess.save(saved.Live(engine, sess.settings, sess.history, sess.oplog), snapshot, op=logged)
    # Why an added request waits, in the sidebar's words (max_num_seqs).
    line = summarize(result, snapshot, why=op_refusal)
    if isinstance(op, Step) and isinstance(result.op, Step) and result.op.count < op.count:
        why = (f": {work.stop_reason}" if work.stop_reason else
               ": nothing was left to run" if engine.idle else "")
        line = f"Stopped after {result.op.count:,} of {op.count:,} iterations{why}. {line}"
    elif isinstance(op, Grow) and isinstance(result.op, Grow) and result.op.tokens < op.tokens:
        why = f": {work.stop_reason}" if work.stop_reason else ""
        line = f"Stopped after {result.op.tokens:,} of {op.tokens:,} tokens{why}. {line}"
    sess.flash("success", line)
    # Back to the live state: what the operation did is what the person wants to see.
    sess.queued.put(TIMELINE_PICK, None)
    sess.queued.put(STEP_PICK, None)
    return result
