"""The Streamlit side of saved sessions: the store, this browser's secret, the address, the list.

The rules are backend/sessions/saved.py's; this module supplies what only
the browser knows:

- The browser's secret lives in a cookie (`pagedlab_browser`). Streamlit can
  read cookies (st.context.cookies) but not set them, so a first visit gets a
  new secret and a few lines of JavaScript that set the cookie (or, where
  another tab of that first visit set one first, reload to present that one:
  `_cookie_script`); every later Streamlit session of that browser (a reload,
  a new tab, a restarted server) presents it. A link opened in another browser
  has no such cookie.
- The session's id is the Playground's address: `/lab?session=ID`, written
  by the page once the session has state. Other pages keep their own
  parameters; a reload there resumes the browser's latest session.
- The store is one per process and data directory. If it cannot be opened
  (a read-only disk, a damaged file) the app works as before, unsaved, and the
  Playground says why.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import streamlit as st

from backend.engine.engine import Engine
from backend.sessions.rows import SessionInfo, StoreError
from backend.sessions.saved import Tab, new_id, row_standing
from backend.sessions.store import (
    FILE_NAME,
    SessionStore,
    browser_key,
    data_dir,
    valid_token,
)
from backend.views.text import plain_md
from ui import clicks
from ui.a11y import UNCLIPPED_ROW
from ui.kept import keep_result, kept_result

COOKIE = "pagedlab_browser"
PARAM = "session"
TAB = "store_tab"              # this tab's backend.sessions.saved.Tab
SECRET = "store_secret"        # this browser's secret: its cookie's, or a new one
PROBLEM = "store_problem"      # why sessions are not saved (the store cannot be opened)
NOTE = "store_note"            # what the last save had to say (a copy, a failure), or None
# The listed session a Delete asks about, kept (ui/kept.py) for the engine the page
# showed when it asked: a question asked beside one session is not left standing beside
# another (an Open, New session, Back or Forward, a reset replaces the engine).
CONFIRM_DELETE = "store_confirm_delete"
# The session a Delete just asked about, until the panel draws the question beside an
# engine (`_asked`).
ASKED_DELETE = "store_asked_delete"
COOKIE_DAYS = 400              # browsers cap a cookie's life at about 400 days

_stores: dict[Path, SessionStore] = {}
_stores_lock = threading.Lock()


def get_store() -> tuple[SessionStore | None, str | None]:
    """The process's store for the data directory, or None and why it cannot be opened."""
    path = (data_dir() / FILE_NAME).resolve()
    with _stores_lock:
        store = _stores.get(path)
        if store is None:
            try:
                store = SessionStore(path)
            except StoreError as exc:
                return None, str(exc)
            _stores[path] = store
    return store, None


def _cookie() -> str | None:
    try:
        value = st.context.cookies.get(COOKIE)
    except Exception:   # no browser behind this run (a script run without a server)
        return None
    return value if isinstance(value, str) else None


def start_tab() -> Tab:
    """This Streamlit session's Tab: the browser's secret, a holder of its own."""
    ss = st.session_state
    cookie = _cookie()
    ss[SECRET] = cookie if valid_token(cookie) else new_id()
    store, problem = get_store()
    ss[PROBLEM] = problem
    ss[NOTE] = None
    tab = Tab(store, browser_key(ss[SECRET]))
    ss[TAB] = tab
    return tab


def get_tab() -> Tab:
    tab: Tab = st.session_state[TAB]
    return tab


def write_cookie() -> None:
    """If the browser has not presented this secret, have it store it (see module doc).

    Drawn in the sidebar, where the empty element it makes takes no visible room.
    """
    secret = st.session_state.get(SECRET)
    if not isinstance(secret, str) or _cookie() == secret:
        return
    # URL-safe base64 (checked or made by us): nothing in it needs quoting in a cookie.
    assert valid_token(secret)
    with st.sidebar:
        st.html(_cookie_script(secret), unsafe_allow_javascript=True)


def _cookie_script(secret: str) -> str:
    """The script that gives the browser `secret`, unless another tab gave it one first.

    Two tabs opened together on a first visit both mint a secret; had each simply set
    the cookie, the last would win, and the other tab's sessions would belong to a
    secret the browser no longer presents (its link a copy, its session not listed).
    So the first valid cookie stands, and a tab that finds another's reloads to present
    it. It looks twice, the second time a moment later, since a cookie another tab has
    just set may not be seen at once. It reloads once for a given cookie: should the
    server never see the cookie (a proxy that drops it), no loop.
    """
    return f"""<script>
(() => {{
  const mine = {json.dumps(secret)};
  const seen = () => (document.cookie.match(
    /(?:^|;\\s*){COOKIE}=([A-Za-z0-9_-]{{16,64}})(?:;|$)/) || [])[1];
  const adopt = (other) => {{
    if (sessionStorage.getItem('{COOKIE}_reloaded_for') === other) return;
    sessionStorage.setItem('{COOKIE}_reloaded_for', other);
    location.reload();
  }};
  const first = seen();
  if (first === undefined) {{
    document.cookie = '{COOKIE}=' + mine + '; path=/; max-age={COOKIE_DAYS * 86400}; '
                      + 'SameSite=Lax';
    setTimeout(() => {{
      const now = seen();
      if (now !== undefined && now !== mine) adopt(now);
    }}, 800);
  }} else if (first !== mine) {{
    adopt(first);
  }}
}})();
</script>"""


def requested_id() -> tuple[str | None, str | None]:
    """The session id in the address, if any, or why the address's value is none."""
    raw = st.query_params.get(PARAM)
    if raw is None:
        return None, None
    # Two different ids are ambiguous: opening either might not be the one meant.
    given = set(st.query_params.get_all(PARAM))
    if len(given) > 1:
        return None, (f"The address names {len(given)} different sessions, so none was "
                      "opened: this is a new session.")
    if valid_token(raw):
        return raw, None
    return None, ("The address names a session id that PagedLab would never make (ids are "
                  "16 to 64 letters, digits, '-' and '_'), so it was ignored: this is a new "
                  "session.")


def short(sid: str) -> str:
    """An id as messages show it: enough to tell sessions apart, not enough to open one."""
    return sid[:8] + "…"


def write_address() -> None:
    """The Playground's address names this tab's session, once it has one (or the
    session it copies, or could not open for a passing reason: `Tab.address`)."""
    tab = get_tab()
    params = st.query_params
    shown = tab.shown_id
    if shown is not None:
        if params.get(PARAM) != shown or len(params.get_all(PARAM)) > 1:
            params[PARAM] = shown
    elif PARAM in params:
        # A refused or unknown id: the address must not go on naming it.
        del params[PARAM]


def _ago(then: float) -> str:
    s = max(0.0, time.time() - then)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= size:
            n = int(s // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


def ask_delete(sid: str) -> None:
    """Callback of a list entry's Delete: ask before deleting (it cannot be undone). The
    question is bound to the engine it is first drawn beside (`_asked`): the one drawn
    with the button may be replaced by the very run the click starts (settings sent with
    it, an operation that waited), and a button's arguments would hold it strongly."""
    st.session_state[ASKED_DELETE] = sid


def cancel_delete() -> None:
    st.session_state[ASKED_DELETE] = st.session_state[CONFIRM_DELETE] = None


def _asked(engine: Engine) -> str | None:
    """The listed session a Delete's question stands for: None once another engine than
    `engine`, the one it was asked beside, is shown, which drops the question. (Keyed by
    the engine, not the session id: an empty engine and a latest session not yet taken
    over both have none.)"""
    asked = st.session_state.pop(ASKED_DELETE, None)
    if asked is not None:
        keep_result(CONFIRM_DELETE, engine, asked)
    sid: str | None = kept_result(CONFIRM_DELETE, engine)
    return sid


def delete_saved(sid: str) -> tuple[Literal["info", "error"], str] | None:
    """Mutates the store: remove one of this browser's saved sessions, after its
    question's Delete for good. What to say on the status line (a Delete is this tab's
    latest action, and its outcome replaces the line), or None for a row that is this
    tab's own (not listed, so not asked about)."""
    tab = get_tab()
    cancel_delete()
    if tab.store is None or sid == tab.id:
        return None
    try:
        gone = tab.store.delete(sid, tab.browser)
    except StoreError as exc:
        return "error", f"Could not delete session {short(sid)}: {exc}"
    # No period straight after the id's ellipsis ("…."): the sentence goes on. A tab
    # still holding the session would save it again (saved.REVIVED_NOTE), so its address
    # is not said to be dead.
    return ("info", f"Deleted saved session {short(sid)} (a tab that still has it open "
                    "would save it again)."
            if gone else f"Session {short(sid)} was already gone (deleted in another tab, "
                         "or expired); nothing to delete.")


def notes() -> None:
    """Why sessions are not saved, and what the last save said (plain text)."""
    ss = st.session_state
    if ss.get(PROBLEM):
        st.warning(plain_md(f"Sessions are not saved on this server: {ss[PROBLEM]}"))
    if ss.get(NOTE):
        # Keyed for ui/a11y.py, which reads a new note (a copy, a failed save) out.
        with st.container(key="store_note"):
            st.info(plain_md(ss[NOTE]))


def _saved_as(sid: str, standing: str | None, behind: bool) -> str:
    """The panel's line on this tab's saved session: its own, or what its next operation
    will find (saved.row_standing), said before that operation rather than after it; a
    row a failed save left behind this tab's state is not said to be saved."""
    if standing == "taken":
        return (f"Session {short(sid)} was opened in another tab, which saves it from now "
                "on: this tab's next operation goes on as a copy under a new address.")
    if standing == "gone":
        return (f"Session {short(sid)} has left the saved sessions (deleted in another tab, "
                "or dropped past the store's limits): this tab's next operation saves it "
                "again.")
    if behind:
        return (f"Session {short(sid)} holds an earlier step: the last save failed (the note "
                "at the top says why), and the next operation tries again, writing it whole.")
    return (f"Saved after every operation as session {short(sid)}: the address names it. "
            "Opened in another browser, the link gives a copy; this one stays yours.")


def sessions_panel(engine: Engine, open_saved: Callable[[str], None],
                   new_session: Callable[[], None], delete: Callable[[str], None],
                   limit: int = 12) -> None:
    """This session's address and this browser's recent sessions beside `engine`, the one
    the page shows: open, delete (`delete`, once asked: see `delete_saved`), start anew."""
    tab = get_tab()
    if tab.store is None:
        st.caption("Sessions are not saved on this server (see the note at the top).")
        return
    try:
        recent: list[SessionInfo] = tab.store.recent(tab.browser, limit)
    except StoreError as exc:
        st.warning(plain_md(f"The saved sessions cannot be listed: {exc}"))
        return
    if tab.unnamed and tab.id is not None:
        st.caption(plain_md(f"Reopened as this browser's latest session, {short(tab.id)}: "
                            "your first operation here takes it over (another tab may be "
                            "working on it), and the address names it from then on."))
    elif tab.id is None:
        st.caption("This session is saved from its first operation on; its address then "
                   "names it, so a reload, a restart of the server or the link brings it "
                   "back. A link opened in another browser opens a copy.")
    else:
        st.caption(plain_md(_saved_as(tab.id, row_standing(tab), tab.behind)))
    clicks.button(st, "New session", key="btn_new_session", on_click=new_session,
                  help="Start an empty engine under a new address; this one stays in the "
                       "list.")
    others = [s for s in recent if s.id != tab.id]
    asked = _asked(engine)
    if not others:
        return
    st.markdown("**Recent sessions in this browser**")
    for info in others:
        # The buttons as wide as their words, the line taking what is left (wrapped onto
        # more lines where the page is narrow): in columns of fixed shares, "Delete" was
        # cut to "Del…" at 1024 px with the sidebar open.
        row = st.container(horizontal=True, vertical_alignment="center", gap="small",
                           wrap=False, key=f"{UNCLIPPED_ROW}session_{info.id}")
        note = " · behind: see when opened" if info.note else ""
        row.markdown(plain_md(f"{short(info.id)} · step {info.step} · {info.label} · "
                              f"used {_ago(info.updated)}{note}"), width="stretch")
        clicks.button(row, "Open", key=f"btn_open_{info.id}", on_click=open_saved,
                      args=(info.id,))
        clicks.button(row, "Delete", key=f"btn_delete_{info.id}", on_click=ask_delete,
                      args=(info.id,))
        if asked == info.id:
            # Below the row, not in Delete's place: a double click must not confirm.
            # Keyed for ui/a11y.py: read out, since the question is drawn below the
            # Delete that keeps the focus.
            with st.container(key="store_delete_asked"):
                st.warning(plain_md(f"Delete session {short(info.id)} for good? It leaves "
                                    "the list and its address stops opening it, unless a "
                                    "tab that still has it open saves it again; this "
                                    "cannot be undone. Delete for good, or Cancel, below."))
            answer = st.container(horizontal=True, gap="small")
            clicks.button(answer, "Delete for good", key=f"btn_delete_confirm_{info.id}",
                          type="primary", on_click=delete, args=(info.id,))
            clicks.button(answer, "Cancel", key="btn_delete_cancel", on_click=cancel_delete)
