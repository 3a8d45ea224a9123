"""Saved sessions in the app, through AppTest (in Chromium: tests/test_browser_sessions.py).

A new AppTest is a new browser session on the same server, as after a reload;
its browser is the cookie it presents (patched here: AppTest has none). The
Playground's address names its session once it has state; the same browser
reopens it exactly, another gets a copy; bad ids, unknown ids and damaged
rows are reported and change nothing; the Sessions list opens and deletes;
the session exports as a scenario that replays checked.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from backend.core.config import SMOLLM2
from backend.engine.engine import Engine
from backend.io.cli import main
from backend.io.snapshot import export_snapshot
from backend.sessions import saved
from backend.sessions.rows import StoreError
from backend.sessions.saved import COPY_NOTE, new_id
from backend.sessions.store import FILE_NAME, SessionStore
from backend.views.text import md_escape
from tests.test_app import shown
from ui import exports, store

APP = str(Path(__file__).resolve().parents[1] / "app.py")
MINE, THEIRS = new_id(), new_id()


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PAGEDLAB_DATA_DIR", str(tmp_path))
    yield tmp_path


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """The cookie the next AppTest's browser presents: set `["cookie"]`."""
    jar: dict[str, str | None] = {"cookie": MINE}
    monkeypatch.setattr(store, "_cookie", lambda: jar["cookie"])
    return jar


def open_app(session: str | list[str] | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if session is not None:
        at.query_params["session"] = session
    at.run()
    assert not at.exception, at.exception
    return at


def worked(at: AppTest) -> str:
    """Some operations on the torch kernel; the session's id from the address."""
    at.segmented_control(key="dev_kernel").set_value("torch").run()
    at.button(key="btn_add").click().run()
    at.number_input(key="batch_n").set_value(3).run()
    at.button(key="btn_step_n").click().run()
    at.selectbox(key="req_pick").set_value("A").run()
    at.button(key="btn_fork").click().run()
    at.number_input(key="req_grow_n").set_value(2).run()
    at.button(key="btn_grow").click().run()
    assert not at.exception
    return sid(at)


def sid(at: AppTest) -> str:
    value = at.query_params["session"]
    return value[0] if isinstance(value, list) else value


def engine(at: AppTest) -> Engine:
    e: Engine = at.session_state["engine"]
    return e


def state(at: AppTest) -> dict[str, Any]:
    s = export_snapshot(engine(at))
    return {**s, "kernel": {**s["kernel"], "time_ms": None}}


def texts(elements: Any) -> str:
    """The text the elements show: session ids are random and may hold "_", which the
    Markdown source escapes."""
    return "\n".join(shown(e.value) for e in elements)


def rows(data_dir: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data_dir / FILE_NAME) as db:
        return db.execute("SELECT * FROM sessions ORDER BY id").fetchall()


def test_a_fresh_session_has_no_address_and_no_row(browser: dict[str, str | None],
                                                   data_dir: Path) -> None:
    at = open_app()
    assert "session" not in at.query_params
    at.segmented_control(key="dev_kernel").set_value("torch").run()
    assert "session" not in at.query_params and rows(data_dir) == []


def test_a_reopened_session_with_nothing_running_claims_no_recomputation(
        browser: dict[str, str | None]) -> None:
    first = open_app()
    first.segmented_control(key="dev_kernel").set_value("torch").run()
    first.button(key="btn_add").click().run()
    first.selectbox(key="req_pick").set_value("A").run()
    first.button(key="btn_finish").click().run()
    again = open_app(sid(first))
    assert "Reopened this session: step 2, 1 request, 32 blocks of 4 slots." in texts(
        again.success)
    assert "recomputed" not in texts(again.success)


@pytest.mark.slow
def test_a_reopened_session_of_a_real_model_names_it(browser: dict[str, str | None]) -> None:
    first = open_app()
    first.segmented_control(key="dev_kernel").set_value("torch").run()
    first.sidebar.selectbox(key="cfg_model_name").select(SMOLLM2).run()
    first.button(key="btn_add").click().run()
    again = open_app(sid(first))
    assert engine(again).config.model == SMOLLM2
    assert "32 blocks of 4 slots on smollm2-135m, K/V recomputed from the tokens." in texts(
        again.success)


def test_a_reload_reopens_the_session_exactly(browser: dict[str, str | None]) -> None:
    first = open_app()
    session_id = worked(first)
    again = open_app(session_id)
    assert sid(again) == session_id
    assert "Reopened this session: step 4" in texts(again.success)
    assert state(again) == state(first)
    assert list(again.session_state["history"]) == list(first.session_state["history"])
    assert again.session_state["oplog"].ops == first.session_state["oplog"].ops
    assert again.session_state["settings"] == first.session_state["settings"]
    assert again.segmented_control(key="dev_kernel").value == "torch"
    # It goes on from there, under the same address.
    again.button(key="btn_step").click().run()
    assert sid(again) == session_id and engine(again).step == 5


def test_a_reopened_session_shows_its_kept_steps_without_a_timeline(
        browser: dict[str, str | None]) -> None:
    first = open_app()
    session_id = worked(first)
    history = first.session_state["history"]
    again = open_app(session_id)
    # The engine's timeline is not saved; its history is, and a step is picked by number.
    assert "since this engine was restored at step 4" in texts(again.caption)
    again.number_input(key="tl_step").set_value(2).run()
    past = [t for t in map(shown, (i.value for i in again.info))
            if "Showing the past: the state after step 2." in t]
    assert len(past) == 1 and "Iteration" not in past[0]
    table = again.dataframe[0].value.set_index("request")
    assert list(table.index) == [r["id"] for r in history[1]["requests"]]
    assert engine(again).step == 4
    # A step the history does not keep is refused by the field's name.
    again.number_input(key="tl_step").set_value(9).run()
    assert ("Show the state after step: the history does not keep step 9; enter 1 to 4. "
            "Showing the live state.") in texts(again.error)
    assert again.number_input(key="tl_step").value is None and not again.info
    # An operation brings the live state and the timeline's own rows back.
    again.number_input(key="tl_step").set_value(2).run()
    again.button(key="btn_step").click().run()
    assert again.number_input(key="tl_iteration").value is None
    assert "Showing the past" not in texts(again.info)


def test_a_saved_steps_check_runs_under_a_spinner(
        browser: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of tens of thousands of blocks takes seconds to check: the page says what
    it is doing (Streamlit draws a spinner only past half a second; AppTest keeps no
    transient element, so the spinner's context is recorded around the check)."""
    from backend.sessions import playground

    session_id = worked(open_app())
    again = open_app(session_id)
    inside: list[str] = []
    spinning: list[str] = []
    real_spinner, real_check = st.spinner, playground.check_snapshot

    @contextlib.contextmanager
    def spinner(text: str, **kw: Any) -> Iterator[None]:
        spinning.append(text)
        with real_spinner(text, **kw):
            yield
        spinning.pop()

    def check(snap: dict[str, Any]) -> None:
        inside.append(spinning[-1] if spinning else "")
        real_check(snap)

    monkeypatch.setattr(st, "spinner", spinner)
    monkeypatch.setattr(playground, "check_snapshot", check)
    again.number_input(key="tl_step").set_value(2).run()
    assert inside == ["Reading the state after step 2…"]
    assert "Showing the past: the state after step 2." in " ".join(
        map(shown, (i.value for i in again.info)))


def test_a_damaged_saved_step_is_said_when_picked_and_the_page_goes_on(
        browser: dict[str, str | None], data_dir: Path) -> None:
    """A saved step of the right shape but no state an engine could hold (the views
    failed on it with a traceback); and a row whose step column is no number (the
    sessions list failed on every visit from that browser)."""
    first = open_app()
    session_id = worked(first)
    with sqlite3.connect(data_dir / FILE_NAME) as db:
        blob = db.execute("SELECT body FROM steps WHERE step=2").fetchone()[0]
        body = json.loads(zlib.decompress(blob))
        del body["config"]
        db.execute("UPDATE steps SET body=? WHERE step=2",
                   (zlib.compress(json.dumps(body).encode()),))
    again = open_app(session_id)
    again.number_input(key="tl_step").set_value(2).run()
    assert not again.exception
    assert ("The saved state after step 2 could not be read back (snapshot: missing field "
            "'config')") in texts(again.error)
    assert ("so the steps saved before this session was opened are left out of its history. "
            "Showing the live state.") in texts(again.error)
    assert not again.info
    # The history holds the live state alone now: there is no earlier step to pick.
    assert "tl_step" not in [n.key for n in again.number_input]
    # A damaged list row is left out; the browser's next visit still works.
    with sqlite3.connect(data_dir / FILE_NAME) as db:
        db.execute("DROP TRIGGER IF EXISTS sessions_revised")
        db.execute("DROP TRIGGER IF EXISTS sessions_revised_new")
        db.execute("UPDATE sessions SET step='abc'")
    later = open_app()
    assert not later.exception and "session" not in later.query_params


def test_a_bare_address_reopens_the_browsers_latest_session(
        browser: dict[str, str | None]) -> None:
    first = open_app()
    session_id = worked(first)
    again = open_app()
    assert "Reopened your latest session" in texts(again.success)
    assert state(again) == state(first)
    # It is taken over at its first operation, not on opening: until then the address
    # stays bare, and the first tab still saves the session.
    assert "session" not in again.query_params
    first.button(key="btn_step").click().run()
    assert sid(first) == session_id and not first.info
    again.button(key="btn_step").click().run()
    # The session moved on in the first tab after this one read it: this one goes on
    # as a copy, and the saved session keeps the first tab's step.
    assert sid(again) != session_id
    assert saved.MOVED_ON_NOTE in texts(again.info) + texts(again.warning)


def test_replacing_a_reopened_session_not_yet_taken_over_says_it_stays_saved(
        browser: dict[str, str | None]) -> None:
    # A bare address shows the latest session without taking it over; no save failed,
    # so the state it replaces is whole in its row, and the message must not say that
    # operations could not be saved.
    session_id = worked(open_app())
    again = open_app()
    assert "Reopened your latest session" in texts(again.success)
    again.sidebar.number_input(key="cfg_num_blocks").set_value(40).run()
    again.button(key="btn_apply_config").click().run()
    said = [t for t in map(shown, (i.value for i in again.info))
            if t.startswith("New engine: 40 blocks")]
    assert len(said) == 1, texts(again.info)
    assert (f"The state it replaced stays saved as session {store.short(session_id)}, "
            "under Recent sessions.") in said[0], said
    assert "could not be saved" not in said[0]
    # The new engine has no state, so no row: a reload would reopen the latest session,
    # and the message says so rather than let the settings go without a word.
    assert said[0].endswith("This engine is saved from its first operation on; a reload "
                            "before then reopens your latest saved session."), said
    again.button(key="btn_add").click().run()
    assert sid(again) != session_id and engine(again).config.num_blocks == 40
    # So after New session: its empty engine has no row either (and, empty, takes new
    # settings at once).
    again.button(key="btn_new_session").click().run()
    again.sidebar.number_input(key="cfg_num_blocks").set_value(48).run()
    assert any(shown(i.value).startswith("New engine: 48 blocks") and shown(i.value).endswith(
        "a reload before then reopens your latest saved session.") for i in again.info), \
        texts(again.info)


def test_new_settings_on_a_first_visit_say_nothing_of_a_reload(
        browser: dict[str, str | None]) -> None:
    # With nothing saved in this browser, a reload gives the defaults, as a first visit
    # does: no sentence about a session it would reopen.
    at = open_app()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(40).run()
    said = [shown(i.value) for i in at.info if i.value.startswith("New engine: 40 blocks")]
    assert len(said) == 1 and "reload" not in said[0], texts(at.info)


def test_another_browser_gets_a_copy(browser: dict[str, str | None], data_dir: Path) -> None:
    first = open_app()
    session_id = worked(first)
    browser["cookie"] = THEIRS
    other = open_app(session_id)
    assert "another browser's session: you are working on a copy" in texts(other.info)
    # Nothing is written until they act: the address still names the link's session.
    assert sid(other) == session_id and state(other) == state(first)
    other.button(key="btn_step").click().run()
    copy_id = sid(other)
    assert copy_id != session_id
    # The original is untouched; the copy is saved under its own id.
    browser["cookie"] = MINE
    mine = open_app(session_id)
    assert engine(mine).step == 4 and state(mine) == state(first)
    browser["cookie"] = THEIRS
    theirs = open_app(copy_id)
    assert sid(theirs) == copy_id and engine(theirs).step == 5
    # A browser without the cookie yet is another browser too: a copy, saved anew.
    browser["cookie"] = None
    fresh = open_app(session_id)
    assert "another browser's session: you are working on a copy" in texts(fresh.info)
    fresh.button(key="btn_step").click().run()
    assert sid(fresh) not in (session_id, copy_id)


def test_reset_on_a_copy_not_saved_yet_lets_go_of_the_link(
        browser: dict[str, str | None]) -> None:
    session_id = worked(open_app())
    browser["cookie"] = THEIRS
    other = open_app(session_id)
    assert sid(other) == session_id
    other.button(key="btn_reset").click().run()
    # Nothing of theirs is saved yet: the warning does not speak of a saved session.
    assert [w.value for w in other.sidebar.warning] == [
        "Reset discards the current 2 requests and 4 steps."]
    other.button(key="btn_reset_confirm").click().run()
    assert not other.exception and engine(other).step == 0
    # The empty engine is not the linked session: the address no longer names it (a
    # reload would have brought the copy's state back).
    assert "session" not in other.query_params


def test_a_second_tab_takes_the_session_and_the_first_goes_on_as_a_copy(
        browser: dict[str, str | None]) -> None:
    first = open_app()
    session_id = worked(first)
    second = open_app(session_id)
    # Before its next operation, the first tab's Sessions panel says what that will do.
    first.run()
    assert [t for t in map(shown, (c.value for c in first.caption))
            if t.startswith(f"Session {session_id[:8]}")] == [
        f"Session {session_id[:8]}… was opened in another tab, which saves it from now on: "
        "this tab's next operation goes on as a copy under a new address."]
    assert not [c for c in first.caption if "this one stays yours" in shown(c.value)]
    first.button(key="btn_step").click().run()
    assert COPY_NOTE in texts(first.info)
    assert [c for c in first.caption if "this one stays yours" in shown(c.value)]
    assert sid(first) != session_id
    second.button(key="btn_step").click().run()
    assert sid(second) == session_id and COPY_NOTE not in texts(second.info)


@pytest.mark.parametrize("bad", [
    "x" * 5000, "ünïcödé-ünïcödé-ünïcödé", "'; DROP TABLE sessions; --aaaaaaaa",
    "\" OR 1=1 OR \"aaaaaaaaaaaaaaaa", "short", "<script>alert(1)</script>aaaaaaa",
    "a\nb\u0000cccccccccccccccccccc"], ids=["long", "unicode", "sql", "sql2", "short",
                                           "html", "control"])
def test_a_bad_id_in_the_address_is_reported_and_changes_nothing(
        browser: dict[str, str | None], data_dir: Path, bad: str) -> None:
    session_id = worked(open_app())
    before = rows(data_dir)
    at = open_app(bad)
    assert "PagedLab would never make" in texts(at.error)
    assert engine(at).step == 0 and "session" not in at.query_params
    assert rows(data_dir) == before
    assert bad not in texts(at.error)        # never echoed
    assert session_id != ""


def test_two_different_ids_in_the_address_open_neither(
        browser: dict[str, str | None], data_dir: Path) -> None:
    first = worked(open_app())
    at = open_app([first, new_id()])       # ?session=A&session=B
    assert ("The address names 2 different sessions, so none was opened: this is a new "
            "session.") in texts(at.error)
    assert engine(at).step == 0 and "session" not in at.query_params
    # The same id twice is one session: it opens.
    again = open_app([first, first])
    assert not at.exception and sid(again) == first and engine(again).step > 0


def test_an_unknown_id_is_reported(browser: dict[str, str | None]) -> None:
    at = open_app(new_id())
    assert "No saved session" in texts(at.error) and engine(at).step == 0
    assert "session" not in at.query_params


def test_a_damaged_row_is_refused_and_the_page_still_works(
        browser: dict[str, str | None], data_dir: Path) -> None:
    session_id = worked(open_app())
    with sqlite3.connect(data_dir / FILE_NAME) as db:
        db.execute("UPDATE sessions SET snapshot=?, revision=revision+1 WHERE id=?",
                   (b"garbage", session_id))
    before = rows(data_dir)
    at = open_app(session_id)
    assert "could not be opened: its snapshot is damaged" in texts(at.error)
    assert engine(at).step == 0 and rows(data_dir) == before
    at.button(key="btn_add").click().run()
    assert not at.exception and sid(at) != session_id


def test_a_damaged_operation_log_opens_the_session_and_the_export_says_why(
        browser: dict[str, str | None], data_dir: Path) -> None:
    session_id = worked(open_app())
    want = state(open_app(session_id))
    with sqlite3.connect(data_dir / FILE_NAME) as db:
        db.execute("UPDATE ops SET op='{\"op\": ' WHERE session=? AND seq=1", (session_id,))
    at = open_app(session_id)
    # Opened, said as news (not a success), with the damage named by its step.
    assert at.success == [] and sid(at) == session_id and state(at) == want
    said = texts(at.info)
    assert "its operation log is damaged (the operation of step 2 is not valid JSON" in said
    captions = texts(at.caption)
    assert ("Scenario file: not available, its operation log was found damaged when the "
            "session was opened (the operation of step 2 is not valid JSON") in captions
    # It goes on: the next operation saves the session whole, and it reopens cleanly.
    at.button(key="btn_add").click().run()
    again = open_app(session_id)
    assert "damaged" not in texts(again.info) and engine(again).step == engine(at).step


def test_the_sessions_list_opens_and_deletes(browser: dict[str, str | None],
                                             data_dir: Path) -> None:
    at = open_app()
    first_id = worked(at)
    at.button(key="btn_new_session").click().run()
    assert engine(at).step == 0 and "session" not in at.query_params
    at.button(key="btn_add").click().run()
    second_id = sid(at)
    assert second_id != first_id
    at.button(key=f"btn_open_{first_id}").click().run()
    assert sid(at) == first_id and engine(at).step == 4
    assert "Opened session" in texts(at.success)
    assert at.segmented_control(key="dev_kernel").value == "torch"
    # Delete asks first, below the row; Cancel keeps the session.
    at.button(key=f"btn_delete_{second_id}").click().run()
    both = sorted([first_id, second_id])
    assert sorted(r[0] for r in rows(data_dir)) == both
    assert any("for good" in w.value for w in at.warning)
    at.button(key="btn_delete_cancel").click().run()
    assert sorted(r[0] for r in rows(data_dir)) == both
    assert not any("for good" in w.value for w in at.warning)
    at.button(key=f"btn_delete_{second_id}").click().run()
    at.button(key=f"btn_delete_confirm_{second_id}").click().run()
    # The Delete's outcome replaces the status line: the earlier "Opened session" is not
    # left above it as if it were news.
    assert texts(at.info) == (f"Deleted saved session {store.short(second_id)} (a tab that "
                              "still has it open would save it again)."), texts(at.info)
    assert not at.success, texts(at.success)
    assert [r[0] for r in rows(data_dir)] == [first_id]
    assert not [b for b in at.button if b.key == f"btn_open_{second_id}"]


def test_a_delete_question_is_dropped_when_another_session_is_opened(
        browser: dict[str, str | None], data_dir: Path) -> None:
    at = open_app()
    first_id = worked(at)
    at.button(key="btn_new_session").click().run()
    at.button(key="btn_add").click().run()
    second_id = sid(at)
    at.button(key="btn_new_session").click().run()
    at.button(key="btn_add").click().run()
    third_id = sid(at)
    # Asked beside the third session about the first; then the second is opened.
    at.button(key=f"btn_delete_{first_id}").click().run()
    assert any("for good" in w.value for w in at.warning)
    at.button(key=f"btn_open_{second_id}").click().run()
    assert not any("for good" in w.value for w in at.warning)
    # Back beside the third, the question does not come back with its live button.
    at.button(key=f"btn_open_{third_id}").click().run()
    assert sid(at) == third_id
    assert not any("for good" in w.value for w in at.warning)
    assert not [b for b in at.button if b.key == f"btn_delete_confirm_{first_id}"]
    assert sorted(r[0] for r in rows(data_dir)) == sorted([first_id, second_id, third_id])
    # A bare address shows the latest session (third) without naming it, as an empty new
    # engine names none: the question asked beside the one is still dropped by the other.
    bare = open_app()
    assert "Reopened your latest session" in texts(bare.success)
    bare.button(key=f"btn_delete_{first_id}").click().run()
    assert any("for good" in w.value for w in bare.warning)
    bare.button(key="btn_new_session").click().run()
    assert not any("for good" in w.value for w in bare.warning)


def test_continuing_a_scenario_keeps_the_playgrounds_saved_state(
        browser: dict[str, str | None], data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ids are random URL-safe text. End each one's short form with "_", which the message
    # must escape (it could open emphasis before the "…"), so the message naming an id is
    # checked as shown whatever the draw.
    monkeypatch.setattr(saved, "new_id", lambda: f"{secrets.token_urlsafe(24)[:7]}_"
                                                 f"{secrets.token_urlsafe(18)}")
    at = open_app()
    first_id = worked(at)
    before = state(at)
    at.switch_page("pages/scenarios.py").run()
    for _ in range(2):
        at.button(key="tour_next").click().run()
    at.button(key="tour_continue").click().run()
    assert not at.exception and at.title[0].value == "Playground"
    # The scenario's state is a new session; the one it replaced is untouched in the list.
    second_id = sid(at)
    assert second_id != first_id and engine(at).step == 2
    assert (f"The state it replaced stays saved as session {store.short(first_id)}, under "
            "Recent sessions.") in texts(at.success)
    # ...and the Markdown source escapes the id (its "_", and a "-" where the draw has one).
    assert md_escape(store.short(first_id)) in "".join(e.value for e in at.success)
    assert sorted(r[0] for r in rows(data_dir)) == sorted([first_id, second_id])
    # (AppTest runs the page it was last sent to, not the one the app switched to.)
    at.switch_page("pages/playground.py").run()
    at.button(key=f"btn_open_{first_id}").click().run()
    assert sid(at) == first_id and state(at) == before


def test_apply_and_reset_keeps_the_replaced_state_saved(
        browser: dict[str, str | None], data_dir: Path) -> None:
    at = open_app()
    first_id = worked(at)
    before = state(at)
    at.number_input(key="cfg_num_blocks").set_value(16).run()
    assert any("leave the page and stay saved, under Recent sessions" in w.value
               for w in at.warning)
    at.button(key="btn_apply_config").click().run()
    assert not at.exception
    # A new engine under a new id, once it has state; the old one is in the list, whole.
    assert engine(at).config.num_blocks == 16 and not engine(at).requests
    assert (f"The state it replaced stays saved as session {store.short(first_id)}, under "
            "Recent sessions.") in texts(at.info)
    at.button(key="btn_add").click().run()
    second_id = sid(at)
    assert second_id != first_id
    assert sorted(r[0] for r in rows(data_dir)) == sorted([first_id, second_id])
    at.button(key=f"btn_open_{first_id}").click().run()
    assert sid(at) == first_id and state(at) == before


def test_apply_and_reset_after_a_failed_save_says_the_row_is_behind(
        browser: dict[str, str | None], data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_app()
    first_id = worked(at)
    saved_step = engine(at).step

    def failing(*_: Any) -> None:
        raise StoreError("the session store failed: disk full")

    with monkeypatch.context() as m:
        m.setattr(SessionStore, "write_op", failing)
        m.setattr(SessionStore, "write_full", failing)
        at.button(key="btn_add").click().run()
    assert engine(at).step == saved_step + 1
    # The Sessions panel does not call the row saved after every operation.
    assert [shown(c.value) for c in at.caption if shown(c.value).startswith(
        f"Session {store.short(first_id)}")] == [
        f"Session {store.short(first_id)} holds an earlier step: the last save failed (the "
        "note at the top says why), and the next operation tries again, writing it whole."]
    at.number_input(key="cfg_num_blocks").set_value(16).run()
    # Not "stay saved": the row holds the state of an earlier step.
    warned = " ".join(w.value for w in at.warning)
    assert "Recent sessions keeps them as last saved, before the operations that could not " \
           "be saved" in warned and "stay saved" not in warned
    at.button(key="btn_apply_config").click().run()
    assert (f"Session {store.short(first_id)}, under Recent sessions, holds the state it "
            "replaced as last saved, before the operations that could not be saved.") \
        in texts(at.info)
    at.button(key=f"btn_open_{first_id}").click().run()
    assert sid(at) == first_id and engine(at).step == saved_step


def test_the_session_exports_as_a_scenario_that_replays_checked(
        browser: dict[str, str | None], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    at = open_app()
    worked(at)
    ss = at.session_state
    final = export_snapshot(engine(at))
    data = exports._scenario_bytes(engine(at).config, None, tuple(ss["oplog"].ops), final,
                                   ss["history"])
    path = tmp_path / "exported.json"
    path.write_bytes(data)
    out = tmp_path / "out.json"
    assert main(["run", str(path), "--check", "--kernel", "torch", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    replayed = json.loads(out.read_text())
    assert {**replayed, "kernel": None} == {**final, "kernel": None}


def test_a_store_that_cannot_be_opened_leaves_the_app_working_unsaved(
        browser: dict[str, str | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the data directory should be")
    monkeypatch.setenv("PAGEDLAB_DATA_DIR", str(blocker))
    at = open_app()
    assert "Sessions are not saved on this server" in texts(at.warning)
    at.button(key="btn_add").click().run()
    assert not at.exception and engine(at).step == 1 and "session" not in at.query_params
    # A link to a session is not called expired or deleted: the store is what is
    # missing, and the address keeps naming the session so a reload tries again.
    wanted = new_id()
    linked = open_app(wanted)
    assert texts(linked.error) == (
        f"Saved session {wanted[:8]}… could not be opened: sessions are not saved on this "
        "server just now (the note at the top says why). The address still names it: reload "
        "once that is mended. This is a new session.")
    assert sid(linked) == wanted


def test_a_store_file_damaged_under_the_server_is_not_said_to_pass(
        browser: dict[str, str | None], data_dir: Path) -> None:
    first = open_app()
    session_id = worked(first)
    path = data_dir / FILE_NAME
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    again = open_app(session_id)
    said = texts(again.error)
    assert "the session store's file is damaged (database disk image is malformed)" in said
    assert "try again" not in said
    assert ("It is left as it was; the address still names it, for once the file is "
            "mended.") in said


def test_the_sessions_panel_says_what_the_next_operation_does_to_a_row_gone_or_taken() -> None:
    # (The "taken" line is seen in a tab above; "gone" follows a Delete in another tab.)
    assert store._saved_as("gFaJmxH9abc", "gone", False) == (
        "Session gFaJmxH9… has left the saved sessions (deleted in another tab, or dropped "
        "past the store's limits): this tab's next operation saves it again.")
    # Taken over by another tab, its failed save does not matter: the next is a copy.
    assert store._saved_as("gFaJmxH9abc", "taken", True).endswith(
        "this tab's next operation goes on as a copy under a new address.")
