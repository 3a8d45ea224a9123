"""Every chart's text alternative: the top-level description a screen reader announces.

Each chart is built from small real inputs the way its page builds it, and its
description is checked against figures worked out here from those inputs (the
run, the replay, the engine), not from the frame the chart draws.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pytest

from backend.core.config import EngineConfig
from backend.core.words import counted, percent
from backend.engine.engine import Engine
from backend.engine.measure import PreemptionRun
from backend.engine.ops import parse_op
from backend.io.snapshot import export_snapshot
from backend.lab.compare.block_sizes import trace_block_sweep
from backend.lab.compare.memory_maps import replay_maps, small_trace
from backend.lab.compare.seed_example import seed_example
from backend.lab.sharing import SharingResult, SharingTrace
from backend.lab.sim.simulator import SimConfig, SimResult, simulate_run, simulate_workload
from backend.lab.workloads import make_trace
from backend.sessions.history import History
from backend.sessions.tour import TourRun, shipped_scenario
from backend.views import tour as tour_views
from backend.views.compare import charts, preemptions, swap_recompute, tables
from backend.views.compare import deployment as dep_views
from backend.views.compare import frames as views
from backend.views.compare import seed as seed_views
from backend.views.compare.timeline import timeline_chart, timeline_frame
from backend.views.grid import overview_spec
from backend.views.timeline import timeline_frame as engine_frame
from backend.views.vector import vector_spec
from ui.timeline import strip_chart

STATES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation",
          "free")
NAMES = {"token_states": "token states", "reservation": "reservation",
         "internal_fragmentation": "internal fragmentation",
         "external_fragmentation": "external fragmentation", "free": "free"}


def described(chart: Any) -> str:
    """The top-level description of an Altair chart or a Vega-Lite dict, as the browser
    gets it (the aria-label of the whole chart)."""
    spec = chart if isinstance(chart, dict) else chart.to_dict()
    text = spec.get("description")
    assert isinstance(text, str) and text, "no top-level description"
    return text


# ---- the seed's example --------------------------------------------------------------


def test_the_seed_strips_count_each_stage_s_slots_by_state() -> None:
    ex = seed_example()
    title = f"{ex.capacity} slots, one region per request"
    said = described(charts.slot_strip(seed_views.seed_arena_slots(ex), title))
    assert said.startswith(f"{title}, slots by state at {len(ex.arena)} stages: ")
    for stage in ex.arena:
        slots: Counter[str] = Counter()
        for seg in stage.segments:
            slots[seg.kind] += seg.length
        counts = ", ".join(f"{NAMES[k]} {slots[k]}" for k in STATES if slots[k])
        assert f"{stage.label}: {counts}" in said
    # The pool: a block's filled slots hold token states, the rest of an owned block is
    # internal fragmentation, everything else is free.
    pool = described(charts.slot_strip(seed_views.seed_pool_slots(ex), "pool"))
    for stage in ex.pool:
        owned = [b for b in stage.blocks if b.owner is not None]
        tokens = sum(b.filled for b in owned)
        inside = sum(ex.block_size - b.filled for b in owned)
        parts = [f"token states {tokens}"] + ([f"internal fragmentation {inside}"] if inside
                                              else [])
        parts.append(f"free {ex.capacity - tokens - inside}")
        assert f"{stage.label}: {', '.join(parts)}" in pool


def test_a_strip_of_many_stages_names_the_first_five() -> None:
    ex = seed_example()
    df = seed_views.seed_arena_slots(ex)
    labels = [s.label for s in ex.arena]
    # Seven stages: the arena's three, then four copies of its last under new names.
    last = df[df["stage"] == labels[-1]]
    extra = [last.assign(stage=f"{i}. later") for i in range(4, 8)]
    said = described(charts.slot_strip(pd.concat([df, *extra]), "t"))
    assert "at 7 stages" in said and "5. later" in said and "6. later" not in said
    assert said.endswith("; and 2 more stages.")


def test_the_maps_legend_names_every_state_in_its_colour() -> None:
    legend = charts.kind_legend_html()
    for name, color in zip(charts.KIND_DOMAIN, charts.KIND_COLORS, strict=True):
        assert f"background:{color}'></span>{name}</span>" in legend
    assert all(name in legend for name in NAMES.values())
    # Read as a list under a name that says what it is the legend of.
    assert "role='list' aria-label='Legend of the memory maps below" in legend
    assert legend.count("role='listitem'") == len(charts.KIND_DOMAIN)


# ---- one workload, two memories --------------------------------------------------------


def test_a_memory_map_and_its_shares_give_each_state_s_share() -> None:
    trace = small_trace("alpaca", 8, 20.0, 0, 64)
    replay = replay_maps(trace, "oracle", 256, max_len=64)
    assert replay.snapshot_every == 1          # every iteration drawn as one column
    segments, stride = views.map_segments(replay)
    assert stride == 1
    # Every drawn column is one iteration wide: a state's area is its slots summed over
    # the iterations, the same as the share chart's mean over its (one-iteration) points.
    frames = replay.frames
    area = {k: sum(f.counts[k] for f in frames) for k in STATES}
    total = sum(area.values())
    shares = ", ".join(f"{NAMES[k]} {percent(area[k] / total)}" for k in STATES if area[k])
    first, last = frames[0].iteration, frames[-1].iteration
    said = described(charts.memory_map(segments, "Contiguous: exact final length", 256,
                                       (first, last + 1)))
    assert said == (f"Contiguous: exact final length: the state of each of 256 slots "
                    f"(vertical) at iterations {first:,}–{last:,} (horizontal), "
                    f"{counted(len(trace), 'request')} shown. Of the area drawn: {shares}.")
    peak = max(frames, key=lambda f: f.counts["token_states"])
    said = described(charts.fractions_area(views.map_fractions(replay), (first, last + 1)))
    assert said == (f"Share of memory in each state over iterations {first:,}–{last:,}, "
                    f"stacked to 100%. Mean over the {len(frames)} points drawn: {shares}. "
                    f"Token states peak at {percent(peak.counts['token_states'] / 256)} "
                    f"(iteration {peak.iteration:,}).")


# ---- the simulator's comparison --------------------------------------------------------


@pytest.fixture(scope="module")
def results() -> list[SimResult]:
    return [simulate_workload("alpaca", SimConfig(p, capacity_tokens=4096), requests=60,
                              rate=20.0) for p in ("max", "pow2", "oracle", "paged")]


def test_the_breakdown_bars_give_each_policy_s_token_share(results: list[SimResult]) -> None:
    said = described(charts.breakdown_bars(views.memory_long(results)))
    assert said.startswith("Where the KV memory goes: one bar per policy")
    for r in results:
        rest = max((k for k in STATES[1:]), key=lambda k: r.memory[k])
        assert (f"{r.policy} {percent(r.memory['token_states'])} (the largest other: "
                f"{NAMES[rest]} {percent(r.memory[rest])})") in said


def test_the_policy_bars_give_each_bar_s_label(results: list[SimResult]) -> None:
    m = views.policy_metrics(results)
    batch = ", ".join(f"{r.policy} {r.mean_batch_size:.1f}" for r in results)
    assert described(charts.policy_bars(m, "mean batch size", "Mean batch size")) == (
        f"Mean batch size, one bar per policy: {batch}.")
    held = ", ".join(f"{r.policy} {percent(r.memory['token_states'] / (1 - r.memory['free']))}"
                     for r in results)
    said = described(charts.policy_bars(m, views.HELD_ROW, "Token states of memory held",
                                        percent=True, paper_field="paper token states"))
    # The paper's Figure 2, as its red ticks show it.
    assert said == (f"Token states of memory held, one bar per policy: {held}. Red ticks mark "
                    "the paper's Figure 2 values: max 20.4%, pow2 26.8%, oracle 38.2%, "
                    "paged 96.3%.")
    pre = ", ".join(f"{r.policy} {r.preemptions:,}" for r in results)
    assert described(charts.policy_bars(m, "preemptions", "Preemptions", integer=True)) == (
        f"Preemptions, one bar per policy: {pre}.")


def test_the_figure_13_bars_name_each_system(results: list[SimResult]) -> None:
    systems = ("Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM")
    told = ", ".join(f"{s} {r.mean_batch_size:,.1f}" for s, r in zip(systems, results,
                                                                    strict=True))
    chart = dep_views.figure13_chart(dep_views.figure13_frame(results))
    assert described(chart) == ("Mean batched requests, one bar per system (cf. the paper's "
                                f"Figure 13): {told}.")


def test_the_preemption_histogram_counts_requests_by_preemptions() -> None:
    run = simulate_run(make_trace("sharegpt", 200, 50.0), SimConfig("paged", 2048))
    times = Counter(int(t) for t in run.preemptions_per_request)
    most = max(times)
    assert most > 5                            # enough bars to be cut short
    said = described(preemptions.preemption_histogram(preemptions.preemption_counts(run)))
    assert said == (f"Preemptions per request: {len(run.preemptions_per_request)} requests by "
                    f"how many times each was preempted, 0 times {times[0]}, once {times[1]}, "
                    f"2 times {times[2]}, 3 times {times[3]}, ... and {most} times "
                    f"{times[most]}.")


def test_the_simulator_timeline_gives_its_panels_figures() -> None:
    run = simulate_run(make_trace("sharegpt", 200, 50.0), SimConfig("paged", 2048))
    c = run.timeline.columns if run.timeline is not None else {}
    said = described(timeline_chart(timeline_frame(run.timeline), paged=True))
    first, last = int(c["iteration"][0]), int(c["iteration"][-1])
    assert said.startswith(f"Timeline of iterations {first:,}–{last:,} (")
    assert said.endswith(
        f" in four panels: at most {int(c['running'].max())} requests running and "
        f"{int(c['waiting'].max())} waiting; at most {int(c['used_blocks'].max())} of "
        f"{2048 // 16} blocks used; {int(c['prefill_tokens'].sum()):,} prefill and "
        f"{int(c['decode_tokens'].sum()):,} decode tokens in all; "
        f"{run.result.preemptions} preemptions.")
    oracle = simulate_run(make_trace("alpaca", 30, 1.0), SimConfig("oracle", 2048))
    c = oracle.timeline.columns if oracle.timeline is not None else {}
    said = described(timeline_chart(timeline_frame(oracle.timeline), paged=False))
    # Contiguous memory counts slots, of the whole arena.
    assert (f"at most {int(c['token_slots'].max())} of 2,048 slots holding tokens and "
            f"{int(c['allocated_slots'].max())} held by the policy; ") in said
    assert said.endswith("0 preemptions.")


def test_the_block_size_charts_give_their_ends() -> None:
    points = trace_block_sweep("alpaca", 100, 0)
    both = charts.block_sweep_lines(tables.block_sweep_frame(points))
    # The page draws each of the two on its own: each carries its own description.
    waste, entries = (described(part.properties(data=both.data, autosize="pad"))
                      for part in both.hconcat)
    lo, hi = points[0], points[-1]
    sizes = f"one point per block size ({len(points)} sizes, {lo.block_size} to {hi.block_size})"
    assert waste == (f"Tail waste (the share of allocated slots left empty), {sizes}: from "
                     f"{percent(lo.tail_waste_share)} at block size {lo.block_size} to "
                     f"{percent(hi.tail_waste_share)} at block size {hi.block_size}.")
    assert entries == (f"Block-table entries at a request's end, {sizes}: from "
                       f"{lo.mean_table_entries:.2f} at block size {lo.block_size} to "
                       f"{hi.mean_table_entries:.2f} at block size {hi.block_size}.")
    assert described(both) == f"{waste} {entries}"
    runs = [simulate_workload("alpaca", SimConfig("paged", 2048, bs), requests=60, rate=50.0)
            for bs in (1, 16, 256)]
    high = max(runs, key=lambda r: r.mean_batch_size)
    low = min(runs, key=lambda r: r.mean_batch_size)
    assert described(charts.block_batch_line(tables.block_batch_frame(runs))) == (
        "Mean batch size the paged simulator reached, one point per block size (3 sizes, 1 "
        f"to 256): highest {high.mean_batch_size:.2f} at block size {high.block_size}, "
        f"lowest {low.mean_batch_size:.2f} at block size {low.block_size}.")


def test_the_sharing_bars_give_each_saving_beside_the_paper_s_range() -> None:
    def result(kind: str, n: int, used: int) -> SharingResult:
        low, high = (0.061, 0.098) if kind == "parallel" else (0.376, 0.552)
        t = SharingTrace(10, used, 100, n, used, 100)
        return SharingResult(kind, n, 16, 5, t.saved_fraction, t, low, high)

    results = [result("parallel", 2, 97), result("parallel", 6, 92), result("beam", 4, 60)]
    said = described(charts.sharing_bars(tables.sharing_frame(results)))
    # Saved: 1 - used / unshared (100 blocks each).
    assert said.endswith(": parallel sampling 3.0% at n = 2, 8.0% at n = 6 (the paper: 6.1% "
                         "to 9.8%); beam search 40.0% at n = 4 (the paper: 37.6% to 55.2%).")


def test_the_swap_chart_gives_each_method_s_milliseconds() -> None:
    def run(bs: int, mode: str, ms: float) -> PreemptionRun:
        swap, rec = (ms, 0.0) if mode == "swap" else (0.0, ms)
        return PreemptionRun(bs, mode, 64, 20, 10.0, 3, 40, rec, 10, swap, True)

    runs = [run(1, "roomy", 0.0), run(1, "recompute", 5.0), run(1, "swap", 0.5),
            run(4, "recompute", 5.25), run(4, "swap", 9.0)]
    assert described(swap_recompute.overhead_chart(runs)).endswith(
        "one line per method. Recompute (re-prefill) 5.00 ms at block size 1 and 5.25 ms at "
        "block size 4; swap (copy out and in) 0.50 ms at block size 1 and 9.00 ms at block "
        "size 4.")


# ---- the Playground, the translator and the Scenarios page ---------------------------


def test_the_playground_charts_give_the_engine_s_figures() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 24, "block_size": 4}), kernel="torch")
    history = History(max_steps=2)
    most_used = 0
    for op in ({"op": "add", "request": "A", "prompt_len": 10, "max_new_tokens": 9},
               {"op": "step", "count": 3},
               {"op": "add", "request": "B", "prompt_len": 30, "max_new_tokens": 8},
               {"op": "step", "count": 4}):
        e.apply(parse_op(op))
        most_used = max(most_used, e.manager.metrics().used_blocks)
        history.record(export_snapshot(e))
    df = engine_frame(e.timeline, e.config.num_blocks, e.config.block_size)
    rows = len(df)
    assert rows == 1 + 3 + 1 + 4                # one row per operation, per iteration
    said = described(timeline_chart(df, paged=True, width=420))
    assert said.startswith(f"Timeline of iterations 0–{rows - 1} in four panels: at most 2 "
                           "requests running and 0 waiting; at most "
                           f"{most_used} of 24 blocks used; 40 prefill and ")
    # Two steps kept: the second add's row and the last step's four; the first four rows'
    # states are gone. Of the last step's four, only its last row's state is kept: the
    # other three show the state after the step, not after themselves.
    strip = strip_chart(df, history)
    assert described(strip) == (
        f"Blocks used, one bar to click per iteration ({rows} bars, iterations 0–{rows - 1}), "
        f"to show the state after it: at most {most_used} used (iteration {rows - 1}); the "
        "state after 4 of them is no longer kept (grey); 3 fall inside a step of several "
        "iterations, whose state is kept only at the step's end (light blue).")
    assert list(strip.data["kept"]) == (
        ["not kept"] * 4 + ["kept"] + ["kept at its step's end"] * 3 + ["kept"])


def test_the_key_vector_gives_each_head_s_range() -> None:
    key = np.array([[0.5, -2.0, 1.25], [3.0, 0.1, -0.2]])
    _, spec = vector_spec(key)
    assert described(spec) == (
        "The K vector, one bar per component for each of its 2 KV heads (3 components "
        "each): K head 0: -2.00 to 1.25; K head 1: -0.20 to 3.00. Largest in size: component "
        "0 of head 1, 3.00.")
    _, spec = vector_spec(np.arange(7 * 2, dtype=float).reshape(7, 2))
    assert "K head 4: 8.00 to 9.00; and 2 more heads. Largest in size: component 1 of head 6" \
        in described(spec)


def test_the_scenario_arena_gives_each_region_and_state() -> None:
    run = TourRun(shipped_scenario("01-contiguous-problem"), "01", "t", kernel="torch")
    run.run_to(5)
    arena = run.frame(5).arena
    assert arena is not None
    regions: dict[str, list[int]] = {}
    for seg in arena["segments"]:
        if seg["owner"] is not None:
            slots = regions.setdefault(seg["owner"], [])
            slots += range(seg["start"], seg["start"] + seg["length"])
    where = " and ".join(f"{owner} in slots {min(s)}–{max(s)}" for owner, s in regions.items())
    b = arena["breakdown"]
    labels = {"token_states": "tokens", "reservation": "reserved for future tokens",
              "internal_fragmentation": "reserved, never used (internal fragmentation)",
              "external_fragmentation": "hole too small for the next request (external "
                                        "fragmentation)", "free": "free"}
    states = ", ".join(f"{labels[k]} {b[k]}" for k in labels if b[k])
    _, spec = tour_views.arena_spec(arena, run.frame(5).snapshot)
    assert described(spec) == (f"A contiguous arena of {arena['capacity']} slots, "
                               "reservations of the exact final length as in the paper's "
                               "Orca (Oracle), first fit; one region per "
                               f"request: {where}. Slots by state: {states}.")
    # Each run of slots keeps its own label.
    assert spec["layer"][0]["encoding"]["description"] == {"field": "aria", "type": "nominal"}


def test_the_whole_pool_overview_sums_up_the_pool_and_its_busiest_run() -> None:
    e = Engine(EngineConfig(num_blocks=200, block_size=4), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt_len": 90}))
    snap = export_snapshot(e)
    states = Counter(b["state"] for b in snap["blocks"])
    held = [i for i, b in enumerate(snap["blocks"]) if b["state"] == "used"]
    # 90 tokens in 4-slot blocks: 23 blocks, all in the first run of 64.
    assert len(held) == 23 and max(held) < 64
    _, spec = overview_spec(snap)
    assert spec["description"] == (
        f"Whole pool of 200 blocks in runs of 64: {states['used']} used, "
        f"{states['cached']} cached, {states['free']} free; the most used run, blocks "
        "0–63, has 23 used. The grid below draws the page picked in Blocks shown.")
