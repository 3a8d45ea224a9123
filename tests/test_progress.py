"""Progress and Stop for long operations (backend/sessions/progress.py, ui/progress.py).

A stop asked for from another thread, without the engine's lock (which the
stepping thread holds), ends a step between two iterations with a consistent
engine whose result is the step that ran; replaying it gives the same state.
Streamlit's control exceptions raised by a display are kept out of the
engine and raised after. In the app, a stopped Step N says so, and what the
log and the saved session hold is the step that ran.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.runtime.scriptrunner import RerunException, StopException
from streamlit.testing.v1 import AppTest

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Grow, Op, Step
from backend.io.snapshot import export_snapshot
from backend.sessions.playground import Settings, apply_or_recover
from backend.sessions.progress import OPENED_ELSEWHERE, SessionRuns, Work, WorkState, tracker
from backend.views.text import plain_md
from ui import progress as ui_progress
from ui import state_writes
from ui.progress import Shown

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def test_a_stop_with_nothing_running_does_nothing() -> None:
    work = Work()
    assert not work.request_stop() and work.state is None and work.should_go()
    work.begin("Stepping", 10)
    work.update(4, 10)
    assert work.request_stop() and not work.should_go()
    state = work.state
    assert state is not None and (state.done, state.total, state.stopping) == (4, 10, True)
    work.end()
    assert work.state is None and work.should_go()
    # A stop asked before an operation begins does not stop the next one.
    work.request_stop()
    work.begin("Stepping", 3)
    assert work.should_go()


def test_a_weight_load_reports_its_fraction_and_cannot_be_stopped() -> None:
    work = Work()
    work.begin("Loading SmolLM2…", stoppable=False)
    work.report("Loading SmolLM2: layer 3 of 30", 0.1)
    # Its waiting display has no Stop button, and a stop asked for changes nothing.
    assert not work.request_stop() and work.should_go()
    state = work.state
    assert state == WorkState("Loading SmolLM2: layer 3 of 30", 0, 0, False, False, 0.1)
    assert ui_progress._bar_text(state) == "Loading SmolLM2: layer 3 of 30"
    work.report("Loading SmolLM2: done", 1.5)
    assert work.state is not None and work.state.fraction == 1.0
    work.end()
    # The next operation is stoppable again.
    work.begin("Stepping", 4)
    assert work.request_stop() and not work.should_go()


def test_queued_writes_to_skipped_keys_stay_for_the_next_run() -> None:
    q = state_writes.Queued()
    q.put("engine", 1)
    q.put("cfg_num_blocks", 64)
    q.put("flash", "done")
    state: dict[str, Any] = {}
    # A page that drew the sidebar already leaves its fields queued, and says so.
    assert q.apply(state, {"cfg_num_blocks"}) is True
    assert state == {"engine": 1, "flash": "done"}
    assert q.apply(state) is False and state["cfg_num_blocks"] == 64
    assert q.apply(state, {"cfg_num_blocks"}) is False


def test_a_conditional_write_yields_to_a_selection_made_meanwhile() -> None:
    """An Add queues "pick the new request" unless the person picked another request
    while it waited for the engine (a long step ran): their later pick is kept."""
    q = state_writes.Queued()
    q.put("req_pick", "mid", if_still="A")
    state: dict[str, Any] = {"req_pick": "B"}      # picked while the add waited
    assert q.apply(state) is False and state == {"req_pick": "B"}
    q.put("req_pick", "mid", if_still="A")
    state = {"req_pick": "A"}                      # untouched: the new request is picked
    q.apply(state)
    assert state == {"req_pick": "mid"}
    q.put("req_pick", "first", if_still=None)      # the first add: nothing was picked
    state = {}
    q.apply(state)
    assert state == {"req_pick": "first"}


def test_two_adds_in_a_row_each_pick_their_request_unless_the_person_picks_another() -> None:
    """Both Adds are clicked with A picked. The first's write lands before the second is
    done (a run in between): the second's expectation moves with the queue's own write,
    so its request is picked too; a pick the person made in between is kept."""
    for person in (None, "B"):
        q = state_writes.Queued()
        first, second = q.expect("req_pick", "A"), q.expect("req_pick", "A")
        state: dict[str, Any] = {"req_pick": "A"}
        q.put("req_pick", "new1", if_still=first)
        q.apply(state)
        assert state == {"req_pick": "new1"}
        if person is not None:
            state["req_pick"] = person               # picked while the second add waited
        q.put("req_pick", "new2", if_still=second)
        q.apply(state)
        assert state == {"req_pick": person or "new2"}


def test_a_conditional_write_asks_its_condition_of_a_queued_write_to_the_same_key() -> None:
    """A new engine's queued "nothing picked" lands before the add's pick: the pick is
    asked of the value it leaves, instead of replacing it unasked."""
    q = state_writes.Queued()
    q.put("req_pick", None)
    q.put("req_pick", "new", if_still="A")          # A was picked on the old engine
    state: dict[str, Any] = {"req_pick": "A"}
    q.apply(state)
    assert state == {"req_pick": None}
    q.put("req_pick", None)
    q.put("req_pick", "new", if_still=None)         # the first add: nothing was picked
    q.apply(state)
    assert state == {"req_pick": "new"}


def test_an_add_queued_behind_a_new_engines_cleared_pick_still_picks_its_request() -> None:
    """A reset's "nothing picked" is still queued when the Add, clicked with A picked and
    run on the new engine, queues its pick: the reset's write lands first and the Add's
    expectation follows it, so the new request is picked, in either order of landing."""
    for landed_first in (False, True):
        q = state_writes.Queued()
        state: dict[str, Any] = {"req_pick": "A"}
        expected = q.expect("req_pick", "A")
        q.put("req_pick", None)                       # the reset
        if landed_first:
            q.apply(state)
        q.put("req_pick", "X.0", if_still=expected)   # the add's first sample
        q.apply(state)
        assert state == {"req_pick": "X.0"}, landed_first


def test_a_pick_the_page_corrects_is_the_apps_not_the_persons() -> None:
    """Add X waits while Finish A runs; the page then moves the pick from the finished A
    to B. The person picked nothing, so X is picked once the add is done."""
    q = state_writes.Queued()
    state: dict[str, Any] = {"req_pick": "A"}
    expected = q.expect("req_pick", "A")
    q.write(state, "req_pick", "B")
    q.put("req_pick", "X", if_still=expected)
    q.apply(state)
    assert state == {"req_pick": "X"}
    # A person's pick meanwhile is theirs.
    expected = q.expect("req_pick", "X")
    state["req_pick"] = "B"
    q.put("req_pick", "Y", if_still=expected)
    q.apply(state)
    assert state == {"req_pick": "B"}


def test_two_runs_applying_at_once_land_a_keys_writes_once_and_in_order() -> None:
    """One run is making the reset's "nothing picked" when another applies: the second
    leaves the add's pick behind it to the first, which lands it after."""
    q = state_writes.Queued()
    started, go = threading.Event(), threading.Event()

    class SlowState(dict[str, Any]):
        def __setitem__(self, key: str, value: Any) -> None:
            if threading.current_thread().name == "slow" and not go.is_set():
                started.set()
                go.wait(10)
            super().__setitem__(key, value)

    state = SlowState(req_pick="A")
    expected = q.expect("req_pick", "A")
    q.put("req_pick", None)
    q.put("req_pick", "X", if_still=expected)
    slow = threading.Thread(target=q.apply, args=(state,), name="slow")
    slow.start()
    assert started.wait(10)
    q.apply(state)                       # the pick waits for the write being made
    assert state == {"req_pick": "A"}
    go.set()
    slow.join(10)
    assert state == {"req_pick": "X"} and not q.apply(state)


def _two_requests() -> tuple[EngineConfig, Engine, list[Op], dict[str, Any]]:
    """An engine with requests A and B admitted: its config, the adds, its snapshot."""
    config = EngineConfig(num_blocks=32, block_size=4)
    engine = Engine(config, kernel="torch")
    setup: list[Op] = [Add("A", prompt="The cat sat on the mat."), Add("B", prompt_len=9)]
    for op in setup:
        engine.apply(op)
    return config, engine, setup, export_snapshot(engine)


def test_a_stop_from_another_thread_ends_the_step_between_two_iterations() -> None:
    config, engine, setup, before = _two_requests()
    work = Work()
    work.begin("Stepping", 200)
    third = threading.Event()
    stopped = threading.Event()

    def stopper() -> None:
        third.wait(timeout=60)
        # Only the Work's lock: the engine's is held by the stepping thread meanwhile.
        assert not engine.lock.acquire(blocking=False)
        work.request_stop()
        stopped.set()

    def display(done: int, total: int) -> bool:
        if done == 3:
            third.set()
            # Wait for the stop here, so the test knows which iteration it lands after.
            assert stopped.wait(timeout=60), "request_stop blocked: it took the engine lock?"
        return True

    thread = threading.Thread(target=stopper)
    thread.start()
    applied = apply_or_recover(engine, Step(200), before, Settings(config, "cpu", "torch"),
                               "o", tracker(work, display))
    thread.join(timeout=60)
    assert applied.result is not None and applied.engine is engine
    assert applied.result.op == Step(3) and engine.step == 3
    engine.check_integrity()
    replay = Engine(config, kernel="torch")
    for op in [*setup, applied.result.op]:
        replay.apply(op)

    def state(e: Engine) -> dict[str, Any]:
        s = export_snapshot(e)
        return {**s, "kernel": {**s["kernel"], "time_ms": None}}

    assert state(replay) == state(engine)


def test_a_grow_stopped_part_way_is_the_grow_that_ran() -> None:
    # A grow of many tokens is one decode per token: a stop lands between two, and the
    # result names the grow of the tokens decoded, so a replay gives the same state.
    config = EngineConfig(num_blocks=32, block_size=4)
    engine = Engine(config, kernel="torch")
    engine.apply(Add("A", prompt="The cat sat on the mat."))
    asked: list[tuple[int, int]] = []

    def three(done: int, total: int) -> bool:
        asked.append((done, total))
        return done < 3

    result = engine.apply(Grow("A", 40), progress=three)
    assert result.op == Grow("A", 3) and asked == [(1, 40), (2, 40), (3, 40)]
    assert engine.requests["A"].num_tokens == 23 + 3
    engine.check_integrity()
    replay = Engine(config, kernel="torch")
    for op in [Add("A", prompt="The cat sat on the mat."), result.op]:
        replay.apply(op)
    assert export_snapshot(replay)["requests"] == export_snapshot(engine)["requests"]
    # Never asked after the last token: a callback saying stop then changes nothing.
    assert engine.apply(Grow("A", 1), progress=lambda d, t: False).op == Grow("A", 1)


@pytest.mark.parametrize("exc", [StopException(), RerunException(None)],
                         ids=["stop", "rerun"])
def test_control_exceptions_are_kept_from_the_engine_and_raised_after(
        exc: BaseException) -> None:
    shown = Shown()
    calls = []

    def draw() -> None:
        calls.append(1)
        raise exc

    assert shown.call(draw) is None
    assert shown.call(draw) is None          # superseded: nothing more is drawn
    assert calls == [1]
    assert shown.rerun_asked is isinstance(exc, RerunException)
    with pytest.raises(type(exc)):
        shown.finish()
    shown.finish()                           # raised once


def torch_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The app on the torch kernel, saving its sessions under `tmp_path`."""
    monkeypatch.setenv("PAGEDLAB_DATA_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.segmented_control(key="dev_kernel").set_value("torch").run()
    return at


@pytest.mark.parametrize(("field", "button", "said", "logged"), [
    ("batch_n", "btn_step_n", "Stopped after 3 of 10 iterations. Step 2: step ×3",
     {"op": "step", "count": 3}),
    ("req_grow_n", "btn_grow", "Stopped after 3 of 10 tokens. Step 2: grow A +3",
     {"op": "grow", "request": "A", "tokens": 3}),
], ids=["step_n", "grow"])
def test_a_stopped_operation_says_so_and_is_what_the_log_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, button: str, said: str,
        logged: dict[str, Any]) -> None:
    at = torch_app(tmp_path, monkeypatch)
    at.button(key="btn_add").click().run()
    work: Work = at.session_state["work"]
    # As if Stop were pressed during the third iteration (a step's, or a grow's token).
    monkeypatch.setattr(work, "should_go", lambda: (work.state is None
                                                    or work.state.done < 3))
    at.number_input(key=field).set_value(10).run()
    at.button(key=button).click().run()
    assert not at.exception
    assert next(s.value for s in at.success).startswith(said)
    assert at.session_state["oplog"].ops[-1] == logged
    engine: Engine = at.session_state["engine"]
    assert engine.requests["A"].num_tokens == 23 + 3
    assert work.state is None          # the work is over, the flag reset


def test_a_grows_bar_counts_tokens() -> None:
    work = Work()
    work.begin(ui_progress.label_of(Grow("A", 10)), 10, unit="token")
    work.update(3, 10)
    state = work.state
    assert state is not None
    assert ui_progress._bar_text(state) == plain_md(
        "Growing A by 10 tokens, one model step each: token 3 of 10")
    work.request_stop()
    work.update(4, 10)
    assert work.state is not None and ui_progress._bar_text(work.state).endswith(
        plain_md("stopping after token 4 of 10…"))


def test_step_n_ends_when_nothing_is_left_to_run(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    at = torch_app(tmp_path, monkeypatch)
    at.number_input(key="add_max_new").set_value(4)
    at.button(key="btn_add").click().run()
    at.number_input(key="batch_n").set_value(50).run()
    at.button(key="btn_step_n").click().run()
    assert not at.exception
    # Four iterations generate A's four tokens, and the step ends there.
    assert next(s.value for s in at.success).startswith(
        "Stopped after 4 of 50 iterations: nothing was left to run. Step 2: step ×4 · "
        "generated 4 tokens · finished A")
    assert at.session_state["oplog"].ops[-1] == {"op": "step", "count": 4}
    engine: Engine = at.session_state["engine"]
    assert engine.requests["A"].status == "finished" and not engine.running
    assert len(engine.timeline.rows) == 1 + 4     # the add's row and four iterations
    # Nothing left: another Step N is refused, and changes nothing.
    at.button(key="btn_step_n").click().run()
    assert [e.value for e in at.error] == [
        "Refused: Step N has nothing to run: no request is running, waiting or swapped out"]
    assert engine.step == 2 and len(engine.timeline.rows) == 5
    # So is a single Step: an empty iteration would take a step number and a row.
    at.button(key="btn_step").click().run()
    assert [e.value for e in at.error] == [
        "Refused: Step has nothing to run: no request is running, waiting or swapped out"]
    assert engine.step == 2 and len(engine.timeline.rows) == 5


def test_step_n_goes_on_while_a_request_only_waits(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    at = torch_app(tmp_path, monkeypatch)
    # One request runs at a time: when A finishes, nothing runs and B only waits.
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(1).run()
    at.number_input(key="add_max_new").set_value(3)
    for _ in range(2):
        at.button(key="btn_add").click().run()
    at.number_input(key="batch_n").set_value(50).run()
    at.button(key="btn_step_n").click().run()
    assert not at.exception
    engine: Engine = at.session_state["engine"]
    assert [engine.requests[r].status for r in "AB"] == ["finished", "finished"]
    said = next(s.value for s in at.success)
    assert said.startswith("Stopped after ") and ": nothing was left to run." in said
    assert engine.requests["B"].num_tokens == engine.requests["B"].prompt_len + 3


def test_progress_texts_show_request_ids_as_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # A spinner or bar renders Markdown: an id that is an image would make the browser fetch.
    image = "![a](http://example.invalid/a.png)"
    shown: list[str] = []

    class FakeSpinner:
        def __init__(self, text: str) -> None:
            shown.append(text)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    class FakeBar:
        def __init__(self, value: float, text: str) -> None:
            shown.append(text)

        def progress(self, value: float, text: str) -> None:
            shown.append(text)

        def empty(self) -> None:
            return None

    monkeypatch.setattr(ui_progress.st, "spinner", FakeSpinner)
    monkeypatch.setattr(ui_progress.st, "progress", FakeBar)
    with ui_progress.working(Add(image, prompt="x"), Work()):
        pass
    with ui_progress.restoring(f"Restoring the snapshot in {image!r}") as (_, moved):
        moved(1, 2)
    bar = ui_progress._bar_text(WorkState(f"Growing {image}", 1, 2, False))
    assert len(shown) == 3
    for text in [*shown, bar]:
        assert "](" not in text and "\\]\\(" in text, text


def test_runs_waiting_for_an_engine_get_its_lock_in_the_order_they_came() -> None:
    # A threading.Lock wakes its waiters in no particular order; clicks must act in the
    # order they were made (a superseded click's operation before the later one's page).
    engine = Engine(EngineConfig())
    work = Work()
    order: list[int] = []
    started: list[threading.Event] = []
    threads: list[threading.Thread] = []

    def wait_and_record(i: int) -> None:
        started[i].set()
        with ui_progress.engine_lock(engine, f"t{i}", work):
            order.append(i)

    with ui_progress.engine_lock(engine, "holder", work):
        # Re-entrant, as the engine's own lock: the holder's thread goes first again.
        with ui_progress.engine_lock(engine, "again", work):
            pass
        for i in range(6):
            started.append(threading.Event())
            threads.append(threading.Thread(target=wait_and_record, args=(i,)))
            threads[i].start()
            assert started[i].wait(5)
            # In line before the next one starts (its place is taken before it waits).
            while len(ui_progress._line(engine)._waiting) < i + 2:
                threading.Event().wait(0.01)
    for t in threads:
        t.join(10)
    assert order == list(range(6))
    assert not ui_progress._line(engine)._waiting


def test_a_spinner_left_by_a_superseded_run_is_closed_now_not_by_the_collector() -> None:
    """Streamlit's spinner is a generator; a run stopped mid-operation used to skip its
    exit, and the garbage collector's close then logged a StopException."""
    closed: list[str] = []

    @contextlib.contextmanager
    def spinner() -> Any:
        try:
            yield
        finally:
            closed.append("closed")
            raise StopException()      # drawing in a stopped run raises

    shown = Shown()
    cm = spinner()
    shown.call(cm.__enter__)
    shown.deferred = RerunException(None)    # the run is superseded meanwhile
    shown.exit(cm)
    assert closed == ["closed"] and isinstance(shown.deferred, RerunException)
    assert cm.gen.gi_frame is None           # nothing left for the collector
    # In a live run the first control exception is kept for `finish`.
    live, cm = Shown(), spinner()
    live.call(cm.__enter__)
    live.exit(cm)
    with pytest.raises(StopException):
        live.finish()


def stopping(work: Work, timeout: float = 60.0) -> None:
    """Wait until a stop of `work` has been asked for (a run held mid-way, so that the
    stop reaches it there however slow the machine)."""
    deadline = time.monotonic() + timeout
    while (work.state is None or not work.state.stopping) and time.monotonic() < deadline:
        threading.Event().wait(0.005)


def test_a_page_opening_a_session_stops_its_other_pages_run_and_waits_for_its_save() -> None:
    """A reload during Step N: the new page stops the old page's run, which Streamlit
    lets go on, and waits until that run has saved, so it opens what the run reached."""
    runs = SessionRuns()
    config, engine, _, before = _two_requests()
    old, new = Work(), Work()
    third = threading.Event()
    saved: list[int] = []
    outcome: list[Any] = []

    def old_page() -> None:
        with runs.running("sid", "browser", "tab 1", old):
            old.begin("Step 200", 200)

            def display(done: int, total: int) -> bool:
                if done == 3:
                    third.set()
                elif done == 4:
                    # Held here until the stop is asked for: 196 more iterations (about
                    # a second) were all that stood between it and a loaded machine.
                    stopping(old)
                return True

            applied = apply_or_recover(engine, Step(200), before,
                                       Settings(config, "cpu", "torch"), "o",
                                       tracker(old, display))
            old.end()
            outcome.append(applied.result)
            saved.append(engine.step)   # "the save": done before the run is unlisted

    thread = threading.Thread(target=old_page)
    thread.start()
    assert third.wait(timeout=60)
    # Another browser, a tab that no longer writes the row, or this page's own run, is
    # not stopped.
    assert runs.stop_and_wait("sid", "another browser", "tab 1", new, timeout=0.1) is None
    assert runs.stop_and_wait("sid", "browser", "tab 2", new, timeout=0.1) is None
    assert runs.stop_and_wait("sid", "browser", "tab 1", old, timeout=0.1) is None
    assert runs.stop_and_wait("other sid", "browser", "tab 1", new, timeout=0.1) is None
    assert old.state is not None and not old.state.stopping
    stopped = runs.stop_and_wait("sid", "browser", "tab 1", new, timeout=60)
    assert len(saved) == 1   # the wait ends only once the run has saved
    assert old.stop_reason == OPENED_ELSEWHERE   # for the line its own page shows
    thread.join(timeout=60)
    assert stopped is not None and stopped.ended
    assert stopped.state is not None and stopped.state.label == "Step 200"
    assert 3 <= stopped.state.done < 200
    # It ended between two iterations, well short of its 200, and saved before the
    # wait was over.
    assert isinstance(outcome[0].op, Step) and 3 <= outcome[0].op.count < 200
    assert saved == [engine.step]
    assert runs.stop_and_wait("sid", "browser", "tab 1", new, timeout=0.1) is None  # unlisted


def test_a_run_that_does_not_stop_in_time_is_said_not_to_have_ended() -> None:
    runs = SessionRuns()
    work = Work()
    release = threading.Event()

    def loading() -> None:
        with runs.running("sid", "browser", "tab", work):
            work.begin("Loading weights", stoppable=False)
            release.wait(timeout=60)
            work.end()

    thread = threading.Thread(target=loading)
    thread.start()
    try:
        for _ in range(200):
            if work.state is not None:
                break
            threading.Event().wait(0.01)
        stopped = runs.stop_and_wait("sid", "browser", "tab", Work(), timeout=0.2)
        assert stopped is not None and not stopped.ended
        assert stopped.state is not None and stopped.state.label == "Loading weights"
    finally:
        release.set()
        thread.join(timeout=60)


def test_a_click_that_waited_keeps_the_messages_of_what_ran_meanwhile_above_its_own() -> None:
    """An upload that waited behind a Step N said only "Refused the snapshot ... unchanged",
    though the Step N had just changed the engine: its line was lost."""
    from ui.operations import MAX_EARLIER, OpSession
    from ui.session import FLASH

    q = state_writes.Queued(remembered=(FLASH,))

    def op_session(seen: int) -> OpSession:
        return OpSession(None, None, None, None, "o", None, q, 0, seen)  # type: ignore[arg-type]

    step_n = op_session(0)
    waiting = op_session(0)     # read before the Step N ended, then waited for the lock
    step_n.flash("success", "Stopped after 40 of 300 iterations. Step 2: step ×40")
    waiting.flash("error", "Refused the snapshot: ... The playground is unchanged.")
    kind, _, _, earlier = q.last(FLASH)
    assert (kind, earlier) == ("error", (("success", "Stopped after 40 of 300 iterations. "
                                                     "Step 2: step ×40"),))
    # Its own second message replaces its first, keeping what came before it.
    waiting.flash("info", "Second word")
    assert q.last(FLASH)[3] == earlier
    # A later click, read after those ended, starts afresh.
    later = op_session(q.last(FLASH)[2])
    later.flash("success", "Step 3: add B")
    assert q.last(FLASH)[3] == ()
    # At most MAX_EARLIER stay: a queue of clicks keeps the latest ones.
    clicks = [op_session(q.last(FLASH)[2]) for _ in range(MAX_EARLIER + 2)]
    for i, c in enumerate(clicks):
        c.flash("success", f"Step {4 + i}")
    assert [t for _, t in q.last(FLASH)[3]] == [f"Step {4 + i}" for i in range(1, MAX_EARLIER + 1)]
    assert q.last(FLASH)[1] == f"Step {4 + MAX_EARLIER + 1}"


def test_a_stop_asked_before_the_run_begins_counting_still_stops_it() -> None:
    """A run is listed before its Work begins, and `begin` clears a stop asked earlier:
    the stop is asked again until the run ends."""
    runs = SessionRuns()
    work = Work()
    listed, ran = threading.Event(), []

    def run() -> None:
        with runs.running("sid", "browser", "tab", work):
            listed.set()
            threading.Event().wait(0.3)     # building the operation, before `begin`
            work.begin("Step 100", 100)
            done = 0
            while done < 100 and work.should_go():
                done += 1
                work.update(done, 100)
                threading.Event().wait(0.01)
            work.end()
            ran.append(done)

    thread = threading.Thread(target=run)
    thread.start()
    assert listed.wait(timeout=60)
    stopped = runs.stop_and_wait("sid", "browser", "tab", Work(), timeout=60)
    thread.join(timeout=60)
    assert stopped is not None and stopped.ended
    assert ran and ran[0] < 100


def test_every_run_of_the_rows_tab_is_stopped_and_none_of_a_tab_that_lost_it() -> None:
    runs = SessionRuns()
    owner_a, owner_b, stale = Work(), Work(), Work()
    for w in (owner_a, owner_b, stale):
        w.begin("Step 100", 100)
    with runs.running("sid", "browser", "owner", owner_a), \
            runs.running("sid", "browser", "owner", owner_b), \
            runs.running("sid", "browser", "stale tab", stale):
        stopped = runs.stop_and_wait("sid", "browser", "owner", Work(), timeout=0.3)
        assert stopped is not None and not stopped.ended   # they run on in this test
        assert [w.state is not None and w.state.stopping
                for w in (owner_a, owner_b, stale)] == [True, True, False]


def test_a_run_queued_behind_the_stopped_one_is_stopped_too() -> None:
    """A click waiting behind the Step N starts its own run once the step ends: the page
    opening the session waits for that one as well, or it would run on unseen."""
    runs = SessionRuns()
    work = Work()        # one browser session: both runs share its Work
    lock = threading.Lock()
    first_going, ran = threading.Event(), []

    def run(name: str) -> None:
        with runs.running("sid", "browser", "tab", work), lock:
            work.begin(name, 300)
            done = 0
            while done < 300 and work.should_go():
                done += 1
                work.update(done, 300)
                first_going.set()
                if done == 2:
                    stopping(work)     # (it held off the stop by its 1.5 s alone)
            work.end()
            ran.append((name, done))

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert first_going.wait(timeout=60)
    queued = threading.Thread(target=run, args=("queued",))
    queued.start()
    for _ in range(500):        # the queued click is listed while it waits for the lock
        with runs._lock:
            if len(runs._runs.get("sid", [])) == 2:
                break
        threading.Event().wait(0.01)
    stopped = runs.stop_and_wait("sid", "browser", "tab", Work(), timeout=60)
    first.join(timeout=60)
    queued.join(timeout=60)
    assert stopped is not None and stopped.ended
    assert [name for name, _ in ran] == ["first", "queued"]
    assert all(done < 300 for _, done in ran), ran
