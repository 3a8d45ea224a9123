"""Admission keeps the engine live and keeps what it promised the running requests.

Each case is a small pool where a rule of admission or swap-in once went wrong: a
beam group that an empty pool holds waited for good, a unit that could never come
back held up the queue for good, a newcomer took blocks (or sequence slots) a
running request's forks were about to need and was preempted at once. Every step
is followed by the allocator's integrity check; "for good" is read as a bound on
the steps the requests' tokens allow.
"""

from __future__ import annotations

from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.engine.request import Request
from backend.io.snapshot import export_snapshot

SWAP = {"preemption": "swap", "num_cpu_blocks": 32}


def engine(**config: Any) -> Engine:
    return Engine(EngineConfig.from_json(config), kernel="torch", check_reference=False)


def apply(e: Engine, *ops: dict[str, Any]) -> None:
    for op in ops:
        e.apply(parse_op(op))
        e.check_integrity()


def run_out(e: Engine, steps: int = 60) -> list[int]:
    """Step until nothing is left to do; the number of sequences running after each step."""
    running = []
    for _ in range(steps):
        if e.idle:
            return running
        apply(e, {"op": "step"})
        running.append(len(e.running))
    raise AssertionError(f"still not idle after {steps} steps: running {list(e.running)}, "
                         f"waiting {list(e.waiting)}, swapped {list(e.swapped)}")


def reasons(e: Engine, group: str) -> dict[str, str | None]:
    return {r.id: r.finish_reason for r in e.requests.values() if r.group == group}


def came_back(r: Request) -> bool:
    return r.num_preemptions > 0 and r.finish_reason in ("max_new_tokens", "eos")


@pytest.mark.parametrize(("config", "ops"), [
    # Two beams back on the cached block of their shared prompt: 1 hit and a new block
    # each, 3 of 4 blocks. Admission counted the shared hit three times (once as not
    # available, once per beam) and asked for 4 of the 3 it saw: nothing ever ran again.
    ({"num_blocks": 10, "block_size": 3},
     [{"op": "add", "request": "A", "prompt_len": 7, "max_new_tokens": 9},
      {"op": "add", "request": "B", "prompt": "The cat s", "beam_width": 2,
       "max_new_tokens": 7}]),
    # The same count held a swapped group on the host for good.
    ({"num_blocks": 4, "block_size": 4, **SWAP},
     [{"op": "add", "request": "A", "prompt_len": 2, "max_new_tokens": 8},
      {"op": "add", "request": "B", "prompt_len": 4, "beam_width": 2, "max_new_tokens": 3}]),
], ids=["recompute", "swap"])
def test_a_beam_group_back_on_its_cached_prefix_runs_once_the_pool_holds_it(
        config: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    e = engine(**config)
    apply(e, *ops)
    run_out(e)
    beams = [r for r in e.requests.values() if r.group == "B"]
    assert any(r.num_preemptions for r in beams), "the case must preempt the group"
    assert any(came_back(r) for r in beams), reasons(e, "B")


def test_why_a_beam_group_waits_counts_its_shared_prefix_once() -> None:
    """While A runs, the waiting group's need is its 2 new blocks (the shared cached one
    is a hit of the first beam, held once the first beam is allocated)."""
    e = engine(num_blocks=4, block_size=4)
    apply(e, {"op": "add", "request": "A", "prompt_len": 1, "max_new_tokens": 9},
          {"op": "add", "request": "B", "prompt_len": 2, "beam_width": 2, "max_new_tokens": 8})
    for _ in range(4):
        apply(e, {"op": "step"})
    assert list(e.waiting) == ["B.0", "B.3"]
    said = e.scheduler.why_waiting("B.0")
    assert "it needs 2 new blocks" in said, said
    run_out(e)
    assert e.requests["B.0"].num_preemptions == 1 and e.requests["B.0"].num_computed > 5


@pytest.mark.parametrize(("config", "ops", "group"), [
    # Back by recompute, B's two beams need 2 + 2 blocks for their tokens, 2 for the
    # next ones at a boundary and 1 for the fork its round makes: 7 of 6. The check for
    # a unit that can never fit left the fork out and let it wait for good.
    ({"num_blocks": 6, "block_size": 3, "prefix_caching": False},
     [{"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 9},
      {"op": "add", "request": "B", "prompt_len": 5, "beam_width": 3, "max_new_tokens": 3}],
     "B"),
    # Swapped out, the group's host copies are each beam's own: coming back needs more
    # than the pool, and swap-in had no end for a unit that can never fit.
    ({"num_blocks": 3, "block_size": 3, "prefix_caching": False, **SWAP},
     [{"op": "add", "request": "A", "prompt_len": 2, "max_new_tokens": 6},
      {"op": "add", "request": "B", "prompt_len": 2, "beam_width": 2, "max_new_tokens": 7}],
     "B"),
    # A lone sample swapped out holding 3 of 5 blocks needs 3 + 1 + the watermark's 2.
    ({"num_blocks": 5, "block_size": 3, "allocation": "fifo", "seed": 11142,
      "max_num_seqs": 4, "watermark_blocks": 2, **SWAP},
     [{"op": "add", "request": "A", "max_new_tokens": 6, "n": 2, "prompt": "abcd"},
      {"op": "step"},
      {"op": "add", "request": "D", "max_new_tokens": 7, "prompt_len": 6}],
     "A"),
], ids=["recompute-round-fork", "swapped-group", "swapped-watermark"])
def test_a_unit_that_can_never_come_back_ends_and_lets_the_queue_go_on(
        config: dict[str, Any], ops: list[dict[str, Any]], group: str) -> None:
    e = engine(**config)
    apply(e, *ops)
    run_out(e)
    assert "capacity" in reasons(e, group).values(), reasons(e, group)
    # Nothing behind it is held up: every request outside the group ran to its end.
    assert all(r.finish_reason in ("max_new_tokens", "eos")
               for r in e.requests.values() if r.group != group)


@pytest.mark.parametrize("mode", [SWAP, {}], ids=["swap", "recompute"])
def test_a_newcomer_waits_for_the_blocks_a_running_groups_first_round_forks(
        mode: dict[str, Any]) -> None:
    """A's prompt fills 3 of a block of 4; its first round forks 3 beams, a copy of the
    shared last block each: 4 blocks in all. B, added meanwhile, was let into one of
    them and preempted by that round at the next step, its prefill thrown away."""
    e = engine(num_blocks=4, block_size=4, **mode)
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "beam_width": 4,
              "max_new_tokens": 3},
          {"op": "add", "request": "B", "prompt_len": 2, "max_new_tokens": 3})
    assert list(e.waiting) == ["B"]
    said = e.scheduler.why_waiting("B")
    assert "0 of the 3 free or cached are left once the running requests take the 3 they " \
           "still need" in said, said
    run_out(e)
    assert e.requests["B"].num_preemptions == 0
    assert e.requests["B"].finish_reason == "max_new_tokens"


@pytest.mark.parametrize(("config", "first"), [
    ({"num_blocks": 32, "block_size": 4, "max_num_seqs": 4},
     {"op": "add", "request": "A", "max_new_tokens": 3, "beam_width": 4, "prompt_len": 5}),
    ({"num_blocks": 32, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 6},
     {"op": "add", "request": "A", "max_new_tokens": 3, "n": 4, "prompt_len": 9}),
], ids=["beams", "samples-mid-prefill"])
def test_max_num_seqs_counts_the_sequences_a_running_request_will_fork(
        config: dict[str, Any], first: dict[str, Any]) -> None:
    """A takes all 4 sequence slots from admission on (its beams or samples fork at its
    first decode); B, added at once, was admitted beside it, and 5 sequences ran."""
    e = engine(**config)
    apply(e, first, {"op": "add", "request": "B", "max_new_tokens": 3, "prompt_len": 3})
    assert "B" in e.waiting
    said = e.scheduler.why_waiting("B")
    assert said.startswith("the 4 sequences of the running requests (their forks to come "
                           "included) take their slots, and max_num_seqs is 4"), said
    assert max(run_out(e)) <= 4
    assert e.requests["B"].finish_reason == "max_new_tokens"


def test_a_group_over_max_num_seqs_beside_forks_to_come_is_told_so() -> None:
    e = engine(num_blocks=32, block_size=4, max_num_seqs=6)
    apply(e, {"op": "add", "request": "A", "max_new_tokens": 3, "beam_width": 4,
              "prompt_len": 5},
          {"op": "add", "request": "B", "max_new_tokens": 3, "n": 3, "prompt_len": 3})
    assert e.scheduler.why_waiting("B.0") == (
        "it starts 3 sequences beside the 4 sequences of the running requests (their forks "
        "to come included), and max_num_seqs is 6; finish one first")


@pytest.mark.parametrize(("config", "ops", "group"), [
    # G's beams share the 5 cached blocks of their 20-token prompt: back by recompute they
    # need about 8 of the 10 blocks; counted beam by beam (7 + 7), G was ended "capacity"
    # at the step after its preemption.
    ({"num_blocks": 10, "block_size": 4},
     [{"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 20},
      {"op": "add", "request": "G", "prompt_len": 20, "beam_width": 2, "max_new_tokens": 8}],
     "G"),
    # Swapped out at step 7 with 9 of 15 blocks free or cached, B's group was ended at
    # step 8 the same way; it comes back once A finishes.
    ({"num_blocks": 15, "block_size": 2, "allocation": "fifo", "seed": 340,
      "max_num_batched_tokens": 7, "temperature": 1.0, **SWAP},
     [{"op": "add", "request": "A", "max_new_tokens": 7, "prompt_len": 6},
      {"op": "add", "request": "B", "max_new_tokens": 6, "beam_width": 4, "prompt_len": 4}],
     "B"),
], ids=["recompute", "swap"])
def test_a_beam_group_sharing_its_cached_prefix_is_not_ended_as_never_fitting(
        config: dict[str, Any], ops: list[dict[str, Any]], group: str) -> None:
    e = engine(**config)
    apply(e, *ops)
    run_out(e)
    beams = [r for r in e.requests.values() if r.group == group]
    assert "capacity" not in reasons(e, group).values(), reasons(e, group)
    assert any(came_back(r) for r in beams), reasons(e, group)


def test_without_the_cache_the_same_group_is_ended_as_never_fitting() -> None:
    """The beams' 20-token prompt, recomputed beam by beam with nothing cached to share,
    takes 7 + 7 blocks of the 10: ended "capacity", and the request beside it finishes."""
    e = engine(num_blocks=10, block_size=4, prefix_caching=False)
    apply(e, {"op": "add", "request": "A", "prompt_len": 3, "max_new_tokens": 20},
          {"op": "add", "request": "G", "prompt_len": 20, "beam_width": 2, "max_new_tokens": 8})
    run_out(e)
    assert "capacity" in reasons(e, "G").values()
    assert e.requests["A"].finish_reason == "max_new_tokens"


def test_a_wait_behind_a_swapped_unit_that_can_never_come_back_says_it_ends() -> None:
    e = engine(num_blocks=3, block_size=3, prefix_caching=False, **SWAP)
    apply(e, {"op": "add", "request": "A", "prompt_len": 2, "max_new_tokens": 6},
          {"op": "add", "request": "B", "prompt_len": 2, "beam_width": 2, "max_new_tokens": 7},
          {"op": "step"}, {"op": "step"})
    assert list(e.swapped) == ["B.0", "B.1"]
    apply(e, {"op": "add", "request": "C", "prompt_len": 1, "max_new_tokens": 2})
    assert e.scheduler.why_waiting("C") == (
        "2 swapped-out requests ahead of it can never come back into the pool (with its "
        "watermark): the next step ends them (finish reason capacity)")
    apply(e, {"op": "step"})
    assert reasons(e, "B") == {"B.0": "capacity", "B.1": "capacity"}
    assert "C" in e.running


@pytest.mark.parametrize("op", [
    {"op": "fork", "request": "B", "child": "Bf"},
    {"op": "add", "request": "P", "prompt_len": 2, "blocks": [15]},
], ids=["fork", "pinned-add"])
def test_an_operation_that_starts_a_sequence_at_once_counts_forks_to_come(
        op: dict[str, Any]) -> None:
    """B runs and A.0, mid-prefill, will fork its second sample: 3 sequences of the 3
    max_num_seqs allows. A fork of B, or an add on pinned blocks (admitted at once), was
    let in beside them and 4 sequences ran."""
    e = engine(num_blocks=16, block_size=4, max_num_seqs=3, max_num_batched_tokens=6)
    apply(e, {"op": "add", "request": "B", "prompt_len": 2, "max_new_tokens": 6},
          {"op": "add", "request": "A", "prompt_len": 12, "n": 2, "max_new_tokens": 3})
    assert list(e.running) == ["B", "A.0"]
    before = export_snapshot(e)
    with pytest.raises(PagedLabError, match=(
            r"the 3 sequences of the running requests \(their forks to come included\) take "
            r"their slots and max_num_seqs is 3; finish one first$")):
        e.apply(parse_op(op))
    assert export_snapshot(e) == before
    assert max(run_out(e)) <= 3


@pytest.mark.parametrize(("num_blocks", "why", "admitted"), [
    (11, "its blocks are free now: the next step starts it", True),
    (10, "the pool has no room for it yet: it needs 2 new blocks (and will share 1 block of "
         "its prompt that a running prefill computes first), and 1 of the 4 free or cached "
         "is left once the running requests take the 3 they still need; step the batch to "
         "admit it as they finish", False),
], ids=["fits", "waits"])
def test_a_wait_counts_the_blocks_a_running_prefill_caches_first(
        num_blocks: int, why: str, admitted: bool) -> None:
    """A is mid-prefill of the prompt C waits with. The next step computes A's chunk
    first, and C hits the block it fills: the wait said "needs 3 new blocks" and "no
    room", and the step admitted C."""
    e = engine(num_blocks=num_blocks, block_size=2, max_num_batched_tokens=6)
    prompt = list(range(65, 81))
    apply(e, {"op": "add", "request": "A", "prompt_tokens": prompt, "max_new_tokens": 4},
          {"op": "step"},
          {"op": "add", "request": "C", "prompt_tokens": prompt, "max_new_tokens": 4})
    assert e.requests["A"].prefilling
    assert e.scheduler.why_waiting("C") == why
    apply(e, {"op": "step"})
    assert (e.requests["C"].status == "running") == admitted
