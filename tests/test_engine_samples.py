"""Parallel sampling run by the engine: `add` with n forks the prompt's blocks for the samples.

Each sample is checked against what paging must not change: the tokens a
request of the same id and prompt generates alone (sampling is seeded by
request and position, so a shared prompt block and a private one must give
the same logits), a contiguous recomputation, and a snapshot restored while
the samples are still to be forked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot

PROMPT = "Tell me a story about a cat"      # 27 bytes: the last block is partial


def engine(**config: Any) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": 64, "block_size": 4, **config}),
                  kernel="torch")


def apply(e: Engine, *ops: dict[str, Any]) -> None:
    for op in ops:
        e.apply(parse_op(op))
        e.check_integrity()


def run_out(e: Engine) -> None:
    for _ in range(300):
        if e.idle:
            return
        apply(e, {"op": "step"})
    raise AssertionError("requests never finished")


def state(e: Engine) -> dict[str, Any]:
    snap = export_snapshot(e)
    snap.pop("kernel")
    return snap


def test_samples_share_the_prompt_and_generate_what_they_would_alone() -> None:
    e = engine()
    apply(e, {"op": "add", "request": "Q", "prompt": PROMPT, "n": 4, "max_new_tokens": 10})
    ids = ["Q.0", "Q.1", "Q.2", "Q.3"]
    assert list(e.running) == ids
    assert all(e.requests[r].group == "Q" for r in ids)
    # Forked after the prefill: one prompt's blocks, each held four times.
    tables = [e.block_table(r) for r in ids]
    assert all(t == tables[0] for t in tables)
    assert all(e.manager.pool.blocks[b].ref_count == 4 for b in tables[0])
    apply(e, {"op": "step", "count": 4})
    v = e.verify_recomputation()
    assert v.num_requests == 4 and v.max_kv_err < 1e-4 and v.max_logit_err < 1e-3
    run_out(e)
    outs = {r: e.requests[r].tokens for r in ids}
    assert len({tuple(t) for t in outs.values()}) == 4, "the samples should differ"
    for rid in ids:
        alone = engine()
        apply(alone, {"op": "add", "request": rid, "prompt": PROMPT, "max_new_tokens": 10})
        run_out(alone)
        assert alone.requests[rid].tokens == outs[rid], rid
    # The first write into the shared partial block copied it for three samples.
    assert sum(1 for ev in e.events if ev.kind == "cow") == 3


def test_sharing_saves_blocks_while_the_samples_run() -> None:
    shared = engine()
    apply(shared, {"op": "add", "request": "Q", "prompt": PROMPT, "n": 4, "max_new_tokens": 6},
          {"op": "step", "count": 3})
    apart = engine()
    for k in range(4):
        apply(apart, {"op": "add", "request": f"Q.{k}", "prompt": PROMPT, "max_new_tokens": 6})
    # Prefix caching shares the full prompt blocks either way; the fork also shares the
    # partial one until each sample writes into it, and the allocation happens once.
    apply(apart, {"op": "step", "count": 3})
    used = shared.manager.metrics().used_blocks
    assert used <= apart.manager.metrics().used_blocks
    off = engine(prefix_caching=False)
    for k in range(4):
        apply(off, {"op": "add", "request": f"Q.{k}", "prompt": PROMPT, "max_new_tokens": 6})
    apply(off, {"op": "step", "count": 3})
    assert used < off.manager.metrics().used_blocks


def test_samples_waiting_for_room_are_forked_when_admitted_and_restore_exactly() -> None:
    e = engine(num_blocks=14, max_num_seqs=4)
    apply(e, {"op": "add", "request": "A", "prompt_len": 30, "max_new_tokens": 8},
          {"op": "add", "request": "Q", "prompt": PROMPT, "n": 3, "max_new_tokens": 8})
    assert list(e.waiting) == ["Q.0"] and e.requests["Q.0"].pending_samples == 2
    snap = json.loads(json.dumps(export_snapshot(e)))
    row = next(r for r in snap["requests"] if r["id"] == "Q.0")
    assert row["group"] == "Q" and row["pending_samples"] == 2
    twin = restore_engine(snap, kernel="torch")
    assert state(twin) == state(e)
    run_out(e)
    run_out(twin)
    assert state(twin) == state(e)
    assert {r for r in e.requests if r.startswith("Q.")} == {"Q.0", "Q.1", "Q.2"}
    assert all(e.requests[r].num_generated == 8 for r in ("Q.0", "Q.1", "Q.2"))


def test_samples_preempted_generate_what_they_would_with_room() -> None:
    roomy, tight = engine(), engine(num_blocks=16)
    for e in (roomy, tight):
        apply(e, {"op": "add", "request": "Q", "prompt": PROMPT, "n": 3, "max_new_tokens": 24},
              {"op": "add", "request": "B", "prompt_len": 20, "max_new_tokens": 24})
        run_out(e)
    assert tight.manager.preemptions > 0
    for rid, req in roomy.requests.items():
        assert tight.requests[rid].tokens == req.tokens, rid


@pytest.mark.parametrize("op, message", [
    ({"n": 0}, "n must be an integer in 1..64"),
    ({"n": 2, "blocks": [0, 1, 2, 3, 4, 5, 6]}, "n and blocks"),
    ({"beam_width": 2, "n": 2}, "not both"),
    ({"n": 5}, "max_num_seqs is 4"),
])
def test_bad_sampling_requests_are_refused(op: dict[str, Any], message: str) -> None:
    e = engine(max_num_seqs=4)
    before = state(e)
    with pytest.raises(PagedLabError, match=message):
        e.apply(parse_op({"op": "add", "request": "Q", "prompt": PROMPT, **op}))
    assert state(e) == before
    apply(e, {"op": "add", "request": "Q.1", "prompt": "taken"})
    with pytest.raises(PagedLabError, match=r"'Q\.1' already exists"):
        e.apply(parse_op({"op": "add", "request": "Q", "prompt": PROMPT, "n": 2}))


@pytest.mark.parametrize("config, n, message", [
    # 27 bytes in blocks of 4: 7 blocks with the first token, and a block for each of the
    # two other samples' first tokens (a copy of the shared partial last block).
    ({"num_blocks": 8}, 3, "3 parallel samples of a 27-token prompt need 9 blocks for their "
                           "first tokens, but the pool has 8: they could never start (at "
                           "most 2 fit, or a pool of at least 9 blocks holds them)"),
    # Where one sample alone would fit, only the pool is suggested.
    ({"num_blocks": 11, "watermark_blocks": 4}, 2,
     "2 parallel samples of a 27-token prompt need 8 blocks for their first tokens, but the "
     "pool has 11 and admission keeps the watermark's 4 free: they could never start (a "
     "pool of at least 12 blocks holds them)"),
])
def test_samples_that_could_never_start_are_refused(config: dict[str, Any], n: int,
                                                    message: str) -> None:
    # Admitted only with room for every sample's first token, they would wait for ever,
    # with the advice to step the batch, and hold up every request behind them.
    e = engine(**config)
    before = state(e)
    with pytest.raises(PagedLabError) as refused:
        e.apply(parse_op({"op": "add", "request": "Q", "prompt": PROMPT, "n": n}))
    assert str(refused.value) == message
    assert state(e) == before
    # One sample fewer fits, and runs to its end.
    apply(e, {"op": "add", "request": "Q", "prompt": PROMPT, "n": n - 1, "max_new_tokens": 3})
    run_out(e)
    assert {r.finish_reason for r in e.requests.values()} == {"max_new_tokens"}, e.requests


def test_a_first_sample_finished_before_its_prompt_ran_forks_nothing_and_restores() -> None:
    e = engine(num_blocks=10)
    apply(e, {"op": "add", "request": "A", "prompt_len": 30, "max_new_tokens": 4},
          {"op": "add", "request": "Q", "prompt": PROMPT, "n": 3, "max_new_tokens": 4},
          {"op": "finish", "request": "Q.0"})
    q = e.requests["Q.0"]
    assert q.status == "finished" and q.pending_samples == 0
    snap = json.loads(json.dumps(export_snapshot(e)))
    assert "pending_samples" not in next(r for r in snap["requests"] if r["id"] == "Q.0")
    twin = restore_engine(snap, kernel="torch")
    run_out(e)
    run_out(twin)
    assert state(twin) == state(e)
    assert not any(r.startswith("Q.") and r != "Q.0" for r in e.requests)


def test_an_id_kept_for_a_sample_still_to_be_forked_is_refused() -> None:
    # A.0 waits with A.1 still to be forked: a request named A.1 made meanwhile would
    # be overwritten (a fork) or stop the step half-way (an add) when A.0 is admitted.
    e = engine(num_blocks=4)
    apply(e, {"op": "add", "request": "Z", "prompt": "abcdefghijk"},
          {"op": "add", "request": "A", "prompt": "hello", "n": 2})
    assert e.requests["A.0"].pending_samples == 1
    before = state(e)
    for op, what in (({"op": "fork", "request": "Z", "child": "A.1"}, "child id"),
                     ({"op": "add", "request": "A.1", "prompt": "xy"}, "id")):
        with pytest.raises(PagedLabError) as exc:
            apply(e, op)
        assert str(exc.value) == (f"request id 'A.1' is kept for a parallel sample of 'A', "
                                  f"forked from 'A.0' when its prompt is computed; pick "
                                  f"another {what}")
        assert state(e) == before
    # Ids no sample takes stay free: A.2 (past n), A.01 (not a sample's spelling).
    apply(e, {"op": "fork", "request": "Z", "child": "A.2"},
          {"op": "add", "request": "A.01", "prompt": "xy"})
    snap = json.loads(json.dumps(export_snapshot(e)))
    apply(e, {"op": "finish", "request": "Z"}, {"op": "finish", "request": "A.2"})
    run_out(e)
    assert [r for r in e.requests] == ["Z", "A.0", "A.2", "A.01", "A.1"]
    assert e.requests["A.1"].group == "A" and e.requests["A.2"].parent == "Z"
    # A snapshot holding such an id (no engine makes one) is refused by restore.
    a2 = next(r for r in snap["requests"] if r["id"] == "A.2")
    a2["id"] = "A.1"
    snap["scheduler"]["running"] = ["A.1" if r == "A.2" else r
                                    for r in snap["scheduler"]["running"]]
    with pytest.raises(PagedLabError) as exc:
        restore_engine(snap, kernel="torch")
    assert str(exc.value) == ("snapshot.requests[2].id 'A.1' is kept for a pending sample "
                              "of 'A.0'")


def test_restored_samples_that_could_never_start_end_at_capacity_rather_than_wait() -> None:
    # `add` refuses such a group; a snapshot can still hold one (here its watermark raised
    # by hand): admission counts the samples still to fork, says the group can never fit,
    # and ends it, instead of leaving it at the head of the queue for ever.
    e = engine(num_blocks=9)
    apply(e, {"op": "add", "request": "R", "prompt": "hi", "max_new_tokens": 2},
          {"op": "add", "request": "Q", "prompt": PROMPT, "n": 3, "max_new_tokens": 2})
    assert e.requests["Q.0"].status == "waiting"
    snap = export_snapshot(e)
    snap["config"]["watermark_blocks"] = 1
    restored = restore_engine(snap, kernel="torch")
    assert restored.scheduler.why_waiting("Q.0").startswith("it can never fit the pool")
    run_out(restored)
    assert restored.requests["Q.0"].finish_reason == "capacity"
    assert restored.requests["R"].finish_reason == "max_new_tokens"


def test_samples_are_listed_where_they_were_forked_after_requests_added_meanwhile() -> None:
    # B arrives while A.0 waits (X holds the sequence slots A's three samples need); the
    # samples A.1 and A.2 are forked once A's prompt is computed, so they arrive after B.
    e = engine(num_blocks=64, block_size=4, max_num_seqs=3)
    apply(e, {"op": "add", "request": "X", "prompt": "hello there"},
          {"op": "add", "request": "A", "prompt": "The cat", "n": 3},
          {"op": "add", "request": "B", "prompt": "dog"})
    snap = export_snapshot(e)
    assert [(r["id"], r["status"]) for r in snap["requests"]] == [
        ("X", "running"), ("A.0", "waiting"), ("B", "waiting")]
    assert [r.get("pending_samples") for r in snap["requests"]] == [None, 2, None]
    apply(e, {"op": "finish", "request": "X"}, {"op": "step"})
    snap = export_snapshot(e)
    assert [r["id"] for r in snap["requests"]] == ["X", "A.0", "B", "A.1", "A.2"]
    # Restored, the order is kept.
    again = export_snapshot(restore_engine(json.loads(json.dumps(snap)), kernel="torch"))
    assert [r["id"] for r in again["requests"]] == ["X", "A.0", "B", "A.1", "A.2"]
