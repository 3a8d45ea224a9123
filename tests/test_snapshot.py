"""Snapshot restore: exact for real states, refused for every inconsistent one."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine import runner
from backend.engine.engine import Engine
from backend.engine.kv_cache import KVCache
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Step
from backend.io.restore import check_snapshot, restore_engine
from backend.io.scenario import load_scenario, run_steps
from backend.io.snapshot import export_snapshot, parse_snapshot_text, snapshot_json
from backend.models.registry import Unloaded
from backend.paging.hashing import hash_block

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "assets" / "scenarios"


def engine_after(ops: list[Op], **cfg: Any) -> Engine:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4, **cfg}), kernel="torch")
    for op in ops:
        e.apply(op)
    return e


@pytest.fixture(scope="module")
def shared() -> dict[str, Any]:
    """A (8 tokens, caching on), B sharing A's first block, C finished (cached blocks)."""
    e = engine_after([Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"),
                      Add("C", prompt="qrstuvwxyz"), Finish("C"), Step()])
    return export_snapshot(e)


def refused(snap: dict[str, Any], match: str) -> None:
    with pytest.raises(PagedLabError, match=match):
        restore_engine(snap, kernel="torch")


def test_the_fixture_restores(shared: dict[str, Any]) -> None:
    assert snapshot_json(restore_engine(copy.deepcopy(shared), kernel="torch")) == (
        snapshot_json(restore_engine(shared, kernel="torch")))


def _salt(snap: dict[str, Any]) -> str:
    cfg = {k: v for k, v in snap["config"].items() if k not in ("device", "bytes_per_block")}
    return EngineConfig.from_json(cfg).cache_salt()


def test_a_chain_that_starts_under_a_foreign_prefix_is_refused() -> None:
    snap = export_snapshot(engine_after([Add("A", prompt="abcdefgh"), Step()]))
    a = snap["requests"][0]
    salt = _salt(snap)
    foreign = hash_block(None, [1, 2, 3, 4], salt)
    n0 = hash_block(foreign, a["tokens"][0:4], salt)
    n1 = hash_block(n0, a["tokens"][4:8], salt)
    # Every digest is honest about its tokens and parent; only the root is foreign.
    for b, node in zip(a["block_table"][:2], (n0, n1), strict=True):
        snap["blocks"][b]["hash"] = node.digest
    snap["prefix_cache"] = [{"hash": x.digest, "parent": x.parent_digest,
                             "tokens": list(x.tokens)} for x in (foreign, n0, n1)]
    refused(snap, "does not chain from the start")


def test_a_full_block_without_its_hash_is_refused(shared: dict[str, Any]) -> None:
    snap = copy.deepcopy(shared)
    a = next(r for r in snap["requests"] if r["id"] == "A")
    digest = snap["blocks"][a["block_table"][1]]["hash"]
    snap["blocks"][a["block_table"][1]]["hash"] = None
    snap["prefix_cache"] = [n for n in snap["prefix_cache"] if n["hash"] != digest]
    refused(snap, "has no hash")


def test_a_fork_is_one_fork_event_then_a_share_per_block_and_restores_exactly() -> None:
    e = engine_after([Add("A", prompt="abcdefghij"), Fork("A", "A2")], prefix_caching=False)
    snap = export_snapshot(e)
    forked = [ev for ev in snap["events"] if ev["step"] == 2]
    table = next(r for r in snap["requests"] if r["id"] == "A")["block_table"]
    assert forked == [{"step": 2, "kind": "fork", "request": "A2", "block": None},
                      *({"step": 2, "kind": "share", "request": "A2", "block": b,
                         "ref_count": 2} for b in table)]
    assert snapshot_json(restore_engine(snap, kernel="torch")) == snapshot_json(e)
    for bad in ({"block": table[0]}, {"request": None}, {"ref_count": 2},
                {"src": 0, "dst": 1}):
        broken = copy.deepcopy(snap)
        next(ev for ev in broken["events"] if ev["kind"] == "fork").update(bad)
        refused(broken, "a fork event names the new request and nothing else")
    # A share's count is bounded as the file's other counts are.
    for count, why in ((-1, "its ref_count is negative"),
                       (2**53, "its ref_count 9,007,199,254,740,992 is past")):
        broken = copy.deepcopy(snap)
        next(ev for ev in broken["events"] if ev["kind"] == "share")["ref_count"] = count
        refused(broken, why)


def test_sharers_with_different_tokens_are_refused() -> None:
    e = engine_after([Add("A", prompt="abcdefghij"), Fork("A", "A2")], prefix_caching=False)
    snap = export_snapshot(e)
    child = next(r for r in snap["requests"] if r["id"] == "A2")
    child["tokens"][0] = (child["tokens"][0] + 1) % 256
    refused(snap, "share blocks but hold different tokens")


def test_a_block_shared_at_two_positions_is_refused() -> None:
    e = engine_after([Add("A", prompt="abcdabcd"), Add("B", prompt="zzzzabcd")],
                     prefix_caching=False)
    snap = export_snapshot(e)
    a, b = snap["requests"]
    freed = b["block_table"][1]
    b["block_table"][1] = a["block_table"][0]
    snap["blocks"][a["block_table"][0]]["ref_count"] = 2
    blk = snap["blocks"][freed]
    blk.update(state="free", ref_count=0, num_filled=0)
    snap["free_queue"].append(freed)
    snap["metrics"].update(used_blocks=3, free_blocks=13, shared_blocks=1,
                           filled_slots=12, blocks_saved_by_sharing=1)
    refused(snap, "holds block .* at logical 1, A at 0")


def _without_first_alloc(s: dict[str, Any]) -> None:
    """The first alloc left out, and with it every later event naming its block: no
    event then says the block was ever handed out."""
    first = next(ev for ev in s["events"] if ev["kind"] == "alloc")
    s["events"] = [ev for ev in s["events"] if ev["block"] != first["block"]
                   and ev.get("src") != first["block"]]
    s["metrics"]["prefix_hit_blocks"] = sum(ev["kind"] == "prefix_hit" for ev in s["events"])
    s["metrics"]["cow_copies"] = sum(ev["kind"] == "cow" for ev in s["events"])


MUTATIONS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("ref count", lambda s: s["blocks"][0].update(ref_count=s["blocks"][0]["ref_count"] + 1),
     "block 0 has ref_count 3 but 2 block table"),
    ("state", lambda s: next(b for b in s["blocks"] if b["state"] == "free").update(
        state="cached"), "is listed as 'cached'"),
    ("tokens", lambda s: s["requests"][0]["tokens"].append(65), "num_tokens is"),
    ("table", lambda s: s["requests"][0].update(num_tokens=20,
                                                tokens=s["requests"][0]["tokens"] * 2 + [1] * 2),
     "do not fit its table"),
    ("limit", lambda s: s["requests"][0].update(max_new_tokens=1), "would have finished"),
    ("negative", lambda s: s["metrics"].update(cow_copies=-1),
     r"cow_copies must be an integer in 0\.\.9,007,199,254,740,991, got -1"),
    ("huge count", lambda s: s["metrics"].update(cow_copies=10**30),
     r"cow_copies must be an integer in 0\.\.9,007,199,254,740,991, got 1,000,"),
    ("derived", lambda s: s["metrics"].update(logical_tokens=1), "metrics.logical_tokens"),
    # Totals the events count: every copy-on-write and prefix-hit block is an event.
    ("cow total", lambda s: s["metrics"].update(cow_copies=10**15),
     "metrics.cow_copies is 1,000,000,000,000,000 but the events hold 0 cow events"),
    ("hit total", lambda s: s["metrics"].update(
        prefix_hit_blocks=s["metrics"]["prefix_hit_blocks"] + 1),
     "metrics.prefix_hit_blocks is 2 but the events hold 1 prefix_hit events"),
    ("event block", lambda s: s["events"][0].update(block=99_999), "outside the pool"),
    ("event request", lambda s: s["events"][0].update(request="ghost"), "'ghost'"),
    ("event step", lambda s: s["events"][0].update(step=s["step"] + 1), "is not in 1.."),
    ("forged node", lambda s: s["prefix_cache"].append(
        {"hash": "0" * 16, "parent": None, "tokens": [0, 0, 0, 0]}), "does not match"),
    # The keys are the old config's: the message names what they are hashed from.
    ("edited seed", lambda s: s["config"].update(seed=s["config"]["seed"] + 1),
     r"does not match its tokens under this config \(a key hashes its tokens, its parent's "
     r"key and the config fields its K/V depend on: seed, num_layers, num_heads, "
     r"num_kv_heads, head_dim, dtype; a file whose config was edited after it was written "
     r"holds the old keys\)"),
    ("waiting ids", lambda s: s["scheduler"].update(waiting=[1]), "are strings"),
    ("running twice", lambda s: s["scheduler"].update(
        running=s["scheduler"]["running"] * 2), "exactly the running"),
    ("reason", lambda s: s["requests"][0].update(finish_reason="capacity"),
     "has no finish_reason"),
    ("bad id", lambda s: s["requests"][0].update(id="a\nb"), "unprintable"),
    ("schema", lambda s: s.update(schema_version=2), "schema_version is 2"),
    ("kernel", lambda s: s["kernel"].update(max_abs_err=float("nan")), "finite"),
    ("config", lambda s: s["config"].update(block_size=0), "block_size must be an integer in"),
    ("device", lambda s: s["config"].update(device="tpu"),
     "snapshot.config.device must be 'cpu' or 'cuda' \\(where the state was taken\\), got 'tpu'"),
    # The Kernel panel shows these as written and a restored state writes them back.
    ("kernel surrogate", lambda s: s["kernel"].update(backend="\ud800"),
     "snapshot.kernel.backend is not valid Unicode text"),
    ("kernel newline", lambda s: s["kernel"].update(device="cpu\nfast"),
     "snapshot.kernel.device must be printable text of at most 64 characters"),
    ("kernel long", lambda s: s["kernel"].update(name="k" * 5000),
     "snapshot.kernel.name must be printable text of at most 64 characters, got 5,000"),
    # Counts past what the app's own fields take (the Add form's max new tokens).
    ("max new", lambda s: s["requests"][0].update(max_new_tokens=10**30),
     r"requests\[0\]\.max_new_tokens must be an integer in 1\.\.1,000,000, got 1,000,"),
    ("huge step", lambda s: s.update(step=2**60), r"snapshot\.step must be an integer in "
                                                   r"0\.\.9,007,199,254,740,991"),
    ("preemptions", lambda s: s["requests"][0].update(num_preemptions=-1),
     "num_preemptions must be an integer in 0.."),
    # The contract's fields are there even where null: one left out is no null (a seed
    # left out would have become 0, a parent left out a request with none).
    ("no seed", lambda s: s["config"].pop("seed"), r"snapshot\.config: missing field 'seed' "),
    ("no dims", lambda s: (s["config"].pop("head_dim"), s["config"].pop("block_size")),
     r"snapshot\.config: missing fields 'block_size', 'head_dim' "),
    ("no parent", lambda s: s["requests"][1].pop("parent"),
     r"snapshot\.requests\[1\]: missing field 'parent'"),
    ("no hash", lambda s: s["blocks"][5].pop("hash"),
     r"snapshot\.blocks\[5\]: missing field 'hash'"),
    ("no event request", lambda s: s["events"][0].pop("request"),
     r"snapshot\.events\[0\]: missing field 'request'"),
    ("no event block", lambda s: s["events"][2].pop("block"),
     r"snapshot\.events\[2\]: missing field 'block'"),
    ("no kernel name", lambda s: s["kernel"].pop("name"),
     r"snapshot\.kernel: missing field 'name'"),
    ("no max_abs_err", lambda s: s["kernel"].pop("max_abs_err"),
     r"snapshot\.kernel: missing field 'max_abs_err'"),
    ("events reversed", lambda s: s["events"].reverse(),
     r"events\[1\]: its step 4 comes after an event of step 5: the events are listed in "
     "the order they happened"),
    # The log, replayed, must leave every block at its count (each event says the count
    # it left): a free of a block still held, an alloc left out, an edited count.
    ("free of a held block", lambda s: s["events"].append(
        {"step": s["step"], "kind": "free", "request": "A",
         "block": s["requests"][0]["block_table"][-1], "ref_count": 0}),
     r"block \d+ has ref_count 1, but the events leave it at 0 \(events\[\d+\] last "
     r"changed it\)"),
    ("alloc left out", _without_first_alloc,
     r"has ref_count \d+, but the events leave it at 0 \(no event names it, so no request "
     r"was ever given it\)"),
    ("edited count", lambda s: next(ev for ev in s["events"] if ev["kind"] == "prefix_hit"
                                    ).update(ref_count=3),
     r"events\[2\] \(prefix_hit, step 2\) gives ref_count 3, but the events before it leave "
     "block 0 at 1, so it leaves 2"),
    # Each event is held to the count the events before it leave, not only the last
    # event of each block to the final counts: a later event that sets the count again
    # would hide each of these.
    ("first alloc left out", lambda s: s["events"].pop(0),
     r"events\[1\] \(prefix_hit, step 2\) gives ref_count 2, but the events before it leave "
     "block 0 at 0, so it leaves 1"),
    ("alloc's count edited", lambda s: s["events"][0].update(ref_count=7),
     r"events\[0\] \(alloc, step 1\) gives ref_count 7, but the events before it leave "
     "block 0 at 0, so it leaves 1"),
    ("alloc of a held block", lambda s: s["events"][1].update(block=0),
     r"events\[1\] \(alloc, step 1\) finds block 0 at ref_count 1, where an alloc takes a "
     r"free block \(0\)"),
    ("free of a held block, then a hit", lambda s: s["events"].insert(2, {
        "step": 1, "kind": "free", "request": "A", "block": 0, "ref_count": 0}),
     r"events\[3\] \(prefix_hit, step 2\) gives ref_count 2, but the events before it leave "
     "block 0 at 0, so it leaves 1"),
    ("free of a free block", lambda s: s["events"].insert(7, {
        "step": 3, "kind": "free", "request": "C", "block": 7, "ref_count": 0}),
     r"events\[7\] \(free, step 3\) finds block 7 at ref_count 0, where a free needs a "
     "block a request holds"),
    # The prefix-cache counters: 3 queries of 25 tokens, 9 of them past any hit (4, 3
    # and 2 of prompts of 8, 7 and 10), and one hit block of 4 tokens. The metrics panel
    # shows them side by side: the first edit showed more tokens served from the cache
    # than were looked up.
    ("queried tokens too few for the hits", lambda s: s["metrics"].update(
        prefix_query_tokens=12),
     r"metrics\.prefix_hit_blocks is 1 \(4 tokens\), more than the 3 tokens a hit could "
     r"serve: metrics\.prefix_query_tokens \(12\) less metrics\.prefix_floor_tokens \(9\)"),
    ("floor past a block per query", lambda s: s["metrics"].update(prefix_floor_tokens=13),
     r"metrics\.prefix_floor_tokens is 13, but 3 queries of blocks of 4 leave from 3 to 12 "
     "tokens no block could serve"),
    ("preemptions total edited", lambda s: s["metrics"].update(preemptions=3),
     r"metrics\.preemptions differs from the requests' num_preemptions"),
    ("event before the first step", lambda s: s["events"][0].update(step=0),
     r"events\[0\]: its step 0 is not in 1\.\.5"),
    # Not from a JSON file (its parser refuses Infinity) but from a dict: a History
    # frame's or a saved session's.
    ("infinite kernel time", lambda s: s["kernel"].update(time_ms=float("inf")),
     r"snapshot\.kernel: max_abs_err and time_ms must be finite and >= 0"),
    ("infinite kernel error", lambda s: s["kernel"].update(max_abs_err=float("inf")),
     r"snapshot\.kernel: max_abs_err and time_ms must be finite and >= 0"),
    ("no queries for the hits", lambda s: s["metrics"].update(prefix_queries=0),
     r"metrics\.prefix_floor_tokens is 9, but 0 queries of blocks of 4 leave from 0 to 0"),
]


@pytest.mark.parametrize("name", ["first alloc left out", "alloc's count edited",
                                  "free of a held block, then a hit"])
def test_a_count_left_out_elsewhere_does_not_let_an_edited_event_pass(
        shared: dict[str, Any], name: str) -> None:
    # A count left out of one event (C's free of block 5) makes the log one another tool
    # may have written; each count the log does give is still held to the events
    # before it.
    mutate, match = next((m, w) for n, m, w in MUTATIONS if n == name)
    snap = copy.deepcopy(shared)
    mutate(snap)
    del next(ev for ev in snap["events"] if ev["kind"] == "free" and ev["block"] == 5
             )["ref_count"]
    refused(snap, match)


def test_a_copy_on_write_of_a_block_one_request_holds_is_refused() -> None:
    # A fork shares A's half-full last block (1); A's next token copies it to a block of
    # its own. Without the fork's share of block 1, the copy had nothing to copy for.
    snap = export_snapshot(engine_after([Add("A", prompt="abcdef"), Fork("A", "A2"), Step()]))
    assert [(ev["kind"], ev.get("src"), ev.get("dst")) for ev in snap["events"]][4:6] == [
        ("share", None, None), ("cow", 1, 2)]
    del snap["events"][4]
    refused(snap, r"events\[4\] \(cow, step 3\) copies from block 1, which the events before "
                  "it leave at ref_count 1: a copy-on-write copies a block two or more "
                  "requests hold")


@pytest.mark.parametrize(("name", "mutate", "match"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_inconsistent_snapshots_are_refused(shared: dict[str, Any], name: str,
                                            mutate: Callable[[dict[str, Any]], None],
                                            match: str) -> None:
    snap = copy.deepcopy(shared)
    mutate(snap)
    refused(snap, match)


def test_counters_at_their_limit_still_take_steps_a_reader_takes_back(
        shared: dict[str, Any]) -> None:
    # A snapshot may hold a count up to 2^53 - 1, but an operation starts only from counts
    # up to 2^52: the snapshot after it must still be a file every reader keeps exactly.
    snap = copy.deepcopy(shared)
    snap["step"] = 2**52
    # Counters that agree with each other and the one hit block of 4 tokens: a query
    # leaves 1 to 4 tokens past any hit.
    snap["metrics"].update(prefix_queries=2**52 - 4, prefix_floor_tokens=2**52 - 4,
                           prefix_query_tokens=2**52)
    engine = restore_engine(snap, kernel="torch")
    engine.apply(Step(2))
    after = json.loads(snapshot_json(engine))
    assert after["step"] == 2**52 + 1
    again = restore_engine(after, kernel="torch")
    assert export_snapshot(again) == after
    # Past 2^52 the state is restored, viewed and exported, but not stepped on.
    snap["step"] = 2**53 - 1
    high = restore_engine(snap, kernel="torch")
    before = snapshot_json(high)
    with pytest.raises(PagedLabError) as refused:
        high.apply(Step())
    assert str(refused.value).startswith(
        "step is 9,007,199,254,740,991, past the 4,503,599,627,370,496 an operation may start "
        "from: the snapshot after it could hold a number past 2^53 - 1")
    assert snapshot_json(high) == before and high.broken is None


def test_a_hash_node_no_block_uses_is_refused(shared: dict[str, Any]) -> None:
    snap = copy.deepcopy(shared)
    stray = hash_block(None, [0, 0, 0, 0], _salt(snap))
    snap["prefix_cache"].append({"hash": stray.digest, "parent": None, "tokens": [0, 0, 0, 0]})
    refused(snap, "which no block's key chains through")


@pytest.mark.parametrize("text", [b"\xff\xfe", "{", "[1, 2]", "9" * 5000, "[" * 50_000])
def test_snapshot_text_is_parsed_as_data_only(text: str | bytes) -> None:
    with pytest.raises(PagedLabError):
        parse_snapshot_text(text)


def test_oversized_snapshot_text_is_refused() -> None:
    with pytest.raises(PagedLabError, match="the limit is"):
        parse_snapshot_text(" " * ((32 << 20) + 1))


def test_restore_recomputes_used_and_cached_blocks_exactly() -> None:
    sc = load_scenario(next(SCENARIO_DIR.glob("13-*.json")))
    e = Engine(sc.config, kernel="torch")
    for _ in run_steps(e, sc.steps):
        pass
    # Finish D so its blocks join the cached ones: some chains now have evicted links.
    e.apply(Grow("D", 2))
    e.apply(Finish("D"))
    r = restore_engine(export_snapshot(e), kernel="torch")
    pool = e.manager.pool
    checked = 0
    for block in pool.blocks:
        if block.ref_count > 0 or block.hash is not None:
            n = block.num_filled
            for layer in range(e.config.num_layers):
                torch.testing.assert_close(r.cache.k[layer][block.id, :n],
                                           e.cache.k[layer][block.id, :n], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(r.cache.v[layer][block.id, :n],
                                           e.cache.v[layer][block.id, :n], atol=1e-5, rtol=1e-5)
            checked += 1
    assert checked >= 6
    # And a later prefix hit on a restored cached block computes what a cold run does.
    for eng in (e, r):
        eng.apply(Add("E", prompt="Once upon a time, a fox ran", max_new_tokens=4))
        eng.apply(Step(4))
    assert e.request("E").tokens == r.request("E").tokens


def test_stepping_a_restored_engine_leaves_its_snapshot_alone() -> None:
    # A History frame or a saved session's row is the snapshot dict itself; an
    # engine restored from it must not write its decoded tokens back into it.
    snap = export_snapshot(engine_after([Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"),
                                         Fork("A", "A2"), Step()]))
    before = copy.deepcopy(snap)
    e = restore_engine(snap, kernel="torch")
    e.apply(Step(3))
    e.apply(Grow("B", 2))
    assert snap == before


def test_restore_reports_each_forward_of_the_recomputation() -> None:
    """Restore's progress: one call per forward (a running request, a swapped one, a
    cached chain), counting up to the total, so a page can draw a bar."""
    e = Engine(EngineConfig.from_json({"num_blocks": 13, "block_size": 4,
                                       "preemption": "swap", "num_cpu_blocks": 16}),
               kernel="torch")
    for rid in "ABCD":
        e.apply(Add(rid, prompt=f"request {rid} asks a question", max_new_tokens=14))
    while not e.swapped:
        e.apply(Step(1))
    e.apply(Finish(e.running[0]))         # its full blocks stay cached
    calls: list[tuple[int, int]] = []
    restore_engine(export_snapshot(e), kernel="torch",
                   progress=lambda done, total: calls.append((done, total)))
    total = calls[-1][1]
    assert calls == [(i, total) for i in range(1, total + 1)]
    assert total >= len(e.running) + len(e.swapped) + 1


def test_a_restored_pool_names_the_same_holder_of_content_that_forks_share() -> None:
    """Greedy forks fill identical blocks (one content, three holders): the content
    index names the lowest id and keeps the others as twins, a restore rebuilds the
    same, and a later prompt with that content hits the same block in both engines."""
    e = engine_after([Add("A", prompt="abcdef", max_new_tokens=12), Fork("A", "A2"),
                      Fork("A", "A3"), Step(4)], temperature=0)
    assert len({tuple(e.request(r).tokens) for r in ("A", "A2", "A3")}) == 1
    pool = e.manager.pool
    [(content, named)] = [(c, b) for c, b in pool.by_content.items() if c in pool.twins]
    holders = sorted([named.id, *pool.twins[content]])
    assert named.id == holders[0] and len(holders) == 3
    r = restore_engine(export_snapshot(e), kernel="torch")
    rpool = r.manager.pool
    assert {c: b.id for c, b in rpool.by_content.items()} == {
        c: b.id for c, b in pool.by_content.items()}
    assert {c: sorted(t) for c, t in rpool.twins.items()} == {
        c: sorted(t) for c, t in pool.twins.items()}
    prompt = e.request("A").tokens[:12]
    for eng in (e, r):
        eng.apply(Add("B", prompt_tokens=tuple(prompt), max_new_tokens=1))
    assert e.manager.block_table("B")[:3] == r.manager.block_table("B")[:3]
    assert e.manager.block_table("B")[1] == holders[0]


def test_a_check_without_kv_reads_the_file_as_restore_does_and_holds_no_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """check_snapshot (a saved session's past step, before it is shown): restore's
    refusals, on an engine with no weights loaded for it and its device and host pools
    on the meta device, which holds no memory (a 65,536-block SmolLM2 pool is
    gigabytes; the CPU copy of the weights a GPU server would otherwise load, seconds)."""
    made: list[tuple[float | None, str]] = []
    real = KVCache.__init__

    def spy(self: KVCache, config: EngineConfig, device: torch.device,
            fill: float | None = 0.0) -> None:
        made.append((fill, device.type))
        real(self, config, device, fill)

    e = Engine(EngineConfig(num_blocks=16, block_size=4, preemption="swap", num_cpu_blocks=8),
               kernel="torch")
    e.apply(Add("A", prompt_len=6))
    snap = export_snapshot(e)
    monkeypatch.setattr(KVCache, "__init__", spy)
    built = runner.build_model

    def no_weights(*args: Any) -> Any:
        raise AssertionError("check_snapshot loaded a model's weights")

    monkeypatch.setattr(runner, "build_model", no_weights)
    check_snapshot(copy.deepcopy(snap))
    assert made == [(None, "meta"), (None, "meta")]
    monkeypatch.setattr(runner, "build_model", built)
    restore_engine(copy.deepcopy(snap), kernel="torch")
    assert made[2:] == [(0.0, "cpu"), (0.0, "cpu")]
    snap["blocks"][0]["ref_count"] += 1
    with pytest.raises(PagedLabError, match="block 0 has ref_count 2 but 1 block table"):
        check_snapshot(snap)
    # Its model computes nothing.
    with pytest.raises(PagedLabError, match="it has no weights to compute with"):
        Unloaded(e.config).forward_contiguous([1, 2])


def _request(snap: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(r for r in snap["requests"] if r["id"] == rid)


@pytest.fixture(scope="module")
def swapped() -> dict[str, Any]:
    """A and B running (sharing "The cat "), A's fork A2, C finished, D swapped out."""
    e = engine_after([Add("A", prompt="The cat sat"), Add("B", prompt="The cat ran"),
                      Fork("A", "A2"), Step(), Add("C", prompt="Once upon a time"), Step(),
                      Finish("C"), Add("D", prompt="xyzw"), Step(3)],
                     block_size=2, preemption="swap", num_cpu_blocks=8, max_new_tokens=None)
    snap = export_snapshot(e)
    assert _request(snap, "D")["status"] == "swapped"
    assert restore_engine(copy.deepcopy(snap), kernel="torch").requests.keys() == e.requests.keys()
    return snap


def _last_blocks_traded(snap: dict[str, Any]) -> None:
    a, b = _request(snap, "A")["block_table"], _request(snap, "B")["block_table"]
    x, y = a[-1], b[-1]
    a[-1], b[-1] = y, x
    blocks = snap["blocks"]
    blocks[x]["hash"], blocks[y]["hash"] = blocks[y]["hash"], blocks[x]["hash"]


def _first_swap_out(snap: dict[str, Any]) -> dict[str, Any]:
    return next(ev for ev in snap["events"] if ev["kind"] == "swap_out")


# The counts stay right in each: only who holds a block, or where a swap put it, is edited.
HOLDER_EDITS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("alloc renamed", lambda s: next(
        ev for ev in s["events"] if ev["kind"] == "alloc"
        and ev["block"] == _request(s, "A")["block_table"][-1]).update(request="B"),
     r"block \d+ is in the block table of 'A', but the events leave it held by 'B'"),
    ("tables traded", _last_blocks_traded,
     r"block \d+ is in the block table of '[AB]', but the events leave it held by '[AB]'"),
    ("swap of another's block", lambda s: _first_swap_out(s).update(block=3, src=3),
     r"events\[\d+\] \(swap_out, step \d+\) names request 'D' for block 3, which the "
     r"events before it leave held by 'A', 'A2', 'B'"),
    ("swap to another host block", lambda s: _first_swap_out(s).update(dst=7),
     r"the host blocks of request 'D' are \[0, 1, 2\], but its last swap_out events copied "
     r"its blocks to host blocks \[7, 1, 2\], in that order"),
    ("host table reordered", lambda s: _request(s, "D").update(block_table=[1, 0, 2]),
     r"the host blocks of request 'D' are \[1, 0, 2\], but its last swap_out events copied "
     r"its blocks to host blocks \[0, 1, 2\], in that order"),
]


@pytest.mark.parametrize(("name", "mutate", "match"), HOLDER_EDITS,
                         ids=[m[0] for m in HOLDER_EDITS])
def test_events_are_held_to_the_requests_that_hold_each_block(
        swapped: dict[str, Any], name: str, mutate: Callable[[dict[str, Any]], None],
        match: str) -> None:
    """Counts alone passed these: the event table then showed block histories that no
    block table agreed with."""
    snap = copy.deepcopy(swapped)
    mutate(snap)
    refused(snap, match)


def _finished(snap: dict[str, Any], reason: str, **fields: Any) -> None:
    row = next(r for r in snap["requests"] if r["status"] == "finished")
    row.update(finish_reason=reason, **fields)


# C of `shared`: finished by hand, 10 prompt tokens, none generated, on tiny-byte (no
# end-of-sequence token, no context of its own).
REASON_EDITS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("eos without one", lambda s: _finished(s, "eos"),
     r"requests\[2\]\.finish_reason is 'eos', but tiny-byte has no end-of-sequence token: "
     "it never stops by itself"),
    ("context without one", lambda s: _finished(s, "context"),
     r"requests\[2\]\.finish_reason is 'context', but tiny-byte has no context of its own"),
    ("limit not reached", lambda s: _finished(s, "max_new_tokens", max_new_tokens=5),
     r"requests\[2\]\.finish_reason is 'max_new_tokens', but it generated 0 of its "
     "max_new_tokens 5"),
    ("no limit", lambda s: _finished(s, "max_new_tokens"),
     r"requests\[2\]\.finish_reason is 'max_new_tokens', but it generated 0 tokens and has "
     "no limit"),
]


@pytest.mark.parametrize(("name", "mutate", "match"), REASON_EDITS,
                         ids=[m[0] for m in REASON_EDITS])
def test_a_finish_reason_the_rest_of_the_file_rules_out_is_refused(
        shared: dict[str, Any], name: str, mutate: Callable[[dict[str, Any]], None],
        match: str) -> None:
    snap = copy.deepcopy(shared)
    assert [r["finish_reason"] for r in snap["requests"]] == [None, None, "finished"]
    mutate(snap)
    refused(snap, match)


def test_a_finish_reason_its_tokens_bear_out_is_kept() -> None:
    e = engine_after([Add("A", prompt="abc", max_new_tokens=2), Step(2)])
    snap = export_snapshot(e)
    assert snap["requests"][0]["finish_reason"] == "max_new_tokens"
    assert restore_engine(snap, kernel="torch").requests["A"].finish_reason == "max_new_tokens"


@pytest.mark.parametrize("reason", ["max_new_tokens", "finished"])
def test_a_request_with_more_tokens_than_its_limit_is_refused(reason: str) -> None:
    """No grow or step passes a request's max_new_tokens, finished or not: an edited file
    showed 5 generated tokens under a limit of 2."""
    snap = export_snapshot(engine_after([Add("A", prompt="abc", max_new_tokens=2), Step(2)]))
    a = snap["requests"][0]
    a["tokens"] += [100, 101, 102]
    a["num_tokens"] += 3
    a["finish_reason"] = reason
    a.pop("text", None)
    refused(snap, r"snapshot\.requests\[0\]: it generated 5 tokens, more than its "
                  r"max_new_tokens 2")


def test_samples_pending_past_an_adds_limit_are_refused() -> None:
    """An add takes at most 64 samples, so its first waits with at most 63 to fork: a file
    saying 1,000 made the first step fork 1,000 requests."""
    snap = export_snapshot(engine_after([Add("X", prompt_len=59), Add("G", prompt_len=5, n=2)]))
    g = next(r for r in snap["requests"] if r["id"] == "G.0")
    assert g["status"] == "waiting" and g["pending_samples"] == 1
    g["pending_samples"] = 63
    assert restore_engine(copy.deepcopy(snap), kernel="torch").requests["G.0"].forks_to_come == 63
    for pending in (64, 1000):
        g["pending_samples"] = pending
        refused(snap, r"snapshot\.requests\[1\]\.pending_samples must be in 0\.\.63 \(an "
                      r"add takes at most 64 parallel samples\)")


ORDER_EDITS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("running reversed", lambda s: s["scheduler"]["running"].reverse(),
     r"snapshot\.scheduler\.running is \['B', 'A'\], but its events leave the running "
     r"requests in the order \['A', 'B'\], the order the scheduler serves and preempts them"),
    ("admissions", lambda s: s["scheduler"].update(admissions=s["scheduler"]["admissions"] + 5),
     r"snapshot\.scheduler\.admissions is 8, but its events hold 3 admissions"),
]


@pytest.mark.parametrize(("name", "mutate", "match"), ORDER_EDITS,
                         ids=[m[0] for m in ORDER_EDITS])
def test_orders_the_log_fixes_are_held_to_it(
        shared: dict[str, Any], name: str, mutate: Callable[[dict[str, Any]], None],
        match: str) -> None:
    """Taken as given, an edited order ran the restored engine otherwise than the run
    that wrote the file: a step preempted another request."""
    snap = copy.deepcopy(shared)
    assert snap["scheduler"]["running"] == ["A", "B"]
    mutate(snap)
    refused(snap, match)


def test_prefix_counters_without_prefix_caching_are_refused() -> None:
    snap = export_snapshot(engine_after([Add("A", prompt="abcdefgh")], prefix_caching=False))
    assert restore_engine(copy.deepcopy(snap), kernel="torch").manager.prefix_queries == 0
    snap["metrics"].update(prefix_queries=1, prefix_query_tokens=8, prefix_floor_tokens=4)
    refused(snap, r"prefix caching is off, but metrics\.prefix_queries, prefix_query_tokens "
                  r"and prefix_floor_tokens are 1, 8 and 4")


def test_a_chain_as_deep_as_the_pool_is_refused_before_anything_is_recomputed(
        shared: dict[str, Any]) -> None:
    """A key at depth d is logical block d of some request, and no request of a pool of
    16 blocks holds a 17th: a chain that deep is no engine's, and recomputing it would
    cost a quadratic forward over all its tokens."""
    def chained(n: int) -> dict[str, Any]:
        snap = copy.deepcopy(shared)
        node = None
        for i in range(n):
            node = hash_block(node, [i % 7, 1, 2, 3], _salt(snap))
            snap["prefix_cache"].append({"hash": node.digest, "parent": node.parent_digest,
                                         "tokens": [i % 7, 1, 2, 3]})
        return snap

    # 16 keys reach depth 15: a chain an engine could hold, refused only as unused.
    refused(chained(16), "which no block's key chains through")
    refused(chained(17), r"is logical block 16 of its chain, but a pool of 16 blocks never "
                         r"holds a request of more than 16 blocks")


def test_a_request_that_is_no_beam_is_never_dropped() -> None:
    """Only a beam search drops a hypothesis (finish_reason "dropped"); a lone request
    with that reason was restored, and its finish shown as "dropped", which no run of
    it could have said."""
    snap = export_snapshot(engine_after([Add("A", prompt_len=6, max_new_tokens=20), Step(),
                                         Finish("A")]))
    a = next(r for r in snap["requests"] if r["id"] == "A")
    assert (a["status"], a["finish_reason"]) == ("finished", "finished")
    assert a.get("beam_width") is None
    a["finish_reason"] = "dropped"
    refused(snap, r"^snapshot\.requests\[0\]: only a beam is dropped$")


def test_admissions_below_the_running_count_are_refused_with_a_partial_log() -> None:
    """Each running request was admitted at least once, so admissions counts at least
    the running requests. With events_partial the log cannot check the count, and a
    file saying 1 admission beside 2 running requests was restored, its metrics card
    showing fewer admissions than requests running."""
    snap = export_snapshot(engine_after([Add("A", prompt_len=6, max_new_tokens=20),
                                         Add("B", prompt_len=5, max_new_tokens=20), Step()]))
    assert snap["scheduler"]["running"] == ["A", "B"]
    assert snap["scheduler"]["admissions"] == 2
    # Accepted as a partial log with the count it holds, refused with one too small.
    assert restore_engine({**copy.deepcopy(snap), "events_partial": True},
                          kernel="torch").log_partial
    for partial in (True, False):
        edited = copy.deepcopy(snap)
        edited["scheduler"]["admissions"] = 1
        if partial:
            edited["events_partial"] = True
        refused(edited, r"^snapshot\.scheduler\.admissions is smaller than the running count$")
