"""A Playground tab and its saved session: open, resume, save after each operation, copy.

The rules (ui/store.py is the Streamlit side; the store is backend/sessions/store.py):

- A session gets a row, and an id in the address, once it has state: a
  visitor who never acts leaves nothing behind.
- Whose a row is: each browser keeps a random secret (a cookie) and a row
  stores its SHA-256. Opening a row of the same browser resumes it; any other
  browser's opens a *copy* (the same state), so a shared link never lets two
  people drive one engine. The copy gets its row, under a new id, at its first
  save, like any new session: a class opening one link writes nothing, and so
  pushes no session (the original least of all) past the store's limits.
- One tab writes a row: the last to open it (`holder`), provided the row was
  still as that tab read it when it took it over; else that tab goes on as a
  copy at its first save. A tab whose row was opened by another tab meanwhile
  (a second tab on the same link) finds out on its next save, and goes on as a
  copy under a new id, with a message. A tab that reopened the browser's latest
  session for a bare address takes it over only at its first save.
- A row that cannot be read back, or whose state the restore refuses, is
  refused with the reason; nothing is changed, neither the store nor the tab.
- After an operation only what changed is written (the row's head, one op,
  one history step); after a start, a restore, a copy or a failed save, all.

Everything here takes its objects as arguments; nothing imports Streamlit.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io.recompute import Progress as RestoreProgress
from backend.io.snapshot import CONFIG_EXTRA, export_snapshot
from backend.sessions.budget import SERVER_BUDGET, KVBudget
from backend.sessions.history import History
from backend.sessions.oplog import OpLog, op_bytes
from backend.sessions.playground import (
    Settings,
    device_choices,
    kernel_choices,
    restore_for_session,
)
from backend.sessions.rows import (
    Full,
    StoredSession,
    StoreError,
    StoreLimits,
    StoreUnavailableError,
    TooLargeError,
    make_full,
    make_head,
    make_step,
    op_text,
)
from backend.sessions.store import SessionStore, Write

Snapshot = dict[str, Any]


def new_id() -> str:
    """A fresh session id or browser secret: 192 random bits, 32 URL-safe characters."""
    return secrets.token_urlsafe(24)


@dataclass(slots=True)
class Live:
    """A tab's live session: what is saved, and what a saved row becomes again."""

    engine: Engine
    settings: Settings
    history: History
    oplog: OpLog


@dataclass(slots=True)
class Tab:
    """One tab's link to its row. `id` is None until the session has state."""

    store: SessionStore | None
    browser: str                   # browser_key of this browser's secret
    holder: str = field(default_factory=new_id)
    id: str | None = None
    synced: bool = False           # the row holds everything up to the last operation
    # A save failed since the row last held this tab's state: the row holds an earlier
    # step. Not the same as `synced` being False, which a row not taken over yet (see
    # `pending_claim`) also is, while it holds exactly the state shown.
    behind: bool = False
    # The row holds the state, but left out what could not be read back when it was
    # opened (its history or operation log): the next save writes it whole.
    rewrite: bool = False
    # While `id` is None, the id the address keeps naming: another browser's session
    # opened as a copy not saved yet, or one that could not be opened for a passing
    # reason (the store locked or unavailable), so that a reload opens it again.
    address: str | None = None
    # The row is this tab's to write but not taken over yet (reopened for a bare
    # address, or the store was locked): the row's revision when this tab read it.
    # The next save takes it over only if the row has not moved on since (then
    # writes it whole); else this tab goes on as a copy, and nothing newer is lost.
    pending_claim: int | None = None
    # Reopened for a bare address and not taken over yet: the address stays bare, so a
    # reload is again a bare address (a link naming the session would take it at once).
    unnamed: bool = False

    def start_anew(self, address: str | None = None) -> None:
        """Mutates: this tab has no row (its next save creates one, under a new id); the
        address names `address` meanwhile (a copy's link), or nothing."""
        self.id, self.synced, self.address = None, False, address
        self.pending_claim, self.unnamed, self.rewrite = None, False, False
        self.behind = False

    def keep_in_address(self, sid: str) -> bool:
        """Mutates: `sid`, which the address named, could not be opened for a passing
        reason; while this tab has no session of its own (nor a copy's link), its
        address keeps naming `sid`, so a reload tries it. Whether it does."""
        if self.id is None and self.address is None:
            self.address = sid
        return self.shown_id == sid

    @property
    def shown_id(self) -> str | None:
        """The session id the page's address should hold."""
        if self.unnamed:
            return None
        return self.id if self.id is not None else self.address


def settings_json(settings: Settings) -> dict[str, Any]:
    return {"config": settings.config.to_json(), "device": settings.device,
            "kernel": settings.kernel}


def settings_from_json(data: dict[str, Any]) -> tuple[Settings, list[str]]:
    """Saved settings, and what had to change: a device or kernel this machine lacks
    becomes "auto". Raises PagedLabError for a malformed config."""
    config = EngineConfig.from_json(data.get("config"), where="its settings' config")
    notes = []
    device, kernel = data.get("device"), data.get("kernel")
    if device not in device_choices():
        notes.append(f"it ran on device {device!r}, which this server lacks: it runs on auto")
        device = "auto"
    if kernel not in kernel_choices():
        notes.append(f"its kernel {kernel!r} is unknown here: it runs on auto")
        kernel = "auto"
    assert isinstance(device, str) and isinstance(kernel, str)
    return Settings(config, device, kernel), notes


def label_of(snapshot: Snapshot) -> str:
    """A line saying what a session holds, for a list of sessions (plain text)."""
    c = snapshot["config"]
    n = len(snapshot["requests"])
    model = c.get("model", "tiny-byte")
    return (f"{counted(n, 'request')} · {counted(c['num_blocks'], 'block')} of "
            f"{c['block_size']:,} · {model}")


def _full(live: Live, snapshot: Snapshot, limits: StoreLimits) -> Full:
    head = make_head(settings_json(live.settings), snapshot, label_of(snapshot), limits)
    log = live.oplog
    return make_full(head, log.base, log.ops, log.complete,
                     [make_step(s) for s in live.history])


# ---- resuming ----------------------------------------------------------------------------

def detached(snapshot: Snapshot) -> Snapshot:
    """`snapshot` with its requests' token lists copied, for `restore_engine`.

    `restore_engine` now copies each request's tokens itself (a restored
    engine's decoding never reaches the caller's snapshot), so this copy is
    only a second guard, kept while callers (ui/session.py) still use it.
    Anything malformed is passed on as it is, for the restore to name.
    """
    requests = snapshot.get("requests")
    if not isinstance(requests, list):
        return snapshot
    return {**snapshot, "requests": [
        {**r, "tokens": list(r["tokens"])}
        if isinstance(r, dict) and isinstance(r.get("tokens"), list) else r
        for r in requests]}


def _history(stored: StoredSession) -> tuple[History, str | None]:
    """The history the row keeps, up to the step before its snapshot's at most; or, if
    it cannot be read back, none and why (the session opens without it)."""
    if stored.history_problem is not None:
        return History(), stored.history_problem
    events = stored.snapshot["events"]
    history = History()
    try:
        for _, body, n in stored.steps:
            history.record({k: (events[:n] if k == "events" else v) for k, v in body.items()},
                           saved=True)
    except (KeyError, TypeError, AttributeError):
        return History(), "its history is damaged"
    last = history.latest()
    if last is not None and last["step"] == stored.snapshot.get("step") \
            and last != stored.snapshot:
        return History(), "its history's last step differs from its snapshot"
    return history, None


def _oplog(stored: StoredSession, config: EngineConfig, step: int) -> tuple[OpLog, str | None]:
    """The operation log the row keeps; or, if it cannot be read back, one not kept and
    why (the session opens without it: only a scenario export needs it)."""
    problem = stored.ops_problem
    if problem is None:
        try:
            return _checked_oplog(stored, config, step), None
        except PagedLabError as exc:
            problem = str(exc)
    log = OpLog()
    log.drop(f"its operation log was found damaged when the session was opened ({problem})")
    return log, problem


def _checked_oplog(stored: StoredSession, config: EngineConfig, step: int) -> OpLog:
    log = OpLog(stored.base, [], stored.ops_complete)
    if stored.base is not None:
        try:
            base_config = EngineConfig.from_json(stored.base.get("config"), ignore=CONFIG_EXTRA)
        except PagedLabError as exc:
            raise StoreError(f"its base snapshot: {exc}") from None
        if base_config.to_json() != config.to_json():
            raise StoreError("its base snapshot has other settings than its engine")
    if not stored.ops_complete:
        return log
    for i, op in enumerate(stored.ops):
        try:
            parse_op(op, vocab_size=config.vocab_size)
        except PagedLabError as exc:
            raise StoreError(f"the operation of step {log.base_step + i + 1}: {exc}") from None
    log.ops = list(stored.ops)
    log.nbytes = sum(op_bytes(o) for o in log.ops)
    if log.base_step + len(log.ops) != step:
        raise StoreError(f"it ends at step {log.base_step + len(log.ops)} but the snapshot is "
                         f"step {step}")
    return log


def resume(stored: StoredSession, owner: str, *, replacing: Engine | None = None,
           budget: KVBudget = SERVER_BUDGET,
           progress: RestoreProgress | None = None) -> tuple[Live, list[str]]:
    """The live session a row describes, and notes on what differs from when it was saved.

    The engine is restored exactly from the snapshot (K/V recomputed from the
    tokens) on the saved device and kernel, counted against `owner`'s K/V
    budget with `replacing` given back. Raises PagedLabError (StoreError for
    a damaged row) naming the problem; then nothing was built. A history of
    earlier steps, or an operation log, that cannot be read back is left out,
    with a note: the snapshot holds the session whole.
    """
    live, notes, _ = _resume(stored, owner, replacing=replacing, budget=budget,
                             progress=progress)
    return live, notes


def _resume(stored: StoredSession, owner: str, *, replacing: Engine | None,
            budget: KVBudget, progress: RestoreProgress | None
            ) -> tuple[Live, list[str], bool]:
    """`resume`, and whether the row's history or operation log was left out (the row is
    then written anew, whole, at the next save)."""
    try:
        settings, notes = settings_from_json(stored.settings)
    except PagedLabError as exc:
        raise StoreError(str(exc)) from None
    # Everything that is only data is checked before the (costly) restore.
    history, damaged = _history(stored)
    if damaged is not None:
        notes.append(f"its earlier steps could not be read back ({damaged}), so it opens "
                     "without them: its timeline's past states start at this step, and "
                     "the next save writes the session whole")
    oplog, lost = _oplog(stored, settings.config, stored.snapshot["step"])
    if lost is not None:
        notes.append(f"its operation log is damaged ({lost}), so it opens without it: its "
                     "state is whole, but it can no longer be exported as a scenario or "
                     "replayed in a control run, and the next save writes the session "
                     "whole")
    # The engine's own export: its beams' scores are taken as they are (restore_engine).
    engine = restore_for_session(detached(stored.snapshot), settings, owner,
                                 replacing=replacing, budget=budget, progress=progress,
                                 check_scores=False)
    if engine.config.to_json() != settings.config.to_json():
        raise StoreError("its settings and its snapshot describe different engines")
    # The engine's own export ends the history: the stored snapshot, unless it ran
    # on another device (then the config's device differs, and so does this).
    now = export_snapshot(engine)
    if history.latest() != now:
        history.record(now)
    else:
        history.mark_own(-1)      # it is the engine's own export
    if stored.note:
        notes.append(stored.note)
    return Live(engine, settings, history, oplog), notes, damaged is not None or lost is not None


@dataclass(frozen=True, slots=True)
class Opened:
    live: Live
    copied: bool        # another browser's session: a copy, saved under a new id at its
                        # first save
    notes: list[str]
    # Its history or operation log could not be read back and was left out (a note
    # says which): the state is whole, but the page says it as news, not as a success.
    damaged: bool = False


def open_saved(tab: Tab, sid: str, owner: str, *, replacing: Engine | None = None,
               budget: KVBudget = SERVER_BUDGET, progress: RestoreProgress | None = None,
               take_now: bool = True) -> Opened | None:
    """Mutates `tab` (and the store) on success: open the saved session `sid` in this tab.

    None if there is no such unexpired row. The same browser's row is
    resumed under its id (this tab writes it from now on); another browser's
    is copied (saved under a new id at its first save). Raises PagedLabError naming
    why a row cannot be opened; then neither the tab nor the store changed.

    `take_now=False` (a bare address reopening the browser's latest session)
    takes the row over at this tab's first save, not now, and only if the row has
    not moved on meanwhile (`Tab.pending_claim`): a tab opened only to read, or on
    another page, leaves a tab working on that session undisturbed.
    """
    store = tab.store
    if store is None:
        return None
    stored = store.load(sid)
    if stored is None:
        return None
    live, notes, rewrite = _resume(stored, owner, replacing=replacing, budget=budget,
                                   progress=progress)
    copied = not stored.owned_by(tab.browser)
    if copied:
        # Its row comes with its first save (see the module doc).
        tab.start_anew(address=sid)
    else:
        claimed = False
        # Taken only as read: another tab may have saved while this one restored
        # (seconds, for a real model); this tab's next save then finds the row moved on
        # and goes on as a copy, rather than writing its steps on top of that tab's
        # newer ones. A store locked meanwhile leaves it to that save too.
        if take_now:
            with contextlib.suppress(StoreUnavailableError):
                claimed = store.claim(sid, tab.holder,
                                      if_unchanged=stored.revision)
        # Not taken over yet, the row may move on under the tab that holds it: the first
        # save takes it, then writes it whole.
        # A history or log that could not be read back is written anew, whole, at the
        # next save; the row still holds the state meanwhile.
        tab.id, tab.synced, tab.address, tab.rewrite = sid, claimed, None, rewrite
        tab.pending_claim = None if claimed else stored.revision
        tab.unnamed, tab.behind = not take_now, False
    return Opened(live, copied, notes, rewrite)


# ---- saving ------------------------------------------------------------------------------

MOVED_ON_NOTE = ("This session changed in another tab (or left the saved sessions) after this "
                 "tab opened it; this tab goes on as a copy under a new address, and the "
                 "saved session keeps the other tab's work.")
COPY_NOTE = ("This session was opened in another tab, which saves it from now on; this tab "
             "goes on as a copy under a new address.")
REVIVED_NOTE = ("This session had left the saved sessions (deleted in another tab, or dropped as "
                "the least recently used past the store's limits); this tab saved it again, so "
                "it is back in the list. Delete it there once this tab is closed.")


def row_standing(tab: Tab) -> Literal["taken", "gone"] | None:
    """What became of the row this tab writes, as its next save will find it: "taken"
    (another tab opened it and saves it now: this tab goes on as a copy), "gone" (deleted
    in another tab, or pruned: this tab saves it again), or None (this tab's, or not known:
    no row yet, one not taken over yet, or the store unreadable). Reads one column, so a
    page can say it before that save, where it would otherwise call the row its own."""
    if tab.store is None or tab.id is None or tab.pending_claim is not None:
        return None
    try:
        holder = tab.store.holder(tab.id)
    except StoreError:
        return None
    if holder is None:
        return "gone"
    return None if holder == tab.holder else "taken"


def save(tab: Tab, live: Live, snapshot: Snapshot, *, op: dict[str, Any] | None = None,
         whole: bool = False) -> str | None:
    """Mutates the store: save `live` (whose snapshot now is `snapshot`) after a change.

    `op` is the operation just logged (None when the log is not kept);
    `whole` writes everything (the engine started again, was restored or
    switched devices). Returns a message for the person (the tab became a
    copy, or the save failed and why), or None. Never raises: a failed save
    leaves the live session as it is and the next save writes it whole.
    """
    store = tab.store
    if store is None:
        return None
    try:
        if tab.id is None:
            sid = new_id()
            store.create(sid, tab.browser, tab.holder, _full(live, snapshot, store.limits))
            tab.id, tab.synced, tab.address, tab.behind = sid, True, None, False
            return None
        if tab.pending_claim is not None:
            if not store.claim(tab.id, tab.holder, if_unchanged=tab.pending_claim):
                # A new session first: if writing it fails, the tab is an unsaved one
                # with a bare address, not one naming the row another tab holds.
                tab.start_anew()
                copy = new_id()
                store.create(copy, tab.browser, tab.holder, _full(live, snapshot, store.limits))
                tab.id, tab.synced, tab.rewrite, tab.behind = copy, True, False, False
                return MOVED_ON_NOTE
            tab.pending_claim, tab.unnamed = None, False
        outcome = Write.MISSING
        if tab.synced and not whole and not tab.rewrite:
            head = make_head(settings_json(live.settings), snapshot, label_of(snapshot),
                             store.limits)
            log = live.oplog
            # The row holds the log up to the operation before: this one is the last.
            entry = None if op is None else (len(log.ops) - 1, op_text(op))
            latest = live.history.latest()
            step = make_step(latest) if latest is not None and latest["step"] == snapshot[
                "step"] else None
            keep_from = live.history[0]["step"] if len(live.history) else None
            outcome = store.write_op(tab.id, tab.holder, head, entry, step, keep_from,
                                     log.complete)
        if outcome is Write.MISSING:
            outcome = store.write_full(tab.id, tab.browser, tab.holder,
                                       _full(live, snapshot, store.limits))
        if outcome is Write.TAKEN:
            copy = new_id()
            store.create(copy, tab.browser, tab.holder, _full(live, snapshot, store.limits))
            tab.id, tab.synced, tab.rewrite, tab.behind = copy, True, False, False
            return COPY_NOTE
        tab.synced, tab.rewrite, tab.behind = True, False, False
        return REVIVED_NOTE if outcome is Write.REVIVED else None
    except TooLargeError as exc:
        tab.synced, tab.behind = False, True
        note = f"Not saved after step {snapshot['step']}: {exc}. Download its snapshot to keep it."
        if tab.id is not None:
            # The row keeps its last good state; opening it says why it is behind.
            with contextlib.suppress(StoreError):
                store.set_note(tab.id, tab.holder, f"it was saved up to an earlier step: {exc}")
        return note
    except StoreError as exc:
        tab.synced, tab.behind = False, True
        return f"Not saved after step {snapshot['step']}: {exc}."
