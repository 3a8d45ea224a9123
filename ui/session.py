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

History: the snapshot after each applied operation since the engine was
started or restored (`HISTORY`, a backend.sessions.history.History, which
keeps them as deltas and bounded), so a whole session can be downloaded as a
run.

One operation at a time: Streamlit may run a second click's callback while
the first is still running (fast reruns), so `apply` holds the engine's lock
from building the operation to recording its snapshot, and the page holds it
while it reads the state. An operation that fails half-way is undone by
rebuilding the engine from the snapshot before it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal

import streamlit as st

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Op
from backend.engine.results import OpResult
from backend.io.snapshot import export_snapshot
from backend.sessions.history import MAX_STEPS, History
from backend.sessions.playground import (
    MODEL_FIELDS,
    MODEL_PRESETS,
    Settings,
    apply_or_recover,
    build_engine,
    config_from_fields,
    has_state,
    preset_of,
    restore_for_session,
    summarize,
    switch_kernels,
)

ENGINE = "engine"
SETTINGS = "settings"
FLASH = "flash"
PENDING = "config_pending"
HISTORY = "history"
OWNER = "kv_owner"
MAX_HISTORY = MAX_STEPS

DEFAULT_PROMPT = "The cat sat on the mat."

# Sidebar field -> EngineConfig field.
CONFIG_KEYS = {
    "cfg_num_blocks": "num_blocks", "cfg_block_size": "block_size",
    "cfg_allocation": "allocation", "cfg_prefix_caching": "prefix_caching",
    "cfg_num_layers": "num_layers", "cfg_num_heads": "num_heads",
    "cfg_num_kv_heads": "num_kv_heads", "cfg_head_dim": "head_dim", "cfg_dtype": "dtype",
    "cfg_seed": "seed", "cfg_max_new": "max_new_tokens",
}

# The panels' own widgets (highlight, page, translator), keyed by a per-page prefix so
# that each page drawing the views keeps its own selection. "" is the Playground's.
VIEW_DEFAULTS: dict[str, Any] = {
    "focus_req": None, "focus_block": None, "grid_page": 0,
    "tr_req": None, "tr_pos": 0, "tr_layer": 0,
}
VIEW_PREFIXES = ("", "tour_")

FlashKind = Literal["error", "success", "info"]


def config_fields(config: EngineConfig) -> dict[str, Any]:
    """The sidebar's field values that show `config`."""
    out: dict[str, Any] = {key: getattr(config, name) for key, name in CONFIG_KEYS.items()}
    out["cfg_model"] = preset_of(config)
    return out


def _widget_defaults(settings: Settings) -> dict[str, Any]:
    return {
        **config_fields(settings.config),
        "dev_device": settings.device, "dev_kernel": settings.kernel,
        # Add form.
        "add_id": "", "add_prompt": DEFAULT_PROMPT, "add_len": None, "add_max_new": None,
        "add_pins": "",
        # Per-request and batch controls.
        "req_pick": None, "req_grow_n": 1, "req_child": "", "batch_n": 4,
        # Views, once per page that draws them (see VIEW_PREFIXES).
        **{f"{prefix}{key}": value for prefix in VIEW_PREFIXES
           for key, value in VIEW_DEFAULTS.items()},
    }


def init() -> None:
    """Initialise this session's state. Guarded: sets only keys that are missing.

    Widget keys are seeded here rather than through `value=` so that callbacks
    may set them (a widget given both warns); a key Streamlit dropped because
    its widget was not drawn on the last page is simply seeded again.
    """
    ss = st.session_state
    if OWNER not in ss:
        # Names this session's engines in the server's K/V budget.
        ss[OWNER] = secrets.token_hex(8)
    if SETTINGS not in ss:
        ss[SETTINGS] = Settings()
    if ENGINE not in ss:
        ss[ENGINE] = build_engine(ss[SETTINGS], ss[OWNER], check=False)
    if HISTORY not in ss:
        ss[HISTORY] = History()
    for key, value in _widget_defaults(ss[SETTINGS]).items():
        if key not in ss:
            ss[key] = value


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


def current_snapshot(engine: Engine) -> dict[str, Any]:
    """The engine's snapshot now, reusing the one recorded after the last operation.

    That record is current while the step is the same (every change of state is an
    operation) and the device too (a device switch restores the state elsewhere).
    Read under the engine's lock, so an operation running in another thread is seen
    either not at all or whole.
    """
    with engine.lock:
        latest = get_history().latest()
        if latest is not None and (latest["step"], latest["config"]["device"]) == (
                engine.step, engine.device.type):
            return latest
        return export_snapshot(engine)


# ---- status line -------------------------------------------------------------

def flash(kind: FlashKind, text: str) -> None:
    st.session_state[FLASH] = (kind, text)


# ---- operations ---------------------------------------------------------------

def apply(make_op: Callable[[Engine], Op]) -> OpResult | None:
    """Build and apply one operation; a refusal becomes the page's error message.

    The engine validates before it changes anything, so after a refusal the
    state is exactly as it was. Anything else is a failure half-way: the engine
    is rebuilt in the state before the operation and the page says so.
    """
    engine = get_engine()
    with engine.lock:
        try:
            before = current_snapshot(engine)
            applied = apply_or_recover(engine, make_op(engine), before, get_settings(),
                                       get_owner())
        except PagedLabError as exc:
            flash("error", f"Refused: {exc}")
            return None
        if applied.result is None:
            st.session_state[ENGINE] = applied.engine
            flash("error", f"The operation failed half-way ({applied.failure}); the engine "
                           f"was put back to the state before it, step {applied.engine.step}.")
            return None
        get_history().record(export_snapshot(engine))
    flash("success", summarize(applied.result))
    return applied.result


# ---- settings -----------------------------------------------------------------

def fields_config() -> tuple[EngineConfig | None, str | None]:
    """The config the sidebar's fields describe, or the reason they describe none."""
    ss = st.session_state
    fields = {name: ss[key] for key, name in CONFIG_KEYS.items() if key in ss}
    try:
        return config_from_fields(fields, get_settings().config), None
    except PagedLabError as exc:
        return None, str(exc)


def _clear_request_widgets() -> None:
    ss = st.session_state
    for key in ("req_pick", "focus_req", "focus_block", "tr_req"):
        ss[key] = None
    ss["req_child"] = ""
    ss["tr_pos"] = 0
    ss["grid_page"] = 0


def _install(engine: Engine, settings: Settings, history: History) -> None:
    """Make `engine` the session's engine; views of the old one's requests reset."""
    ss = st.session_state
    ss[ENGINE] = engine
    ss[SETTINGS] = settings
    ss[HISTORY] = history
    ss["tr_layer"] = 0
    _clear_request_widgets()


def _replace_engine(settings: Settings, message: str) -> None:
    try:
        engine = build_engine(settings, get_owner(), replacing=get_engine())
    except PagedLabError as exc:
        flash("error", f"Refused: {exc}")
        return
    _install(engine, settings, History())
    c = settings.config
    flash("info", f"{message}: {c.num_blocks} blocks of {c.block_size} slots, "
                  f"{c.num_layers} layers, {c.dtype}, kernel {engine.kernels.name} on "
                  f"{engine.device}.")


def restore_snapshot(data: dict[str, Any], source: str) -> str | None:
    """Replace the engine by the exact state a snapshot describes.

    Returns None on success (the status line says what was restored), else
    the reason it was refused, with the current engine kept. For callbacks
    only: it also sets the sidebar's fields to the snapshot's config, which
    Streamlit allows only before the sidebar is drawn. The device and kernel
    stay the sidebar's. `source` names where the snapshot came from.
    """
    ss = st.session_state
    s = get_settings()
    try:
        engine = restore_for_session(data, s, get_owner(), replacing=get_engine())
    except PagedLabError as exc:
        return str(exc)
    history = History()
    history.record(export_snapshot(engine))
    _install(engine, Settings(engine.config, s.device, s.kernel), history)
    for key, value in config_fields(engine.config).items():
        ss[key] = value
    c = engine.config
    flash("success", f"Restored {source}: step {engine.step}, {len(engine.requests)} "
                     f"request(s), {c.num_blocks} blocks of {c.block_size} slots, K/V "
                     f"recomputed from the tokens. Keep working from here.")
    return None


def apply_config(config: EngineConfig) -> None:
    """Start a new engine with `config` (the current state is discarded)."""
    s = get_settings()
    _replace_engine(Settings(config, s.device, s.kernel), "New engine")


def apply_pending() -> None:
    """Callback of "Apply and reset": the confirmation."""
    config, _ = fields_config()
    if config is not None:
        apply_config(config)


def keep_current() -> None:
    """Callback of "Keep current": put the fields back to the applied config."""
    for key, value in config_fields(get_settings().config).items():
        st.session_state[key] = value


def reset() -> None:
    """Callback of "Reset engine": a fresh engine with the applied settings."""
    _replace_engine(get_settings(), "Engine reset")


def change_kernel() -> None:
    """Callback of the device and kernel fields: the same state on another kernel."""
    ss = st.session_state
    s = get_settings()
    device, kernel = ss["dev_device"], ss["dev_kernel"] or s.kernel
    try:
        ss[ENGINE] = switch_kernels(get_engine(), device, kernel)
    except PagedLabError as exc:
        ss["dev_device"], ss["dev_kernel"] = s.device, s.kernel
        flash("error", f"Refused: {exc}")
        return
    ss[SETTINGS] = Settings(s.config, device, kernel)
    engine = get_engine()
    flash("info", f"Kernel switched: the next model step runs on {engine.kernels.name} "
                  f"({engine.device}); requests and blocks are unchanged.")


def model_preset_changed() -> None:
    """Callback of the model-size field: fill in that preset's dimensions."""
    ss = st.session_state
    preset = MODEL_PRESETS.get(ss["cfg_model"])
    if preset is not None:
        for name in MODEL_FIELDS:
            ss[f"cfg_{name}"] = preset[name]


def model_dims_changed() -> None:
    """Callback of the four dimension fields: name the preset they match, if any."""
    ss = st.session_state
    dims = {name: ss[f"cfg_{name}"] for name in MODEL_FIELDS}
    ss["cfg_model"] = next((n for n, p in MODEL_PRESETS.items() if p == dims), "custom")


def engine_has_state() -> bool:
    return has_state(get_engine())
