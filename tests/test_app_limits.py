"""The Playground within its limits, in AppTest: the K/V budget and the run history."""

from __future__ import annotations

import gc
import types

import pytest
import torch

from backend.core.config import EngineConfig
from backend.sessions import budget as budget_module
from backend.sessions import playground, saved
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Settings, build_engine, switch_kernels
from tests.test_app import add, click, engine, start
from ui import operations, state_writes


def test_a_pool_over_the_session_budget_is_refused_and_the_engine_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module.SERVER_BUDGET, "per_session", 1 << 20)
    at = start()
    kept = engine(at)
    # 1,024 blocks of 2 KiB: 2 MiB of K/V against a 1 MiB session budget.
    at.sidebar.number_input(key="cfg_num_blocks").set_value(1024).run()
    assert not at.exception
    # Refused in the sidebar, by the field's name, before anything is built or discarded.
    assert [e.value for e in at.sidebar.error] == [
        "Pool size: 1,024 blocks of 2.0 KiB would take 2.0 MiB of K/V, but a browser "
        "session may hold at most 1.0 MiB, which is 512 blocks of this size. Use fewer "
        "or smaller blocks, fewer layers or heads, or a 2-byte dtype"]
    assert "btn_apply_config" not in [b.key for b in at.button]
    assert engine(at) is kept and kept.config.num_blocks == 32


def test_the_run_history_is_kept_as_deltas_and_downloads_whole() -> None:
    at = start()
    for _ in range(3):
        add(at)
        click(at, "btn_step")
    history = at.session_state["history"]
    assert isinstance(history, History)
    e = engine(at)
    assert len(history) == e.step and history.num_event_records == len(e.events)
    assert history[-1]["step"] == e.step


def test_an_engine_the_sidebar_replaced_stops_counting_at_once() -> None:
    """Streamlit keeps a session's previous state (the old engine in it) until that
    session's next run; the budget gives the old engine's bytes back when it is replaced,
    not when it is collected, so other sessions are not refused for it."""
    at = start()
    old = engine(at)
    gc.collect()
    before = budget_module.SERVER_BUDGET.in_use()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(40).run()
    assert not at.exception
    new = engine(at)
    assert new is not old and new.config.num_blocks == 40
    gc.collect()
    # `old` is still referenced here, and counted no more.
    assert budget_module.SERVER_BUDGET.in_use() - before == (
        budget_module.engine_bytes(new) - budget_module.engine_bytes(old))


def test_a_kernel_switch_on_the_same_device_leaves_nothing_alive_after_the_session() -> None:
    """`OpSession.replace` files the new session under the engine it replaced; after a
    kernel switch that is the same engine, and a strong reference from the record to
    it kept its K/V (and its budget) alive for good once the session ended."""
    s = Settings(EngineConfig(num_blocks=64, block_size=4), "cpu", "torch")
    engine = build_engine(s, "owner-switch")
    assert budget_module.SERVER_BUDGET.in_use("owner-switch") > 0
    sess = operations.OpSession(engine, s, History(), OpLog(), "owner-switch",
                             saved.Tab(None, "browser"), state_writes.Queued(), 0)
    with engine.lock:
        same = switch_kernels(engine, "cpu", "torch")
        assert same is engine
        after = sess.replace(saved.Live(same, s, sess.history, sess.oplog))
    # A run that waited for the lock follows the record to the same engine.
    assert operations._successor(sess) == after
    del sess, same, engine, after
    gc.collect()
    assert budget_module.SERVER_BUDGET.in_use("owner-switch") == 0


def test_an_engine_moved_to_another_device_is_counted_in_place_of_the_old(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(EngineConfig(num_blocks=64, block_size=4), "cpu", "torch")
    engine = build_engine(s, "owner-move")
    counted = budget_module.SERVER_BUDGET.in_use("owner-move")
    # One device here: take the other-device branch (cpu -> cuda on a GPU machine); the
    # new engine is still built on the CPU.
    monkeypatch.setattr(playground, "select_kernels",
                        lambda d, k: types.SimpleNamespace(device=torch.device("meta")))
    sess = operations.OpSession(engine, s, History(), OpLog(), "owner-move",
                             saved.Tab(None, "browser"), state_writes.Queued(), 0)
    with engine.lock:
        moved = switch_kernels(engine, "cpu", "torch", "owner-move")
        assert moved is not engine
        sess.replace(saved.Live(moved, s, sess.history, sess.oplog))
    assert budget_module.SERVER_BUDGET.in_use("owner-move") == counted == (
        budget_module.engine_bytes(moved))


def test_a_pool_the_server_has_no_room_for_waits_in_the_sidebar_as_typed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Other sessions' engines fill the server: the sidebar says so under the fields,
    which keep the number typed, and applies it once there is room."""
    at = start()
    kept = engine(at)
    gc.collect()
    # A server of room for what is held now and 4 MiB more, 3 MiB of which another
    # session takes: 1 MiB left.
    budget = budget_module.SERVER_BUDGET
    monkeypatch.setattr(budget, "per_server", budget.in_use() + (4 << 20))
    other = budget.claim_unchecked(EngineConfig(num_blocks=1536, block_size=4), "other")
    try:
        # 1,024 blocks of 2 KiB: 2 MiB in place of this engine's 64 KiB.
        at.sidebar.number_input(key="cfg_num_blocks").set_value(1024).run()
        assert not at.exception
        (error,) = [e.value for e in at.sidebar.error]
        assert error.startswith("Not applied: the server's sessions hold ")
        # The app ends closed tabs' sessions when it needs their memory (ui/reclaim.py):
        # what is left is open sessions' engines.
        assert error.endswith("Try a smaller pool, or again when other sessions have ended.")
        assert "btn_keep_config" in [b.key for b in at.sidebar.button]
        assert any("The sidebar's settings are not applied: the server's sessions hold"
                   in w.value for w in at.warning)
        assert engine(at) is kept and kept.config.num_blocks == 32
        assert at.sidebar.number_input(key="cfg_num_blocks").value == 1024
        # Another run with the server still full asks again and builds nothing.
        at.run()
        assert engine(at) is kept and len(at.sidebar.error) == 1
    finally:
        # Room again (the other session ended): the next run applies the pool as typed.
        budget.cancel(other)
    at.run()
    assert not at.exception and not at.sidebar.error
    assert engine(at) is not kept and engine(at).config.num_blocks == 1024


def test_a_pool_that_waited_for_room_is_applied_before_the_click_that_finds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The room frees while the page is idle; the next run is a click's (Add request),
    whose callback runs before the sidebar: the request went into the old 32-block
    engine, which then had state, so the sidebar asked to discard it for the pool."""
    at = start()
    kept = engine(at)
    gc.collect()
    budget = budget_module.SERVER_BUDGET
    monkeypatch.setattr(budget, "per_server", budget.in_use() + (4 << 20))
    other = budget.claim_unchecked(EngineConfig(num_blocks=1536, block_size=4), "other")
    try:
        at.sidebar.number_input(key="cfg_num_blocks").set_value(1024).run()
        assert engine(at) is kept and len(at.sidebar.error) == 1
    finally:
        budget.cancel(other)
    add(at)
    assert engine(at) is not kept and engine(at).config.num_blocks == 1024
    assert list(engine(at).requests) == ["A"]
    assert "btn_apply_config" not in [b.key for b in at.sidebar.button]
    assert not at.sidebar.error
    # What ran, in order: the new engine, then the add on it.
    said = [m.value for m in at.info] + [m.value for m in at.success]
    assert any(m.startswith("New engine: 1,024 blocks") for m in said), said


def test_a_pool_typed_and_add_clicked_in_one_run_builds_the_request_in_that_pool() -> None:
    """A field changed and a button clicked before the page ran again reach one run,
    the click's callback first: the request went into the old pool."""
    at = start()
    kept = engine(at)
    at.sidebar.number_input(key="cfg_num_blocks").set_value(64)
    add(at)
    assert engine(at) is not kept and engine(at).config.num_blocks == 64
    assert list(engine(at).requests) == ["A"]
    assert "btn_apply_config" not in [b.key for b in at.sidebar.button]
    # With state now, a change of the fields asks before discarding it, as before.
    at.sidebar.number_input(key="cfg_num_blocks").set_value(48)
    add(at)
    assert engine(at).config.num_blocks == 64 and list(engine(at).requests) == ["A", "B"]
    assert "btn_apply_config" in [b.key for b in at.sidebar.button]


def test_a_clicks_waiting_settings_do_not_undo_settings_applied_while_it_waited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A click reads the fields' settings before it waits for the engine's lock; a run
    ahead of it may apply newer ones meanwhile (here 48 blocks, applied between the
    read and the lock). The click's older 64 must not replace them."""
    from ui import engine_actions
    real = engine_actions.applying_first

    def applied_meanwhile(config: EngineConfig) -> operations.First:
        first = real(config)
        engine_actions.apply_config(EngineConfig(num_blocks=48, block_size=4))
        return first

    monkeypatch.setattr(engine_actions, "applying_first", applied_meanwhile)
    at = start()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(64)
    add(at)
    assert not at.exception
    assert engine(at).config.num_blocks == 48 and list(engine(at).requests) == ["A"]
