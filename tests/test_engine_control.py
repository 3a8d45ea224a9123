"""Control runs: the same operations without shuffle, preemption or prefix cache.

The claims of scenarios 06, 11, 12, 13 and 17 (a prefix hit, a move, a
preemption, a revived cached block, a beam group's swap change no token) are checked against a
live control engine; a wrong block-table entry injected into the user's
engine must show up as a difference, or the comparison proves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.control import ControlRun, compare_with_control, control_config
from backend.engine.engine import Engine
from backend.engine.ops import Add, Grow, Op, Shuffle, Step, parse_op
from backend.io.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "assets" / "scenarios"
LOGIT_TOL = 1e-4


@pytest.mark.parametrize("name", ["06-prefix-sharing", "11-moving-blocks", "12-preemption",
                                  "13-cache-revival", "17-swap-preemption"])
def test_the_scenarios_perturbations_change_no_token(name: str) -> None:
    sc = load_scenario(SCENARIOS / f"{name}.json")
    ops = [s.op for s in sc.steps]
    report = compare_with_control(sc.config, ops)
    assert report.agrees, [r for r in report.requests if not r.same]
    assert report.positions_compared > 0
    assert report.max_logit_diff < LOGIT_TOL
    c = report.control_config
    assert not c.prefix_caching and c.preemption == "recompute"
    for r in report.requests:
        # Every token the user's run generated was compared with the control's.
        assert r.compared_tokens == len(r.tokens), r.request
    if name == "11-moving-blocks":
        assert report.not_replayed == ("step 4: shuffle (no block moves in the control)",)
    if name == "12-preemption":
        # C was preempted and recomputed: compared once its recomputation caught up.
        c_row = next(r for r in report.requests if r.request == "C")
        assert c_row.positions_compared >= 1
    if name == "17-swap-preemption":
        # The swapped beams' tokens and logits were compared past their swap-in (B.13,
        # forked at the last round, finished with no logits left to compare).
        by = {r.request: r for r in report.requests}
        assert by["B.5"].positions_compared > 0 and by["B.4"].positions_compared > 0
        assert all(by[b].same for b in ("B.5", "B.10", "B.13"))


def test_a_position_counts_once_however_often_its_logits_are_compared() -> None:
    # A's logits at 6 tokens stay as they are through B's add and the shuffle: compared
    # after each operation, they are one position. Each step operation adds the position
    # it ends at (a step of 2 iterations, one).
    config = EngineConfig.from_json({"num_blocks": 32, "block_size": 4})
    ops = [parse_op({"op": "add", "request": "A", "prompt_len": 6}),
           parse_op({"op": "add", "request": "B", "prompt_len": 5}),
           Shuffle(), Step(1), Step(2)]
    report = compare_with_control(config, ops)
    by = {r.request: r for r in report.requests}
    assert by["A"].positions_compared == by["B"].positions_compared == 3
    assert report.positions_compared == 6
    assert report.agrees


def test_a_wrong_table_entry_shows_as_a_difference() -> None:
    # Greedy, so that a changed logit soon changes a token too.
    config = EngineConfig.from_json({"num_blocks": 32, "block_size": 4, "temperature": 0})
    ops = [parse_op({"op": "add", "request": "A", "prompt": "Paging moves nothing:",
                     "max_new_tokens": 12}),
           parse_op({"op": "add", "request": "B", "prompt": "Blocks of another text",
                     "max_new_tokens": 12}),
           Step(2), Step(4)]
    clean = compare_with_control(config, ops)
    assert clean.agrees and clean.max_logit_diff < LOGIT_TOL
    engine = Engine(config, kernel="torch", check_reference=False)
    run = ControlRun(config, ops)
    for op in ops[:3]:
        run.apply(op, engine)
    # A's first logical block now points at B's first block: A attends to B's tokens.
    a, b = engine.manager.seqs["A"], engine.manager.seqs["B"]
    a.block_table[0] = b.block_table[0]
    run.apply(ops[3], engine)
    report = run.report(engine)
    row = next(r for r in report.requests if r.request == "A")
    assert row.max_logit_diff > 1e-2 and not report.agrees
    assert not row.same and not report.same
    assert row.first_mismatch is not None and row.first_mismatch >= 21
    assert next(r for r in report.requests if r.request == "B").same


def test_an_operation_the_control_refuses_is_left_out_saying_why_the_runs_differ() -> None:
    # B is preempted here and comes back late; in the control's roomy pool it decoded
    # all along and has finished by the time this run grows it.
    config = EngineConfig(num_blocks=7, block_size=4)
    ops: list[Op] = [Add("A", prompt_len=10, max_new_tokens=8),
                     Add("B", prompt_len=10, max_new_tokens=8), Step(3),
                     *[Step(1)] * 8, Grow("B", 1)]
    report = compare_with_control(config, ops)
    assert report.not_replayed == (
        "step 12: refused in the control, where nothing waits for room or is preempted, so "
        "a request can be further along than in this run: cannot grow request 'B': it has "
        "finished",)


def test_the_control_leaves_out_pins_and_moves_and_is_bounded() -> None:
    config = EngineConfig.from_json({"num_blocks": 16, "block_size": 4})
    ops = [Add("A", prompt="hello world", blocks=(9, 2, 14), max_new_tokens=5), Shuffle(3),
           Step(3)]
    report = compare_with_control(config, ops)
    assert report.same and report.not_replayed == (
        "step 2: shuffle (no block moves in the control)",)
    assert control_config(config, ops).num_blocks >= 16
    # Each request reaches at most SmolLM2's context (8,192 tokens), and 64 of them do.
    huge = EngineConfig.for_model("smollm2-135m", num_blocks=64, block_size=16)
    with pytest.raises(PagedLabError, match="control run of these operations needs a pool"):
        control_config(huge, [*(Add(f"R{i}", prompt_len=8_000, max_new_tokens=None)
                                for i in range(64)), Step(60_000)])


def test_a_replay_stopped_part_way_says_where_and_compares_only_what_both_reached() -> None:
    """The Playground's replay stops at its time limit within an operation (a long step)
    on either engine: the report says how many operations it replayed whole, and what
    it compared is still a true comparison, with no position one side never reached."""
    config = EngineConfig.from_json({"num_blocks": 32, "block_size": 4, "temperature": 0})
    ops = [parse_op({"op": "add", "request": "A", "prompt": "Paging moves nothing:",
                     "max_new_tokens": 40}),
           parse_op({"op": "add", "request": "B", "prompt": "Blocks of another text",
                     "max_new_tokens": 40}),
           Step(3), Step(30), Step(2)]
    full = compare_with_control(config, ops)
    assert full.stopped_after is None and full.agrees

    # Stopped in the user's side of the long step, after 5 of its iterations (the first
    # step's 3 iterations on each side come first).
    calls = 0

    def iterations(limit: int) -> Callable[[int, int], bool]:
        def keep_going(done: int, total: int) -> bool:
            nonlocal calls
            calls += 1
            return calls < limit
        return keep_going

    report = compare_with_control(config, ops, keep_going=iterations(3 + 3 + 5))
    assert report.stopped_after == (3, 5)
    assert report.agrees and report.positions_compared > 0
    by = {r.request: r for r in report.requests}
    # The user's engine ran 5 iterations of the 30; the control none of them.
    assert len(by["A"].tokens) == len(by["A"].control_tokens) + 5
    assert by["A"].compared_tokens == len(by["A"].control_tokens)
    # Stopped in the control's side of it: the user's engine ran all 30.
    calls = 0
    report = compare_with_control(config, ops, keep_going=iterations(3 + 3 + 30 + 7))
    assert report.stopped_after == (3, 5) and report.agrees
    # Its own part-way note is the replay's stop, said once by stopped_after.
    assert report.not_replayed == ()
    by = {r.request: r for r in report.requests}
    assert len(by["A"].control_tokens) < len(by["A"].tokens)
    # Stopped between two operations by `progress`.
    report = compare_with_control(config, ops, progress=lambda done, total: done < 2)
    assert report.stopped_after == (2, 5) and report.agrees
    assert compare_with_control(config, ops, progress=lambda d, t: True).stopped_after is None
