"""The contiguous arena a scenario runs beside its paged pool (backend/io/contiguous_mirror.py).

It serves the same requests on a clock of its own: a request that waits for a
region generates nothing meanwhile and finishes later than in the paged run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Step
from backend.io.contiguous_mirror import ContiguousMirror, ContiguousSpec
from backend.views import tour as tv


def _run(ops: list[Op], capacity: int, *, policy: str = "oracle", num_blocks: int = 32,
         max_len: int = 2048) -> tuple[Engine, ContiguousMirror]:
    engine = Engine(EngineConfig(num_blocks=num_blocks, block_size=4), kernel="torch")
    mirror = ContiguousMirror(ContiguousSpec(capacity, policy, max_len))
    for op in ops:
        _apply(engine, mirror, op)
    return engine, mirror


def _follow(engine: Engine, mirror: ContiguousMirror,
            op: Op) -> Callable[[int, int], bool] | None:
    """As `run_steps` does: the mirror follows each iteration of a step (a grow reports
    its tokens too, which the mirror takes from the result instead)."""
    return mirror.on_iteration(engine) if isinstance(op, Step) else None


def _apply(engine: Engine, mirror: ContiguousMirror, op: Op) -> None:
    mirror.observe(engine, engine.apply(op, progress=_follow(engine, mirror, op)))
    mirror.arena.check_integrity()


def _tokens(mirror: ContiguousMirror) -> dict[str, int]:
    return {rid: r["tokens"] for rid, r in mirror.state()["regions"].items()}


def test_a_request_that_waits_for_a_region_falls_behind_and_finishes_later() -> None:
    # A (final 8) fills the arena; B (final 4) waits there while the pool runs it.
    engine, mirror = _run([Add("A", prompt_len=4, max_new_tokens=4),
                           Add("B", prompt_len=2, max_new_tokens=2)], capacity=8)
    assert mirror.waiting == ["B"] and _tokens(mirror) == {"A": 4}
    _apply(engine, mirror, Step(2))
    # The pool finished B; the arena has not started it.
    assert engine.requests["B"].status == "finished"
    assert mirror.waiting == ["B"] and _tokens(mirror) == {"A": 6}
    _apply(engine, mirror, Step(2))
    # A finishes at 8 in both; B is placed with the 2 tokens it arrived with.
    assert engine.requests["A"].status == "finished"
    assert _tokens(mirror) == {"B": 2} and mirror.finished == ["A"]
    assert mirror.state()["out_of_step"] == {"B": {"here": 2, "paged": 4,
                                                    "paged_status": "finished"}}
    _apply(engine, mirror, Step(1))
    assert _tokens(mirror) == {"B": 3}
    _apply(engine, mirror, Step(1))
    assert _tokens(mirror) == {} and mirror.finished == ["A", "B"]
    assert mirror.state()["out_of_step"] == {}


def test_a_request_the_pool_keeps_waiting_runs_ahead_here() -> None:
    # 16 slots of paged pool: B's 8-token prompt waits for blocks behind A's 12.
    engine, mirror = _run([Add("A", prompt_len=12, max_new_tokens=4),
                           Add("B", prompt_len=8, max_new_tokens=4), Step(1)],
                          capacity=64, num_blocks=4)
    assert engine.requests["B"].status == "waiting"
    assert _tokens(mirror) == {"A": 13, "B": 9}
    assert mirror.state()["out_of_step"] == {"B": {"here": 9, "paged": 8,
                                                    "paged_status": "waiting"}}
    assert tv.arena_message(mirror.state()) == (
        "B holds 9 tokens here and 8 in the paged pool: the paged pool ran it later.")
    # B reaches its 12 here while the pool still makes it wait: done here first.
    _apply(engine, mirror, Step(3))
    assert engine.requests["B"].status == "waiting" and mirror.finished == ["A", "B"]


def test_a_step_of_n_iterations_is_n_steps_of_one() -> None:
    # Samples forked in the middle of a step arrive in the iteration that made them.
    ops: list[Op] = [Add("A", prompt_len=10, max_new_tokens=3),
                     Add("S", prompt_len=4, max_new_tokens=5, n=3)]
    # The pool (5 blocks) admits S only once A has finished, inside the step; the
    # arena (24 slots) places S.0 at once and S.1 when A leaves.
    engine, whole = _run([*ops, Step(4)], capacity=24, num_blocks=5)
    _, ones = _run([*ops, Step(1), Step(1), Step(1), Step(1)], capacity=24, num_blocks=5)
    assert {"S.1", "S.2"} <= set(engine.requests)
    assert whole.state() == ones.state()
    assert whole.finished == ["A"] and whole.waiting == ["S.2"]
    assert _tokens(whole) == {"S.0": 8, "S.1": 5}


def test_a_child_arrives_with_the_history_its_parent_has_here() -> None:
    engine, mirror = _run([Add("A", prompt_len=6, max_new_tokens=2),
                           Add("B", prompt_len=2, max_new_tokens=6), Step(2),
                           Fork("B", "K")], capacity=8)
    # B waits here with 2 tokens while it has 4 in the pool; its child K too.
    assert engine.requests["K"].num_tokens == 4
    assert mirror.waiting == ["K"] and _tokens(mirror) == {"B": 2}
    assert mirror.arrived_with["K"] == 2


def test_a_waiting_request_with_nothing_left_to_do_leaves_the_queue() -> None:
    engine, mirror = _run([Add("A", prompt_len=4, max_new_tokens=4),
                           Add("B", prompt_len=2, max_new_tokens=8),
                           Add("C", prompt_len=2, max_new_tokens=1)], capacity=12)
    assert mirror.waiting == ["B", "C"]
    # Finished by hand before it generated anything: it needs no region here, and C,
    # which fits in the 4 free slots, no longer waits behind it.
    _apply(engine, mirror, Finish("B"))
    assert mirror.waiting == [] and mirror.finished == ["B"]
    assert _tokens(mirror) == {"A": 4, "C": 2}


def test_an_unlimited_prompt_past_max_len_is_never_placed() -> None:
    _, mirror = _run([Add("A", prompt_len=30, max_new_tokens=None),
                      Add("B", prompt_len=3, max_new_tokens=None)], capacity=64,
                     policy="max", max_len=24)
    assert mirror.never == ["A"] and _tokens(mirror) == {"B": 3}


def test_grow_gives_the_tokens_the_engine_decoded() -> None:
    engine, mirror = _run([Add("A", prompt_len=6, max_new_tokens=2),
                           Add("B", prompt_len=2, max_new_tokens=3), Step(2)], capacity=8)
    assert _tokens(mirror) == {"B": 2} and engine.requests["B"].num_tokens == 4
    _apply(engine, mirror, Grow("B", 3))   # the pool decodes 1 (its last) token
    assert engine.requests["B"].num_tokens == 5
    assert _tokens(mirror) == {"B": 3}


def test_placed_requests_take_one_token_per_iteration_and_grow_takes_its_tokens() -> None:
    engine, mirror = _run([Add("A", prompt_len=3, max_new_tokens=10),
                           Add("B", prompt_len=5, max_new_tokens=10),
                           Step(3), Grow("A", 4)], capacity=64)
    assert _tokens(mirror) == {"A": 3 + 3 + 4, "B": 5 + 3}
    assert _tokens(mirror) == {r: engine.requests[r].num_tokens for r in "AB"}
    assert mirror.state()["out_of_step"] == {}


def test_a_request_finished_by_hand_ends_here_with_the_tokens_it_had() -> None:
    engine, mirror = _run([Add("A", prompt_len=4, max_new_tokens=4),
                           Add("B", prompt_len=2, max_new_tokens=6), Step(1),
                           Finish("A")], capacity=8)
    # A is released at once (it holds its 5 tokens here too) and B is placed.
    assert mirror.finished == ["A"] and _tokens(mirror) == {"B": 2}
    # B, finished by hand at 3 tokens in the pool, runs here until it holds 3.
    _apply(engine, mirror, Finish("B"))
    assert _tokens(mirror) == {"B": 2}
    _apply(engine, mirror, Step(1))
    assert _tokens(mirror) == {} and mirror.finished == ["A", "B"]


def test_a_request_finished_in_the_pool_before_it_was_placed_still_runs_here() -> None:
    engine, mirror = _run([Add("A", prompt_len=6, max_new_tokens=2),
                           Add("B", prompt_len=3, max_new_tokens=1),
                           Step(1)], capacity=8)
    assert engine.requests["B"].status == "finished"
    assert mirror.waiting == ["B"]
    _apply(engine, mirror, Step(1))
    # A released at 8; B placed with its 3, and takes its one token a step later.
    assert mirror.waiting == [] and _tokens(mirror) == {"B": 3}
    _apply(engine, mirror, Step(1))
    assert mirror.finished == ["A", "B"]


def test_forks_samples_and_beams_each_get_a_region() -> None:
    engine, mirror = _run([Add("S", prompt_len=3, max_new_tokens=2, n=2),
                           Add("W", prompt_len=3, max_new_tokens=3, beam_width=2),
                           Step(1), Fork("S.0", "K")], capacity=256)
    assert set(engine.requests) <= set(mirror.final_len)
    assert {"S.0", "S.1", "K"} <= set(_tokens(mirror))
    # The child arrives with its parent's history: 4 tokens, final length 5.
    assert mirror.state()["regions"]["K"]["tokens"] == engine.requests["K"].num_tokens == 4


@pytest.mark.parametrize("seed", range(6))
def test_random_runs_keep_every_request_in_one_place(seed: int) -> None:
    """Fresh random operations: the arena stays consistent, every request the engine
    holds is waiting, placed, finished or never placeable here, and a placed one
    never holds more than its final length, or than the pool finished it with."""
    rng = random.Random(seed)
    engine = Engine(EngineConfig(num_blocks=24, block_size=4, seed=seed), kernel="torch")
    mirror = ContiguousMirror(ContiguousSpec(rng.choice([16, 32, 48]),
                                             rng.choice(["oracle", "pow2", "max"]), 24))
    for i in range(40):
        live = [r for r, q in engine.requests.items() if q.status == "running"
                and q.beam_width is None]
        kind = rng.choice(["add", "add", "step", "step", "step", "grow", "fork", "finish"])
        op: Op
        if kind == "add" or not live:
            many = rng.choice([{}, {}, {"n": 2}, {"beam_width": 2}])
            op = Add(f"R{i}", prompt_len=rng.randint(1, 12),
                     max_new_tokens=rng.choice([None, 1, 3, 8]), **many)
        elif kind == "step":
            op = Step(rng.randint(1, 3))
        elif kind == "grow":
            op = Grow(rng.choice(live), rng.randint(1, 3))
        elif kind == "fork":
            op = Fork(rng.choice(live), f"K{i}")
        else:
            op = Finish(rng.choice(live))
        try:
            result = engine.apply(op, progress=_follow(engine, mirror, op))
        except PagedLabError:  # refused (say, no room to grow): nothing changed
            continue
        mirror.observe(engine, result)
        mirror.arena.check_integrity()
        placed = set(_tokens(mirror))
        places = [set(mirror.waiting), placed, set(mirror.finished), set(mirror.never)]
        assert sum(len(p) for p in places) == len(set().union(*places)) == len(engine.requests)
        for rid, held in _tokens(mirror).items():
            req = engine.requests[rid]
            assert held <= mirror.final_len[rid]
            if req.status == "finished":
                assert held < min(req.num_tokens, mirror.final_len[rid])


@pytest.mark.parametrize(("data", "said"), [
    ({}, "contiguous: missing field 'capacity' (the arena's size in token slots)"),
    ({"capacity": None}, "contiguous.capacity must be an integer in 1..1,048,576, got null"),
    ({"capacity": 8, "size": 1}, "contiguous: unknown field 'size'"),
])
def test_a_bad_arena_is_refused_by_what_is_wrong_with_it(data: dict[str, Any], said: str) -> None:
    # A field left out is said to be missing, not null: null is what a file wrote.
    with pytest.raises(PagedLabError) as info:
        ContiguousSpec.from_json(data)
    assert str(info.value) == said
