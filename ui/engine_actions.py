"""Everything that replaces the session's engine, and its kernel changes.

The sidebar's fields describe an `EngineConfig` (ui/settings_fields.py); applying
one, a reset, a new session or a restored snapshot (ui/restore.py) builds a new engine
(`_replace_engine`) under the current engine's lock (`operations.holding_current`),
loading a real model's weights first with a progress bar, and installs it with
its settings, history and log (`install`); a device or kernel change keeps the
state on another kernel (`change_kernel`). A click meanwhile waits for the
lock, then acts on the new engine. The per-session state lives in ui/session.py,
the lock's rules in ui/operations.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import streamlit as st

from backend.core.config import GREEDY_BELOW, EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.io.snapshot import export_snapshot
from backend.sessions import saved
from backend.sessions.budget import SERVER_BUDGET
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import (
    Settings,
    build_engine,
    has_state,
    load_model,
    model_cards,
    model_loaded,
    switch_kernels,
)
from backend.sessions.progress import Work
from backend.views.text import plain_md
from ui import progress, state_writes, store
from ui.operations import REPLACED_TOO_OFTEN, OpSession, holding_current
from ui.progress import Shown
from ui.session import (
    CONFIRM_RESET,
    STEP_PICK,
    TIMELINE_PICK,
    collect,
    config_fields,
    flash,
    get_engine,
    get_owner,
    get_settings,
    snapshot_now,
    view_defaults,
)
from ui.settings_fields import fields_config

REQUEST_WIDGETS: dict[str, Any] = {"req_pick": None, "req_child": "", TIMELINE_PICK: None,
                                   STEP_PICK: None,
                                   # A Reset asked about the old engine's requests.
                                   CONFIRM_RESET: False,
                                   # The Playground's views' selections, live and past (the
                                   # Scenarios page's run is not this engine's).
                                   **view_defaults("", "past_")}


def install(live: saved.Live, sess: OpSession) -> OpSession:
    """Queue `live` as the session's (its engine, settings, history, log; see
    `OpSession.replace`); views of the old engine's requests reset. Returns the session
    that results. The caller performs the writes (`collect`)."""
    after = sess.replace(live)
    for key, value in REQUEST_WIDGETS.items():
        sess.queued.put(key, value)
    return after


def set_fields(settings: Settings, q: state_writes.Queued) -> None:
    """Queue the sidebar's fields to show `settings` (written before the sidebar is drawn)."""
    for key, value in config_fields(settings.config).items():
        q.put(key, value)
    q.put("dev_device", settings.device)
    q.put("dev_kernel", settings.kernel)


def load_weights(settings: Settings, work: Work) -> Shown:
    """Load the weights `settings`' model needs, with a progress bar: a real model's first
    use in this process reads and dequantizes its file (seconds); later ones share it.

    Call with the engine's lock held, as part of replacing it: a click meanwhile waits
    for the lock and then acts on the new engine, showing this load's progress (from
    `work`) while it waits. Raises PagedLabError (a missing package names its install
    command in one line). The caller calls the result's `finish` once its bookkeeping
    is done.
    """
    shown = Shown()
    if model_loaded(settings):
        return shown
    label = model_cards(settings.config)[settings.config.model].label
    # Plain text, as every progress text; a waiting run's bar adds the "…" itself
    # (ui/progress.py).
    work.begin(plain_md(f"Loading {label}"), stoppable=False)
    bar = shown.call(st.progress, 0.0, text=plain_md(f"Loading {label}…"))

    def report(fraction: float, message: str) -> None:
        text = plain_md(f"Loading {label}: {message}")
        work.report(text, fraction)
        if bar is not None:
            shown.call(bar.progress, min(1.0, max(0.0, fraction)), text=text)

    try:
        load_model(settings, report)
    finally:
        work.end()
        if bar is not None:
            shown.call(bar.empty)
    return shown


def departures(c: EngineConfig) -> str:
    """The cache, scheduler and sampling settings that differ from the defaults, for the
    line that announces a new or restored engine ("; at most 2 running, greedy")."""
    parts = []
    # Off after a scenario that turned it off (Continue in the Playground keeps a
    # scenario's settings): two same prompts then share nothing, which surprises.
    if not c.prefix_caching:
        parts.append("prefix caching off")
    if c.max_num_seqs is not None:
        parts.append(f"at most {c.max_num_seqs:,} running")
    if c.max_num_batched_tokens is not None:
        parts.append(f"{counted(c.max_num_batched_tokens, 'token')} a step")
    if c.watermark_blocks:
        parts.append(f"a watermark of {counted(c.watermark_blocks, 'block')}")
    if c.preemption == "swap":
        parts.append(f"swap preemption to {counted(c.num_cpu_blocks, 'host block')}")
    if c.temperature == 0:
        parts.append("greedy (temperature 0: every sample takes the most likely token)")
    elif c.temperature is not None and c.temperature < GREEDY_BELOW:
        parts.append(f"greedy (temperature {c.temperature:g}, under {GREEDY_BELOW:g}: every "
                     "sample takes the most likely token)")
    elif c.temperature is not None:
        parts.append(f"temperature {c.temperature:g}")
    if c.top_p is not None:
        parts.append(f"top-p {c.top_p:g}")
    return "; " + ", ".join(parts) if parts else ""


def _replace_engine(settings_for: Callable[[Settings], Settings], message: str, *,
                    detach: bool = False, keep: bool = False) -> None:
    """A fresh engine with `settings_for(the applied settings)`; `detach`: under a new
    session id (the old row stays); `keep`: the same where the old state has anything
    to keep, said in the message.

    Under the current engine's lock, weights included (`operations.holding_current`): an
    operation still running on it finishes (and is saved) first, one clicked meanwhile
    waits and then runs on the new engine, and a replacement clicked meanwhile replaces
    this one's engine, with its settings. Once the engine is built, nothing reads
    session state: a click during a weight load supersedes this run, whose reads would
    raise (ui/progress.py); the writes are queued.
    """
    work = progress.get_work()
    shown: list[Shown] = []
    loaded = Shown()
    with holding_current("replace", work, shown) as sess:
        if sess is None:
            flash("error", REPLACED_TOO_OFTEN)
        else:
            loaded, _ = _replace_held(sess, work, settings_for(sess.settings), message,
                                      detach, keep)
    collect()
    loaded.finish()
    for waited in shown:
        waited.finish()


def _replace_held(sess: OpSession, work: Work, settings: Settings, message: str,
                  detach: bool, keep: bool) -> tuple[Shown, OpSession]:
    """`_replace_engine` with the engine's lock held; the weight load's Shown, and the
    session that results (`sess` itself if the engine was not replaced)."""
    loaded = Shown()
    try:
        loaded = load_weights(settings, work)
        engine = build_engine(settings, sess.owner, replacing=sess.engine)
    except PagedLabError as exc:
        sess.flash("error", f"Refused: {exc}")
        return loaded, sess
    kept = kept_row(sess.tab, sess.engine) if keep else None
    if detach or kept is not None:
        sess.detach()
    elif sess.tab.id is None:
        # A copy not saved yet (another browser's link): the fresh engine is not that
        # session any more, and the address must stop naming it.
        sess.tab.address = None
    live = saved.Live(engine, settings, History(), OpLog())
    after = install(live, sess)
    sess.save(live, export_snapshot(engine), whole=True)
    c = settings.config
    model = "" if c.dims is None else f" on {c.model}"
    unsaved = (" This engine is saved from its first operation on; a reload before then "
               "reopens your latest saved session." if keep and _reload_reopens(sess.tab)
               else "")
    sess.flash("info", f"{message}: {counted(c.num_blocks, 'block')} of "
                       f"{counted(c.block_size, 'slot')}, {counted(c.num_layers, 'layer')}"
                       f"{model}, "
                       f"{c.dtype}, kernel {engine.kernels.name} on {engine.device}"
                       f"{departures(c)}." + kept_sentence(kept) + unsaved)
    return loaded, after


def _reload_reopens(tab: saved.Tab) -> bool:
    """Whether a reload now would reopen a saved session rather than this tab's engine:
    the tab has no row yet (an engine with no state gets none, OpSession.save) and the
    browser has a saved session. New settings applied meanwhile are then not kept, a
    surprise worth a sentence; with nothing saved, a reload gives the defaults, as a
    first visit does."""
    if tab.store is None or tab.id is not None:
        return False
    try:
        return tab.store.latest(tab.browser) is not None
    except PagedLabError:      # the store failed: it says so at the next save
        return False


class Kept(NamedTuple):
    """The saved row that keeps a state a replacement takes off the page: its id, and
    whether it holds that state whole (no save has failed since)."""

    id: str
    whole: bool


def kept_row(tab: saved.Tab, engine: Engine) -> Kept | None:
    """The row that keeps `engine`'s state when a replacement takes it off the page, or
    None: only a saved row (not an unsaved copy of another browser's session) of an
    engine something was done on. Read before `detach`, which forgets it."""
    if tab.store is None or tab.id is None or not has_state(engine):
        return None
    return Kept(tab.id, not tab.behind)


def kept_sentence(kept: Kept | None) -> str:
    """What the message adds about the replaced state: where it stays, and, when the
    store failed since, that the row holds an earlier step ('Not saved after step N'
    says which)."""
    if kept is None:
        return ""
    if kept.whole:
        return (f" The state it replaced stays saved as session {store.short(kept.id)}, "
                "under Recent sessions.")
    return (f" Session {store.short(kept.id)}, under Recent sessions, holds the state it "
            "replaced as last saved, before the operations that could not be saved.")


def apply_config(config: EngineConfig) -> None:
    """Start a new engine with `config`, under a new session id when the current one has
    state: that state stays saved, under Recent sessions, as a restore keeps the state
    it replaces (settings are no reason to lose work)."""
    _replace_engine(lambda s: Settings(config, s.device, s.kernel), "New engine",
                    keep=True)


def room_problem(config: EngineConfig) -> str | None:
    """Why the K/V budget has no room now for an engine with `config` in place of the
    session's, or None. Other sessions' engines count, so the answer changes without
    this session doing anything: the sidebar asks again on every run."""
    try:
        SERVER_BUDGET.check(config, get_owner(), replacing=get_engine())
    except PagedLabError as exc:
        return str(exc)
    return None


def is_applied(config: EngineConfig) -> bool:
    """Whether `config` is the running engine's. Compared as values: when a source file
    changes, Streamlit imports its module afresh, and an EngineConfig of the new class
    never equals one made before it (dataclass equality wants the same class)."""
    return config.to_json() == get_settings().config.to_json()


def waiting_config() -> EngineConfig | None:
    """Read before a click's operation waits for the engine: the config the sidebar's
    fields describe, where the engine has no state, the config differs from the applied
    one and the server has room for it (a pool that waited for room, a field changed in
    the same run as the click); else None. The sidebar would apply it at once, but it
    runs after the click's callback: the operation would act on the old engine and give
    it state, turning the change into a question that discards the click's work."""
    if engine_has_state():
        return None
    config, _ = fields_config()
    if config is None or is_applied(config):
        return None
    return config if room_problem(config) is None else None


def applying_first(config: EngineConfig) -> Callable[[OpSession, Work, list[Shown]], OpSession]:
    """`operations.apply`'s `first`: `config` applied with the engine's lock held, the
    session that results returned, unless, while the click waited, the engine took state
    or a run ahead of it applied settings (this config, or a later one of the fields':
    the click's, read before, is older)."""
    applied = get_settings().config.to_json()

    def first(sess: OpSession, work: Work, shown: list[Shown]) -> OpSession:
        if has_state(sess.engine) or sess.settings.config.to_json() != applied:
            return sess
        settings = Settings(config, sess.settings.device, sess.settings.kernel)
        loaded, after = _replace_held(sess, work, settings, "New engine", False, True)
        shown.append(loaded)
        # Its line stays above the operation's, as another operation's would: the
        # operation's own line would otherwise take its place (OpSession.flash).
        return dataclasses.replace(after, mine=set())
    return first


def apply_pending() -> None:
    """Callback of "Apply and reset": the confirmation."""
    config, _ = fields_config()
    if config is not None:
        apply_config(config)


def reset() -> None:
    """Callback of "Reset engine": a fresh engine with the applied settings."""
    _replace_engine(lambda s: s, "Engine reset")


def new_session() -> None:
    """Callback of "New session": an empty engine under a new address once it has state;
    the session it replaces stays saved, in the list."""
    _replace_engine(lambda s: s, "New session", detach=True)


def change_kernel() -> None:
    """Callback of the device and kernel fields: the same state on another kernel."""
    ss = st.session_state
    device, kernel_field = ss["dev_device"], ss["dev_kernel"]
    work = progress.get_work()
    shown: list[Shown] = []
    with holding_current("replace", work, shown) as sess:
        if sess is None:
            flash("error", REPLACED_TOO_OFTEN)
        else:
            _switch_held(sess, device, kernel_field or sess.settings.kernel)
    collect()
    for waited in shown:
        waited.finish()


def _switch_held(sess: OpSession, device: str, kernel: str) -> None:
    """`change_kernel` with the engine's lock held."""
    s = sess.settings
    try:
        engine = switch_kernels(sess.engine, device, kernel, sess.owner)
    except PagedLabError as exc:
        sess.queued.put("dev_device", s.device)
        sess.queued.put("dev_kernel", s.kernel)
        sess.flash("error", f"Refused: {exc}")
        return
    live = saved.Live(engine, Settings(s.config, device, kernel), sess.history, sess.oplog)
    sess.replace(live)
    sess.save(live, snapshot_now(engine, sess.history), whole=True)
    sess.flash("info", f"Kernel switched: the next model step runs on "
                       f"{engine.kernels.name} ({engine.device}); requests and blocks "
                       "are unchanged.")


def engine_has_state() -> bool:
    return has_state(get_engine())
