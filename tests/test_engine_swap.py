"""Swap preemption: K/V copied to a host pool and back, and nothing it generates changes.

A pool too small for its batch preempts; with `preemption: "swap"` the
victims' blocks go to host memory and come back. The checks: the host copy
equals a contiguous recomputation while swapped, every request generates
exactly the tokens of a run with room to spare, the events say what moved
where, snapshots restore a swapped state exactly, and a host pool too small
for a victim falls back to recomputation.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io import export
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot
from backend.views.grid import grid_spec
from backend.views.host_pool import host_view
from backend.views.model import events_frame
from bench.soak import soak_configs, soak_sequence

PROMPTS = [{"op": "add", "request": rid, "prompt": f"request {rid} asks a question",
            "max_new_tokens": 14} for rid in "ABCD"]


def engine(num_blocks: int, **config: Any) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": num_blocks, "block_size": 4,
                                          **config}), kernel="torch")


def apply(e: Engine, op: dict[str, Any]) -> None:
    e.apply(parse_op(op))
    e.check_integrity()


def run_out(e: Engine, *, verify: bool = False) -> int:
    """Step until nothing runs or waits; returns the steps with a swapped request."""
    swapped_steps = 0
    for _ in range(200):
        if e.idle:
            return swapped_steps
        apply(e, {"op": "step"})
        swapped_steps += bool(e.swapped)
        if verify:
            v = e.verify_recomputation()
            assert v.max_kv_err < 1e-4 and v.max_logit_err < 1e-3
    raise AssertionError("requests never finished")


def swapped_engine() -> Engine:
    """The four requests in a 13-block pool with swap, stepped until one is swapped out."""
    e = engine(13, preemption="swap", num_cpu_blocks=16)
    for op in PROMPTS:
        apply(e, op)
    while not e.swapped:
        apply(e, {"op": "step"})
    return e


def state(e: Engine) -> dict[str, Any]:
    snap = export_snapshot(e)
    snap.pop("kernel")
    return snap


def test_swapped_requests_generate_what_they_would_with_room() -> None:
    roomy = engine(64)
    tight = engine(13, preemption="swap", num_cpu_blocks=16)
    for e in (roomy, tight):
        for op in PROMPTS:
            apply(e, op)
    assert run_out(roomy) == 0
    # The host copies are checked against a contiguous pass at every step.
    assert run_out(tight, verify=True) > 0
    kinds = {ev.kind for ev in tight.events}
    assert {"swap_out", "swap_in", "preempt"} <= kinds
    for rid, req in roomy.requests.items():
        assert tight.requests[rid].tokens == req.tokens, rid
    assert tight.host is not None
    assert tight.host.swap_outs > 0 and tight.host.swap_ins == tight.host.swap_outs
    assert tight.host.num_used == 0


def test_swap_events_name_device_and_host_blocks() -> None:
    e = swapped_engine()
    rid = e.swapped[0]
    outs = [ev for ev in e.events if ev.kind == "swap_out" and ev.request == rid]
    assert e.host is not None
    assert [ev.dst for ev in outs] == e.host.tables[rid]
    assert all(ev.block == ev.src for ev in outs)
    # The blocks went back to the device pool right after their copy.
    frees = [ev for ev in e.events if ev.kind == "free" and ev.request == rid]
    assert {ev.block for ev in outs} <= {ev.block for ev in frees}
    assert e.requests[rid].status == "swapped" and e.block_table(rid) == []
    snap = export_snapshot(e)
    row = next(r for r in snap["requests"] if r["id"] == rid)
    assert row["status"] == "swapped" and row["block_table"] == e.host.tables[rid]
    assert snap["metrics"]["swapped_requests"] == len(e.swapped)
    # The exported tables: the swapped request holds none of the device's blocks (its
    # table's numbers are host blocks, which the requests table says).
    blocks = export.blocks_table(snap)
    held = blocks[blocks["holders"].str.split().apply(lambda ids: rid in ids)]
    assert held.empty, held
    for b in blocks.itertuples():
        assert len(b.holders.split()) <= b.ref_count, b
    requests = export.requests_table(snap).set_index("id")
    assert requests.loc[rid, "pool"] == "host"
    assert set(requests.drop(index=rid)["pool"]) == {"device"}
    assert snap["metrics"]["cpu_used_blocks"] == e.host.num_used > 0
    assert [b["state"] for b in snap["cpu_blocks"]].count("used") == e.host.num_used
    for op, word in ((("grow", {"tokens": 1}), "swapped out"),
                     (("fork", {"child": "Z"}), "swapped out")):
        before = state(e)
        with pytest.raises(PagedLabError, match=word):
            e.apply(parse_op({"op": op[0], "request": rid, **op[1]}))
        assert state(e) == before
    # Finishing a swapped request frees its host blocks.
    used = e.host.num_used
    apply(e, {"op": "finish", "request": rid})
    assert e.host.num_used < used and rid not in e.swapped


def test_snapshot_of_a_swapped_state_restores_exactly() -> None:
    e = swapped_engine()
    snap = json.loads(json.dumps(export_snapshot(e)))
    twin = restore_engine(snap, kernel="torch")
    assert state(twin) == state(e)
    v = twin.verify_recomputation()
    assert v.max_kv_err < 1e-4
    run_out(e)
    run_out(twin)
    assert state(twin) == state(e)


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["cpu_blocks"].pop(), "cpu_blocks lists"),
    (lambda s: s["scheduler"].update(swapped=[]), "scheduler.swapped"),
    (lambda s: s["config"].update(preemption="recompute"), "swapped request needs"),
])
def test_bad_host_state_is_refused(mutate: Any, message: str) -> None:
    e = swapped_engine()
    snap = json.loads(json.dumps(export_snapshot(e)))
    mutate(snap)
    with pytest.raises(PagedLabError, match=message):
        restore_engine(snap, kernel="torch")


def test_a_full_host_pool_falls_back_to_recompute() -> None:
    # One host block: no victim fits, so every preemption recomputes.
    e = engine(13, preemption="swap", num_cpu_blocks=1)
    for op in PROMPTS:
        apply(e, op)
    run_out(e, verify=True)
    kinds = [ev.kind for ev in e.events]
    assert "preempt" in kinds and "swap_out" not in kinds
    assert e.manager.preemptions > 0


def test_swap_needs_a_host_pool() -> None:
    with pytest.raises(PagedLabError, match="num_cpu_blocks"):
        EngineConfig.from_json({"preemption": "swap"})
    # Under swap the host pool's range starts at 1; 0 says why, 0.0 is refused as a count.
    for value, said in ((0, 'preemption "swap" needs a host pool: set num_cpu_blocks to 1'),
                        (0.0, "num_cpu_blocks must be an integer in 1..65,536, got 0.0"),
                        (70_000, "num_cpu_blocks must be an integer in 1..65,536, got 70,000")):
        with pytest.raises(PagedLabError, match=re.escape(said)):
            EngineConfig.from_json({"preemption": "swap", "num_cpu_blocks": value})
    with pytest.raises(PagedLabError, match=re.escape("in 0..65,536, got 70,000")):
        EngineConfig.from_json({"num_cpu_blocks": 70_000})
    with pytest.raises(PagedLabError, match="preemption"):
        EngineConfig.from_json({"preemption": "sometimes"})


@pytest.mark.parametrize("extra", [{"num_cpu_blocks": 6}, {"num_cpu_blocks": 40},
                                   {"num_cpu_blocks": 12, "max_num_batched_tokens": 5}])
def test_random_operations_with_swap_keep_every_invariant(extra: dict[str, Any]) -> None:
    swaps = 0
    for seed, config in enumerate(soak_configs(10)[:5]):
        # Raises SoakError naming the config, seed and operation that broke; a
        # refused operation must leave the snapshot (host pool included) as it was,
        # and the final state must survive export, restore, export.
        stats = soak_sequence({**config, "preemption": "swap", **extra}, seed=seed,
                              num_ops=35)
        swaps += stats.events["swap_out"]
    assert swaps > 0, "the fuzz should swap"


def test_swap_events_are_checked_against_the_host_pool() -> None:
    e = swapped_engine()
    snap = json.loads(json.dumps(export_snapshot(e)))
    at = next(i for i, ev in enumerate(snap["events"]) if ev["kind"] == "swap_out")
    # A host block id past the device pool is a host block like any other: read, then
    # held to the swapped request's host table, which says its first block went elsewhere.
    snap["events"][at]["dst"] = 15
    with pytest.raises(PagedLabError, match=r"its last swap_out events copied its blocks to "
                                            r"host blocks \[15, "):
        restore_engine(snap, kernel="torch")
    snap["events"][at]["dst"] = 16
    with pytest.raises(PagedLabError, match="outside the host pool"):
        restore_engine(snap, kernel="torch")


def test_a_log_that_contradicts_who_is_swapped_out_or_preempted_is_refused() -> None:
    """The totals follow the log where a file leaves them out, so a log edited with them
    made "0 swap-outs" beside a swapped request, and later more swap-ins than swap-outs."""
    e = swapped_engine()
    snap = json.loads(json.dumps(export_snapshot(e)))
    rid = e.swapped[0]
    # Its swap_out events gone (and the totals left to the log).
    unlogged = copy.deepcopy(snap)
    unlogged["events"] = [ev for ev in unlogged["events"] if ev["kind"] != "swap_out"]
    del unlogged["metrics"]["swap_outs"], unlogged["metrics"]["swap_ins"]
    with pytest.raises(PagedLabError, match=(
            f"request '{rid}' is swapped out, but the events hold no swap_out for it since "
            "it last took device blocks")):
        restore_engine(unlogged, kernel="torch")
    # Preemptions the log does not hold.
    for delta in (1, 2):
        wrong = copy.deepcopy(snap)
        row = next(r for r in wrong["requests"] if r["id"] == rid)
        row["num_preemptions"] += delta
        wrong["metrics"]["preemptions"] += delta
        with pytest.raises(PagedLabError, match=(
                f"request '{rid}' has num_preemptions {row['num_preemptions']} but the "
                f"events hold {row['num_preemptions'] - delta} preempt events? for it")):
            restore_engine(wrong, kernel="torch")
    # Back on the device, running, with its return cut from the log.
    while rid in e.swapped:
        apply(e, {"op": "step"})
    back = json.loads(json.dumps(export_snapshot(e)))
    assert next(r for r in back["requests"] if r["id"] == rid)["status"] == "running"
    last_out = max(i for i, ev in enumerate(back["events"])
                   if ev["kind"] == "swap_out" and ev["request"] == rid)
    back["events"] = back["events"][:last_out + 1] + [
        ev for ev in back["events"][last_out + 1:]
        if ev["request"] != rid or ev["kind"] not in ("alloc", "prefix_hit", "evict", "swap_in")]
    del back["metrics"]["swap_outs"], back["metrics"]["swap_ins"]
    back["metrics"]["prefix_hit_blocks"] = sum(ev["kind"] == "prefix_hit"
                                               for ev in back["events"])
    with pytest.raises(PagedLabError, match=(
            f"request '{rid}' is running, but the events hold no return to the device after "
            "its last swap_out")):
        restore_engine(back, kernel="torch")


def test_the_swap_totals_are_the_logs_or_the_snapshot_is_refused() -> None:
    # Swapped out, back, and out again: two swap-outs and one swap-in in the log.
    e = swapped_engine()
    for _ in range(100):
        if e.host.swap_ins and e.swapped:
            break
        apply(e, {"op": "step"})
    snap = json.loads(json.dumps(export_snapshot(e)))
    outs, ins = snap["metrics"]["swap_outs"], snap["metrics"]["swap_ins"]
    assert outs >= 2 and ins >= 1
    # Left out (the contract's metrics may leave them out): counted from the log.
    bare = copy.deepcopy(snap)
    del bare["metrics"]["swap_outs"], bare["metrics"]["swap_ins"]
    assert export_snapshot(restore_engine(bare, kernel="torch")) == snap
    nulls = copy.deepcopy(snap)
    nulls["metrics"]["swap_outs"] = nulls["metrics"]["swap_ins"] = None
    assert export_snapshot(restore_engine(nulls, kernel="torch")) == snap
    # A swapped request finished where it is logs no swap-in: the counts stay the log's.
    rid = e.swapped[0]
    apply(e, {"op": "finish", "request": rid})
    assert export_snapshot(restore_engine(export_snapshot(e), kernel="torch")) == \
        export_snapshot(e)
    # Given, they must be the log's: "0 swap-outs" showed beside a swapped request.
    for key, value, logged in (("swap_outs", 0, outs), ("swap_outs", outs + 1, outs),
                               ("swap_ins", ins + 5, ins), ("swap_ins", 0, ins)):
        wrong = copy.deepcopy(snap)
        wrong["metrics"][key] = value
        with pytest.raises(PagedLabError, match=(
                rf"metrics\.{key} is {value} but the events hold {logged} "
                rf"swap-{key[5:-1]}s? \(")):
            restore_engine(wrong, kernel="torch")
    # A swapped request was preempted: with num_preemptions 0 (and the total to match)
    # the Preemptions card read 0 beside it.
    unpreempted = copy.deepcopy(snap)
    row = next(r for r in unpreempted["requests"] if r["id"] == rid)
    unpreempted["metrics"]["preemptions"] -= row["num_preemptions"]
    row["num_preemptions"] = 0
    with pytest.raises(PagedLabError, match=f"request '{rid}' is swapped out but its "
                                            "num_preemptions is 0"):
        restore_engine(unpreempted, kernel="torch")
    # The same in a file with the contract's fields alone, whose log may leave
    # preemptions out: refused all the same.
    unpreempted["events"] = [ev for ev in unpreempted["events"] if ev["kind"] != "preempt"]
    for key in ("free_queue", "prefix_cache", "scheduler", "allocator"):
        unpreempted.pop(key)
    with pytest.raises(PagedLabError, match=f"request '{rid}' is swapped out but its "
                                            "num_preemptions is 0"):
        restore_engine(unpreempted, kernel="torch")


def test_the_host_pools_grid_is_named_for_it() -> None:
    # Drawn like the device pool, its text alternative began as the device pool's did,
    # with a "cached" count the host pool can never have.
    snap = export_snapshot(swapped_engine())
    _, spec = grid_spec(host_view(snap))
    used = sum(b["state"] == "used" for b in snap["cpu_blocks"])
    assert spec["description"].startswith(
        f"Host pool blocks 0–15 (4 slots each): {used} used, {16 - used} free. ")
    assert grid_spec(snap)[1]["description"].startswith("Physical blocks 0–12 (4 slots each)")
    one = engine(13, preemption="swap", num_cpu_blocks=1)
    assert grid_spec(host_view(export_snapshot(one)))[1]["description"].startswith(
        "Host pool block 0 (4 slots): 0 used, 1 free. ")


def test_the_event_log_says_where_a_preempted_requests_k_v_went() -> None:
    swapped = swapped_engine()
    rid = swapped.swapped[0]
    log = events_frame(export_snapshot(swapped))
    said = log[(log["kind"] == "preempt") & (log["request"] == rid)]["what happened"]
    assert list(said)[:1] == [
        f"request {rid} was preempted: its K/V went to the host pool (swap_out) and its "
        "device blocks are released; it resumes from there, nothing recomputed"]
    # The oldest event shown, its swap_outs cut off by the log's limit: still told apart.
    snap = export_snapshot(swapped)
    at = max(i for i, ev in enumerate(snap["events"])
             if ev["kind"] == "preempt" and ev["request"] == rid)
    oldest = events_frame(snap, limit=len(snap["events"]) - at).iloc[-1]
    assert oldest["kind"] == "preempt" and "its K/V went to the host pool" in oldest[
        "what happened"]
    # No room in the host pool: the victim is recomputed, and the log says so.
    recomputed = engine(13, preemption="swap", num_cpu_blocks=1)
    for op in PROMPTS:
        apply(recomputed, op)
    while not recomputed.manager.preemptions:
        apply(recomputed, {"op": "step"})
    log = events_frame(export_snapshot(recomputed))
    said = set(log[log["kind"] == "preempt"]["what happened"])
    assert len(said) == 1 and said.pop().endswith(
        "was preempted: its blocks are released and it will be recomputed (the host pool "
        "had no room for its K/V)")


def test_a_victim_that_exactly_fills_the_host_pool_is_swapped_not_recomputed() -> None:
    """B's one block is all the host pool has, and it fits: B is swapped out. (Checking
    `<` where `<=` is meant recomputed every victim whose blocks exactly fill the free
    host blocks: the log said "preempt" with no swap_out, B waited to be prefilled again
    and the Swap outs metric stayed at 0 beside an empty host pool of the right size.)"""
    e = engine(2, preemption="swap", num_cpu_blocks=1)
    # A and B take a block each; after one decode both blocks are full, and A's next
    # token preempts B, the newest.
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 4})
    apply(e, {"op": "add", "request": "B", "prompt_len": 3, "max_new_tokens": 4})
    apply(e, {"op": "step"})
    assert e.host is not None and e.host.num_free == 1 and len(e.block_table("B")) == 1
    res = e.apply(parse_op({"op": "step"}))
    e.check_integrity()
    assert res.preempted == ("B",)
    assert [ev.kind for ev in res.events
            if ev.kind in ("swap_out", "preempt")] == ["swap_out", "preempt"]
    b = e.requests["B"]
    assert (b.status, b.num_preemptions) == ("swapped", 1)
    assert list(e.swapped) == ["B"] and list(e.waiting) == []
    assert (e.host.swap_outs, e.host.num_used, e.host.num_free) == (1, 1, 0)
    assert export_snapshot(e)["metrics"]["swap_outs"] == 1


def test_a_swapped_request_full_to_a_block_boundary_waits_for_its_next_tokens_block() -> None:
    """B was swapped out with its 4 tokens filling its one block, so coming back it needs
    that block and one for its next token. With only 1 free it stays swapped; swapped in
    on the block alone (the next token's block left uncounted) it would be swapped in
    and straight back out at every step, its preemption count climbing, until A ends."""
    # A host pool with room to spare: this is about coming back, not going out.
    e = engine(4, preemption="swap", num_cpu_blocks=4)
    apply(e, {"op": "add", "request": "A", "prompt_len": 7, "max_new_tokens": 8})
    apply(e, {"op": "add", "request": "B", "prompt_len": 3, "max_new_tokens": 4})
    # Step 1 fills both last blocks; step 2 gives A the free block and swaps B out.
    apply(e, {"op": "step", "count": 2})
    b = e.requests["B"]
    assert (b.status, b.num_tokens, b.num_preemptions) == ("swapped", 4, 1)
    assert e.manager.num_free_blocks == 1
    res = e.apply(parse_op({"op": "step"}))
    e.check_integrity()
    assert (res.swapped_in, res.preempted) == ((), ())
    assert not [ev for ev in res.events if ev.request == "B"]
    assert (b.status, b.num_preemptions) == ("swapped", 1)
    assert e.host is not None and (e.host.swap_outs, e.host.swap_ins) == (1, 0)
    # Run out: B comes back once, when A has finished, and is never swapped out again.
    run_out(e)
    assert (b.finish_reason, b.num_preemptions) == ("max_new_tokens", 1)
    assert (e.host.swap_outs, e.host.swap_ins) == (1, 1)


def test_a_host_block_with_a_prefix_hash_is_refused() -> None:
    """Only device blocks are in the prefix cache: a swap-out copies K/V to a host block
    that no lookup can find. A file whose host block carried a hash was restored as if
    the hash were not there (and re-exported without it), so an edited or foreign file
    passed for a PagedLab state it could not be."""
    e = swapped_engine()
    snap = json.loads(json.dumps(export_snapshot(e)))
    used = [i for i, b in enumerate(snap["cpu_blocks"]) if b["state"] == "used"]
    free = [i for i, b in enumerate(snap["cpu_blocks"]) if b["state"] == "free"]
    assert used and free
    assert all(b["hash"] is None for b in snap["cpu_blocks"])
    for i in (used[0], free[0]):
        edited = copy.deepcopy(snap)
        edited["cpu_blocks"][i]["hash"] = "ab" * 32
        with pytest.raises(PagedLabError, match=(
                rf"^snapshot\.cpu_blocks\[{i}\]: host blocks are not in the prefix cache "
                r"\(no hash\)$")):
            restore_engine(edited, kernel="torch")
