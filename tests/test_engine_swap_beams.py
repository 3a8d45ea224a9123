"""A beam group swapped out keeps its sharing: one host block per shared device block.

vLLM v0 swaps a sequence group through one block mapping, so a block its beams share
is copied once and comes back once. The checks: the host pool holds the group's
distinct blocks (ref count = the beams holding each), the events name every beam's
host table while the copies are one per distinct block, the beams share device
blocks again after the swap-in, the K/V matches a contiguous recomputation at every
step and the search ends as a roomy pool's does; a group that fits the host pool or
the device pool only shared is swapped and comes back rather than being recomputed or
ended; snapshots restore a shared host pool exactly, and refuse sharing no run makes.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.measure import swap_copies
from backend.engine.ops import parse_op
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot
from backend.paging.block_manager import BlockManager
from backend.paging.events import shared_swap_outs
from backend.views.model import events_frame

# A runs beside a beam group whose beams share their prompt's blocks; as A and the
# beams grow, the group (admitted last) is preempted to the host pool.
OPS = [{"op": "add", "request": "A", "prompt_len": 11, "max_new_tokens": 14},
       {"op": "add", "request": "B", "prompt_len": 6, "beam_width": 3, "max_new_tokens": 12}]


def engine(num_blocks: int, *, caching: bool = False, **config: Any) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": num_blocks, "block_size": 4,
                                          "prefix_caching": caching, **config}),
                  kernel="torch")


def apply(e: Engine, op: dict[str, Any]) -> None:
    e.apply(parse_op(op))
    e.check_integrity()


def step(e: Engine) -> None:
    apply(e, {"op": "step"})
    v = e.verify_recomputation()
    assert v.max_kv_err < 1e-4 and v.max_logit_err < 1e-3


def swapped_group(caching: bool) -> tuple[Engine, dict[str, list[int]]]:
    """The engine right after the group's swap-out, and the beams' device tables just
    before it."""
    e = engine(10, caching=caching, preemption="swap", num_cpu_blocks=32)
    for op in OPS:
        apply(e, op)
    while True:
        before = {rid: e.block_table(rid) for rid in e.running}
        step(e)
        if e.swapped:
            return e, before


def finals(e: Engine) -> list[tuple[int, ...]]:
    """The beam search's results: the tokens of the beams that ran to the limit."""
    return sorted(tuple(r.tokens) for r in e.requests.values()
                  if r.group == "B" and r.finish_reason == "max_new_tokens")


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
def test_a_groups_shared_blocks_go_out_once_and_come_back_shared(caching: bool) -> None:
    e, before = swapped_group(caching)
    assert e.host is not None
    beams = list(e.swapped)
    assert len(beams) >= 2
    held = [before[rid] for rid in beams]
    distinct = {b for table in held for b in table}
    assert sum(map(len, held)) > len(distinct), "the beams shared no block"
    # One host block per distinct device block, held by each beam that held it.
    assert e.host.num_used == len(distinct)
    to_host = {}
    for rid, table in zip(beams, held, strict=True):
        for d, h in zip(table, e.host.tables[rid], strict=True):
            assert to_host.setdefault(d, h) == h
    refs = {b["id"]: b["ref_count"] for b in export_snapshot(e)["cpu_blocks"]}
    for d, h in to_host.items():
        assert refs[h] == sum(d in table for table in held)
    # Each beam's swap_out events are its host table; the copies are one per block.
    out = [ev for ev in e.events if ev.kind == "swap_out" and ev.step == e.manager.step]
    for rid in beams:
        assert [ev.dst for ev in out if ev.request == rid] == e.host.tables[rid]
    assert len(out) - len(shared_swap_outs(e.events, {r: "B" for r in beams})) == len(distinct)
    # The event log says which swap_outs shared another beam's copy.
    lines = events_frame(export_snapshot(e))["what happened"]
    assert lines.str.contains("shares that copy").sum() == len(out) - len(distinct)
    # Back on the device, the beams share blocks again: a share event per block that an
    # earlier beam brought back, a copy only for the others.
    while e.swapped:
        step(e)
    back = [ev for ev in e.events if ev.kind in ("swap_in", "share")
            and ev.request in beams and ev.step == e.manager.step]
    assert sum(ev.kind == "swap_in" for ev in back) <= len(distinct)
    assert any(ev.kind == "share" for ev in back)
    tables = [set(e.block_table(rid)) for rid in beams if rid in e.running]
    assert len(tables) >= 2 and tables[0] & tables[1]
    while not e.idle:
        step(e)
    roomy = engine(64, caching=caching)
    for op in OPS:
        apply(roomy, op)
    while not roomy.idle:
        apply(roomy, {"op": "step"})
    assert finals(e) == finals(roomy) and finals(e)
    assert e.host.num_used == 0 and e.host.swap_ins == e.host.swap_outs


def test_a_group_that_fits_the_host_pool_only_shared_is_swapped() -> None:
    """The beams hold 6 table entries over 4 distinct blocks: a host pool of 4 takes
    the group shared. Counted beam by beam, it was recomputed instead."""
    e, _ = swapped_group(False)
    assert e.host is not None
    used = e.host.num_used
    assert sum(map(len, e.host.tables.values())) > used
    tight = engine(10, preemption="swap", num_cpu_blocks=used)
    for op in OPS:
        apply(tight, op)
    while not tight.swapped:
        step(tight)
        assert not tight.waiting, "the group was recomputed, not swapped"
    assert tight.host is not None and tight.host.num_free == 0


def test_a_group_that_fits_the_device_pool_only_shared_comes_back() -> None:
    """The beams' 17-token prompt and their own blocks: 5 shared blocks and 2 more each
    at most, 9 of a pool of 9, and 12 counted beam by beam. Back from the host pool as
    each beam's own copy the group could never fit, and it was ended "capacity"."""
    e = engine(9, preemption="swap", num_cpu_blocks=32)
    apply(e, {"op": "add", "request": "A", "prompt_len": 4, "max_new_tokens": 6})
    apply(e, {"op": "add", "request": "B", "prompt_len": 17, "beam_width": 2,
              "max_new_tokens": 8})
    swapped = 0
    while not e.idle:
        step(e)
        swapped += bool(e.swapped)
    assert swapped
    reasons = {r.finish_reason for r in e.requests.values() if r.group == "B"}
    assert "capacity" not in reasons and "max_new_tokens" in reasons


def test_copies_are_counted_once_per_shared_block() -> None:
    e, _ = swapped_group(False)
    while not e.idle:
        step(e)
    outs = [ev for ev in e.events if ev.kind == "swap_out"]
    ins = [ev for ev in e.events if ev.kind == "swap_in"]
    # Every swap-out here is the group's: its distinct host blocks per swap-out.
    distinct = len({(ev.step, ev.dst) for ev in outs})
    assert distinct < len(outs)
    assert swap_copies(e) == distinct + len(ins)


def test_a_snapshot_with_shared_host_blocks_restores_exactly() -> None:
    e, _ = swapped_group(False)
    snap = json.loads(json.dumps(export_snapshot(e)))
    assert any(b["ref_count"] > 1 for b in snap["cpu_blocks"])
    twin = restore_engine(snap, kernel="torch")
    twin.check_integrity()
    assert export_snapshot(twin) == snap
    assert twin.verify_recomputation().max_kv_err < 1e-4
    for _ in range(3):
        step(e)
        step(twin)
        a, b = export_snapshot(e), export_snapshot(twin)
        assert [(r["id"], r["block_table"]) for r in a["requests"]] == [
            (r["id"], r["block_table"]) for r in b["requests"]]


def _shared_pair(snap: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two swapped beams of the snapshot whose host tables share their first block."""
    rows = [r for r in snap["requests"] if r["status"] == "swapped" and r.get("beam_width")]
    a, b = rows[0], rows[1]
    assert a["block_table"][0] == b["block_table"][0]
    return a, b


def _other_group(snap: dict[str, Any]) -> None:
    a, _ = _shared_pair(snap)
    c = next(r for r in snap["requests"] if r["id"] == "C")
    c["block_table"][0] = a["block_table"][0]


def _other_position(snap: dict[str, Any]) -> None:
    _, b = _shared_pair(snap)
    b["block_table"][0], b["block_table"][1] = b["block_table"][1], b["block_table"][0]


def _not_a_leading_run(snap: dict[str, Any]) -> None:
    """b takes a copy of its first block of its own and still shares its second."""
    _, b = _shared_pair(snap)
    free = next(c for c in snap["cpu_blocks"] if c["ref_count"] == 0)
    old = snap["cpu_blocks"][b["block_table"][0]]
    free.update(ref_count=1, state="used", num_filled=old["num_filled"])
    old["ref_count"] -= 1
    b["block_table"][0] = free["id"]
    snap["metrics"]["cpu_used_blocks"] += 1
    # Its log says so too: its last swap-out's first event names the new host block.
    last = max(i for i, e in enumerate(snap["events"])
               if e["kind"] == "swap_out" and e["request"] == b["id"] and e["dst"] == old["id"])
    snap["events"][last]["dst"] = free["id"]


def _other_tokens(snap: dict[str, Any]) -> None:
    _, b = _shared_pair(snap)
    b["tokens"][0] = (b["tokens"][0] + 1) % 256


def _one_holder(snap: dict[str, Any]) -> None:
    a, _ = _shared_pair(snap)
    snap["cpu_blocks"][a["block_table"][0]]["ref_count"] = 1


@pytest.mark.parametrize("mutate, message", [
    (_other_group, "only beams of one group share host blocks"),
    (_other_position, r"it is block 0 of one table and block 1 of the other"),
    (_not_a_leading_run, r"host block 1 is in the tables of 'B.4' and 'B.5', but their tables "
                         r"differ before it"),
    (_other_tokens, "their tokens differ before its end"),
    (_one_holder, "with ref_count 1 .* make it used with ref_count 3"),
], ids=["other-group", "other-position", "not-a-leading-run", "other-tokens", "one-holder"])
def test_host_sharing_no_swap_out_makes_is_refused(mutate: Any, message: str) -> None:
    if mutate is _not_a_leading_run:
        # B.4 and B.5 share their first two host blocks.
        e, _ = swapped_group(False)
    else:
        # C, a request alone, is swapped out beside the group, whose three beams share
        # their first host block.
        e = engine(8, preemption="swap", num_cpu_blocks=32)
        for op in [OPS[0], {"op": "add", "request": "C", "prompt_len": 2,
                            "max_new_tokens": 12}, OPS[1]]:
            apply(e, op)
        while not ("C" in e.swapped and len(e.swapped) > 2):
            step(e)
    snap = json.loads(json.dumps(export_snapshot(e)))
    bad = copy.deepcopy(snap)
    mutate(bad)
    with pytest.raises(PagedLabError, match=message):
        restore_engine(bad, kernel="torch")


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
def test_allocate_shares_leading_blocks_and_chains_the_rest(caching: bool) -> None:
    """A sequence admitted on another's held blocks: every one of them (the last
    partial), or the full ones and new blocks past them whose prefix-cache keys chain
    after the shared ones (the integrity check recomputes every key)."""
    m = BlockManager(num_blocks=12, block_size=4, prefix_caching=caching)
    tokens = list(range(10))
    m.allocate("a", tokens)
    table = m.block_table("a")
    whole = m.allocate("b", tokens, shared=table)
    assert whole.block_table == tuple(table) and whole.new_blocks == ()
    assert [m.pool.blocks[b].ref_count for b in table] == [2, 2, 2]
    part = m.allocate("c", [*tokens[:8], 99, 98, 97, 96, 95], shared=table[:2])
    assert part.block_table[:2] == tuple(table[:2]) and len(part.new_blocks) == 2
    assert [ev.kind for ev in m.events[-4:]] == ["share", "share", "alloc", "alloc"]
    m.check_integrity()
    # Copy-on-write on the partial block both hold, then appends fill and key it.
    m.append("b", [10, 11, 12])
    m.append("c", [94, 93, 92])
    m.check_integrity()
    if caching:
        # c's third block, full, is keyed after the shared prefix: a new sequence with
        # its tokens hits all three blocks.
        hit = m.allocate("d", [*tokens[:8], 99, 98, 97, 96, 1])
        assert hit.hit_blocks == part.block_table[:3]


def test_a_beam_whose_whole_table_another_beam_holds_comes_back_sharing_all_of_it() -> None:
    """Two swapped beams with one host table (a restored state: the engine's rounds copy
    a shared last block in the step that forks it): the second shares every device
    block the first brought back and copies nothing."""
    e, _ = swapped_group(False)
    snap = json.loads(json.dumps(export_snapshot(e)))
    rows = {r["id"]: r for r in snap["requests"]}
    a, b = rows["B.4"], rows["B.5"]
    own = b["block_table"][-1]
    b["tokens"], b["block_table"] = list(a["tokens"]), list(a["block_table"])
    b["cum_logprob"] = a["cum_logprob"]          # its score goes with its tokens
    snap["cpu_blocks"][own].update(ref_count=0, state="free", num_filled=0)
    snap["cpu_blocks"][a["block_table"][-1]]["ref_count"] = 2
    snap["metrics"]["cpu_used_blocks"] -= 1
    last = max(i for i, ev in enumerate(snap["events"])
               if ev["kind"] == "swap_out" and ev["request"] == "B.5" and ev["dst"] == own)
    snap["events"][last]["dst"] = a["block_table"][-1]
    twin = restore_engine(snap, kernel="torch")
    twin.check_integrity()
    while twin.swapped:
        step(twin)
    back = [(ev.kind, ev.request) for ev in twin.events
            if ev.step == twin.manager.step and ev.kind in ("swap_in", "share")
            and ev.request in ("B.4", "B.5")]
    assert back == [("swap_in", "B.4")] * 3 + [("share", "B.5")] * 3
    while not twin.idle:
        step(twin)
    assert twin.host is not None and twin.host.num_used == 0
