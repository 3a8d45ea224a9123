"""The session store (backend/sessions/store.py, its rows in rows.py) and a tab's saved
session (saved.py).

Rows round-trip exactly, are written incrementally after an operation, are
bounded in size, number and age, and a damaged row of any kind is refused
with a message and changes nothing. The copy rule: the same browser resumes
a row, another browser copies it, and a tab whose row another tab opened
becomes a copy on its next save. Many threads write at once without losing
or mixing anything.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork, Grow, Op, Step
from backend.io.snapshot import export_snapshot
from backend.sessions import playground
from backend.sessions import store as store_module
from backend.sessions.budget import KVBudget
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Known, Settings, kept_snapshot, known_snapshots
from backend.sessions.rows import (
    MIB,
    StoreDamagedError,
    StoreError,
    StoreLimits,
    make_full,
    make_head,
)
from backend.sessions.saved import (
    COPY_NOTE,
    MOVED_ON_NOTE,
    REVIVED_NOTE,
    Live,
    Tab,
    new_id,
    open_saved,
    resume,
    row_standing,
    save,
)
from backend.sessions.store import (
    DEFAULT_DATA_DIR,
    SessionStore,
    Write,
    browser_key,
    data_dir,
    valid_token,
)
from ui import exports
from ui.engine_actions import Kept, kept_row

CONFIG = EngineConfig(num_blocks=24, block_size=4)
ME, THEM = browser_key(new_id()), browser_key(new_id())
BUDGET = KVBudget(512 * MIB, 4096 * MIB)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _store(tmp_path: Path, clock: Clock | None = None, **limits: Any) -> SessionStore:
    if clock is None:
        return SessionStore(tmp_path / "s.sqlite3", StoreLimits(**limits))
    return SessionStore(tmp_path / "s.sqlite3", StoreLimits(**limits), clock=clock)


def _live(ops: Sequence[Op] = ()) -> Live:
    engine = Engine(CONFIG, kernel="torch")
    live = Live(engine, Settings(CONFIG, "cpu", "torch"), History(), OpLog())
    for op in ops:
        _apply(live, op)
    return live


def _apply(live: Live, op: Op, tab: Tab | None = None) -> str | None:
    result = live.engine.apply(op)
    logged = live.oplog.append(result.op)
    snap = export_snapshot(live.engine)
    live.history.record(snap)
    return None if tab is None else save(tab, live, snap, op=logged)


def _state(snap: dict[str, Any]) -> dict[str, Any]:
    # A resumed engine's K/V are recomputed from the tokens, so its kernel-vs-reference
    # error may differ from the live engine's by float rounding; the tokens, tables and
    # events must be the same.
    return {**snap, "kernel": {**snap["kernel"], "time_ms": None, "max_abs_err": None}}


OPS: list[Op] = [Add("A", prompt="The cat sat on the mat."), Step(2), Fork("A", "A.1"),
                 Grow("A.1", 2), Add("B", prompt_len=7), Step(1)]


def _saved(tmp_path: Path, ops: list[Op] = OPS,
           clock: Clock | None = None) -> tuple[SessionStore, Tab, Live]:
    store = _store(tmp_path, clock)
    tab = Tab(store, ME)
    live = _live()
    for op in ops:
        assert _apply(live, op, tab) is None
    assert tab.id is not None and valid_token(tab.id)
    return store, tab, live


# ---- ids --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "", "short", "x" * 65, "a" * 10_000, "é" * 32, "Robert'); DROP TABLE sessions;--",
    "abc def ghi jkl mno pqr", "../../../../etc/passwd/xx", "%27%20OR%201%3D1%20--%20aa",
    "ａｂｃｄｅｆｇｈｉｊｋｌｍｎｏｐ", None, 12345678901234567890, ["x" * 32]])
def test_values_that_are_not_our_ids_are_refused(value: Any) -> None:
    assert not valid_token(value)


def test_new_ids_are_valid_and_distinct() -> None:
    ids = {new_id() for _ in range(200)}
    assert len(ids) == 200 and all(valid_token(i) and len(i) == 32 for i in ids)


def test_the_test_run_saves_sessions_outside_the_repository() -> None:
    # tests/conftest.py points the store at a temporary directory for the run, so
    # AppTests and the browser tests' servers never fill the repository's data/.
    root = Path(__file__).resolve().parents[1]
    assert data_dir() != DEFAULT_DATA_DIR
    assert not data_dir().resolve().is_relative_to(root)


# ---- round trip and incremental writes ----------------------------------------------------

def test_the_file_is_created_on_first_use_in_wal_mode(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "deeper" / "dir" / "s.sqlite3", StoreLimits())
    assert (tmp_path / "deeper" / "dir" / "s.sqlite3").exists()
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_session_resumes_exactly(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    stored = store.load(tab.id or "")
    assert stored is not None and stored.owned_by(ME) and not stored.owned_by(THEM)
    again, notes = resume(stored, "owner", budget=BUDGET)
    assert notes == []
    assert export_snapshot(again.engine) == export_snapshot(live.engine)
    assert again.settings == live.settings
    assert again.oplog.ops == live.oplog.ops and again.oplog.complete
    assert list(again.history) == list(live.history)
    # And it goes on as the original would.
    _apply(again, Step(3))
    _apply(live, Step(3))
    assert _state(export_snapshot(again.engine)) == _state(export_snapshot(live.engine))


def test_each_operation_adds_one_op_and_one_history_step(tmp_path: Path) -> None:
    store, tab, _ = _saved(tmp_path)
    with sqlite3.connect(store.path) as db:
        ops = db.execute("SELECT seq, op FROM ops WHERE session=? ORDER BY seq",
                         (tab.id,)).fetchall()
        steps = [s for (s,) in db.execute("SELECT step FROM steps WHERE session=? ORDER BY "
                                          "step", (tab.id,))]
    assert [json.loads(o)["op"] for _, o in ops] == ["add", "step", "fork", "grow", "add",
                                                       "step"]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_the_history_kept_is_the_live_one(tmp_path: Path) -> None:
    store = _store(tmp_path)
    tab = Tab(store, ME)
    live = _live()
    live.history = History(max_steps=3)
    for op in OPS:
        _apply(live, op, tab)
    stored = store.load(tab.id or "")
    assert stored is not None and [s for s, _, _ in stored.steps] == [4, 5, 6]
    again, _ = resume(stored, "owner", budget=BUDGET)
    assert [s["step"] for s in again.history] == [4, 5, 6]


def test_a_restarted_log_is_written_whole(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    base = export_snapshot(live.engine)
    live.oplog = OpLog(base)
    live.history = History()
    live.history.record(base)
    assert save(tab, live, base, whole=True) is None
    _apply(live, Step(1), tab)
    stored = store.load(tab.id or "")
    assert stored is not None and stored.base == base and stored.ops == [{"op": "step",
                                                                          "count": 1}]
    again, _ = resume(stored, "o", budget=BUDGET)
    assert again.oplog.base_step == 6 and again.engine.step == 7


# ---- the copy rule ------------------------------------------------------------------------

def test_the_same_browser_resumes_another_browser_copies(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    sid = tab.id or ""
    mine = Tab(store, ME)
    opened = open_saved(mine, sid, "o2", budget=BUDGET)
    assert opened is not None and not opened.copied and mine.id == sid
    theirs = Tab(store, THEM)
    copied = open_saved(theirs, sid, "o3", budget=BUDGET)
    assert copied is not None and copied.copied
    assert export_snapshot(copied.live.engine) == export_snapshot(live.engine)
    # Opening writes nothing (a class opening one link pushes no session past the
    # store's limits): the address keeps the link's id until the first save.
    assert (theirs.id, theirs.shown_id) == (None, sid) and store.recent(THEM) == []
    # The copy is theirs: working on it leaves the original alone.
    _apply(copied.live, Step(2), theirs)
    assert theirs.id not in (None, sid) and theirs.shown_id == theirs.id
    original = store.load(sid)
    assert original is not None and original.snapshot["step"] == 6
    copy = store.load(theirs.id or "")
    assert copy is not None and copy.snapshot["step"] == 7 and copy.owned_by(THEM)
    assert [s.id for s in store.recent(THEM)] == [theirs.id]


def test_a_tab_whose_row_another_tab_opened_goes_on_as_a_copy(tmp_path: Path) -> None:
    store, first, live = _saved(tmp_path)
    sid = first.id
    second = Tab(store, ME)
    assert row_standing(first) is None
    opened = open_saved(second, sid or "", "o2", budget=BUDGET)
    assert opened is not None
    # Known before the first tab's next save: its panel says so (ui/store.py).
    assert (row_standing(first), row_standing(second)) == ("taken", None)
    assert _apply(live, Step(1), first) == COPY_NOTE
    assert row_standing(first) is None
    assert first.id not in (None, sid)
    # The row stays the second tab's, which goes on writing it.
    assert _apply(opened.live, Grow("A", 1), second) is None
    row = store.load(sid or "")
    copy = store.load(first.id or "")
    assert row is not None and copy is not None
    assert row.ops[-1] == {"op": "grow", "request": "A", "tokens": 1}
    assert copy.ops[-1] == {"op": "step", "count": 1} and len(copy.ops) == 7


def test_a_row_that_cannot_be_read_is_not_said_to_be_taken_or_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, tab, _ = _saved(tmp_path)

    def unavailable(sid: str) -> str | None:
        raise StoreError("the session store failed: disk I/O error")

    monkeypatch.setattr(store, "holder", unavailable)
    assert row_standing(tab) is None


def test_a_deleted_row_is_written_again_by_its_tab(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    assert not store.delete(tab.id or "", THEM)       # only its own browser deletes it
    assert store.delete(tab.id or "", ME)
    assert store.load(tab.id or "") is None
    assert row_standing(tab) == "gone"
    # Saved again under its address, saying so: the person may have deleted it from
    # another tab and would otherwise see it come back unexplained.
    assert _apply(live, Step(1), tab) == REVIVED_NOTE
    stored = store.load(tab.id or "")
    assert stored is not None and len(stored.ops) == 7
    assert _apply(live, Step(1), tab) is None       # once
    assert row_standing(tab) is None


def test_a_session_without_state_writes_nothing_until_it_has_some(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.recent(ME) == [] and store.latest(ME) is None
    tab = Tab(store, ME)
    live = _live()
    _apply(live, OPS[0], tab)
    assert store.latest(ME) == tab.id


# ---- bounds -------------------------------------------------------------------------------

def test_rows_expire_and_the_oldest_go_past_the_count(tmp_path: Path) -> None:
    clock = Clock()
    store = SessionStore(tmp_path / "s.sqlite3", StoreLimits(max_sessions=3, ttl_s=100.0),
                         clock=clock)
    live = _live(OPS[:1])
    snap = export_snapshot(live.engine)
    full = make_full(make_head({}, snap, "x", store.limits), None, [], True, [])
    ids = []
    for _ in range(5):
        clock.now += 1
        ids.append(new_id())
        store.create(ids[-1], ME, "h", full)
    assert [s.id for s in store.recent(ME)] == ids[:1:-1]
    clock.now += 99.5
    assert [s.id for s in store.recent(ME)] == [ids[4]]      # the others are past their time
    assert store.load(ids[3]) is None
    store.prune()
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
        assert db.execute("SELECT count(*) FROM ops").fetchone()[0] == 0


def test_the_oldest_go_past_the_total_bytes(tmp_path: Path) -> None:
    clock = Clock()
    store = SessionStore(tmp_path / "s.sqlite3", StoreLimits(max_total_bytes=6000),
                         clock=clock)
    live = _live(OPS)
    snap = export_snapshot(live.engine)
    full = make_full(make_head({}, snap, "x", store.limits), None, [], True, [])
    size = len(full.head.snapshot)
    assert 1000 < size < 3000
    ids = []
    for _ in range(6):
        clock.now += 1
        ids.append(new_id())
        store.create(ids[-1], ME, "h", full)
    kept = [s.id for s in store.recent(ME)]
    assert kept == ids[::-1][:len(kept)] and len(kept) == 6000 // size


def test_a_snapshot_over_the_limit_is_not_saved_and_the_row_says_so(tmp_path: Path) -> None:
    store = _store(tmp_path, max_snapshot_bytes=12_000)
    tab = Tab(store, ME)
    live = _live()
    note = None
    for op in [*OPS, Step(40), Step(40)]:
        note = _apply(live, op, tab) or note
    assert note is not None and "Not saved after step" in note and "a saved session may hold" \
        in note
    stored = store.load(tab.id or "")
    assert stored is not None and stored.note is not None and "earlier step" in stored.note
    again, notes = resume(stored, "o", budget=BUDGET)
    assert again.engine.step < live.engine.step and any("earlier step" in n for n in notes)


# ---- damaged rows ---------------------------------------------------------------------------

def _corrupt(store: SessionStore, sql: str, *args: Any) -> None:
    with sqlite3.connect(store.path) as db:
        # Damage written past PagedLab's own rules (its triggers included).
        db.execute("DROP TRIGGER IF EXISTS sessions_revised")
        db.execute("DROP TRIGGER IF EXISTS sessions_revised_new")
        db.execute(sql, args)


CORRUPTIONS = {
    "format": ("UPDATE sessions SET format=7", (), "session format 7"),
    "settings-json": ("UPDATE sessions SET settings='{not json'", (), "not valid JSON"),
    "settings-shape": ("UPDATE sessions SET settings='[1, 2]'", (), "not a JSON object"),
    "settings-config": ("UPDATE sessions SET settings=?",
                        (json.dumps({"config": {"num_blocks": -3}, "device": "cpu",
                                     "kernel": "torch"}),), "num_blocks"),
    "snapshot-zlib": ("UPDATE sessions SET snapshot=?", (b"not zlib at all",), "damaged"),
    "snapshot-cut": ("UPDATE sessions SET snapshot=substr(snapshot, 1, 40)", (), "cut short"),
    "snapshot-text": ("UPDATE sessions SET snapshot='plain text'", (), "not stored data"),
    "snapshot-json": ("UPDATE sessions SET snapshot=?", (zlib.compress(b"{]"),),
                      "not valid JSON"),
    "snapshot-bomb": ("UPDATE sessions SET snapshot=?", (zlib.compress(b" " * (40 * MIB)),),
                      "inflates past"),
    "snapshot-step": ("UPDATE sessions SET snapshot=?",
                      (zlib.compress(b'{"events": [], "step": "six"}'),),
                      "not a snapshot object"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_damaged_row_is_refused_with_a_message_and_left_alone(tmp_path: Path,
                                                                name: str) -> None:
    store, tab, _ = _saved(tmp_path)
    sql, args, message = CORRUPTIONS[name]
    _corrupt(store, sql, *args)
    with sqlite3.connect(store.path) as db:
        before = db.execute("SELECT * FROM sessions").fetchall()
    reader = Tab(store, ME)
    with pytest.raises(PagedLabError, match=message):
        open_saved(reader, tab.id or "", "o", budget=BUDGET)
    assert reader.id is None
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT * FROM sessions").fetchall() == before
    # The list reads no state, so it still shows the row (to open or delete it).
    assert [s.id for s in store.recent(ME)] == [tab.id]


HISTORY_DAMAGE = {
    "history": ("UPDATE steps SET num_events=100000 WHERE step=3",
                "history step 3 is damaged"),
    "history-last": ("UPDATE steps SET body=(SELECT body FROM steps s WHERE s.step=5) "
                     "WHERE step=6", "history step 6 is damaged"),
    "history-zlib": ("UPDATE steps SET body=X'00' WHERE step=2", "history step 2 is cut short"),
    "history-json": ("UPDATE steps SET body=X'" + zlib.compress(b"{not json").hex() + "' "
                     "WHERE step=2", "history step 2 is not valid JSON"),
    "history-twice": ("UPDATE steps SET body=X'" + zlib.compress(b'{"step": 2, "step": 2}')
                      .hex() + "' WHERE step=2", "history step 2 is ambiguous"),
}


@pytest.mark.parametrize("name", list(HISTORY_DAMAGE))
def test_a_damaged_history_opens_the_session_without_it_and_says_so(tmp_path: Path,
                                                                    name: str) -> None:
    """The history only keeps the timeline's earlier states; the snapshot holds the session
    whole. One damaged history step locked the whole session out."""
    store, tab, live = _saved(tmp_path)
    sql, where = HISTORY_DAMAGE[name]
    _corrupt(store, sql)
    reader = Tab(store, ME)
    opened = open_saved(reader, tab.id or "", "o", budget=BUDGET)
    assert opened is not None and reader.id == tab.id and not opened.copied
    assert _state(export_snapshot(opened.live.engine)) == _state(export_snapshot(live.engine))
    assert [s["step"] for s in opened.live.history] == [live.engine.step]
    assert kept_row(reader, opened.live.engine) == Kept(tab.id, True)
    [note] = opened.notes
    assert note.startswith(f"its earlier steps could not be read back (its {where}")
    assert note.endswith("), so it opens without them: its timeline's past states start at "
                         "this step, and the next save writes the session whole")
    # The next save writes it whole: the damaged step is gone, and it opens cleanly.
    assert _apply(opened.live, Step(1), reader) is None
    again = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert again is not None and again.notes == []
    assert [s["step"] for s in again.live.history] == [live.engine.step,
                                                       live.engine.step + 1]


# A body that is valid JSON naming its own step, so the row's shape check passes it, but
# no state the engine could have been in: the views would fail on it.
WRONG_STATES = {
    "blocks": lambda body: body.__setitem__("blocks", "garbage"),
    "metrics": lambda body: body.__setitem__("metrics", "x"),
    "config": lambda body: body.pop("config"),
    "ref-count": lambda body: body["blocks"][0].__setitem__("ref_count", 7),
}


@pytest.mark.parametrize("name", list(WRONG_STATES))
def test_a_history_step_no_engine_could_hold_is_refused_when_shown_and_the_saved_steps_go(
        tmp_path: Path, name: str) -> None:
    """A saved step is checked as a restore checks a snapshot the first time it is shown
    (checking 100 steps at open would cost SmolLM2's seconds); a damaged one is said, not
    a traceback, and the steps read back with it leave the history and the row."""
    store, tab, live = _saved(tmp_path)
    with sqlite3.connect(store.path) as db:
        blob = db.execute("SELECT body FROM steps WHERE step=3").fetchone()[0]
        body = json.loads(zlib.decompress(blob))
        WRONG_STATES[name](body)
        db.execute("UPDATE steps SET body=? WHERE step=3",
                   (zlib.compress(json.dumps(body).encode()),))
    reader = Tab(store, ME)
    opened = open_saved(reader, tab.id or "", "o", budget=BUDGET)
    assert opened is not None and opened.notes == []
    history = opened.live.history
    assert [s["step"] for s in history] == [1, 2, 3, 4, 5, 6]
    assert kept_snapshot(history, 2) == live.history[1]       # checked, and sound
    with pytest.raises(PagedLabError, match=(
            r"^the saved state after step 3 could not be read back \(.+\), so the "
            "steps saved before this session was opened are left out of its history$")):
        kept_snapshot(history, 3)
    assert [s["step"] for s in history] == [6]                 # the live state stays
    assert kept_snapshot(history, 2) is None
    assert history.entry(0)[0].checked and not history.entry(0)[0].saved
    # The next save keeps only the steps the history holds.
    assert _apply(opened.live, Step(1), reader) is None
    again = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert again is not None
    assert [s["step"] for s in again.live.history] == [6, 7]


def _damage_step(store: SessionStore, live: Live, step: int) -> None:
    """Saved step `step` of the right shape (the row's checks pass it) holding no state:
    its `blocks` a string."""
    body = {k: v for k, v in live.history[step - 1].items() if k != "events"}
    _corrupt(store, "UPDATE steps SET body=? WHERE step=?",
             zlib.compress(json.dumps({**body, "events": [], "blocks": "garbage"}).encode()),
             step)


def test_the_step_a_session_was_opened_at_stays_when_a_saved_step_is_found_damaged_later(
        tmp_path: Path) -> None:
    """The step a session opened at equals its restored engine's export: it is the
    engine's own, and outlives the steps read back before it."""
    store, tab, live = _saved(tmp_path)
    _damage_step(store, live, 3)
    reader = Tab(store, ME)
    opened = open_saved(reader, tab.id or "", "o", budget=BUDGET)
    assert opened is not None
    _apply(opened.live, Step(1), reader)
    with pytest.raises(PagedLabError, match="the saved state after step 3"):
        kept_snapshot(opened.live.history, 3)
    assert [s["step"] for s in opened.live.history] == [6, 7]


def test_a_history_read_while_steps_are_recorded_checks_the_entries_it_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download builds its file in a thread of its own: a step recorded (and the oldest
    evicted) while it checks must not make it mark another entry (by index, step 2 took
    step 1's place and was marked checked), or hand out a damaged step."""
    store, tab, live = _saved(tmp_path)
    _damage_step(store, live, 2)
    opened = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert opened is not None
    history = opened.live.history
    history.max_steps = len(history)
    checked = threading.Event()
    real = playground.check_snapshot

    def slow(snap: dict[str, Any]) -> None:
        if snap["step"] == 1:
            checked.set()
            # The script thread records a step meanwhile, evicting step 1.
            assert record.wait(5)
        real(snap)

    record = threading.Event()
    monkeypatch.setattr(playground, "check_snapshot", slow)
    got: list[list[int]] = []
    reader = threading.Thread(target=lambda: got.append(
        [s["step"] for s in known_snapshots(history).snapshots]))
    reader.start()
    assert checked.wait(5)
    engine = opened.live.engine
    engine.apply(Step(1))
    history.record(export_snapshot(engine))
    record.set()
    reader.join(5)
    # Step 1 passed (as it was read), step 2 was refused, and the steps after it that
    # were read back went with it: the export gets step 1 and the opened step 6.
    assert got == [[1, 6]]
    # The history lost every step read back; the opened step and the new one stay.
    assert [s["step"] for s in history] == [6, 7]
    assert kept_snapshot(history, 2) is None


def test_a_scenario_export_takes_its_earlier_expect_values_from_sound_steps_alone(
        tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    _corrupt(store, "UPDATE steps SET body=? WHERE step=3", zlib.compress(json.dumps(
        {**live.history[2], "metrics": {**live.history[2]["metrics"], "used_blocks": 99}}
    ).encode()))
    opened = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert opened is not None
    # Steps 1 and 2 passed before step 3 was refused; 4 and 5 went with it.
    known = known_snapshots(opened.live.history)
    assert [s["step"] for s in known.snapshots] == [1, 2, 6]
    assert known.refused is not None and known.refused.startswith(
        "the saved state after step 3 could not be read back (")
    # The scenario file is built in the download's thread, after the page is drawn: its
    # description says why some steps carry no expect values.
    reopened = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert reopened is not None
    again = reopened.live
    final = export_snapshot(again.engine)
    scenario = json.loads(exports._scenario_bytes(
        again.engine.config, again.oplog.base, tuple(again.oplog.ops), final, again.history))
    assert scenario["description"].startswith(
        "A PagedLab Playground session exported at step 6 with 3 requests; each step's "
        "expect values are what the session showed. The saved state after step 3 could not "
        "be read back (")
    assert scenario["description"].endswith(
        "left out of its history. The steps from that one on that were saved before this "
        "session was opened carry no expect values here.")
    assert [i + 1 for i, s in enumerate(scenario["steps"]) if "expect" in s] == [1, 2, 6]
    # A second export of the same session, its history now without the steps read back,
    # says so too (it has fewer expect values, and the same reason).
    later = json.loads(exports._scenario_bytes(
        again.engine.config, again.oplog.base, tuple(again.oplog.ops), final, again.history))
    assert [i + 1 for i, s in enumerate(later["steps"]) if "expect" in s] == [6]
    assert later["description"] == scenario["description"]
    # A history started afresh forgets it.
    again.history.clear()
    assert again.history.dropped_because is None
    assert [s["step"] for s in opened.live.history] == [6]
    # A sound history gives every step.
    _corrupt(store, "UPDATE steps SET body=? WHERE step=3",
             zlib.compress(json.dumps(live.history[2]).encode()))
    sound = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert sound is not None
    assert known_snapshots(sound.live.history) == Known(list(live.history))


def test_a_row_whose_step_is_not_a_number_is_left_out_of_the_list(tmp_path: Path) -> None:
    """SQLite keeps any value in any column: one such row failed every visit from its
    browser, since the list (and the bare address's latest session) is read first."""
    store, tab, _ = _saved(tmp_path)
    other = Tab(store, ME)
    other_live = _live()
    _apply(other_live, Add("Z", prompt_len=5), other)
    assert [i.id for i in store.recent(ME)] == [other.id, tab.id]
    for column, value in (("step", "abc"), ("created", "yesterday"), ("updated", "soon")):
        with sqlite3.connect(store.path) as db:
            [was] = db.execute(f"SELECT {column} FROM sessions WHERE id=?", (other.id,)).fetchone()
        _corrupt(store, f"UPDATE sessions SET {column}=? WHERE id=?", value, other.id)
        assert [i.id for i in store.recent(ME)] == [tab.id], column
        assert store.latest(ME) == tab.id
        _corrupt(store, f"UPDATE sessions SET {column}=? WHERE id=?", was, other.id)
        assert [i.id for i in store.recent(ME)] == [other.id, tab.id]
    # Its address still opens it.
    _corrupt(store, "UPDATE sessions SET step='abc' WHERE id=?", other.id)
    assert open_saved(Tab(store, ME), other.id or "", "o", budget=BUDGET) is not None


OPLOG_DAMAGE = {
    "op-json": ("UPDATE ops SET op='{\"op\": \"grow\"' WHERE seq=2",
                "the operation of step 3 is not valid JSON"),
    "op-unknown": ("UPDATE ops SET op='{\"op\": \"explode\"}' WHERE seq=2",
                   "the operation of step 3: unknown op 'explode'"),
    "op-missing": ("DELETE FROM ops WHERE seq=5", "it ends at step 5 but the snapshot is step 6"),
    "op-gap": ("DELETE FROM ops WHERE seq=1", "its entry for step 2 is missing or damaged"),
    "base": ("UPDATE sessions SET base=X'00'", "its base snapshot is cut short"),
    "flag": ("UPDATE sessions SET ops_complete=5", "its flag is neither 0 nor 1"),
}


@pytest.mark.parametrize("name", list(OPLOG_DAMAGE))
def test_a_damaged_operation_log_opens_the_session_without_it_and_says_so(
        tmp_path: Path, name: str) -> None:
    """The operation log only turns the session into a scenario file; the snapshot holds
    the session whole. One damaged operation locked the whole session out."""
    store, tab, live = _saved(tmp_path)
    sql, where = OPLOG_DAMAGE[name]
    _corrupt(store, sql)
    reader = Tab(store, ME)
    opened = open_saved(reader, tab.id or "", "o", budget=BUDGET)
    assert opened is not None and reader.id == tab.id and not opened.copied
    assert _state(export_snapshot(opened.live.engine)) == _state(export_snapshot(live.engine))
    [note] = opened.notes
    assert note.startswith(f"its operation log is damaged ({where}")
    assert note.endswith("), so it opens without it: its state is whole, but it can no longer "
                         "be exported as a scenario or replayed in a control run, and the "
                         "next save writes the session whole")
    log = opened.live.oplog
    assert not log.complete and log.ops == [] and log.base is None
    why = log.why_not_exportable()
    assert why is not None and why.startswith(
        f"its operation log was found damaged when the session was opened ({where}")
    # The row holds the state meanwhile: a replacement of the engine is told so.
    assert kept_row(reader, opened.live.engine) == Kept(tab.id, True)
    # The next save writes it whole, as a session whose log is not kept: it opens
    # cleanly, and still says why it has no scenario file.
    assert _apply(opened.live, Step(1), reader) is None
    again = open_saved(Tab(store, ME), tab.id or "", "o", budget=BUDGET)
    assert again is not None and again.notes == []
    assert not again.live.oplog.complete
    assert again.live.oplog.why_not_exportable() == (
        "its operation log is no longer kept: it passed 10,000 operations or 4 MiB, or "
        "was found damaged when the session was opened")


def test_a_state_the_restore_refuses_is_refused_and_left_alone(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    snap = export_snapshot(live.engine)
    snap["blocks"][0]["ref_count"] += 5
    _corrupt(store, "UPDATE sessions SET snapshot=?", zlib.compress(json.dumps(snap).encode()))
    _corrupt(store, "DELETE FROM steps")
    budget = KVBudget(512 * MIB, 4096 * MIB)
    with pytest.raises(PagedLabError, match="block 0 has ref_count"):
        open_saved(Tab(store, ME), tab.id or "", "o", budget=budget)
    assert budget.in_use() == 0


def test_a_file_that_is_no_database_is_refused_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(StoreError, match="cannot open the session store"):
        SessionStore(path, StoreLimits())


def test_a_file_damaged_after_it_was_opened_is_said_to_be_damaged_not_busy(
        tmp_path: Path) -> None:
    """SQLite's "database disk image is malformed" was reported as a passing failure, and
    the page said to try again in a moment: waiting mends nothing."""
    store, tab, _ = _saved(tmp_path)
    with sqlite3.connect(store.path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    path = store.path
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    damaged = SessionStore(path, StoreLimits())
    with pytest.raises(StoreDamagedError, match=(
            r"^the session store's file is damaged \(database disk image is malformed\)$")):
        damaged.load(tab.id or "")
    # A lock held past the wait is still a passing failure.
    held = SessionStore(tmp_path / "other.sqlite3", StoreLimits())
    blocker = sqlite3.connect(held.path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        note = _apply(_live(), Add("A", prompt_len=3), Tab(held, ME))
        assert note is not None and "the session store failed: database is locked" in note
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


@pytest.mark.parametrize(("code", "damaged"), [
    (11, True), (779, True), (26, True),      # SQLITE_CORRUPT, _CORRUPT_INDEX, _NOTADB
    (5, False), (13, False), (None, False)])  # SQLITE_BUSY, _FULL, no code
def test_sqlites_extended_codes_tell_a_damaged_file_from_a_passing_failure(
        code: int | None, damaged: bool) -> None:
    exc = sqlite3.DatabaseError("database disk image is malformed")
    if code is not None:
        exc.sqlite_errorcode = code
    assert isinstance(store_module._failed(exc), StoreDamagedError) is damaged


def _as_layout_1(path: Path) -> None:
    """Make `path` what PagedLab wrote before rows had a revision."""
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER sessions_revised")
        db.execute("DROP TRIGGER sessions_revised_new")
        db.execute("ALTER TABLE sessions DROP COLUMN revision")
        db.execute("PRAGMA user_version=1")


def test_a_store_of_the_layout_before_revisions_is_upgraded_in_place(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    store.close()
    path, sid = store.path, tab.id or ""
    _as_layout_1(path)
    # Two servers starting on the file at once: one upgrades, the other finds it done.
    opened: list[SessionStore] = []
    starts = [threading.Thread(target=lambda: opened.append(SessionStore(path, StoreLimits())))
              for _ in range(2)]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    assert len(opened) == 2
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    upgraded = opened[0]
    row = upgraded.load(sid)
    assert row is not None and row.revision == 0
    assert row.snapshot == export_snapshot(live.engine)
    # A tab that read revision 0 takes the row only until its first write replaces it.
    assert upgraded.claim(sid, "a tab", if_unchanged=0)
    assert not upgraded.claim(sid, "another tab", if_unchanged=0)
    after = opened[1].load(sid)
    assert after is not None and after.holder == "a tab" and after.revision != 0


def test_a_server_of_the_layout_before_still_writing_the_upgraded_file_is_refused(
        tmp_path: Path) -> None:
    # Its writes would leave the revision as it was, so a tab that read the row before
    # them could take it over and put it back to what it read. The file refuses them.
    store, tab, _ = _saved(tmp_path)
    sid = tab.id or ""
    before = store.load(sid)
    assert before is not None
    with sqlite3.connect(store.path) as db:
        for old_write in ("UPDATE sessions SET updated=1, step=99 WHERE id=?",
                          "UPDATE sessions SET holder='old server' WHERE id=?",
                          "UPDATE sessions SET note='behind' WHERE id=?"):
            with pytest.raises(sqlite3.IntegrityError, match="upgraded by a newer PagedLab"):
                db.execute(old_write, (sid,))
        # Its whole-session write: the row deleted and inserted again, with no revision.
        db.execute("CREATE TEMP TABLE kept AS SELECT * FROM sessions WHERE id=?", (sid,))
        columns = [c[1] for c in db.execute("PRAGMA table_info(sessions)")
                   if c[1] != "revision"]
        listed = ", ".join(columns)
        db.execute("DELETE FROM sessions WHERE id=?", (sid,))
        with pytest.raises(sqlite3.IntegrityError, match="give a session no revision"):
            db.execute(f"INSERT INTO sessions ({listed}) SELECT {listed} FROM kept")
        db.rollback()
    after = store.load(sid)
    assert after is not None and after.revision == before.revision
    assert after.holder == before.holder and after.snapshot == before.snapshot
    # PagedLab's own writes change it, and pass.
    assert store.claim(sid, "a tab", if_unchanged=before.revision)


def test_a_store_of_the_layout_without_triggers_gets_them(tmp_path: Path) -> None:
    store, tab, _ = _saved(tmp_path)
    store.close()
    with sqlite3.connect(store.path) as db:
        db.execute("DROP TRIGGER sessions_revised")
        db.execute("DROP TRIGGER sessions_revised_new")
        db.execute("PRAGMA user_version=2")
    SessionStore(store.path, StoreLimits()).close()
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        assert sorted(r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type='trigger'")) == [
            "sessions_revised", "sessions_revised_new"]
        with pytest.raises(sqlite3.IntegrityError, match="upgraded by a newer PagedLab"):
            db.execute("UPDATE sessions SET step=99 WHERE id=?", (tab.id,))


def test_a_database_of_another_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=9")
    with pytest.raises(StoreError, match="layout 9"):
        SessionStore(path, StoreLimits())


def test_a_restore_the_budget_refuses_names_it_and_builds_nothing(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    tiny = KVBudget(CONFIG.kv_bytes // 2, 4096 * MIB)
    reader = Tab(store, ME)
    with pytest.raises(PagedLabError, match="a browser session may hold at most"):
        open_saved(reader, tab.id or "", "o", budget=tiny)
    assert tiny.in_use() == 0 and reader.id is None
    # Replacing an engine gives its bytes back: exactly one session's worth fits.
    fits = KVBudget(CONFIG.kv_bytes, 4096 * MIB)
    fits.track(live.engine, "o")
    opened = open_saved(reader, tab.id or "", "o", replacing=live.engine, budget=fits)
    assert opened is not None


def test_store_writes_report_a_taken_or_missing_row(tmp_path: Path) -> None:
    store, tab, live = _saved(tmp_path)
    snap = export_snapshot(live.engine)
    head = make_head({}, snap, "x", store.limits)
    assert store.write_op(tab.id or "", "someone else", head, None, None, None, True) \
        is Write.TAKEN
    assert store.write_op(new_id(), tab.holder, head, None, None, None, True) is Write.MISSING


# ---- concurrency ------------------------------------------------------------------------------

def test_many_threads_save_their_sessions_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    n, rounds = 6, 12
    tabs = [Tab(store, browser_key(new_id())) for _ in range(n)]
    lives = [_live(OPS[:1]) for _ in range(n)]
    for tab, live in zip(tabs, lives, strict=True):
        save(tab, live, export_snapshot(live.engine), op=live.oplog.ops[0])
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def drive(i: int) -> None:
        barrier.wait()
        try:
            for r in range(rounds):
                note = _apply(lives[i], Step(1) if r % 2 else Grow("A", 1), tabs[i])
                assert note is None, note
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    for tab, live in zip(tabs, lives, strict=True):
        stored = store.load(tab.id or "")
        assert stored is not None and stored.owned_by(tab.browser)
        assert stored.snapshot == export_snapshot(live.engine)
        assert stored.ops == live.oplog.ops and len(stored.ops) == rounds + 1


# ---- another process holding the database ------------------------------------------------

def test_reads_do_not_wait_behind_a_save_and_a_save_gives_up_on_a_held_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import backend.sessions.store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    store, tab, live = _saved(tmp_path)
    assert tab.id is not None
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")      # another process holds the write lock
    try:
        # A save waits at most BUSY_TIMEOUT_S, then fails with a message; the tab's
        # state is kept and its next save writes it whole.
        note = _apply(live, Step(1), tab)
        assert note == f"Not saved after step {live.engine.step}: the session store failed: " \
                       "database is locked."
        # Behind: the row holds an earlier step (what a replacement's message says).
        assert not tab.synced and tab.behind
        # While a save holds the writing connection (here: its lock, taken as a save
        # waiting on SQLite holds it), reads still answer: the list and a load.
        found: list[Any] = []
        with store._lock:
            reader = threading.Thread(target=lambda: found.extend(
                [store.recent(ME), store.load(tab.id or "")]))
            reader.start()
            reader.join(timeout=120)
            assert not reader.is_alive()
        assert [s.id for s in found[0]] == [tab.id] and found[1] is not None
        # A save queued behind that one waits for the same BUSY_TIMEOUT_S in all, not
        # for its turn and then the timeout again: saves queued behind another
        # process's lock fail within it, one after another.
        notes: list[str | None] = []
        with store._lock:
            queued = threading.Thread(target=lambda: notes.append(_apply(live, Step(1), tab)))
            queued.start()
            queued.join(timeout=120)
            assert not queued.is_alive()
        assert notes == [f"Not saved after step {live.engine.step}: the session store failed: "
                         "database is locked (the saves before this one are still waiting "
                         "for it)."]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _apply(live, Step(1), tab) is None and tab.synced and not tab.behind
    stored = store.load(tab.id)
    assert stored is not None and stored.snapshot == export_snapshot(live.engine)


def test_a_session_read_while_the_store_is_locked_opens_and_is_taken_over_at_its_next_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import backend.sessions.store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    store, tab, live = _saved(tmp_path)
    sid = tab.id or ""
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        # A reload: the row reads (WAL readers do not wait), but taking it over cannot
        # be written; the session still opens, under its own id.
        again = Tab(store, ME)
        opened = open_saved(again, sid, "o2", budget=BUDGET)
        assert opened is not None and not opened.copied
        assert (again.id, again.shown_id) == (sid, sid) and again.pending_claim is not None
        # Not synced (not taken over), but not behind: the row holds what it shows.
        assert not again.synced and not again.behind
        # The row's holder is still the first tab, but this one is to take it over at
        # its next save: not said to be taken from it.
        assert row_standing(again) is None
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Its next save takes the row first, then writes the operation (not a copy).
    assert _apply(opened.live, Step(1), again) is None
    assert again.id == sid and again.pending_claim is None
    stored = store.load(sid)
    assert stored is not None and stored.snapshot == export_snapshot(opened.live.engine)
    # The tab that held it before finds it taken, and goes on as a copy.
    assert _apply(live, Step(1), tab) == COPY_NOTE and tab.id != sid


def _reopened_for_a_bare_address(tmp_path: Path, clock: Clock | None = None,
                                 ) -> tuple[SessionStore, Tab, Live, Tab, Any]:
    """A session saved by one tab, and a second tab that reopened it for a bare address."""
    store, tab, live = _saved(tmp_path, clock=clock)
    reader = Tab(store, ME)
    opened = open_saved(reader, tab.id or "", "o2", budget=BUDGET, take_now=False)
    assert opened is not None
    return store, tab, live, reader, opened


def test_the_latest_session_reopened_for_a_bare_address_is_taken_over_only_when_it_acts(
        tmp_path: Path) -> None:
    # A second tab opened on "/" (or on another page) reopens the browser's latest
    # session: the tab at work on it keeps saving until the second one acts.
    store, tab, live, reader, opened = _reopened_for_a_bare_address(tmp_path)
    sid = tab.id
    assert reader.id == sid and reader.pending_claim is not None
    assert (row_standing(reader), row_standing(tab)) == (None, None)
    # Its address stays bare until it acts: a reload is a bare address again, not a
    # link (which would take the session at once).
    assert reader.shown_id is None
    # The reader acts first: it takes the row and writes its own state whole; the tab
    # that held it goes on as a copy, its work kept.
    assert _apply(opened.live, Grow("A", 1), reader) is None and reader.id == sid
    assert reader.shown_id == sid
    stored = store.load(sid)
    assert stored is not None and stored.snapshot == export_snapshot(opened.live.engine)
    assert stored.ops == opened.live.oplog.ops
    assert _apply(live, Step(1), tab) == COPY_NOTE and tab.id not in (None, sid)
    copy = store.load(tab.id or "")
    assert copy is not None and copy.snapshot == export_snapshot(live.engine)


@pytest.mark.parametrize("clock", [None, Clock()], ids=["wall clock", "a clock standing still"])
def test_a_session_that_moved_on_since_a_tab_read_it_is_not_rolled_back_by_that_tab(
        tmp_path: Path, clock: Clock | None) -> None:
    # The tab at work saves two more steps after a bare-address tab read the row: that
    # tab's first operation must not put the row back to what it read (the newer steps
    # would be nowhere once the first tab closed). It goes on as a copy instead. The
    # row's revision tells, not its time: a clock that does not move hides nothing.
    store, tab, live, reader, opened = _reopened_for_a_bare_address(tmp_path, clock)
    sid = tab.id
    for _ in range(2):
        assert _apply(live, Step(1), tab) is None and tab.id == sid
    assert _apply(opened.live, Grow("A", 1), reader) == MOVED_ON_NOTE
    assert reader.id not in (None, sid)
    kept = store.load(sid)
    assert kept is not None and kept.snapshot == export_snapshot(live.engine)
    mine = store.load(reader.id or "")
    assert mine is not None and mine.snapshot == export_snapshot(opened.live.engine)
    # And the tab at work still holds its row.
    assert _apply(live, Step(1), tab) is None and tab.id == sid


def test_a_link_opened_while_its_tab_at_work_saves_does_not_write_on_top_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tab B opens the link (or Open in the list) and restores for a while; tab A saves
    # two more steps meanwhile. B must not take the row as if unchanged: its next save
    # would have written its step on top of A's newer log and history (a row that
    # could no longer be opened). B goes on as a copy; A keeps the row.
    store, tab, live = _saved(tmp_path)
    sid = tab.id or ""
    read = store.load

    def load_then_the_other_tab_saves(s: str) -> Any:
        found = read(s)
        for _ in range(2):
            assert _apply(live, Step(1), tab) is None
        return found

    monkeypatch.setattr(store, "load", load_then_the_other_tab_saves)
    second = Tab(store, ME)
    opened = open_saved(second, sid, "o2", budget=BUDGET)
    monkeypatch.setattr(store, "load", read)
    assert opened is not None and second.shown_id == sid and not second.synced
    assert _apply(opened.live, Grow("A", 1), second) == MOVED_ON_NOTE
    assert second.id not in (None, sid)
    row = store.load(sid)
    assert row is not None and row.snapshot == export_snapshot(live.engine)
    resume(row, "o3", budget=BUDGET)            # the row still opens
    assert _apply(live, Step(1), tab) is None and tab.id == sid


def test_a_takeover_refused_then_a_failed_copy_leaves_a_new_unsaved_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, tab, live, reader, opened = _reopened_for_a_bare_address(tmp_path)
    sid = tab.id
    assert _apply(live, Step(1), tab) is None           # the row moves on

    def full(*_: Any) -> None:
        raise StoreError("the session store failed: disk I/O error")

    monkeypatch.setattr(store, "create", full)
    note = _apply(opened.live, Grow("A", 1), reader)
    assert note == (f"Not saved after step {opened.live.engine.step}: the session store "
                    "failed: disk I/O error.")
    # Not the other tab's row: an unsaved session with a bare address, saved anew next.
    assert (reader.id, reader.shown_id, reader.pending_claim) == (None, None, None)
    monkeypatch.undo()
    assert _apply(opened.live, Step(1), reader) is None and reader.id not in (None, sid)
    assert _apply(live, Step(1), tab) is None and tab.id == sid
