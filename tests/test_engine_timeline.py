"""The live engine's timeline: every row against the engine's own state and totals."""

from __future__ import annotations

from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot
from backend.views.compare.timeline import timeline_chart
from backend.views.timeline import latency_frame, timeline_frame, unlisted_note

OPS: list[dict[str, Any]] = [
    {"op": "add", "request": "A", "prompt": "a shared system prompt, then A", "max_new_tokens": 9},
    {"op": "add", "request": "B", "prompt": "a shared system prompt, then B", "max_new_tokens": 12},
    {"op": "step", "count": 3},
    {"op": "fork", "request": "A", "child": "A1"},
    {"op": "add", "request": "C", "prompt_len": 30, "max_new_tokens": 8},
    {"op": "step", "count": 6},
    {"op": "finish", "request": "B"},
    {"op": "step", "count": 20},
]


def run(config: dict[str, Any]) -> tuple[Engine, list[tuple[int, dict[str, Any]]]]:
    """The engine after OPS, and after each operation (its step, its state, and what
    its result says it generated, admitted and preempted)."""
    e = Engine(EngineConfig.from_json({"num_blocks": 24, "block_size": 4, **config}),
               kernel="torch")
    states = []
    for op in OPS:
        result = e.apply(parse_op(op))
        m = e.manager.metrics()
        states.append((e.step, {"decode_tokens": len(result.generated),
                                "admitted": len(result.admitted),
                                "preemptions": len(result.preempted),
                                "finished": len(result.finished),
                                "running": len(e.running), "waiting": len(e.waiting),
                                "swapped": len(e.swapped),
                                "used_blocks": m.used_blocks, "cached_blocks": m.cached_blocks,
                                "free_blocks": m.free_blocks, "token_slots": m.filled_slots}))
    return e, states


@pytest.mark.parametrize("config", [{}, {"max_num_batched_tokens": 16},
                                    {"num_blocks": 14},
                                    {"num_blocks": 14, "preemption": "swap",
                                     "num_cpu_blocks": 24}])
def test_rows_agree_with_the_engine(config: dict[str, Any]) -> None:
    e, states = run(config)
    df = timeline_frame(e.timeline, e.config.num_blocks, e.config.block_size)
    assert list(df["iteration"]) == list(range(len(df)))
    # One row per iteration of a step, one per other operation.
    assert len(df) == sum(op.get("count", 1) for op in OPS)
    counted = ("decode_tokens", "admitted", "preemptions", "finished")
    for step, state in states:
        rows = df[df["step"] == step]
        # An operation's rows add up to what its result reports ...
        for key in counted:
            assert rows[key].sum() == state[key], (step, key)
        # ... and its last row is the state after it.
        for key, value in state.items():
            if key not in counted:
                assert rows.iloc[-1][key] == value, (step, key)
    assert df["preemptions"].sum() == e.manager.preemptions
    assert df["finished"].sum() == sum(r.status == "finished" for r in e.requests.values())
    assert df["prefix_hit_tokens"].sum() == e.manager.prefix_hit_blocks * e.config.block_size
    assert df["prefix_query_tokens"].sum() == e.manager.prefix_query_tokens
    if e.config.max_num_batched_tokens is not None:
        steps = df[df["step"].isin([s for s, _ in states if OPS[s - 1]["op"] == "step"])]
        assert (steps["prefill_tokens"] + steps["decode_tokens"]
                <= e.config.max_num_batched_tokens).all()
    if config.get("num_blocks") == 14:
        assert df["preemptions"].sum() > 0, "the small pool should preempt"
    if "preemption" in config:
        assert df["swapped"].max() > 0, "the small pool should swap"
    # The simulator's chart draws the live timeline too.
    assert timeline_chart(df, paged=True).to_dict()


def test_latencies_in_iterations() -> None:
    e = Engine(EngineConfig(num_blocks=32, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 6, "max_new_tokens": 5}))
    e.apply(parse_op({"op": "step", "count": 2}))
    e.apply(parse_op({"op": "add", "request": "B", "prompt_len": 3, "max_new_tokens": 2}))
    e.apply(parse_op({"op": "step", "count": 5}))
    lat = latency_frame(e.timeline).set_index("request")
    # Rows: 0 add A, 1-2 steps, 3 add B, 4-8 steps. Times are rows, as the chart numbers
    # them; TTFT and TPOT count scheduler iterations (B's add is none).
    # A: added in row 0, first token in row 1 (the first step), one token per step: its
    # fifth in row 6, the third step after B's add.
    assert lat.loc["A", "arrived"] == 0 and lat.loc["A", "first_token"] == 1
    assert lat.loc["A", "ttft_iterations"] == 1
    assert lat.loc["A", "tpot_iterations"] == 1.0
    assert lat.loc["A", "generated"] == 5 and lat.loc["A", "finished"] == 6
    # B: added in row 3, first token in row 4, its second and last in row 5.
    assert (lat.loc["B", "arrived"], lat.loc["B", "first_token"], lat.loc["B", "finished"]) \
        == (3, 4, 5)
    assert lat.loc["B", "ttft_iterations"] == 1 and lat.loc["B", "generated"] == 2
    rows = {r[0]: r for r in e.timeline.rows}
    assert rows[3][2] == 0 and rows[4][2] == 1          # `scheduled`: the add, a step
    assert (lat["ttft_ms"] >= 0).all() and (lat["tpot_ms"].dropna() >= 0).all()


def test_a_refused_operation_records_nothing() -> None:
    e = Engine(EngineConfig(num_blocks=8, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 6}))
    rows, clock = list(e.timeline.rows), e.timeline.clock_s
    with pytest.raises(PagedLabError):
        e.apply(parse_op({"op": "grow", "request": "A", "tokens": 100}))
    with pytest.raises(PagedLabError):
        e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 2}))
    assert e.timeline.rows == rows and e.timeline.clock_s == clock
    assert list(e.timeline.requests) == ["A"]


def test_the_chart_draws_swapped_requests_when_some_were() -> None:
    swapping, _ = run({"num_blocks": 14, "preemption": "swap", "num_cpu_blocks": 24})
    df = timeline_frame(swapping.timeline, 14, 4)
    assert "swapped out" in str(timeline_chart(df, paged=True).to_dict()["datasets"])
    plain, _ = run({})
    df = timeline_frame(plain.timeline, 24, 4)
    assert "swapped out" not in str(timeline_chart(df, paged=True).to_dict()["datasets"])


def test_samples_arrive_with_their_add_and_a_restored_groups_arrival_is_unknown() -> None:
    e = Engine(EngineConfig(num_blocks=32, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "step"}))                                   # row 0
    e.apply(parse_op({"op": "add", "request": "S", "prompt_len": 6, "n": 3,
                      "max_new_tokens": 2}))                            # row 1
    e.apply(parse_op({"op": "step", "count": 2}))                       # rows 2-3
    lat = latency_frame(e.timeline).set_index("request")
    # The samples are forked once the prompt is computed, but they arrived with the add.
    assert list(lat.index) == ["S.0", "S.1", "S.2"]
    assert lat["arrived"].tolist() == [1, 1, 1]
    assert lat["first_token"].tolist() == [2, 2, 2] and lat["finished"].tolist() == [3, 3, 3]
    assert lat["ttft_iterations"].tolist() == [1, 1, 1]
    # A snapshot taken before the prompt is computed, restored: the samples still to fork
    # have no known arrival, so they are left out rather than shown arriving late.
    pending = Engine(EngineConfig(num_blocks=32, block_size=4, max_num_batched_tokens=4),
                     kernel="torch")
    pending.apply(parse_op({"op": "add", "request": "S", "prompt_len": 6, "n": 3,
                            "max_new_tokens": 2}))
    restored = restore_engine(export_snapshot(pending), kernel="torch")
    restored.apply(parse_op({"op": "step", "count": 3}))
    assert {"S.1", "S.2"} <= set(restored.requests)
    assert latency_frame(restored.timeline).empty


def test_a_one_row_timeline_draws_its_values_as_points() -> None:
    e = Engine(EngineConfig(num_blocks=32, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 6}))
    df = timeline_frame(e.timeline, 32, 4)
    assert len(df) == 1
    chart = timeline_chart(df, paged=True).to_dict()
    lines = chart["vconcat"][:3]
    # A line of one point draws nothing: each point is marked, on an axis one wide.
    assert all(p["mark"]["point"] is True for p in lines)
    lo = int(df["iteration"].iloc[0])
    assert lines[0]["encoding"]["x"]["scale"]["domain"] == [lo, lo + 1]
    assert chart["vconcat"][3]["title"] == "Preemptions: none in this run"
    # A long run's lines are lines alone.
    e.apply(parse_op({"op": "step", "count": 70}))
    long = timeline_frame(e.timeline, 32, 4)
    assert len(long) > 60
    assert all(p["mark"]["point"] is False
               for p in timeline_chart(long, paged=True).to_dict()["vconcat"][:3])


def test_requests_from_before_the_timeline_are_named_under_the_latency_table() -> None:
    e = Engine(EngineConfig(num_blocks=32, block_size=4), kernel="torch")
    for op in ({"op": "add", "request": "A", "prompt": "abcdef"}, {"op": "step"}):
        e.apply(parse_op(op))
    assert unlisted_note(e.timeline, list(e.requests)) == ""
    # A restored engine starts a new timeline: A ran before it.
    again = restore_engine(export_snapshot(e), kernel="torch")
    again.apply(parse_op({"op": "add", "request": "B", "prompt": "xyz"}))
    assert list(latency_frame(again.timeline)["request"]) == ["B"]
    assert unlisted_note(again.timeline, list(again.requests)) == (
        "Not listed: A, which arrived before this timeline began (a reload, a restored "
        "snapshot or a reopened session starts a new one), so its arrival and first token "
        "are not on it.")


def test_free_slots_are_the_whole_pools_slots_less_the_allocated() -> None:
    """8 blocks of 4 are 32 slots; a 9-token prompt holds 3 blocks (12 slots), leaving
    20 free. Counting one block too few, the timeline's free slots read 16."""
    e = Engine(EngineConfig(num_blocks=8, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 9, "max_new_tokens": 3}))
    df = timeline_frame(e.timeline, e.config.num_blocks, e.config.block_size)
    first = df.iloc[0]
    assert (int(first["used_blocks"]), int(first["allocated_slots"])) == (3, 12)
    assert int(first["free_slots"]) == 20
    assert list(df.columns).index("free_slots") == list(df.columns).index("allocated_slots") + 1


def test_latency_milliseconds_from_hand_set_times() -> None:
    """Arrived at 0 s, first token at 0.010 s, third and last at 0.030 s: TTFT is 10 ms
    and TPOT is (30 - 10) ms over the 2 tokens after the first, 10 ms. (Over all 3
    tokens TPOT read 6.7 ms; scaled by 100 rather than 1,000, TTFT read 1 ms.)"""
    from backend.engine.timeline import EngineTimeline, RequestTimes

    tl = EngineTimeline()
    tl.requests["A"] = RequestTimes(arrived=0, arrived_s=0.0, arrived_row=0, first_token=1,
                                    first_token_s=0.010, first_token_row=1, last_token=3,
                                    last_token_s=0.030, finished_row=3, num_generated=3)
    tl.requests["B"] = RequestTimes(arrived=1, arrived_s=0.002, arrived_row=1, first_token=2,
                                    first_token_s=0.027, first_token_row=2, last_token=2,
                                    last_token_s=0.027, num_generated=1)
    lat = latency_frame(tl).set_index("request")
    assert lat.loc["A", "ttft_ms"] == pytest.approx(10.0)
    assert lat.loc["A", "tpot_ms"] == pytest.approx(10.0)
    assert lat.loc["A", "tpot_iterations"] == pytest.approx(1.0)
    assert lat.loc["B", "ttft_ms"] == pytest.approx(25.0)
    assert lat["tpot_ms"].isna().tolist() == [False, True]
