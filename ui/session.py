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
reset, another kernel) are in ui/engine_actions.py; a restore is ui/restore.py.

History: the snapshot after each applied operation since the engine was
started or restored (`HISTORY`, a backend.sessions.history.History, which
keeps them as deltas and bounded), so a whole session can be downloaded as a
run.

Operations (`ui/operations.py`): one at a time under the engine's lock, their
writes queued and written here by `collect`.

Saved sessions: the operation log (`OPLOG`, a backend.sessions.oplog.OpLog)
records every applied operation, and after every change the session is saved
in the store (ui/store.py, backend/sessions/saved.py): its snapshot, settings,
history and log. The first run of a browser session reopens the session the
address names (or a copy, if it is another browser's), or else this
browser's latest one (ui/resume.py).
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any, Literal

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.io.snapshot import export_snapshot
from backend.sessions.history import MAX_STEPS, History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import (
    MODEL_FIELDS,
    Settings,
    build_engine,
    has_state,
    preset_of,
)
from backend.sessions.progress import Work
from ui import progress, reclaim, state_writes, store

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
    "focus_req": None, "focus_block": None, "grid_page": 0, "host_grid_page": 0,
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
# The status line's message: its kind, its words, its number, and the messages of the
# operations that ended while it waited its turn, shown above it (kind and words). Numbered
# so that the same words said again (a refusal repeated) are a new message to a screen
# reader (ui/a11y.py); process-wide, so that no two messages of a session share one.
Flash = tuple[FlashKind, str, int, tuple[tuple[FlashKind, str], ...]]
_FLASHES = itertools.count(1)


def flash_of(kind: FlashKind, text: str,
             earlier: tuple[tuple[FlashKind, str], ...] = ()) -> Flash:
    """A new status-line message."""
    return (kind, text, next(_FLASHES), earlier)


def flash_number(flash: Flash | None) -> int:
    """A message's number (0 for none): later messages have larger ones."""
    return 0 if flash is None else flash[2]


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
    an interrupted run queued land here first (see state_writes.Queued).
    """
    ss = st.session_state
    if QUEUED not in ss:
        ss[QUEUED] = state_writes.Queued(remembered=(FLASH,))
    collect()
    if OWNER not in ss:
        # Names this session's engines in the server's K/V budget.
        ss[OWNER] = secrets.token_hex(8)
    if progress.WORK not in ss:
        ss[progress.WORK] = Work()
        ctx = get_script_run_ctx()
        if ctx is not None:
            # So that the server's K/V limit can end this session once its tab has gone.
            reclaim.register(ss[OWNER], ctx.session_id, ss[progress.WORK])
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


def queued() -> state_writes.Queued:
    q: state_writes.Queued = st.session_state[QUEUED]
    return q


# The sidebar's fields, which app.py draws before the page: a write to one once it is
# drawn raises (StreamlitAPIException), so the page leaves those to the next run.
SIDEBAR_KEYS = frozenset({*CONFIG_KEYS, *DIM_KEYS, "cfg_model", "dev_device", "dev_kernel"})


def collect(*, sidebar_drawn: bool = False) -> None:
    """Perform the session-state writes queued by operations (see state_writes.Queued).

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
    st.session_state[FLASH] = flash_of(kind, text)
