"""Beam search run by the engine on shared blocks, against a search with no paging.

`beams.reference_search` recomputes every beam from its whole token list with
the model's contiguous pass each round; the engine's search forks, copies on
write and frees blocks, batches the beams with other requests, preempts and
restores. Both must keep the same beams with the same scores, round by round.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine import beams
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.engine.request import Request
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot

PROMPT = "The cat sat"      # 11 bytes: a full block and a partial one of 4
SCORE_TOL = 1e-4            # float32 paged kernel against the contiguous pass


def engine(**config: Any) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": 96, "block_size": 4, **config}),
                  kernel="torch")


def apply(e: Engine, *ops: dict[str, Any]) -> None:
    for op in ops:
        e.apply(parse_op(op))
        e.check_integrity()


def run_out(e: Engine, rounds: list[list[tuple[list[int], float]]] | None = None,
            group: str = "B") -> None:
    """Step until nothing runs, noting the group's live beams (best first) after each step."""
    for _ in range(500):
        if e.idle:
            return
        apply(e, {"op": "step"})
        if rounds is not None:
            rounds.append(live(e, group))
    raise AssertionError("requests never finished")


def live(e: Engine, group: str) -> list[tuple[list[int], float]]:
    beams_now = [r for r in e.requests.values()
                 if r.group == group and r.status != "finished" and r.beam_width]
    return sorted(((list(r.tokens), r.cum_logprob or 0.0) for r in beams_now),
                  key=lambda b: -b[1])


def finished(e: Engine, group: str) -> list[Request]:
    return [r for r in beams.group_members(e.requests, group)
            if r.finish_reason in ("max_new_tokens", "eos")]


def assert_same_beams(got: list[tuple[list[int], float]], want: list[beams.Hypothesis]) -> None:
    assert [t for t, _ in got] == [h.tokens for h in want]
    for (_, score), h in zip(got, want, strict=True):
        assert score == pytest.approx(h.cum_logprob, abs=SCORE_TOL)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 6])
def test_the_engine_keeps_the_reference_searchs_beams_round_by_round(width: int) -> None:
    e = engine()
    apply(e, {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": width,
              "max_new_tokens": 7})
    prompt = list(e.requests["B.0"].tokens)
    rounds: list[list[tuple[list[int], float]]] = []
    run_out(e, rounds)
    final, ref_rounds = beams.reference_search(e.model, prompt, width, 7)
    # Every round but the last (whose beams finish at max_new_tokens at once).
    for got, want in zip(rounds, ref_rounds[:-1], strict=False):
        assert_same_beams(got, want)
    done = sorted(finished(e, "B"), key=lambda r: -(r.cum_logprob or 0.0))
    assert_same_beams([(r.tokens, r.cum_logprob or 0.0) for r in done], final)
    assert len(done) == width
    # The first W beams are ID.0 .. ID.{W-1} in score order.
    assert e.requests["B.0"].cum_logprob is not None
    firsts = [e.requests[f"B.{k}"] for k in range(width)]
    assert all(r.num_generated >= 1 for r in firsts)
    assert [r.tokens[len(prompt)] for r in firsts] == [
        h.tokens[len(prompt)] for h in ref_rounds[0]]
    assert not e.running and e.manager.metrics().used_blocks == 0


def test_a_width_4_round_shares_copies_and_frees_as_worked_out_by_hand() -> None:
    # Pool of 12 blocks of 4; the prompt "The cat sat" takes blocks 0 and 1 (full) and
    # block 2 (3 of 4 slots).
    e = engine(num_blocks=12, prefix_caching=False)
    apply(e, {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 4,
              "max_new_tokens": 3})
    assert e.block_table("B.0") == [0, 1, 2]
    apply(e, {"op": "step"})
    # Round 1: B.0 forks B.1, B.2, B.3 (every block held 4 times), then each writes its
    # token into block 2: the first three writers copy it (to blocks 3, 4, 5), the last
    # writes in place, so block 2 ends with one holder and blocks 0 and 1 with four.
    blocks = e.manager.pool.blocks
    tables = {f"B.{k}": e.block_table(f"B.{k}") for k in range(4)}
    assert tables == {"B.0": [0, 1, 3], "B.1": [0, 1, 4], "B.2": [0, 1, 5],
                      "B.3": [0, 1, 2]}
    assert blocks[0].ref_count == blocks[1].ref_count == 4
    assert [blocks[b].ref_count for b in (2, 3, 4, 5)] == [1, 1, 1, 1]
    assert [blocks[b].num_filled for b in (2, 3, 4, 5)] == [4, 4, 4, 4]
    kinds = [ev.kind for ev in e.events if ev.step == 2]
    assert kinds.count("share") == 9 and kinds.count("cow") == 3
    assert e.manager.metrics().cow_copies == 3
    assert e.manager.metrics().used_blocks == 6
    # Round 2: every last block is full, so each surviving beam takes a new block; a
    # beam with no survivor frees its private third block at once. Counted by hand
    # from the survivors the round chose:
    before = {rid: e.block_table(rid) for rid in tables}
    apply(e, {"op": "step"})
    members = beams.group_members(e.requests, "B")
    alive = [r for r in members if r.status == "running"]
    dropped = [r for r in members if r.finish_reason == "dropped"]
    assert len(alive) == 4 and len(alive) + len(dropped) == len(members)
    for r in dropped:
        assert blocks[before[r.id][2]].ref_count == 0     # freed: no one else held it
    for r in alive:
        table = e.block_table(r.id)
        parent = r.id if r.id in before else r.parent
        assert parent is not None
        assert table[:3] == before[parent] and len(table) == 4
        assert blocks[table[3]].ref_count == 1 and blocks[table[3]].num_filled == 1
    assert blocks[0].ref_count == blocks[1].ref_count == 4
    # Each third block is held by the beams that descend from its holder.
    for rid, table in before.items():
        holders = sum(1 for r in alive if e.block_table(r.id)[2] == table[2])
        assert blocks[table[2]].ref_count == holders, rid
    kept = {e.block_table(r.id)[2] for r in alive}
    assert len(kept) < 4, "with these weights two beams descend from one parent"
    assert e.manager.metrics().cow_copies == 3       # nothing was copied in round 2
    assert e.manager.metrics().used_blocks == 2 + len(kept) + 4


def test_beams_run_beside_other_requests_and_through_preemption_as_with_room() -> None:
    roomy = engine()
    tight = engine(num_blocks=20)
    swap = engine(num_blocks=20, preemption="swap", num_cpu_blocks=64)
    for e in (roomy, tight, swap):
        apply(e, {"op": "add", "request": "A", "prompt_len": 18, "max_new_tokens": 30},
              {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 4,
               "max_new_tokens": 12},
              {"op": "add", "request": "C", "prompt_len": 9, "max_new_tokens": 30})
        run_out(e)
    assert tight.manager.preemptions > 0 and swap.manager.preemptions > 0
    assert swap.host is not None and swap.host.swap_outs > 0
    want = {r.id: (r.tokens, r.finish_reason) for r in roomy.requests.values()}
    for e in (tight, swap):
        got = {r.id: (r.tokens, r.finish_reason) for r in e.requests.values()}
        # The same hypotheses and the same other requests (ids of dropped beams may
        # differ: a recomputed round can run at another step, but not choose otherwise).
        for rid in ("A", "C"):
            assert got[rid] == want[rid]
        assert sorted(r.tokens for r in finished(e, "B")) == sorted(
            r.tokens for r in finished(roomy, "B"))


def test_a_snapshot_mid_search_restores_and_continues_exactly() -> None:
    e = engine(num_blocks=24)
    apply(e, {"op": "add", "request": "A", "prompt_len": 14, "max_new_tokens": 20},
          {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 3,
           "max_new_tokens": 10},
          {"op": "step", "count": 4})
    snap = json.loads(json.dumps(export_snapshot(e)))
    rows = [r for r in snap["requests"] if r.get("group") == "B"]
    assert rows and all(r["beam_width"] == 3 and r["cum_logprob"] <= 0 for r in rows)
    twin = restore_engine(snap, kernel="torch")
    assert export_snapshot(twin)["requests"] == snap["requests"]
    run_out(e)
    run_out(twin)
    a, b = export_snapshot(e), export_snapshot(twin)
    # Restore recomputes the pending logits in another batch, so the scores added
    # after it agree to float32 rounding; every token, block and event is the same.
    scores = [[r.pop("cum_logprob", 0.0) for r in s["requests"]] for s in (a, b)]
    assert scores[0] == pytest.approx(scores[1], abs=SCORE_TOL)
    for s in (a, b):
        s.pop("kernel")
    assert a == b


def test_restore_refuses_inconsistent_beams() -> None:
    e = engine()
    apply(e, {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 3,
              "max_new_tokens": 6}, {"op": "step", "count": 2})
    snap = json.loads(json.dumps(export_snapshot(e)))
    for change, message in [
        (lambda r: r.update(beam_width=4), "different beam_width"),
        (lambda r: r.update(cum_logprob=0.5),
         r"cum_logprob must be a finite log-probability \(<= 0\), got 0\.5$"),
        # Each in JSON's words: a field left out, null, and Python's reading of NaN.
        (lambda r: r.pop("cum_logprob"), r"\]: missing field 'cum_logprob' \(a beam carries"),
        (lambda r: r.update(cum_logprob=None), r"\(<= 0\), got null$"),
        (lambda r: r.update(cum_logprob=float("nan")), r"\(<= 0\), got NaN"),
        # false is an int to Python, and was read as a log-probability of 0.
        (lambda r: r.update(cum_logprob=False), r"\.cum_logprob must be a number, got false"),
        (lambda r: r.pop("group"), "carries the group"),
    ]:
        bad = json.loads(json.dumps(snap))
        change(next(r for r in bad["requests"] if r["id"] == "B.1"))
        with pytest.raises(PagedLabError, match=message):
            restore_engine(bad, kernel="torch")
    # Edits of a whole group, or of one beam's limit, each consistent on its own row.
    alive = [r for r in snap["requests"] if r.get("group") == "B" and r["status"] != "finished"]
    assert len(alive) == 3
    narrower = json.loads(json.dumps(snap))
    for r in narrower["requests"]:
        if r.get("group") == "B":
            r["beam_width"] = 2
    with pytest.raises(PagedLabError, match=r"snapshot: group 'B' has 3 beams alive, more "
                                            r"than its beam_width 2 \(each round keeps"):
        restore_engine(narrower, kernel="torch")
    longer = json.loads(json.dumps(snap))
    next(r for r in longer["requests"] if r["id"] == "B.1")["max_new_tokens"] = 20
    with pytest.raises(PagedLabError, match="the beams of group 'B' have different "
                                            "max_new_tokens values"):
        restore_engine(longer, kernel="torch")


@pytest.mark.parametrize("op, message", [
    ({"beam_width": 0}, "beam_width must be an integer in 1..64"),
    ({"beam_width": 2, "n": 2}, "not both"),
    ({"beam_width": 2, "max_new_tokens": None}, "needs a max_new_tokens limit"),
    ({"beam_width": 5}, "max_num_seqs is 4"),
    ({"beam_width": 2, "blocks": [0, 1, 2]}, "beam_width and blocks"),
])
def test_bad_beam_searches_are_refused(op: dict[str, Any], message: str) -> None:
    e = engine(max_num_seqs=4, max_new_tokens=8)
    before = export_snapshot(e)
    with pytest.raises(PagedLabError, match=message):
        e.apply(parse_op({"op": "add", "request": "B", "prompt": PROMPT, **op}))
    assert export_snapshot(e) == before


def test_a_beam_is_not_grown_or_forked_by_hand_and_a_full_pool_is_refused() -> None:
    e = engine(max_new_tokens=8)
    apply(e, {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 2},
          {"op": "step"})
    before = export_snapshot(e)
    for op in ({"op": "grow", "request": "B.0"}, {"op": "fork", "request": "B.1", "child": "X"}):
        with pytest.raises(PagedLabError, match="the beam search extends and forks"):
            e.apply(parse_op(op))
    assert export_snapshot(e) == before
    small = engine(num_blocks=4, max_new_tokens=8)
    with pytest.raises(PagedLabError, match="need 7 blocks for their first tokens"):
        small.apply(parse_op({"op": "add", "request": "B", "prompt": PROMPT,
                              "beam_width": 5}))
    # So is one that fits the pool but not beside the watermark admission keeps free.
    kept = engine(num_blocks=8, watermark_blocks=3, max_new_tokens=8)
    with pytest.raises(PagedLabError, match="the pool has 8 and admission keeps the "
                                            "watermark's 3 free: they could never start"):
        kept.apply(parse_op({"op": "add", "request": "B", "prompt": PROMPT,
                             "beam_width": 5}))
    assert not kept.requests


def test_new_beams_number_around_an_id_the_user_took() -> None:
    # B.2 is the user's own request (an add after the beam search's): the search's third
    # beam takes B.3, the next free number, and keeps the reference search's beams (it
    # stopped the step half-way with "request 'B.2' already exists").
    e = engine()
    apply(e, {"op": "add", "request": "B", "prompt": PROMPT, "beam_width": 3,
              "max_new_tokens": 5},
          {"op": "add", "request": "B.2", "prompt": "xy", "max_new_tokens": 5})
    prompt = list(e.requests["B.0"].tokens)
    run_out(e)
    mine = e.requests["B.2"]
    assert mine.group is None and mine.parent is None and mine.tokens[:2] == list(b"xy")
    members = [r.id for r in beams.group_members(e.requests, "B")]
    assert "B.2" not in members and members[:3] == ["B.0", "B.1", "B.3"]
    final, _ = beams.reference_search(e.model, prompt, 3, 5)
    done = sorted(finished(e, "B"), key=lambda r: -(r.cum_logprob or 0.0))
    assert_same_beams([(r.tokens, r.cum_logprob or 0.0) for r in done], final)
    # The snapshot restores and says the same.
    snap = json.loads(json.dumps(export_snapshot(e)))
    assert export_snapshot(restore_engine(snap, kernel="torch"))["requests"] == snap["requests"]


def test_a_beam_group_that_exactly_fills_the_host_pool_is_swapped_not_recomputed() -> None:
    """B's two beams hold a block each and the host pool has exactly 2: when A's next
    token preempts the group it goes to the host pool whole. (Checking `<` where `<=`
    is meant recomputed the group instead: no swap_out in the log, both beams queued
    as waiting and the Swap outs metric at 0.)"""
    e = engine(num_blocks=4, preemption="swap", num_cpu_blocks=2)
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 12},
          {"op": "add", "request": "B", "prompt_len": 3, "beam_width": 2, "max_new_tokens": 6},
          # The first round forks B.1; both beams fill their copies of the last block.
          {"op": "step"})
    assert list(e.running) == ["A", "B.0", "B.1"]
    assert [len(e.block_table(r)) for r in ("B.0", "B.1")] == [1, 1]
    res = e.apply(parse_op({"op": "step"}))
    e.check_integrity()
    assert res.preempted == ("B.1", "B.0")
    assert [ev.kind for ev in res.events if ev.kind in ("swap_out", "preempt")] == [
        "swap_out", "preempt", "swap_out", "preempt"]
    assert [e.requests[r].status for r in ("B.0", "B.1")] == ["swapped", "swapped"]
    assert list(e.swapped) == ["B.0", "B.1"] and list(e.waiting) == []
    assert e.host is not None and (e.host.swap_outs, e.host.num_free) == (2, 0)
    assert export_snapshot(e)["metrics"]["swap_outs"] == 2


@pytest.mark.parametrize("mode", [{"preemption": "swap", "num_cpu_blocks": 64}, {}],
                         ids=["swap", "recompute"])
def test_a_lone_beam_back_mid_search_waits_for_the_fork_its_round_makes(
        mode: dict[str, Any]) -> None:
    """B.0, alone of its width-2 group, is preempted at a block boundary. Its next round
    keeps 2 extensions, so it forks: its token's block and the fork's. Admitted on one
    block per beam, it came back and was preempted again by its own round at each of
    the next three steps (4 preemptions; with swap, 4 swap-outs and 4 swap-ins)."""
    e = engine(num_blocks=6, **mode)
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 12},
          {"op": "add", "request": "B", "prompt_len": 3, "beam_width": 2, "max_new_tokens": 6})
    run_out(e)
    assert {rid: r.num_preemptions for rid, r in e.requests.items() if r.num_preemptions} == {
        "B.0": 1}
    assert e.manager.preemptions == 1
    if e.host is not None:
        assert (e.host.swap_outs, e.host.swap_ins) == (1, 1)
