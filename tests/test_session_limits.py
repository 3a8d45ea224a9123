"""What one browser session may hold: its run history (as deltas, bounded) and its K/V."""

from __future__ import annotations

import gc
import json
import threading
import time
from types import SimpleNamespace

import pytest

from backend.core.config import SMOLLM2, TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Op, Shuffle, Step
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot, snapshot_json
from backend.sessions import budget as budget_module
from backend.sessions.budget import MIB, KVBudget
from backend.sessions.forms import config_from_fields
from backend.sessions.history import History
from backend.sessions.playground import Settings, build_engine


def _ops(n: int) -> list[Op]:
    ops: list[Op] = []
    for i in range(n):
        rid = f"R{i}"
        ops += [Add(rid, prompt_len=3 + i % 7, max_new_tokens=4 + i % 5), Step(2)]
        if i % 3 == 0:
            ops.append(Fork(rid, f"{rid}.c") if i % 2 == 0 else Shuffle(i))
        if i % 4 == 1:
            ops.append(Finish(rid))
    return ops


def test_history_holds_each_event_once_and_rebuilds_every_step_exactly() -> None:
    e = Engine(EngineConfig(num_blocks=24, block_size=4), kernel="torch")
    history = History(max_steps=1_000)
    exported: list[str] = []
    for op in _ops(40):
        e.apply(op)
        snap = export_snapshot(e)
        exported.append(json.dumps(snap, indent=1) + "\n")
        history.record(snap)
    assert len(history) == len(exported) > 100
    # Kept whole, the steps would hold every event once per step after it.
    assert history.num_event_records == len(e.events)
    assert sum(len(s["events"]) for s in history) > 20 * len(e.events)
    # Every rebuilt step is byte for byte the snapshot exported at that step.
    for snap, text in zip(history, exported, strict=True):
        assert json.dumps(snap, indent=1) + "\n" == text
    assert snapshot_json(e) == exported[-1]


def test_history_is_bounded_by_steps_and_by_size_and_keeps_the_newest() -> None:
    e = Engine(EngineConfig(num_blocks=64, block_size=4), kernel="torch")
    by_steps, by_cells = History(max_steps=10), History(max_steps=1_000, max_cells=400)
    for op in _ops(20):
        e.apply(op)
        by_steps.record(export_snapshot(e))
        by_cells.record(export_snapshot(e))
    assert len(by_steps) == 10 and by_steps[-1]["step"] == e.step
    assert [s["step"] for s in by_steps] == list(range(e.step - 9, e.step + 1))
    # 64 blocks plus the tokens per step: 400 cells keep only a few of them.
    assert 1 <= len(by_cells) < 10 and by_cells[-1]["step"] == e.step
    assert by_cells[-1] == export_snapshot(e)


def test_history_starts_again_when_the_events_do_not_continue() -> None:
    e = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    history = History()
    e.apply(Add("A", prompt="hello", max_new_tokens=3))
    history.record(export_snapshot(e))
    other = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    other.apply(Add("Z", prompt="other text", max_new_tokens=3))
    history.record(export_snapshot(other))
    assert len(history) == 1 and history[0] == export_snapshot(other)


def _config(num_blocks: int) -> EngineConfig:
    # 2 x 2 layers x 2 kv heads x 16 x 4 slots x 4 bytes = 2 KiB a block.
    return EngineConfig(num_blocks=num_blocks, block_size=4)


def test_a_pool_over_the_session_limit_is_refused_before_anything_is_built() -> None:
    budget = KVBudget(per_session=MIB, per_server=4 * MIB)
    with pytest.raises(PagedLabError, match=r"num_blocks: 1,024 blocks of 2\.0 KiB would take "
                       r"2\.0 MiB of K/V, but a browser session may hold at most 1\.0 MiB, "
                       r"which is 512 blocks"):
        build_engine(Settings(_config(1024), "cpu", "torch"), "s1", budget=budget)
    assert budget.in_use() == 0


def test_a_host_pool_counts_against_the_session_as_the_device_pool_does() -> None:
    budget = KVBudget(per_session=MIB, per_server=4 * MIB)
    swap = EngineConfig(num_blocks=256, block_size=4, preemption="swap", num_cpu_blocks=384)
    assert swap.host_kv_bytes == 384 * swap.bytes_per_block      # 0.75 MiB beside 0.5
    with pytest.raises(PagedLabError, match=r"^num_cpu_blocks: 384 host blocks of 2\.0 KiB "
                       r"would take 0\.8 MiB of K/V beside the pool's 0\.5 MiB, but a browser "
                       r"session may hold at most 1\.0 MiB, which leaves room for 256 host "
                       r"blocks$"):
        build_engine(Settings(swap, "cpu", "torch"), "s1", budget=budget)
    # The sidebar's own check says it too, in its words (ui/sidebar.labelled).
    with pytest.raises(PagedLabError, match=r"num_cpu_blocks: 384 host blocks"):
        config_from_fields({"preemption": "swap", "num_cpu_blocks": 384}, _config(256),
                           budget)
    fits = build_engine(Settings(EngineConfig(num_blocks=256, block_size=4, preemption="swap",
                                              num_cpu_blocks=256), "cpu", "torch"), "s1",
                        budget=budget)
    assert fits.host is not None
    assert budget.in_use("s1") == fits.cache.total_bytes + fits.host.cache.total_bytes == MIB
    # Nothing is left for another engine of this session.
    with pytest.raises(PagedLabError, match=r"this session's engines already hold 1\.0 MiB"):
        build_engine(Settings(_config(1), "cpu", "torch"), "s1", budget=budget)


def test_a_real_models_pool_over_the_limit_is_told_what_it_can_change() -> None:
    smol = EngineConfig.for_model(SMOLLM2, num_blocks=1024, block_size=16)
    budget = KVBudget(per_session=512 * MIB, per_server=4096 * MIB)
    with pytest.raises(PagedLabError) as refused:
        budget.check_size(smol)
    said = str(refused.value)
    fits = 512 * MIB // smol.bytes_per_block
    assert f"which is {fits:,} blocks of this size. Use fewer or smaller blocks" in said
    # Its shape is its weights': no advice to change layers, heads or dtype.
    assert said.endswith("Use fewer or smaller blocks")
    budget.check_size(EngineConfig.for_model(SMOLLM2, num_blocks=fits, block_size=16))
    # A single block past the limit: only smaller blocks help.
    with pytest.raises(PagedLabError) as refused:
        KVBudget(per_session=MIB // 2, per_server=MIB).check_size(smol)
    assert str(refused.value) == (
        "num_blocks: 1,024 blocks of 720 KiB would take 720.0 MiB of K/V, but a browser "
        "session may hold at most 0.5 MiB, less than one block of this size. Use smaller "
        "blocks")


def test_a_pool_past_the_limit_is_told_the_count_that_leaves_the_host_pool_room() -> None:
    """With swap, the host pool is held beside the pool: the count the refusal named was
    the whole session's, which the host pool's own check then refused."""
    budget = KVBudget(per_session=512 * MIB, per_server=4096 * MIB)
    base = EngineConfig.for_model(SMOLLM2, num_blocks=8, block_size=256,
                                  preemption="swap", num_cpu_blocks=1)
    per = base.bytes_per_block
    fits = (512 * MIB - per) // per
    assert fits == 44 and 512 * MIB // per == 45
    with pytest.raises(PagedLabError) as refused:
        config_from_fields({"num_blocks": 46}, base, budget)
    assert str(refused.value) == (
        "num_blocks: 46 blocks of 11.3 MiB would take 517.5 MiB of K/V, but a browser "
        "session may hold at most 512.0 MiB, which is 44 blocks of this size beside the "
        "host pool's 11.3 MiB (1 host block). Use fewer or smaller blocks")
    # The count named is one the next check takes.
    assert config_from_fields({"num_blocks": fits}, base, budget).num_blocks == fits
    # One more leaves the host pool no block (swap needs one): still the pool to shrink.
    with pytest.raises(PagedLabError, match=r"^num_blocks: 45 blocks .* which is 44 blocks"):
        config_from_fields({"num_blocks": fits + 1}, base, budget)
    # A pool that fits beside a host block: the host pool is the one to shrink.
    with pytest.raises(PagedLabError, match=(
            r"^num_cpu_blocks: 200 host blocks of 11\.3 MiB would take 2,250\.0 MiB of K/V "
            r"beside the pool's 90\.0 MiB, but a browser session may hold at most 512\.0 "
            r"MiB, which leaves room for 37 host blocks$")):
        # Past the 2 GiB any host pool may take too: the session's limit is the tighter.
        config_from_fields({"num_cpu_blocks": 200}, base, budget)
    # A host pool past the limit on its own is named, not the pool beside it.
    with pytest.raises(PagedLabError, match=(
            r"^num_cpu_blocks: 50 host blocks of 11\.3 MiB would take 562\.5 MiB of K/V, "
            r"more than the 512\.0 MiB a browser session may hold with its pool besides: "
            r"45 blocks of this size in all, pool and host pool together$")):
        config_from_fields({"num_blocks": 50, "num_cpu_blocks": 50}, base, budget)
    # The range's top is not the tighter bound when the host pool takes most of the room.
    tiny = EngineConfig(num_blocks=8, block_size=16, preemption="swap", num_cpu_blocks=1)
    with pytest.raises(PagedLabError, match=(
            r"^num_blocks: 70,000 blocks of 8\.0 KiB .* which is 5,536 blocks of this size "
            r"beside the host pool's 468\.8 MiB \(60,000 host blocks\)\. Use fewer or "
            r"smaller blocks, fewer layers or heads, or a 2-byte dtype \(a smaller host pool "
            r"leaves room for more\)$")):
        config_from_fields({"num_blocks": 70_000, "num_cpu_blocks": 60_000}, tiny, budget)
    assert config_from_fields({"num_blocks": 5_536, "num_cpu_blocks": 60_000}, tiny,
                              budget).num_blocks == 5_536
    # A count of one is singular.
    one = KVBudget(per_session=per * 3 // 2, per_server=4096 * MIB)
    with pytest.raises(PagedLabError, match=r"which is 1 block of this size\. Use fewer"):
        config_from_fields({"num_blocks": 5, "preemption": "recompute"}, base, one)


def test_a_pool_past_the_session_limit_is_told_it_before_the_2_gib_any_pool_may_take(
        ) -> None:
    """Both bind SmolLM2's 256-slot blocks; the tighter is the one to name, or a person
    would meet the 2 GiB first and then, a few blocks fewer, the session's 512 MiB."""
    budget = KVBudget(per_session=512 * MIB, per_server=4096 * MIB)
    base = EngineConfig.for_model(SMOLLM2, num_blocks=8, block_size=256)
    with pytest.raises(PagedLabError) as refused:
        config_from_fields({"num_blocks": 183}, base, budget)
    assert str(refused.value).startswith(
        "num_blocks: 183 blocks of 11.3 MiB would take 2,058.8 MiB of K/V, but a browser "
        "session may hold at most 512.0 MiB, which is 45 blocks of this size"), refused.value


def test_a_pool_size_past_the_range_is_refused_by_the_tighter_bound() -> None:
    budget = KVBudget(per_session=512 * MIB, per_server=4096 * MIB)
    base = EngineConfig()
    # SmolLM2's blocks are large: the session's limit binds long before 65,536 blocks, so
    # the refusal says how many fit, watermark or not, rather than the range's top.
    for extra in ({}, {"watermark_blocks": 4}):
        fields = {"model": SMOLLM2, "num_blocks": 70_000, "block_size": 16, **extra}
        with pytest.raises(PagedLabError) as refused:
            config_from_fields(fields, base, budget)
        fits = 512 * MIB // EngineConfig.for_model(SMOLLM2, block_size=16).bytes_per_block
        assert fits < 65_536 and str(refused.value).startswith(
            "num_blocks: 70,000 blocks of 720 KiB would take "), refused.value
        assert f"which is {fits:,} blocks of this size" in str(refused.value)
    # tiny-byte's blocks are small: the range is the tighter bound, said with separators.
    with pytest.raises(PagedLabError, match=r"^settings: num_blocks must be an integer in "
                                            r"1\.\.65,536, got 70,000$"):
        config_from_fields({"model": TINY_BYTE, "num_blocks": 70_000}, base, budget)
    # With another field refused there is no block size to count with: the range is said.
    with pytest.raises(PagedLabError, match=r"num_blocks must be an integer in 1\.\.65,536"):
        config_from_fields({"model": SMOLLM2, "num_blocks": 70_000, "block_size": 999}, base,
                           budget)


def test_sessions_together_are_capped_by_the_server_limit_and_give_back_on_drop() -> None:
    budget = KVBudget(per_session=MIB, per_server=int(1.25 * MIB))
    half = _config(256)   # 0.5 MiB
    first = build_engine(Settings(half, "cpu", "torch"), "s1", budget=budget)
    second = build_engine(Settings(half, "cpu", "torch"), "s2", budget=budget)
    assert budget.in_use() == 2 * half.kv_bytes and budget.in_use("s1") == half.kv_bytes
    with pytest.raises(PagedLabError, match=r"server's sessions hold 1\.0 MiB"):
        build_engine(Settings(half, "cpu", "torch"), "s3", budget=budget)
    # One session's engines together are capped too.
    with pytest.raises(PagedLabError, match=r"this session's engines already hold 0\.5 MiB"):
        build_engine(Settings(_config(384), "cpu", "torch"), "s1", budget=budget)
    # ...but replacing its own engine counts the old one as given back.
    replaced = build_engine(Settings(_config(384), "cpu", "torch"), "s1", replacing=first,
                            budget=budget)
    del first
    gc.collect()
    assert budget.in_use("s1") == replaced.cache.total_bytes
    del second
    gc.collect()
    third = build_engine(Settings(half, "cpu", "torch"), "s3", budget=budget)
    assert budget.in_use() == replaced.cache.total_bytes + third.cache.total_bytes


def test_a_claim_counts_before_the_engine_is_built_so_two_cannot_share_one_room() -> None:
    budget = KVBudget(per_session=MIB, per_server=int(1.25 * MIB))
    half = _config(256)   # 0.5 MiB
    first = budget.claim(half, "s1")
    second = budget.claim(half, "s2")
    # Nothing is built yet, and still a third is refused (check and count were apart,
    # and three sessions building at once could all pass the same check).
    with pytest.raises(PagedLabError, match=r"server's sessions hold 1\.0 MiB"):
        budget.claim(half, "s3")
    budget.cancel(second)
    assert budget.in_use() == half.kv_bytes
    engine = budget.bind(first, Engine(half, device="cpu", kernel="torch"))
    assert budget.in_use("s1") == engine.cache.total_bytes


def test_claims_from_many_threads_at_once_never_pass_the_server_limit() -> None:
    budget = KVBudget(per_session=MIB, per_server=int(1.25 * MIB))
    half = _config(256)
    won: list[int] = []
    refused: list[str] = []
    start = threading.Barrier(8)

    def claim(i: int) -> None:
        start.wait()
        try:
            won.append(budget.claim(half, f"s{i}"))
        except PagedLabError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 2 and len(refused) == 6
    assert budget.in_use() == 2 * half.kv_bytes


def test_an_engine_its_session_replaced_stops_counting_while_it_lingers() -> None:
    budget = KVBudget(per_session=MIB, per_server=MIB)
    half = _config(256)
    old = build_engine(Settings(half, "cpu", "torch"), "s1", budget=budget)
    new = build_engine(Settings(half, "cpu", "torch"), "s1", replacing=old, budget=budget)
    assert budget.in_use() == 2 * half.kv_bytes      # both alive, neither retired yet
    budget.retire(old)
    # `old` is still referenced (as Streamlit keeps a session's previous state until its
    # next run), yet another session may use its room now.
    assert budget.in_use() == new.cache.total_bytes
    build_engine(Settings(half, "cpu", "torch"), "s2", budget=budget)
    budget.retire(old)   # twice: nothing more
    assert old.cache.total_bytes == half.kv_bytes


def test_restore_and_engines_on_the_budget_keep_their_state() -> None:
    e = build_engine(Settings(_config(16), "cpu", "torch"), "s1",
                     budget=KVBudget(per_session=MIB, per_server=MIB))
    e.apply(Add("A", prompt="a budgeted engine", max_new_tokens=4))
    assert export_snapshot(restore_engine(export_snapshot(e), kernel="torch")) == \
        export_snapshot(e)


def test_a_pool_past_the_whole_server_limit_is_not_told_to_wait() -> None:
    """A server limit below the session limit (PAGEDLAB_SERVER_KV_MIB=1): a pool the
    server could never hold, even alone, gets no "again in a few minutes"."""
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    with pytest.raises(PagedLabError) as e:
        budget.claim(_config(1024), "s1")           # 2 MiB
    assert str(e.value) == ("2.0 MiB of K/V is more than the 1.0 MiB the server's sessions "
                            "may hold together. Try a smaller pool")
    assert budget.in_use() == 0


def test_a_form_check_collects_dropped_engines_at_most_every_few_seconds() -> None:
    """An engine dropped in a reference cycle still counts until a collection. The
    sidebar's check, asked on every run of the page, collects before refusing, but at
    most once every COLLECT_EVERY_S seconds across the server; a claim always does."""
    cfg = _config(256)                                    # 0.5 MiB
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    mine = budget.built(budget.claim(cfg, "s1"), lambda: Engine(cfg, kernel="torch"))
    bigger = _config(384)
    gc.disable()
    try:
        def drop_one_in_a_cycle() -> None:
            other = budget.built(budget.claim(cfg, "s2"), lambda: Engine(cfg, kernel="torch"))
            other.me = other  # type: ignore[attr-defined]

        drop_one_in_a_cycle()
        budget.check(bigger, "s1", replacing=mine)        # collected: room again
        drop_one_in_a_cycle()
        with pytest.raises(PagedLabError, match=r"server's sessions hold"):
            budget.check(bigger, "s1", replacing=mine)    # too soon to collect again
        budget._collected -= budget_module.COLLECT_EVERY_S
        budget.check(bigger, "s1", replacing=mine)
        drop_one_in_a_cycle()
        budget.claim(bigger, "s1", replacing=mine)        # a claim always collects
    finally:
        gc.enable()


def test_a_pool_past_the_server_is_told_so_before_the_sessions_own_limit() -> None:
    budget = KVBudget(per_session=2 * MIB, per_server=MIB)
    budget.claim_unchecked(_config(512), "s1")            # 1 MiB
    with pytest.raises(PagedLabError, match=r"^1\.5 MiB of K/V is more than the 1\.0 MiB"):
        budget.check(_config(768), "s1")


class _Tabs:
    """Browser sessions as a reclaimer sees them: each owner's engines, and which
    owners' tabs have gone. Ending a gone one drops its engines, in a reference
    cycle (as a session's state holds them), or later, from another thread."""

    def __init__(self, budget: KVBudget, *, later_s: float = 0.0, cycle: bool = True) -> None:
        self.budget, self.later_s, self.cycle = budget, later_s, cycle
        self.engines: dict[str, list[Engine]] = {}
        self.gone: set[str] = set()
        self.asked: list[frozenset[str]] = []

    def open(self, owner: str, num_blocks: int) -> Engine:
        cfg = _config(num_blocks)
        engine = self.budget.built(self.budget.claim(cfg, owner),
                                   lambda: Engine(cfg, kernel="torch"))
        self.engines.setdefault(owner, []).append(engine)
        return engine

    def end_gone(self, held: dict[str, int], shortfall: int) -> frozenset[str]:
        self.asked.append(frozenset(held))
        assert all(held[o] == sum(e.cache.total_bytes for e in self.engines[o])
                   for o in held if o in self.engines)
        ending = [o for o in set(held) & self.gone if o in self.engines]
        if sum(held[o] for o in ending) < shortfall:
            return frozenset()

        def end() -> None:
            for owner in ending:
                for engine in self.engines.pop(owner):
                    if self.cycle:
                        engine.me = engine  # type: ignore[attr-defined]
        if self.later_s:
            threading.Timer(self.later_s, end).start()
        else:
            end()
        return frozenset(ending)


def test_a_closed_tabs_engines_are_given_back_when_the_server_needs_them() -> None:
    """A reload leaves the old session's pool to the server until Streamlit drops it: the
    new session's pool of the same size is no longer refused, since the reclaimer ends
    the session no browser holds; an open tab's session is never ended."""
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget)
    tabs.open("open", 128)                                # 0.25 MiB, its tab still open
    tabs.open("reloaded", 256)                            # 0.5 MiB
    mine = tabs.open("new", 16)
    # No reclaimer: refused, and told to wait for Streamlit's two minutes.
    with pytest.raises(PagedLabError, match=r"or again in a few minutes \(a browser tab"):
        budget.check(_config(256), "new", replacing=mine)
    budget.set_reclaimer(tabs.end_gone)
    # The tab that closed is not gone yet (a reconnect may come): refused, and only
    # the other owners were asked about.
    with pytest.raises(PagedLabError, match=r"Try a smaller pool, or again when other "
                                            r"sessions have ended$"):
        budget.claim(_config(256), "new", replacing=mine)
    assert tabs.asked == [frozenset({"open", "reloaded"})]
    assert budget.in_use() == (128 + 256 + 16) * 2048
    tabs.gone.add("reloaded")
    gc.disable()      # its engines are dropped in a cycle: only a collection frees them
    try:
        budget.claim(_config(256), "new", replacing=mine)
    finally:
        gc.enable()
    assert "reloaded" not in tabs.engines and "open" in tabs.engines
    assert budget.in_use("reloaded") == 0


def test_a_claim_waits_for_the_ended_sessions_engines_and_no_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Far longer than the 0.3 s the engines take, which a busy machine can stretch.
    monkeypatch.setattr(budget_module, "RECLAIM_WAIT_S", 60.0)
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget, later_s=0.3)
    budget.set_reclaimer(tabs.end_gone)
    tabs.open("reloaded", 384)
    tabs.gone.add("reloaded")
    started = time.monotonic()
    budget.claim(_config(384), "new")                     # waits until they are dropped
    assert budget.in_use("reloaded") == 0
    # ... and no longer: it returned as they came back, not at the wait's end.
    assert time.monotonic() - started < 30.0
    # Nothing more to end: refused at once, without waiting for anything.
    tabs.open("open", 128)

    def no_wait(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s with no session ending")
    monkeypatch.setattr(budget_module.time, "sleep", no_wait)
    with pytest.raises(PagedLabError, match=r"server's sessions hold 1\.0 MiB"):
        budget.claim(_config(256), "late")


def test_the_reclaimer_is_not_asked_about_a_sessions_own_limit() -> None:
    budget = KVBudget(per_session=MIB, per_server=4 * MIB)
    tabs = _Tabs(budget)
    budget.set_reclaimer(tabs.end_gone)
    tabs.open("mine", 384)
    with pytest.raises(PagedLabError, match=r"this session's engines already hold"):
        budget.claim(_config(384), "mine")
    assert tabs.asked == []


def test_a_claim_waits_for_sessions_another_claim_ended_and_forgets_them_in_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two claims at once: the first ends the gone session, the second finds nothing
    left to end but waits for those engines too. A session whose engines are never
    given back (a leak) is waited for once, RECLAIM_WAIT_S at most, then forgotten."""
    # A wait far longer than the 0.2 s the engines take to come back: a busy machine can
    # delay that timer's thread well past a short one. The claim returns as they do.
    monkeypatch.setattr(budget_module, "RECLAIM_WAIT_S", 60.0)
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget, later_s=0.2)
    budget.set_reclaimer(lambda held, shortfall: frozenset())   # ends nothing itself
    tabs.open("reloaded", 384)
    tabs.gone.add("reloaded")
    budget.ending(tabs.end_gone({"reloaded": 384 * 2048}, 1))    # another claim's doing
    started = time.monotonic()
    budget.claim(_config(384), "new")
    assert budget.in_use("reloaded") == 0
    assert time.monotonic() - started < 30.0    # as they came back, not at the wait's end
    # A leak: ended, but its engine never collected (it alone would make the room).
    # On a clock that only the waits move, so that a busy machine's pauses between
    # these lines cannot use up the wait before it starts.
    clock = [time.monotonic()]
    sleeps: list[float] = []

    def counted_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds
    monkeypatch.setattr(budget_module, "time",
                        SimpleNamespace(monotonic=lambda: clock[0], sleep=counted_sleep))
    monkeypatch.setattr(budget_module, "RECLAIM_WAIT_S", 0.5)
    tabs.open("leaked", 128)
    budget.ending(frozenset({"leaked"}))
    for _ in range(2):
        with pytest.raises(PagedLabError, match=r"server's sessions hold"):
            budget.claim(_config(128), "late")
    waited = len(sleeps)
    assert waited == 0.5 / budget_module.RECLAIM_POLL_S   # the whole wait, once
    with pytest.raises(PagedLabError, match=r"server's sessions hold"):
        budget.claim(_config(128), "late")
    assert len(sleeps) == waited            # forgotten: no wait any more


def test_no_wait_for_ended_sessions_that_could_not_make_the_room_and_none_ended_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim short of more than ending sessions hold does not wait for them; and room
    already on its way back (a session another claim ended) is not made again by
    ending one more."""
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget)
    budget.set_reclaimer(tabs.end_gone)
    tabs.open("open", 128)                       # blocks of 2 KiB; the server holds 512
    tabs.open("g1", 160)
    tabs.open("g2", 128)
    tabs.gone |= {"g1", "g2"}
    # g1 is ending (another claim's doing) but not yet collected; for the whole test (a
    # slow gc.collect on a loaded machine took the default 3 s, and g1 was asked again).
    monkeypatch.setattr(budget_module, "RECLAIM_WAIT_S", 60.0)
    budget.ending(frozenset({"g1"}))

    def no_wait(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s for what could not make the room")
    monkeypatch.setattr(budget_module.time, "sleep", no_wait)
    with pytest.raises(PagedLabError, match=r"server's sessions hold"):
        budget.claim(_config(400), "big")    # short by 304 blocks: g1 and g2 hold 288
    assert tabs.asked[-1] == frozenset({"open", "g2"})       # g1's room counted, not asked
    assert "g2" in tabs.engines                              # and g2 kept: not enough
    monkeypatch.undo()
    tabs.asked.clear()
    # Short by 104 blocks: g1's 160, on their way, cover it; g2 is not ended for it.
    tabs.engines.pop("g1")
    budget.claim(_config(200), "small")
    assert tabs.asked == [] and "g2" in tabs.engines


def test_gone_sessions_are_not_ended_when_they_would_not_make_the_room() -> None:
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget)
    budget.set_reclaimer(tabs.end_gone)
    tabs.open("open", 384)
    tabs.open("gone", 64)
    tabs.gone.add("gone")
    with pytest.raises(PagedLabError, match=r"server's sessions hold"):
        budget.claim(_config(256), "new")                 # 64 blocks free would not do
    assert "gone" in tabs.engines and budget.in_use("gone") == 64 * 2048


def test_a_claim_gets_the_room_of_engines_freed_the_moment_their_session_ends() -> None:
    """No reference cycle: the ended session's engines are freed as it ends, before
    the claim looks again; it must still look again."""
    budget = KVBudget(per_session=512 * MIB, per_server=MIB)
    tabs = _Tabs(budget, cycle=False)
    budget.set_reclaimer(tabs.end_gone)
    tabs.open("reloaded", 384)
    tabs.gone.add("reloaded")
    budget.claim(_config(384), "new")
    assert budget.in_use("reloaded") == 0 and budget.in_use("new") == 384 * 2048


def test_a_scenario_replacing_one_gives_back_its_control_runs_engine_too() -> None:
    """A counted while B was checked: B, which fits on its own, was refused in A's
    place whenever A's control run was large."""
    from backend.sessions.tour import TourRun, parse_scenario_upload

    def upload(name: str, blocks: int, steps: list[dict[str, object]]) -> object:
        return parse_scenario_upload(json.dumps({
            "name": name, "description": name, "steps": steps,
            "config": {"num_blocks": blocks, "block_size": 4}}).encode(), f"{name}.json")

    # A: an 8 KiB pool, and a control run sized for 930 steps (470 KiB); B: 400 KiB.
    a_file = upload("A", 4, [{"op": "add", "request": "A", "prompt_len": 1,
                              "max_new_tokens": None}, {"op": "step", "count": 930}])
    b_file = upload("B", 100, [{"op": "add", "request": "B", "prompt_len": 4}])
    budget = KVBudget(per_session=512 * 1024, per_server=64 * MIB)
    a = TourRun(a_file, "upload", "A", device="cpu", kernel="torch", owner="s",
                budget=budget)
    assert a.control is not None and budget.in_use("s") > 470 * 1024
    b = TourRun(b_file, "upload", "B", device="cpu", kernel="torch", owner="s",
                budget=budget, replacing=a)
    assert budget.in_use("s") == b.engine.cache.total_bytes + (
        0 if b.control is None else b.control.control.cache.total_bytes) <= 512 * 1024


def test_ended_sessions_are_forgotten_once_their_wait_is_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Forgotten only when a refusal ran: on a server never full, every closed tab left
    an entry for the life of the process."""
    b = KVBudget(per_session=MIB, per_server=MIB)
    now = [1000.0]
    monkeypatch.setattr(budget_module.time, "monotonic", lambda: now[0])
    b.ending(frozenset({"a", "b"}))
    now[0] += budget_module.RECLAIM_WAIT_S / 2
    b.ending(frozenset({"c"}))
    assert set(b._ending) == {"a", "b", "c"}
    now[0] += budget_module.RECLAIM_WAIT_S
    b.ending(frozenset({"d"}))
    assert set(b._ending) == {"d"}
