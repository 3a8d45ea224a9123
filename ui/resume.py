"""Opening saved sessions in this tab: on a browser session's first run, from the list, anew.

The first run of every browser session (a reload, a link, a restarted server)
calls `at_start`: the session the address names is reopened (or copied, if it
is another browser's: backend/sessions/saved.py has the rules); an address
that names none reopens this browser's latest session; a bad or unknown id is
reported and changes nothing. The list's Open buttons call `open_other`.
Each replaces the engine under the old one's lock, as every replacement
does (ui/operations.py).
"""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.sessions import saved
from backend.sessions.progress import SESSION_RUNS, Work
from backend.sessions.rows import StoreDamagedError, StoreUnavailableError
from backend.views.text import notes_text
from ui import engine_actions, history, operations, progress, session, store
from ui.progress import Shown

STARTED = "store_started"   # set once the first run's reopening was tried
# How long opening a session waits for another page's run on it to stop and save: one
# iteration of a step, or one token of a grow, even a real model's at a large batch.
STOP_WAIT_S = 20.0


def _describe(engine: Engine) -> str:
    """"step 9, 5 requests, 32 blocks of 4 slots", and a real model's name (as a new
    engine's line says it: tiny-byte, the default, goes unnamed)."""
    c = engine.config
    model = "" if c.dims is None else f" on {c.model}"
    return (f"step {engine.step}, {counted(len(engine.requests), 'request')}, "
            f"{counted(c.num_blocks, 'block')} of {counted(c.block_size, 'slot')}{model}")


def _load_model_of(sess: operations.OpSession, sid: str, work: Work) -> Shown:
    """Load the weights saved session `sid`'s model needs, with the progress bar a
    first load shows (with the engine's lock held: see engine_actions.load_weights).
    A row that cannot be read is left to `_open` to report."""
    try:
        stored = sess.tab.store.load(sid) if sess.tab.store is not None else None
        if stored is None:
            return Shown()
        settings, _ = saved.settings_from_json(stored.settings)
        return engine_actions.load_weights(settings, work)
    except PagedLabError:
        return Shown()


def _open(sess: operations.OpSession, sid: str, take_now: bool = True
          ) -> tuple[saved.Opened | str, Shown]:
    """Open saved session `sid` in this tab (installed), or the message saying why not;
    and the Shown of its progress bar, for the caller to finish after its bookkeeping.

    Call with the current engine's lock held. On success the sidebar's fields
    show the opened session's settings (so: before the sidebar is drawn).
    Session state was read before (`sess`); writes go through the queue (see
    state_writes.Queued).
    """
    q = sess.queued
    tab = sess.tab
    with progress.restoring(f"Opening saved session {store.short(sid)}: restoring its "
                            "state, K/V recomputed from the tokens") as (shown, moved):
        try:
            opened = saved.open_saved(tab, sid, sess.owner, replacing=sess.engine,
                                      progress=moved, take_now=take_now)
        except StoreUnavailableError as exc:
            # A problem of the store, not of the session: an address that named it keeps
            # it, so that a reload tries again once the store works.
            opened = None
            keeps = take_now and tab.keep_in_address(sid)
            if isinstance(exc, StoreDamagedError):
                # Waiting mends nothing: whoever runs the server must mend or move the file.
                when = ""
                again = ("the address still names it, for once the file is mended" if keeps
                         else "the file needs mending by whoever runs this server")
            else:
                when = " just now"
                again = ("the address still names it: reload to try again" if keeps
                         else "try again in a moment")
            problem = (f"Saved session {store.short(sid)} could not be opened{when}: "
                       f"{exc}. It is left as it was; {again}.")
        except PagedLabError as exc:
            opened = None
            problem = (f"Saved session {store.short(sid)} could not be opened: {exc}. It is "
                       "left as it was.")
        else:
            if opened is None and tab.store is None:
                kept = take_now and tab.keep_in_address(sid)
                problem = (f"Saved session {store.short(sid)} could not be opened: sessions "
                           "are not saved on this server just now (the note at the top says "
                           "why)." + (" The address still names it: reload once that is "
                                      "mended." if kept else ""))
            elif opened is None:
                problem = (f"No saved session {store.short(sid)}: it may have expired or "
                           "been deleted.")
            else:
                problem = ""
        if opened is not None:
            engine_actions.install(opened.live, sess)
            engine_actions.set_fields(opened.live.settings, q)
            q.put(store.NOTE, None)
    return (opened if opened is not None else problem), shown


def _stop_other_page(sess: operations.OpSession, sid: str, work: Work) -> str:
    """Stop what another page of this browser runs on `sid` (see SessionRuns), waiting
    for it to save; the note that says so, or ""."""
    rows = sess.tab.store
    try:
        holder = None if rows is None else rows.holder(sid)
    except PagedLabError:
        return ""     # opening it will say what is wrong with the store
    if rows is None or holder is None:
        return ""
    stopped = SESSION_RUNS.stop_and_wait(sid, sess.tab.browser, holder, work, STOP_WAIT_S)
    if stopped is None:
        return ""
    try:
        still = rows.holder(sid) == holder
    except PagedLabError:
        still = False
    if not still:
        # Another tab took the session meanwhile: what the stopped run saved went to a
        # copy, or was overtaken; opening it says what the session holds now.
        return (" This session's other page was stopped, and another tab took the session "
                "meanwhile: this is the state that tab saved.")
    state = stopped.state
    what = "an operation" if state is None else f"“{state.label}”"
    if state is not None and state.total > 1:
        what += f" ({state.unit} {state.done:,} of {state.total:,} when this page opened)"
    where = "This session's other page (this one before a reload, or another tab)"
    if stopped.ended:
        return (f" {where} was in the middle of {what}: it was stopped after its current "
                f"{'iteration' if state is None else state.unit} and saved first, so this "
                "is the state it reached.")
    return (f" {where} was in the middle of {what}, which did not stop within "
            f"{STOP_WAIT_S:.0f} s: this is the state saved before it, and what it does "
            "is saved as a copy.")


def _say_opened(sess: operations.OpSession, opened: saved.Opened, how: str,
                stopped: str = "") -> None:
    engine = opened.live.engine
    notes = notes_text(opened.notes) + stopped
    if opened.copied:
        sess.flash("info", f"This link is another browser's session: you are working on a "
                           f"copy of it ({_describe(engine)}), saved under a new address "
                           f"from your first operation on; the original is unchanged."
                           f"{notes}")
    else:
        # Only the blocks of running and swapped-out requests hold K/V to recompute.
        recomputed = (", K/V recomputed from the tokens" if engine.running or engine.swapped
                      else "")
        sess.flash("info" if opened.damaged else "success",
                   f"{how}: {_describe(engine)}{recomputed}.{notes}")


def _reopen(sid: str, where: str, how: str, failed: str, take_now: bool = True) -> None:
    """Replace this tab's engine by saved session `sid`, under the current engine's lock,
    weights included; the status line says how it went (`how` on success, `failed`
    after the reason otherwise). See engine_actions._replace_engine."""
    work = progress.get_work()
    shown: list[Shown] = []
    with operations.holding_current(where, work, shown) as sess:
        if sess is None:
            session.flash("error", f"{operations.REPLACED_TOO_OFTEN} {failed}")
        else:
            # A bare address's latest session is taken only at the first save (to read
            # it leaves the page at work alone): only a named one stops that page's run.
            stopped = _stop_other_page(sess, sid, work) if take_now else ""
            shown.append(_load_model_of(sess, sid, work))
            outcome, opening = _open(sess, sid, take_now)
            shown.append(opening)
            if isinstance(outcome, str):
                sess.flash("error", f"{outcome} {failed}")
            else:
                _say_opened(sess, outcome, how, stopped)
    session.collect()
    for s in shown:
        s.finish()


def at_start() -> None:
    """Once per browser session, after `session.init`: reopen what the address names."""
    ss = st.session_state
    if ss.get(STARTED):
        return
    ss[STARTED] = True
    tab = store.get_tab()
    sid, problem = store.requested_id()
    if problem is not None:
        session.flash("error", problem)
        return
    how = "Reopened this session"
    named = sid is not None
    if sid is None:
        if tab.store is None:
            return
        try:
            sid = tab.store.latest(tab.browser)
        except PagedLabError:
            return
        if sid is None:
            return
        how = "Reopened your latest session (New session, under Sessions, starts afresh)"
    # Named by the address: this tab takes it over now (a second tab on a link does).
    # The latest session, reopened for a bare address: at this tab's first save, so
    # that a tab opened to read, or on another page, leaves the tab at work alone.
    _reopen(sid, "start", how, "This is a new session.", take_now=named)


# Back or Forward onto an entry from before a session's first operation.
NAMES_NONE = ("The page gone back or forward to had no session in its address (an empty new "
              "session, or your latest session before you acted on it), so the Playground "
              "keeps {} as it is; Sessions, below, opens the others.")


def follow_history() -> None:
    """In a run the browser's Back or Forward started: open the session the address
    names, when it is not this tab's. The address was otherwise written back to this
    tab's session, rewriting the entry gone back to, so Back never left it.

    An address naming no session (the entry before a session's first operation) is
    left to name this tab's session again, as before: which state that entry showed
    (an empty engine, or the latest session reopened) is not known here. The status line
    says so, rather than keep the last action's line as if this one had done it."""
    if not history.went_back_or_forward():
        return
    sid, problem = store.requested_id()
    tab = store.get_tab()
    shown = tab.shown_id
    # A session the tab holds, named; an address kept without a row of the tab's own (a
    # copy's, or one that could not be opened) is no session this tab holds.
    kept = f"session {store.short(tab.id)}" if tab.id is not None and not tab.unnamed else (
        "what it showed")
    if sid is None and problem is None and shown is not None:
        session.flash("info", NAMES_NONE.format(kept))
        return
    if sid is None or problem is not None or sid == shown:
        return
    # A Step N or Grow this tab is running would otherwise go on to its end (with the
    # address already naming the other session) before the session could be replaced:
    # stopped after its current iteration, it saves what it ran, as on a reload.
    progress.get_work().request_stop("Back or Forward opened another session")
    _reopen(sid, "history", f"Opened session {store.short(sid)} (the browser's Back or "
                            "Forward)", f"The Playground keeps {kept} as it is.")


def open_other(sid: str) -> None:
    """Callback of a Recent sessions entry's Open: that session replaces this one here."""
    _reopen(sid, "replace", f"Opened session {store.short(sid)}", "This session is unchanged.")


def delete_other(sid: str) -> None:
    """Callback of a Recent sessions entry's Delete for good: its outcome on the status
    line, in place of the last action's (an earlier "Opened session …" would otherwise
    read as news above it)."""
    said = store.delete_saved(sid)
    if said is not None:
        session.flash(*said)
