"""The live scheduler's budgets: max_num_seqs, max_num_batched_tokens, watermark_blocks.

Each budget is checked where it bites (the tokens one step processes, the
requests running, the blocks left free at admission), and a budgeted run is
checked against what paging must not change: the generated tokens of an
unbudgeted run, the K/V of a contiguous recomputation, and a snapshot
restored half-way through a chunked prefill.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io.restore import restore_engine
from backend.io.scenario import load_scenario, run_steps
from backend.io.snapshot import export_snapshot
from backend.sessions.summary import summarize
from bench.soak import soak_configs, soak_sequence


def engine(**config: Any) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": 48, "block_size": 4, **config}),
                  kernel="torch")


def apply(e: Engine, *ops: dict[str, Any]) -> None:
    for op in ops:
        e.apply(parse_op(op))
        e.check_integrity()
        e.check_requests()


def count_tokens(e: Engine) -> list[int]:
    """Spy on the model: the query tokens of every forward, appended per call."""
    calls: list[int] = []
    forward = e.runner.forward

    def counted(seqs: list[tuple[list[int], int, list[int], list[int]]]) -> Any:
        calls.append(sum(len(s[0]) for s in seqs))
        return forward(seqs)

    e.runner.forward = counted  # type: ignore[method-assign]
    return calls


def state(e: Engine) -> dict[str, Any]:
    snap = export_snapshot(e)
    snap.pop("kernel")
    return snap


PROMPTS = [
    {"op": "add", "request": "A", "prompt_len": 23, "max_new_tokens": 5},
    {"op": "add", "request": "B", "prompt_len": 9, "max_new_tokens": 7},
    {"op": "add", "request": "C", "prompt": "the same long prompt, shared", "max_new_tokens": 4},
    {"op": "add", "request": "D", "prompt": "the same long prompt, shared", "max_new_tokens": 4},
]


def run_out(e: Engine, steps: int = 40) -> None:
    for _ in range(steps):
        if e.idle:
            return
        apply(e, {"op": "step"})
    raise AssertionError("requests still running")


def test_generous_budgets_change_nothing() -> None:
    """Limits that never bind give the unbudgeted run's snapshots, step by step."""
    free, roomy = engine(), engine(max_num_seqs=64, max_num_batched_tokens=4096,
                                   watermark_blocks=0)
    for op in [*PROMPTS, *[{"op": "step"}] * 12]:
        apply(free, op)
        apply(roomy, op)
        a, b = state(free), state(roomy)
        for key in ("max_num_seqs", "max_num_batched_tokens", "watermark_blocks"):
            b["config"].pop(key)
        assert a == b


@pytest.mark.parametrize("budget", [1, 3, 5, 8])
def test_token_budget_caps_every_step_and_keeps_the_tokens(budget: int) -> None:
    e = engine(max_num_batched_tokens=budget)
    calls = count_tokens(e)
    apply(e, *PROMPTS)
    for _ in range(200):
        if not e.running and not e.waiting:
            break
        calls.clear()
        apply(e, {"op": "step"})
        assert sum(calls) <= budget, calls
        # Every step makes progress: a prefill chunk or a decode.
        assert sum(calls) >= 1 or not e.running
        assert e.verify_recomputation().max_kv_err < 1e-4
    assert not e.running and not e.waiting
    free = engine()
    apply(free, *PROMPTS)
    run_out(free)
    # Chunking changes when tokens are computed, never which: the samples are
    # seeded by (seed, request, position) and the logits agree to rounding.
    for rid, req in free.requests.items():
        assert e.requests[rid].tokens == req.tokens, rid
        assert e.requests[rid].finish_reason == req.finish_reason


def test_long_prompt_is_prefilled_in_chunks_over_steps() -> None:
    e = engine(max_num_batched_tokens=6)
    apply(e, {"op": "add", "request": "A", "prompt_len": 23, "max_new_tokens": 3})
    a = e.requests["A"]
    seen = [a.num_computed]
    while a.prefilling:
        with pytest.raises(PagedLabError, match="still being prefilled"):
            e.apply(parse_op({"op": "grow", "request": "A", "tokens": 1}))
        with pytest.raises(PagedLabError, match="still being prefilled"):
            e.apply(parse_op({"op": "fork", "request": "A", "child": "A2"}))
        # Blocks come with their chunk: the table covers the computed tokens only.
        assert len(e.block_table("A")) == -(-a.num_computed // 4)
        apply(e, {"op": "step"})
        seen.append(a.num_computed)
    # 6 tokens a step: 6, 12, 18, then the last 5 plus the first decode.
    assert seen == [6, 12, 18, 24]
    assert a.num_generated == 1


def test_snapshot_mid_prefill_restores_and_continues_exactly() -> None:
    e = engine(max_num_batched_tokens=5, max_num_seqs=2, watermark_blocks=2)
    apply(e, *PROMPTS, {"op": "step", "count": 2})
    snap = export_snapshot(e)
    partial = [r for r in snap["requests"] if "num_computed_tokens" in r]
    assert partial, "the scenario should stop half-way through a prompt"
    for r in partial:
        assert len(r["block_table"]) == -(-r["num_computed_tokens"] // 4)
    twin = restore_engine(json.loads(json.dumps(snap)), kernel="torch")
    assert state(twin) == state(e)
    run_out(e)
    run_out(twin)
    assert state(twin) == state(e)


def test_bad_num_computed_tokens_is_refused() -> None:
    e = engine(max_num_batched_tokens=5)
    apply(e, {"op": "add", "request": "A", "prompt_len": 23})
    snap = export_snapshot(e)
    for value in (0, 23, 40, "5"):
        bad = json.loads(json.dumps(snap))
        bad["requests"][0]["num_computed_tokens"] = value
        with pytest.raises(PagedLabError, match="num_computed_tokens"):
            restore_engine(bad, kernel="torch")
    bad = json.loads(json.dumps(snap))
    # 9 tokens need 3 blocks of 4; the table holds the 2 that 5 tokens need.
    bad["requests"][0]["num_computed_tokens"] = 9
    with pytest.raises(PagedLabError):
        restore_engine(bad, kernel="torch")


def test_max_num_seqs_caps_the_running_batch() -> None:
    e = engine(max_num_seqs=2)
    apply(e, *PROMPTS)
    assert len(e.running) == 2 and list(e.waiting) == ["C", "D"]
    before = state(e)
    with pytest.raises(PagedLabError, match="max_num_seqs is 2"):
        e.apply(parse_op({"op": "fork", "request": "A", "child": "A2"}))
    with pytest.raises(PagedLabError, match="max_num_seqs is 2"):
        e.apply(parse_op({"op": "add", "request": "P", "prompt_len": 3, "blocks": [40]}))
    assert state(e) == before
    while e.running or e.waiting:
        apply(e, {"op": "step"})
        assert len(e.running) <= 2


def refusal(e: Engine, op: dict[str, Any]) -> str:
    """The engine's refusal of `op`, checked to leave the state as it was."""
    before = state(e)
    with pytest.raises(PagedLabError) as refused:
        e.apply(parse_op(op))
    assert state(e) == before
    return str(refused.value)


def test_a_waiting_request_s_refusal_names_what_holds_it_back() -> None:
    """Grow or fork on a request that has not started says which of admission's rules
    holds it back, with advice that works: "wait for room in the pool" was said of
    every waiting request, also of one a budget held back with the pool nearly free."""
    grow_c = {"op": "grow", "request": "C", "tokens": 1}
    # max_num_seqs: A and B run, C and D wait with 36 of 48 blocks free.
    e = engine(max_num_seqs=2)
    apply(e, *PROMPTS)
    assert refusal(e, grow_c) == (
        "cannot grow request 'C': it has not started: 2 requests are running, and "
        "max_num_seqs is 2; finish one first")
    # D is behind C, first come, first served.
    assert refusal(e, {"op": "fork", "request": "D", "child": "D2"}) == (
        "cannot fork request 'D': it has not started: it is queued behind 1 request, first "
        "come, first served ('C' starts first); step the batch")
    # The token budget: B and E's decodes take both of its tokens (A's prompt, prefilled
    # in chunks, gets a token when one of them waits its turn), so C, which waited for
    # the pool at first, stays out.
    e = engine(num_blocks=12, max_num_batched_tokens=2)
    apply(e, {"op": "add", "request": "A", "prompt_len": 23, "max_new_tokens": 1},
          {"op": "add", "request": "B", "prompt_len": 1, "max_new_tokens": 30},
          {"op": "add", "request": "E", "prompt_len": 1, "max_new_tokens": 30},
          {"op": "add", "request": "C", "prompt_len": 20, "max_new_tokens": 4})
    for _ in range(13):
        apply(e, {"op": "step"})
    assert e.running == ["A", "B", "E"] and e.requests["A"].prefilling
    assert refusal(e, grow_c) == (
        "cannot grow request 'C': it has not started: the running requests take the token "
        "budget first, and max_num_batched_tokens is 2; finish one first")
    # The pool: 12 blocks of 4. A's 23 tokens take 6 and B's 9 take 3, each with room for
    # its next token; C's 28 tokens need 7 and its first generated token an 8th: 3 are free.
    e = engine(num_blocks=12)
    apply(e, PROMPTS[0], PROMPTS[1], PROMPTS[2])
    assert list(e.waiting) == ["C"]
    assert refusal(e, grow_c) == (
        "cannot grow request 'C': it has not started: the pool has no room for it yet: "
        "it needs 8 new blocks, and 3 are free or cached; step the batch to admit it as "
        "they finish")
    # Where a running request still needs a block (A's 8 tokens fill its 2 blocks, and
    # its next token takes a third), the figure is said as what is left of the free and
    # cached blocks, not as a count the Free blocks metric might seem to show.
    held = engine(num_blocks=6)
    apply(held, {"op": "add", "request": "A", "prompt_len": 8},
          {"op": "add", "request": "C", "prompt_len": 16})
    assert refusal(held, grow_c) == (
        "cannot grow request 'C': it has not started: the pool has no room for it yet: "
        "it needs 5 new blocks, and 3 of the 4 free or cached are left once the running "
        "requests take the 1 they still need; step the batch to admit it as they finish")
    # Once A finishes, C's blocks are free: the next step starts it.
    apply(e, {"op": "finish", "request": "A"})
    assert refusal(e, grow_c).endswith("it has not started: its blocks are free now: the "
                                       "next step starts it")
    apply(e, {"op": "step"})
    assert e.requests["C"].status == "running"


def test_an_add_left_waiting_says_why_in_its_result_and_status_line() -> None:
    e = engine(max_num_seqs=1)
    first = e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 5}))
    assert first.waits == () and first.admitted == ("A",)
    second = e.apply(parse_op({"op": "add", "request": "B", "prompt_len": 5}))
    held = "1 request is running, and max_num_seqs is 1; finish one first"
    assert second.waits == (("B", held),) and second.admitted == ()
    line = summarize(second, export_snapshot(e))
    assert line == f"Step 2: add B (5 random tokens) · B waits: {held}"
    # A page may reword the reason (the Playground names its sidebar's fields).
    assert summarize(second, export_snapshot(e), why=str.upper).endswith(held.upper())
    # Behind B, first come, first served.
    third = e.apply(parse_op({"op": "add", "request": "C", "prompt_len": 5}))
    assert third.waits == (("C", "it is queued behind 1 request, first come, first served "
                                  "('B' starts first); step the batch"),)
    # What the result said is what the scheduler says of the request now.
    assert [why for _, why in third.waits] == [e.scheduler.why_waiting("C")]
    # Only an add says it: a step that leaves requests waiting does not.
    assert e.apply(parse_op({"op": "step"})).waits == ()
    # Parallel samples and beams wait as their first request, ID.0 (the others are
    # forked from it): that is the one named.
    e = engine(max_num_seqs=3, max_new_tokens=8)
    apply(e, {"op": "add", "request": "A", "prompt_len": 5})
    samples = e.apply(parse_op({"op": "add", "request": "N", "prompt_len": 5, "n": 3}))
    assert list(e.waiting) == ["N.0"]
    assert samples.waits == (("N.0", "it starts 3 sequences beside the 1 request running, and "
                                     "max_num_seqs is 3; finish one first"),)
    beams = e.apply(parse_op({"op": "add", "request": "B", "prompt_len": 5,
                              "beam_width": 2}))
    assert beams.waits == (("B.0", "it is queued behind 1 request, first come, first served "
                                   "('N.0' starts first); step the batch"),)


def test_a_waiting_request_s_refusal_is_true_in_the_harder_cases() -> None:
    """What `why_waiting` says next is what the next step does: a head that can never fit
    is ended, a beam group needs a token per beam, a preempted request is said to be
    one, and "finish N first" counts the sequences a group starts."""
    # Preempted (recompute) B, grown past the pool less its watermark: the next step ends
    # it, as the refusal says; before, it was told to step the batch to be admitted.
    e = engine(num_blocks=8, watermark_blocks=2)
    apply(e, {"op": "add", "request": "A", "prompt_len": 1, "max_new_tokens": 60},
          {"op": "add", "request": "B", "prompt_len": 17, "max_new_tokens": 60})
    while "B" not in e.waiting:
        apply(e, {"op": "step"})
    assert e.requests["B"].num_preemptions == 1
    assert refusal(e, {"op": "fork", "request": "B", "child": "Z"}) == (
        "cannot fork request 'B': it was preempted and waits to be recomputed: it can never "
        "fit the pool (with its watermark): the next step ends it (finish reason capacity)")
    apply(e, {"op": "step"})
    assert e.requests["B"].finish_reason == "capacity"
    # A beam group of 3 with 2 tokens of the budget left after the running requests: it
    # waits, though its blocks are free (it was told the next step starts it).
    e = engine(num_blocks=8, max_num_batched_tokens=3)
    apply(e, {"op": "add", "request": "A", "prompt_len": 1, "max_new_tokens": 40},
          {"op": "add", "request": "B", "prompt_len": 4, "max_new_tokens": 40},
          {"op": "add", "request": "G", "prompt_len": 2, "max_new_tokens": 30,
           "beam_width": 3})
    for _ in range(37):
        apply(e, {"op": "step"})
    assert list(e.waiting) == ["G.0", "G.1", "G.2"]
    assert refusal(e, {"op": "grow", "request": "G.2", "tokens": 1}).endswith(
        "the running requests take the token budget first (its 3 beams need one each), and "
        "max_num_batched_tokens is 3; step the batch: the prompts still prefilling take it "
        "first")
    assert not e.apply(parse_op({"op": "step"})).admitted
    # Three parallel samples beside four running requests, with max_num_seqs 4: finishing
    # one is not enough, and the advice says how many.
    e = engine(max_num_seqs=4)
    apply(e, *({"op": "add", "request": x, "prompt_len": 3, "max_new_tokens": 40}
               for x in "ABCD"),
          {"op": "add", "request": "G", "prompt_len": 3, "max_new_tokens": 5, "n": 3})
    assert refusal(e, {"op": "grow", "request": "G.0", "tokens": 1}).endswith(
        "it starts 3 sequences beside the 4 requests running, and max_num_seqs is 4; finish 3 "
        "first")


def test_watermark_keeps_blocks_free_at_admission() -> None:
    # 12 blocks of 4: A's 23 tokens take 6 (its next token fits in the 6th), leaving 6;
    # B's 9 take 3, which leaves 3 free: enough for a watermark of 3, not of 4.
    for watermark, admitted in ((0, ["A", "B"]), (3, ["A", "B"]), (4, ["A"])):
        e = Engine(EngineConfig.from_json({"num_blocks": 12, "block_size": 4,
                                           "watermark_blocks": watermark}), kernel="torch")
        apply(e, PROMPTS[0], PROMPTS[1])
        assert e.running == admitted, watermark
        if watermark:
            assert e.manager.num_free_blocks >= watermark


def test_a_prompt_the_watermark_could_never_admit_is_refused() -> None:
    # 12 blocks of 4 with 5 kept free: 30 tokens and the first generated one take 8.
    e = engine(num_blocks=12, watermark_blocks=5)
    with pytest.raises(PagedLabError) as refused:
        apply(e, {"op": "add", "request": "A", "prompt_len": 30})
    assert str(refused.value) == (
        "a prompt of 30 tokens needs 8 blocks with its first generated token, and admission "
        "keeps the watermark's 5 of the pool's 12 free: it could never be admitted")
    assert not e.requests and e.step == 0
    # One token fewer in blocks (7 + 5 = 12) is admitted; pinned blocks skip the test.
    apply(e, {"op": "add", "request": "A", "prompt_len": 27})
    assert e.running == ["A"]
    pinned = engine(num_blocks=12, watermark_blocks=5)
    apply(pinned, {"op": "add", "request": "P", "prompt_len": 30, "blocks": list(range(8))})
    assert pinned.running == ["P"]


def test_watermark_must_leave_a_block() -> None:
    with pytest.raises(PagedLabError, match="watermark_blocks"):
        EngineConfig.from_json({"num_blocks": 8, "watermark_blocks": 8})
    with pytest.raises(PagedLabError, match="max_num_batched_tokens"):
        EngineConfig.from_json({"max_num_batched_tokens": 0})


def test_prefix_hits_only_on_computed_blocks() -> None:
    """Two requests with one long prompt under a small budget: the second may only
    share blocks whose K/V the first has written; a hit on a block still to be
    prefilled would attend to garbage, which the contiguous recomputation catches."""
    e = engine(max_num_batched_tokens=7)
    prompt = {"prompt": "a long shared system prompt, then a question"}
    apply(e, {"op": "add", "request": "A", **prompt, "max_new_tokens": 3},
          {"op": "add", "request": "B", **prompt, "max_new_tokens": 3})
    hits = 0
    while e.running or e.waiting:
        apply(e, {"op": "step"})
        assert e.verify_recomputation().max_kv_err < 1e-4
        hits = e.manager.prefix_hit_blocks
    assert hits > 0


@pytest.mark.parametrize("budgets", [
    {"max_num_batched_tokens": 3},
    {"max_num_batched_tokens": 8, "max_num_seqs": 2},
    {"max_num_seqs": 1, "watermark_blocks": 2},
])
def test_random_operations_under_budgets_keep_every_invariant(budgets: dict[str, Any]) -> None:
    for seed, config in enumerate(soak_configs(14)[:4]):
        # Raises SoakError naming the config, seed and operation that broke.
        soak_sequence({**config, **budgets}, seed=seed, num_ops=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hst.data())
def test_budgets_hold_at_every_step(data: hst.DataObject) -> None:
    """A property over random workloads and budgets: at every step the tokens
    processed stay within max_num_batched_tokens, the running batch within
    max_num_seqs, every admission leaves watermark_blocks free, and chunked
    prefill (with swap or recompute) generates the unbudgeted run's tokens."""
    block_size = data.draw(hst.sampled_from([1, 2, 4, 8]), "block_size")
    tokens = data.draw(hst.none() | hst.integers(1, 24), "max_num_batched_tokens")
    seqs = data.draw(hst.none() | hst.integers(1, 4), "max_num_seqs")
    watermark = data.draw(hst.integers(0, 3), "watermark_blocks")
    swap = data.draw(hst.booleans(), "swap")
    requests = data.draw(hst.lists(hst.tuples(hst.integers(1, 30), hst.integers(1, 12)),
                                   min_size=1, max_size=6), "requests")
    longest = max(p + n for p, n in requests)
    num_blocks = -(-longest // block_size) + watermark + 2
    config = {"num_blocks": num_blocks, "block_size": block_size,
              "max_num_batched_tokens": tokens, "max_num_seqs": seqs,
              "watermark_blocks": watermark,
              **({"preemption": "swap", "num_cpu_blocks": 3 * num_blocks} if swap else {})}
    e = Engine(EngineConfig.from_json(config), kernel="torch")
    free = Engine(EngineConfig(num_blocks=4 * num_blocks * len(requests),
                               block_size=block_size), kernel="torch")
    calls = count_tokens(e)
    ops = [{"op": "add", "request": f"r{i}", "prompt_len": p, "max_new_tokens": n}
           for i, (p, n) in enumerate(requests)]
    for op in ops:
        apply(free, op)
        running = set(e.running)
        apply(e, op)
        if set(e.running) - running:
            assert e.manager.num_free_blocks >= watermark
    run_out(free, steps=400)
    for _ in range(400):
        if e.idle:
            break
        calls.clear()
        running = set(e.running)
        apply(e, {"op": "step"})
        if tokens is not None:
            assert sum(calls) <= tokens, calls
        if seqs is not None:
            assert len(e.running) <= seqs
    assert e.idle
    for rid, req in free.requests.items():
        assert e.requests[rid].tokens == req.tokens, rid


def test_a_recomputed_beam_group_shares_a_small_token_budget() -> None:
    """Beams preempted together come back together; when the first beam's chunk would
    take the whole token budget, each later beam still gets a token of it. (A later
    beam once got none, allocated only its cached prefix and failed an assertion.)"""
    e = engine(num_blocks=8, block_size=2, seed=190, max_num_batched_tokens=4)
    apply(e, {"op": "add", "request": "R37", "prompt_len": 3, "max_new_tokens": None},
          {"op": "step"},
          {"op": "add", "request": "R40", "prompt_len": 5, "max_new_tokens": 3,
           "beam_width": 2},
          {"op": "step", "count": 2}, {"op": "step", "count": 4},
          {"op": "grow", "request": "R37", "tokens": 2}, {"op": "step", "count": 3})
    beams = [r for r in e.requests.values() if r.group == "R40"]
    assert sum(r.num_preemptions for r in beams) > 0
    for _ in range(4):
        calls = count_tokens(e)
        apply(e, {"op": "step"})
        assert sum(calls) <= 4
    assert e.verify_recomputation().max_kv_err < 1e-4


def test_a_chunked_prompts_prefix_query_counts_the_whole_prompt() -> None:
    """Under a token budget the allocator is given the first chunk only; the prefix-cache
    query, and what the block floor loses of it, are the whole prompt's, as without
    a budget."""
    prompt = "Paged attention stores keys and values in blocks of memory!!"   # 60 bytes
    chunked = engine(block_size=16, max_num_batched_tokens=8)
    whole = engine(block_size=16)
    for e in (chunked, whole):
        apply(e, {"op": "add", "request": "A", "prompt": prompt, "max_new_tokens": 4})
        apply(e, {"op": "add", "request": "B", "prompt": prompt, "max_new_tokens": 4})
    assert chunked.request("B").prefilling          # still in its first chunk
    for e in (chunked, whole):
        m = export_snapshot(e)["metrics"]
        assert (m["prefix_queries"], m["prefix_query_tokens"]) == (2, 120)
        # 60 tokens: 3 full blocks (48), the last 12 never served by a block-granular cache.
        assert m["prefix_floor_tokens"] == 2 * 12
    # Unbudgeted, B shares A's three full blocks; budgeted, A had computed none of them
    # when B came, so B's query found nothing.
    assert [export_snapshot(e)["metrics"]["prefix_hit_blocks"] for e in (whole, chunked)] == [
        3, 0]


def test_a_wait_for_room_counts_apart_the_cached_blocks_its_prompt_would_hit() -> None:
    """Scenario 13's step 6: D's prompt would hit the 2 cached blocks the Cached blocks
    metric shows; "0 are free or cached" beside it read as a contradiction."""
    sc = load_scenario(Path(__file__).resolve().parents[1] / "assets" / "scenarios"
                       / "13-cache-revival.json")
    e = Engine(sc.config, kernel="torch")
    waits = {i: res.waits for i, _, res in run_steps(e, sc.steps[:6])}
    assert e.manager.metrics().cached_blocks == 2
    assert waits[6] == (("D", "the pool has no room for it yet: it needs 4 new blocks, and 0 "
                              "are free or cached besides the 2 cached blocks its prompt "
                              "would hit; step the batch to admit it as they finish"),)


def test_a_prompt_ending_on_a_block_boundary_waits_for_its_first_tokens_block_too() -> None:
    """B's 4 tokens fill a block: its first decoded token needs a second. Admitted with
    the one block free (the other is A's next token's), it was preempted at the next
    step, admitted again and preempted again, its Preemptions count rising for nothing."""
    e = Engine(EngineConfig.from_json({"num_blocks": 4, "block_size": 4}), kernel="torch")
    apply(e, {"op": "add", "request": "A", "prompt": "abcdefgh"})
    added = e.apply(parse_op({"op": "add", "request": "B", "prompt": "wxyz"}))
    assert added.waits == (("B", "the pool has no room for it yet: it needs 2 new blocks, and "
                                 "1 of the 2 free or cached is left once the running requests "
                                 "take the 1 they still need; step the batch to admit it as "
                                 "they finish"),)
    for _ in range(3):
        e.apply(parse_op({"op": "step"}))
        assert e.requests["B"].status == "waiting" and e.requests["B"].num_preemptions == 0


def test_a_chunk_at_a_block_boundary_waits_when_no_block_is_free() -> None:
    """B's computed tokens end on a block boundary, and A's decode takes the pool's last
    free block: B has no room for a chunk this step, so it waits, still running, for a
    later one. Counting a full last block as a block's worth of free slots, B's chunk
    took that block and A's decode then preempted B, throwing away the prefill."""
    e = engine(num_blocks=4, max_num_batched_tokens=4)
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 8},
          # 8 tokens: 2 blocks and its first token's, 3 of the 3 free; a first chunk of 4.
          {"op": "add", "request": "B", "prompt_len": 8, "max_new_tokens": 4},
          # A's 5 forced tokens fill its second block (the one B's prompt counted on).
          {"op": "grow", "request": "A", "tokens": 5})
    b = e.requests["B"]
    assert (b.num_computed, len(e.block_table("B"))) == (4, 1)
    assert (e.requests["A"].num_tokens, e.manager.num_free_blocks) == (8, 1)
    calls = count_tokens(e)
    res = e.apply(parse_op({"op": "step"}))
    e.check_integrity()
    e.check_requests()
    assert calls == [1]                     # A's decode, and no chunk of B
    assert (res.prefilled, res.preempted) == ((), ())
    assert (b.status, b.num_computed, b.num_preemptions) == ("running", 4, 0)
    assert e.manager.preemptions == 0 and list(e.running) == ["A", "B"]
