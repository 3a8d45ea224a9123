"""The per-session engine and settings, held in `st.session_state`.

Each browser session gets its own engine: nothing here is module-level state,
so two people never see each other's requests. `init()` is the one place
session state is initialised; it runs at the top of every rerun and only fills
in what is missing.

Settings and confirmation: the sidebar's fields are widgets whose values live
in session state. The applied settings are `st.session_state["settings"]`.
When the fields describe another config than the applied one, the change is
*pending*: if the engine has no state it is applied at once, otherwise the
sidebar asks ("Apply and reset" / "Keep current") and nothing is lost
until the person confirms. Device and kernel changes never need asking: the
same state continues on the other kernel.
The callbacks that apply settings and replace the engine (a new config, a
reset, a restore, another kernel) are in ui/engine_actions.py.

History: the snapshot after each applied operation since the engine was
started or restored (`HISTORY`, a backend.sessions.history.History, which
keeps them as deltas and bounded), so a whole session can be downloaded as a
run.

One operation at a time: Streamlit may run a second click's callback while
the first is still running (fast reruns), so `apply` holds the engine's lock
from building the operation to saving its result, and the page holds it
while it reads the state; so does anything that replaces the engine. Whoever
waits for the lock shows what the holder is doing (ui/progress.py). An
operation that fails half-way is undone by rebuilding the engine from the
snapshot before it.

Stopped runs: a run Streamlit has superseded raises from its next session-state
access, which after a step would lose its bookkeeping. So an operation reads
what it needs first (`OpSession.read`), and what it writes once the engine has
changed is queued (`QUEUED`, a ui.progress.Queued) and written by `collect`:
at once, or by the next run (`init`, the page after the engine's lock).

Progress: a `step` of several iterations shows a bar and a "Stop stepping"
button while it runs, and stops between two iterations when asked; other
operations and restores show a spinner saying what they do.

Saved sessions: the operation log (`OPLOG`, a backend.sessions.oplog.OpLog)
records every applied operation, and after every change the session is saved
in the store (ui/store.py, backend/sessions/saved.py): its snapshot, settings,
history and log. The first run of a browser session reopens the session the
address names (or a copy, if it is another browser's), or else this
browser's latest one (ui/resume.py).
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import streamlit as st

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Grow, Op, Step
from backend.engine.results import OpResult
from backend.io.snapshot import export_snapshot
from backend.sessions import saved
from backend.sessions.budget import SERVER_BUDGET
from backend.sessions.history import MAX_STEPS, History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import (
    MODEL_FIELDS,
    Settings,
    apply_or_recover,
    build_engine,
    has_state,
    preset_of,
    summarize,
)
from backend.sessions.progress import Work
from ui import progress, store
from ui.labels import op_refusal
from ui.progress import Shown

ENGINE = "engine"
SETTINGS = "settings"
FLASH = "flash"
PENDING = "config_pending"
FIELDS_PROBLEM = "config_problem"   # why the sidebar's fields describe no config, or None
HISTORY = "history"
OPLOG = "oplog"
QUEUED = "queued_writes"
GENERATION = "engine_generation"   # see OpSession.generation
OWNER = "kv_owner"
MAX_HISTORY = MAX_STEPS

DEFAULT_PROMPT = "The cat sat on the mat."
DEFAULT_STEP_N = 4     # the Steps field before any edit
DEFAULT_GROW = 1       # the "Grow by" field before any edit

# Sidebar field -> EngineConfig field. ("cfg_model" is tiny-byte's size preset, which
# only fills in the four dimension fields; "cfg_model_name" picks the model.)
CONFIG_KEYS = {
    "cfg_model_name": "model",
    "cfg_num_blocks": "num_blocks", "cfg_block_size": "block_size",
    "cfg_allocation": "allocation", "cfg_prefix_caching": "prefix_caching",
    "cfg_num_layers": "num_layers", "cfg_num_heads": "num_heads",
    "cfg_num_kv_heads": "num_kv_heads", "cfg_head_dim": "head_dim", "cfg_dtype": "dtype",
    "cfg_seed": "seed", "cfg_max_new": "max_new_tokens",
    "cfg_temperature": "temperature", "cfg_top_p": "top_p",
    "cfg_max_num_seqs": "max_num_seqs", "cfg_max_num_batched_tokens": "max_num_batched_tokens",
    "cfg_watermark_blocks": "watermark_blocks",
    "cfg_preemption": "preemption", "cfg_num_cpu_blocks": "num_cpu_blocks",
}
DIM_KEYS = frozenset(f"cfg_{name}" for name in MODEL_FIELDS)

# The panels' own widgets (highlight, page, translator), keyed by a per-page prefix so
# that each page drawing the views keeps its own selection. "" is the Playground's.
VIEW_DEFAULTS: dict[str, Any] = {
    "focus_req": None, "focus_block": None, "grid_page": 0,
    "tr_req": None, "tr_pos": 0, "tr_layer": 0,
}
# "past_" is the Playground's view of a past step picked on its timeline (ui/timeline.py).
VIEW_PREFIXES = ("", "tour_", "past_")


def view_defaults(*prefixes: str) -> dict[str, Any]:
    """The views' widget keys under each of `prefixes`, with their defaults."""
    return {f"{prefix}{key}": value for prefix in prefixes
            for key, value in VIEW_DEFAULTS.items()}
# Set by a first click on Reset engine with requests to discard: the sidebar asks first.
CONFIRM_RESET = "confirm_reset"
# The timeline row whose step the Playground shows (its iteration); None: the live state.
TIMELINE_PICK = "tl_iteration"
# A step picked from the history alone, while the timeline has no rows (a reopened
# session keeps its history, not its engine's timeline); None: the live state.
STEP_PICK = "tl_step"

FlashKind = Literal["error", "success", "info"]


def config_fields(config: EngineConfig) -> dict[str, Any]:
    """The sidebar's field values that show `config`.

    The size preset and the four dimension fields are tiny-byte's: for a real
    model they are not set (its dimensions would not even fit their ranges),
    so they keep, or `init` seeds them with, tiny-byte's sizes.
    """
    out: dict[str, Any] = {key: getattr(config, name) for key, name in CONFIG_KEYS.items()}
    if config.dims is not None:
        return {k: v for k, v in out.items() if k not in DIM_KEYS}
    out["cfg_model"] = preset_of(config)
    return out


def _widget_defaults(settings: Settings) -> dict[str, Any]:
    return {
        # tiny-byte's sizes, for a session whose model brings its own (see config_fields).
        **config_fields(EngineConfig()),
        **config_fields(settings.config),
        "dev_device": settings.device, "dev_kernel": settings.kernel,
        # Add form.
        # (The prompt's default is its widget's: ui/controls.py.)
        "add_id": "", "add_len": None, "add_max_new": None,
        "add_pins": "", "add_n": None, "add_beam": None,
        # Per-request and batch controls.
        "req_pick": None, "req_grow_n": DEFAULT_GROW, "req_child": "",
        "batch_n": DEFAULT_STEP_N,
        TIMELINE_PICK: None, STEP_PICK: None,
        # Views, once per page that draws them (see VIEW_PREFIXES).
        **view_defaults(*VIEW_PREFIXES),
    }


def init() -> None:
    """Initialise this session's state. Guarded: sets only keys that are missing.

    Widget keys are seeded here rather than through `value=` so that callbacks
    may set them (a widget given both warns). The fields persist for the session
    (persist_state="session"), so a visit to another page keeps them; a key missing
    all the same (a fresh session, a widget that does not persist) is seeded. Writes
    an interrupted run queued land here first (see progress.Queued).
    """
    ss = st.session_state
    if QUEUED not in ss:
        ss[QUEUED] = progress.Queued()
    collect()
    if OWNER not in ss:
        # Names this session's engines in the server's K/V budget.
        ss[OWNER] = secrets.token_hex(8)
    if progress.WORK not in ss:
        ss[progress.WORK] = Work()
    if store.TAB not in ss:
        store.start_tab()
    if SETTINGS not in ss:
        ss[SETTINGS] = Settings()
    if ENGINE not in ss:
        ss[ENGINE] = build_engine(ss[SETTINGS], ss[OWNER], check=False)
    if HISTORY not in ss:
        ss[HISTORY] = History()
    if OPLOG not in ss:
        # The log starts where the engine is now (fresh, or some state: then that).
        engine = ss[ENGINE]
        ss[OPLOG] = OpLog(export_snapshot(engine) if has_state(engine) else None)
    for key, value in _widget_defaults(ss[SETTINGS]).items():
        if key not in ss:
            ss[key] = value


def queued() -> progress.Queued:
    q: progress.Queued = st.session_state[QUEUED]
    return q


# The sidebar's fields, which app.py draws before the page: a write to one once it is
# drawn raises (StreamlitAPIException), so the page leaves those to the next run.
SIDEBAR_KEYS = frozenset({*CONFIG_KEYS, *DIM_KEYS, "cfg_model", "dev_device", "dev_kernel"})


def collect(*, sidebar_drawn: bool = False) -> None:
    """Perform the session-state writes queued by operations (see progress.Queued).

    `sidebar_drawn`: called by a page, after this run drew the sidebar. A restore or
    an opened session that another run finished meanwhile queued the sidebar's
    fields too: those stay queued and the run starts again, so that `init` writes
    them before the sidebar is drawn.
    """
    if queued().apply(st.session_state, SIDEBAR_KEYS if sidebar_drawn else ()):
        st.rerun()


def get_engine() -> Engine:
    engine: Engine = st.session_state[ENGINE]
    return engine


def keep_result(key: str, engine: Engine, value: Any) -> None:
    """Keep `value`, computed on `engine`, under `key` until that engine is replaced."""
    st.session_state[key] = (weakref.ref(engine), value)


def kept_result(key: str, engine: Engine) -> Any:
    """What `keep_result` kept under `key` for `engine`, else None.

    A result computed on an engine the session has since replaced (a new session, a
    reset, a restore, new settings, another device) is forgotten: its step or operation count may
    match the new engine's, yet it describes other requests, even another model.
    """
    kept = st.session_state.get(key)
    if kept is None:
        return None
    ref, value = kept
    if ref() is not engine:
        del st.session_state[key]
        return None
    return value


def get_settings() -> Settings:
    settings: Settings = st.session_state[SETTINGS]
    return settings


def get_history() -> History:
    """Snapshots since the engine started or was restored, oldest first (see module doc)."""
    history: History = st.session_state[HISTORY]
    return history


def get_owner() -> str:
    owner: str = st.session_state[OWNER]
    return owner


def get_oplog() -> OpLog:
    """The operations since the engine started or was restored (see module doc)."""
    oplog: OpLog = st.session_state[OPLOG]
    return oplog


def snapshot_now(engine: Engine, history: History) -> dict[str, Any]:
    with engine.lock:
        latest = history.latest()
        if latest is not None and (latest["step"], latest["config"]["device"]) == (
                engine.step, engine.device.type):
            return latest
        return export_snapshot(engine)


def current_snapshot(engine: Engine) -> dict[str, Any]:
    """The engine's snapshot now, reusing the one recorded after the last operation.

    That record is current while the step is the same (every change of state is an
    operation) and the device too (a device switch restores the state elsewhere).
    Read under the engine's lock, so an operation running in another thread is seen
    either not at all or whole.
    """
    return snapshot_now(engine, get_history())


# ---- status line -------------------------------------------------------------

def flash(kind: FlashKind, text: str) -> None:
    st.session_state[FLASH] = (kind, text)


# ---- operations ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OpSession:
    """What an operation works with, read from session state before it changes anything:
    afterwards this run may no longer read there (see progress.Queued)."""

    engine: Engine
    settings: Settings
    history: History
    oplog: OpLog
    owner: str
    tab: saved.Tab
    queued: progress.Queued
    # How many times the session's engine or settings were replaced (`replace`).
    generation: int

    @staticmethod
    def read() -> OpSession:
        return OpSession(get_engine(), get_settings(), get_history(), get_oplog(),
                         get_owner(), store.get_tab(), queued(),
                         st.session_state.get(GENERATION, 0))

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

        The writes are queued (see progress.Queued), and the new session is recorded as
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
        after = OpSession(live.engine, live.settings, live.history, live.oplog, self.owner,
                          self.tab, q, self.generation + 1)
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
        self.queued.put(FLASH, (kind, text))


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
    return OpSession(new, record.settings, record.history, record.oplog, sess.owner,
                     sess.tab, sess.queued, record.generation)


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
    (its reads would raise: see progress.Queued). Yields None if the engine kept being
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


REPLACED_TOO_OFTEN = "The engine kept being replaced while this waited; try again."


# Builds a click's operation on the engine it will run on. Reads no session state: it
# runs after the wait for the engine's lock (see `apply`).
MakeOp = Callable[[Engine], Op]
# Queues what a click writes once its operation is applied (see progress.Queued).
AfterOp = Callable[[OpResult, progress.Queued], None]


def apply(prepare: Callable[[], MakeOp], after: AfterOp | None = None) -> None:
    """Build and apply one operation; a refusal becomes the page's error message.

    `prepare` reads the click's fields (session state) before anything waits, and
    returns what builds the operation once this run holds the engine's lock: a click
    that waited behind another operation still acts, even if a later click has
    superseded its run meanwhile. `after` queues the click's writes for an applied
    operation.

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
    with holding_current("wait", work, shown) as sess:
        if sess is None:
            flash("error", REPLACED_TOO_OFTEN)
        else:
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
    line = summarize(result, snapshot)
    if isinstance(op, Step) and isinstance(result.op, Step) and result.op.count < op.count:
        why = ": nothing was left to run" if engine.idle else ""
        line = f"Stopped after {result.op.count} of {op.count} iterations{why}. {line}"
    elif isinstance(op, Grow) and isinstance(result.op, Grow) and result.op.tokens < op.tokens:
        line = f"Stopped after {result.op.tokens} of {op.tokens} tokens. {line}"
    sess.flash("success", line)
    # Back to the live state: what the operation did is what the person wants to see.
    sess.queued.put(TIMELINE_PICK, None)
    sess.queued.put(STEP_PICK, None)
    return result
