"""The "Contiguous vs paged" view models: the seed's timeline, the map replay, the block-size
sweep, the tables and the charts, with hand-worked numbers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import percent, tenths
from backend.engine.control import ControlReport, RequestComparison
from backend.engine.measure import PreemptionRun
from backend.lab.compare.block_sizes import block_size_sweep, trace_block_sweep
from backend.lab.compare.memory_maps import MapSegment, replay_maps, small_trace
from backend.lab.compare.seed_example import seed_example
from backend.lab.memory_calc import kv_capacity
from backend.lab.sharing import SharingResult, SharingTrace
from backend.lab.sim.simulator import SimConfig, simulate, simulate_workload
from backend.lab.traces import workload_trace
from backend.lab.workloads import Trace
from backend.views.compare import charts, preemptions, swap_recompute, tables
from backend.views.compare import frames as views
from backend.views.compare import seed as seed_views
from backend.views.control import control_sentence

ROOT = Path(__file__).resolve().parents[1]


def trace(arrival_s: list[float], prompt: list[int], output: list[int]) -> Trace:
    return Trace("hand", 1.0, 0, np.array(arrival_s, dtype=np.float64),
                 np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64))


# ---- the seed's example ---------------------------------------------------------------


def test_seed_example_defaults_by_hand() -> None:
    ex = seed_example()
    # A (2 of 6 tokens) at 0-5, B (1 of 3) at 6-8, C (2 of 5) at 9-13; 14-15 free.
    first, after, d = ex.arena
    assert first.holes == ((14, 2),)
    assert first.breakdown.as_dict() == {"token_states": 5, "reservation": 9,
                                         "internal_fragmentation": 0,
                                         "external_fragmentation": 0, "free": 2}
    # Two steps: A 4, B 3 (finished, slots 6-8 released), C 4.
    assert after.holes == ((6, 3), (14, 2))
    assert (after.free_total, after.largest_hole) == (5, 3)
    assert ex.fit.reason == "external_fragmentation"
    assert (ex.fit.size, ex.fit.free_total, ex.fit.largest_hole) == (5, 5, 3)
    assert "5 slots are free in total but the largest hole is 3" in ex.fit.message
    # Judged against D's region of 5, every free slot is external fragmentation.
    assert d.waiting == ("D",)
    assert d.breakdown.as_dict() == {"token_states": 8, "reservation": 3,
                                     "internal_fragmentation": 0,
                                     "external_fragmentation": 5, "free": 0}
    assert d.text.splitlines()[0] == "kind   ####++xxx####+xx"
    # The pool (FIFO queue 0..15): A 0,1 then 5,8; B 2,6,9 released tail first; C 3,4,7,10.
    pool = ex.pool[-1]
    assert pool.tables == {"A": (0, 1, 5, 8), "C": (3, 4, 7, 10), "D": (11, 12, 13, 14)}
    assert ex.d_table == (11, 12, 13, 14)
    assert pool.free_blocks == 4
    assert ex.pool_message == "D's 4 tokens take 4 blocks of 1: block table [11, 12, 13, 14]"


def test_seed_example_agrees_with_the_scenario_file() -> None:
    """The page and the guided scenario tell the same story with the same numbers."""
    scenario = json.loads((ROOT / "assets/scenarios/01-contiguous-problem.json").read_text())
    last = scenario["steps"][-1]["expect"]
    before = scenario["steps"][-2]["expect"]
    ex = seed_example()
    assert [list(h) for h in ex.arena[1].holes] == before["contiguous.holes"]
    assert ex.arena[1].free_total == before["contiguous.free_total"]
    assert list(ex.d_table or ()) == last["requests.D.block_table"]
    assert ex.fit.reason == last["contiguous.next_fit.reason"]
    assert ex.pool[-1].free_blocks == last["metrics.free_blocks"]


def test_seed_example_block_size_two_and_pow2() -> None:
    ex = seed_example(block_size=2)
    # 8 blocks of 2: A [0, 3], B [1, 5] (released 5, 1), C [2, 4]; D's 4 tokens take 6, 7.
    assert ex.pool[-1].tables == {"A": (0, 3), "C": (2, 4), "D": (6, 7)}
    assert ex.pool[-1].free_blocks == 2
    # A, C and D hold 4 tokens each, two full blocks: their next tokens need 3 blocks and
    # 2 are free. The pool placed D on what it needs now; the page says what follows.
    assert ex.short_next_step == 1
    assert ex.pool_message == (
        "D's 4 tokens take 2 blocks of 2: block table [6, 7]. The next decode step needs 3 "
        "new blocks (A, C and D each have a full last block) and 2 are free, so an engine "
        "would then preempt a request: the pool admits on the blocks a request needs now, "
        "while the arena reserved each final length up front and never runs short later")
    # Blocks of 1: every token takes a block, and the 4 free cover the 3 next tokens.
    assert seed_example().short_next_step == 0
    pow2 = seed_example("pow2")
    # A 8 + B 4 leave 4 slots: C (region 8) waits, then takes B's and the free 8-15.
    assert pow2.arena[0].waiting == ("C",)
    assert pow2.arena[1].waiting == ()
    assert pow2.arena[1].free_total == 0
    assert pow2.fit.reason == "not_enough_free"
    assert pow2.fit.size == 8


def test_a_d_larger_than_the_free_slots_leaves_them_free_not_fragmented() -> None:
    ex = seed_example(new_len=16)
    # 5 slots free, D needs 16: no compaction would place it, so nothing is fragmentation.
    assert ex.fit.reason == "not_enough_free"
    d = ex.arena[-1]
    assert d.waiting == ("D",)
    assert d.breakdown.external_fragmentation == 0 and d.breakdown.free == 5
    assert {s.kind for s in d.segments if s.owner is None} == {"free"}
    # Just past the largest hole but within the free total: the holes are fragmentation.
    ex = seed_example(new_len=4)
    assert ex.fit.reason == "external_fragmentation"
    assert ex.arena[-1].breakdown.external_fragmentation == 5


def test_seed_example_refuses_bad_input() -> None:
    with pytest.raises(PagedLabError, match="policy"):
        seed_example("paged")
    with pytest.raises(PagedLabError, match="new request's length"):
        seed_example(new_len=17)
    with pytest.raises(PagedLabError, match="block size"):
        seed_example(block_size=0)


def test_seed_slot_frames_cover_every_slot_per_stage() -> None:
    ex = seed_example(block_size=2)
    arena = seed_views.seed_arena_slots(ex)
    pool = seed_views.seed_pool_slots(ex)
    assert len(arena) == len(pool) == 3 * 16
    last = arena[arena["stage"] == ex.arena[-1].label]
    assert last[last["kind"] == "external fragmentation"]["slot"].tolist() == [6, 7, 8, 14, 15]
    # C holds 4 tokens in blocks 2 and 4; D's blocks 6 and 7 are full.
    p = pool[pool["stage"] == ex.pool[-1].label].set_index("slot")
    assert p.loc[[4, 5, 8, 9], "owner"].tolist() == ["C", "C", "C", "C"]
    assert (p.loc[12:15, "owner"] == "D").all()
    assert seed_views.seed_stage_table(ex)["largest hole"].tolist() == [2, 3, 3]
    assert seed_views.seed_block_tables(ex)["block table"].tolist() == ["[0, 3]", "[2, 4]",
                                                                    "[6, 7]"]


def test_slot_strip_wraps_its_stage_labels_and_legend_on_a_narrow_screen() -> None:
    # On a phone (390 px) a stage label on one line took half the chart from the slots,
    # and the legend's second column ran off the screen.
    ex = seed_example()
    spec = charts.slot_strip(seed_views.seed_arena_slots(ex), "arena").to_dict()
    test, _, pick = spec["layer"][0]["encoding"]["y"]["axis"]["labelExpr"].partition(" ? ")
    table, _, otherwise = pick.partition("[datum.label] : ")
    # (`width` read too, so that a resize makes the test again: Vega does not watch
    # containerSize(); the browser test narrows a window to check it.)
    narrow = f"containerSize()[0] + 0 * width < {charts.NARROW_PX}"
    assert (test, otherwise) == (narrow, "datum.label")
    lines = json.loads(table)
    assert list(lines) == [stage.label for stage in ex.arena]
    assert lines["3. D arrives (4 tokens, final length 5)"] == ["3. D arrives (4 tokens,",
                                                                "final length 5)"]
    assert lines["1. A, B and C arrive"] == ["1. A, B and C arrive"]
    for label, wrapped in lines.items():
        assert " ".join(wrapped) == label
        assert all(len(line) <= charts.WRAP_CHARS + 1 for line in wrapped), wrapped
    legend = spec["layer"][0]["encoding"]["color"]["legend"]
    assert legend["columns"] == {"expr": f"{narrow} ? 1 : 2"}


# ---- the map replay --------------------------------------------------------------------


def test_replay_by_hand_oracle_and_paged() -> None:
    # r0: prompt 2, final 5; r1: prompt 1, final 3; both arrive at once; capacity 8.
    t = trace([0.0, 0.0], [2, 1], [3, 2])
    oracle = replay_maps(t, "oracle", 8)
    # k0: 3 + 2 tokens in regions of 5 and 3; k1: 4 + 3 (r1 done); k2: 5 alone.
    assert [f.counts["token_states"] for f in oracle.frames] == [5, 7, 5]
    assert [f.counts["reservation"] for f in oracle.frames] == [3, 1, 0]
    assert [f.counts["free"] for f in oracle.frames] == [0, 0, 3]
    assert oracle.breakdown() == pytest.approx({
        "token_states": 17 / 24, "reservation": 4 / 24, "internal_fragmentation": 0.0,
        "external_fragmentation": 0.0, "free": 3 / 24}, abs=1e-15)
    assert oracle.mean_batch_size == pytest.approx(5 / 3)
    paged = replay_maps(t, "paged", 8, block_size=2)
    # Blocks of 2: k0 r0 [0, 1], r1 [2]; k1 r1 takes 3 and finishes (3, 2 released);
    # k2 r0's fifth token takes block 3, the front of the queue.
    assert [f.counts["internal_fragmentation"] for f in paged.frames] == [1, 1, 1]
    assert [f.counts["free"] for f in paged.frames] == [2, 0, 2]
    assert paged.frames[-1].segments == (
        MapSegment(0, 4, "token_states", "r0"), MapSegment(4, 2, "free", None),
        MapSegment(6, 1, "token_states", "r0"), MapSegment(7, 1, "internal_fragmentation", "r0"))
    assert paged.preemptions == 0


def test_map_rows_group_slots_by_their_dominant_state() -> None:
    oracle = replay_maps(trace([0.0, 0.0], [2, 1], [3, 2]), "oracle", 8)
    first = oracle.frames[0]
    assert first.segments == (
        MapSegment(0, 3, "token_states", "r0"), MapSegment(3, 2, "reservation", "r0"),
        MapSegment(5, 2, "token_states", "r1"), MapSegment(7, 1, "reservation", "r1"))
    exact, stride = views.map_segments(oracle)
    assert stride == 1 and len(exact) == 4 + 3 + 2   # the frames hold 4, 3, 2 runs
    # Rows of 2 slots: a tie goes to the state listed first (token states), whose
    # first slot names the owner: slots 4-5 are half r0's reservation, half r1's tokens.
    rows, _ = views.map_segments(oracle, max_rows=4)
    col = rows[rows["iteration"] == 0]
    assert col[["start", "end", "kind", "owner"]].values.tolist() == [
        [0, 4, "token states", "r0"], [4, 8, "token states", "r1"]]


def test_snapshots_thin_out_evenly_and_keep_every_count() -> None:
    t = small_trace("alpaca", 40, 20.0, 0, 256)
    full = replay_maps(t, "paged", 768, max_len=256)
    thin = replay_maps(t, "paged", 768, max_len=256, max_snapshots=10)
    # 310 busy iterations (5..314): a budget of 256 keeps every 2nd; one of 10 every 32nd.
    assert len(full.frames) == 310
    assert full.snapshot_every == 2 and thin.snapshot_every == 32
    kept = [f.iteration for f in thin.frames if f.segments is not None]
    assert kept == list(range(32, 315, 32))
    # Thinning drops pictures, never the counts the averages come from.
    assert thin.breakdown() == full.breakdown()
    same = {f.iteration: f.segments for f in full.frames if f.segments is not None}
    assert all(same[f.iteration] == f.segments for f in thin.frames if f.segments is not None)


def test_replay_counts_external_fragmentation_while_the_head_waits() -> None:
    # Two requests of final length 5 in 8 slots: the second waits for the first, but
    # the 3 free slots could not hold its 5 even in one piece: free, not fragmentation.
    oracle = replay_maps(trace([0.0, 0.0], [1, 1], [4, 4]), "oracle", 8)
    assert [f.waiting for f in oracle.frames] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert [f.counts["external_fragmentation"] for f in oracle.frames] == [0] * 8
    assert oracle.breakdown() == pytest.approx({
        "token_states": 28 / 64, "reservation": 12 / 64, "internal_fragmentation": 0.0,
        "external_fragmentation": 0.0, "free": 24 / 64}, abs=1e-15)
    # Regions of 3, 4 and 3 fill 10 slots; the two of 3 end in the first iteration,
    # leaving 6 free in two holes of 3 while the fourth request waits for 5: external
    # fragmentation until the region of 4 ends.
    split = replay_maps(trace([0.0] * 4, [2, 1, 2, 4], [1, 3, 1, 1]), "oracle", 10)
    assert [f.waiting for f in split.frames] == [1, 1, 1, 0]
    assert [f.counts["external_fragmentation"] for f in split.frames] == [0, 6, 6, 0]
    assert split.breakdown()["external_fragmentation"] == pytest.approx(12 / 40)
    # Every frame's segments tile the arena exactly once.
    for f in oracle.frames:
        assert f.segments is not None
        assert sum(s.length for s in f.segments) == 8
        assert [s.start for s in f.segments] == sorted(s.start for s in f.segments)


@pytest.mark.parametrize(("workload", "rate", "capacity", "max_len", "block_size"), [
    ("alpaca", 20.0, 768, 256, 16),
    ("alpaca", 20.0, 300, 200, 1),     # block size 1, many preemptions
    ("sharegpt", 8.0, 1024, 512, 32),
])
def test_replay_agrees_exactly_with_the_simulator(workload: str, rate: float, capacity: int,
                                                  max_len: int, block_size: int) -> None:
    t = small_trace(workload, 30, rate, 0, max_len)
    for policy in ("max", "pow2", "oracle", "paged"):
        r = replay_maps(t, policy, capacity, block_size=block_size, max_len=max_len)
        s = simulate(t, SimConfig(policy, capacity, block_size, max_len))  # type: ignore[arg-type]
        assert r.breakdown() == pytest.approx(s.memory, abs=1e-12), policy
        assert r.mean_batch_size == pytest.approx(s.mean_batch_size, abs=1e-12)
        assert (r.max_batch_size, r.preemptions, len(r.frames)) == (
            s.max_batch_size, s.preemptions, s.iterations)


def test_default_small_workload_orders_like_figure_2_and_is_seeded() -> None:
    t = small_trace("alpaca", 40, 20.0, 0, 256)
    share = {p: replay_maps(t, p, 768, max_len=256).breakdown()["token_states"]
             for p in ("max", "pow2", "oracle", "paged")}
    assert share["max"] < share["pow2"] < share["oracle"] < share["paged"]
    again = replay_maps(small_trace("alpaca", 40, 20.0, 0, 256), "paged", 768, max_len=256)
    assert again == replay_maps(t, "paged", 768, max_len=256)


def test_small_trace_cuts_requests_at_the_maximum_length() -> None:
    t = small_trace("sharegpt", 50, 4.0, 3, 128)
    assert t.final_len.max() <= 128 and t.prompt_len.max() <= 127
    assert t.output_len.min() >= 1
    with pytest.raises(PagedLabError, match="integer >= 2"):
        small_trace("alpaca", 10, 4.0, 0, 1)
    with pytest.raises(PagedLabError, match="at most 200 requests"):
        small_trace("alpaca", 201, 4.0, 0, 256)


def test_replay_refuses_what_it_cannot_draw() -> None:
    t = small_trace("alpaca", 10, 20.0, 0, 256)
    with pytest.raises(PagedLabError, match="longest request"):
        replay_maps(t, "paged", 64, block_size=16, max_len=256)
    with pytest.raises(PagedLabError, match="at most 8,192 slots"):
        replay_maps(t, "oracle", 10_000)
    with pytest.raises(PagedLabError, match="policy"):
        replay_maps(t, "first-fit", 768)


def test_map_frames_tile_memory_and_stay_under_the_row_limit() -> None:
    t = small_trace("alpaca", 40, 20.0, 0, 256)
    r = replay_maps(t, "paged", 768, block_size=1, max_len=256)
    segs, stride = views.map_segments(r, max_rects=4500)
    assert len(segs) <= 4500
    assert stride > 1
    per_column = segs.groupby("iteration")["slots"].sum()
    assert (per_column == 768).all()
    fr = views.map_fractions(r, stride)
    assert np.allclose(fr.groupby("iteration")["fraction"].sum(), 1.0)
    # Altair refuses more than 5000 rows unless told otherwise: the chart must build.
    spec = charts.memory_map(segs, "paged", 768, (0, 500)).to_dict()
    assert spec["encoding"]["y2"] == {"field": "end"}


# ---- simulator tables ----------------------------------------------------------------------


def test_breakdown_table_and_gain_sentence() -> None:
    results = [simulate_workload("sharegpt", SimConfig(p), requests=300, rate=4.0, seed=0)
               for p in ("paged", "max", "pow2", "oracle")]
    df = views.breakdown_table(results).set_index("measure")
    assert df.columns.tolist() == ["max", "pow2", "oracle", "paged"]
    assert df.loc["paper: token states"].tolist() == [
        "20.4% (Orca)", "26.8% (Orca)", "38.2% (Orca)", "96.3% (vLLM)"]
    by = {r.policy: r for r in results}
    assert df.loc["token states", "paged"] == percent(by["paged"].memory["token_states"])
    # Figure 2's measure leaves free memory out: under this load paging holds tokens in
    # over 95% of what it holds, as the paper's 96.3%, the contiguous policies far less.
    for policy, r in by.items():
        assert df.loc[views.HELD_ROW, policy] == percent(
            r.memory["token_states"] / (1 - r.memory["free"]))
    held = [views.held_token_share(by[p]) for p in ("max", "pow2", "oracle", "paged")]
    assert held == sorted(held) and held[-1] > 0.95 and held[2] < 0.6
    # Short enough for a 100 px column: the column's name says which policy.
    assert df.loc["memory"].tolist() == ["contiguous"] * 3 + ["paged"]
    # The five shares of each policy add up to its whole memory.
    shares = ["token states", "reservation", "internal fragmentation", "external fragmentation",
              "free"]
    for policy in df.columns:
        total = sum(float(df.loc[k, policy].rstrip("%")) for k in shares)
        assert total == pytest.approx(100, abs=0.3)
    m = views.policy_metrics(results)
    shares = m["token states"].tolist()
    assert shares == sorted(shares)        # Figure 2's order: max < pow2 < oracle < paged
    assert m["mean batch size"].idxmax() == 3
    gain = by["paged"].mean_batch_size / by["max"].mean_batch_size
    assert f"{tenths(gain)}x max" in views.batch_gain_sentence(results)
    long = views.memory_long(results)
    assert np.allclose(long.groupby("policy")["fraction"].sum(), 1.0)
    assert views.batch_gain_sentence([by["max"]]) == ""
    # Loaded, every policy uses most of its memory: nothing to explain.
    assert max(r.memory["free"] for r in results) <= views.MOSTLY_FREE
    assert views.free_memory_note(results) == ""
    # A trace that leaves memory idle: the low share is the load's, and the note says so.
    light = [simulate_workload("alpaca", SimConfig(p), requests=50) for p in ("max", "paged")]
    most = max(light, key=lambda r: r.memory["free"])
    note = views.free_memory_note(light)
    assert note.startswith(f"Free memory counts in these shares: {most.policy} left "
                           f"{percent(most.memory['free'])} of its memory free on average, "
                           "so its token-state share is low because this trace did not need")
    # Free memory while requests often waited for it (long prompts at the queue's head)
    # was not left free for want of work: the note says what held them back instead.
    code = workload_trace("azure-code", requests=300)
    queued = [simulate(code, SimConfig(p, capacity_tokens=10_000)) for p in ("oracle", "paged")]
    paged = queued[1]
    assert paged.memory["free"] > views.MOSTLY_FREE
    waited = paged.memory_wait_iterations / paged.iterations
    assert waited >= views.OFTEN_WAITED
    note = views.free_memory_note(queued)
    assert note.startswith(f"Free memory counts in these shares: paged left "
                           f"{percent(paged.memory['free'])} of its memory free on average, "
                           f"yet in {percent(waited)} of its busy iterations requests waited "
                           "for memory: the next in line needed more blocks than admission "
                           "could give it (those free, less the watermark kept back)")
    assert "did not need" not in note
    # Contiguous memory's free slots are free only while nobody waits for them (those a
    # waiting request cannot use are external fragmentation): its note is the load's.
    contiguous = [simulate(code, SimConfig(p, capacity_tokens=20_000, max_len=8192))
                  for p in ("max", "pow2", "oracle")]
    most = max(contiguous, key=lambda r: r.memory["free"])
    assert most.memory["free"] > views.MOSTLY_FREE
    assert most.memory_wait_iterations / most.iterations >= views.OFTEN_WAITED
    assert "because this trace did not need the memory" in views.free_memory_note(contiguous)
    # A token budget of one token an iteration: the batch, not the load, kept memory free,
    # and a higher rate would only lengthen the queue.
    starved = [simulate_workload("alpaca", SimConfig("paged", max_num_batched_tokens=1),
                                 requests=30)]
    note = views.free_memory_note(starved)
    assert "while its batch was held at the scheduler budget (max_num_batched_tokens 1, " \
           "reached)" in note, note
    assert "because this trace did not need" not in note and "higher rate" not in note


def test_a_mean_batch_reads_alike_in_the_sentence_and_on_its_bar() -> None:
    # 1.25 is an exact half: Python's own formatting reads 1.2, the browser's 1.3. The
    # sentence and the bar's label (written server-side, with its tooltip) say the same.
    paged, pow2 = (replace(simulate_workload("alpaca", SimConfig(p), requests=20),
                           mean_batch_size=b) for p, b in (("paged", 1.25), ("pow2", 1.0)))
    assert views.batch_gain_sentence([paged, pow2]) == (
        "Paged memory ran a mean batch of 1.3 requests: 1.3x pow2.")
    spec = charts.policy_bars(views.policy_metrics([paged, pow2]), "mean batch size",
                              "Mean batch size").to_dict()
    labels = {row["policy"]: row["mean batch size label"]
              for row in next(iter(spec["datasets"].values()))}
    assert labels == {"paged": "1.3", "pow2": "1.0"}
    assert spec["layer"][1]["encoding"]["text"]["field"] == "mean batch size label"
    assert spec["layer"][0]["encoding"]["tooltip"][1]["field"] == "mean batch size label"
    assert "paged 1.3" in spec["description"]


def test_the_max_batch_row_is_each_policys_largest_batch() -> None:
    """The breakdown's "max batch" row is the largest batch each policy ran (7 for max,
    20 for the others on this light trace), not its mean rounded (5 and 6), which read
    as if no policy ever ran more than its average."""
    results = [simulate_workload("alpaca", SimConfig(p), requests=50, rate=8.0)
               for p in ("paged", "max", "pow2", "oracle")]
    by = {r.policy: r for r in results}
    assert all(r.max_batch_size != round(r.mean_batch_size) for r in results)
    df = views.breakdown_table(results).set_index("measure")
    assert df.loc["max batch"].tolist() == [f"{by[p].max_batch_size:,}"
                                            for p in ("max", "pow2", "oracle", "paged")]
    assert df.loc["max batch"].tolist() == ["7", "20", "20", "20"]
    assert df.loc["mean batch"].tolist() == [f"{by[p].mean_batch_size:.2f}"
                                             for p in ("max", "pow2", "oracle", "paged")]


def test_a_batch_that_reached_max_num_seqs_is_said_held_at_the_budget() -> None:
    """With max_num_seqs 4, a light trace ran batches of 4 at most, exactly the budget,
    and left most memory free: the budget held the batch, and the note names it. Taken
    as reached only past the budget (which no batch goes), the note blamed the load and
    advised a higher rate, which would only lengthen the queue."""
    capped = simulate_workload("alpaca", SimConfig("paged", max_num_seqs=4), requests=30)
    assert (capped.max_num_seqs, capped.max_batch_size) == (4, 4)
    assert capped.memory["free"] > views.MOSTLY_FREE
    note = views.free_memory_note([capped])
    assert ("while its batch was held at the scheduler budget (max_num_seqs 4, reached)"
            in note), note
    assert "higher rate" not in note
    # A budget the batch never reached is not named.
    roomy = simulate_workload("alpaca", SimConfig("paged", max_num_seqs=64), requests=30)
    assert roomy.max_batch_size < 64
    assert "max_num_seqs" not in views.free_memory_note([roomy])


# ---- block size ------------------------------------------------------------------------------


def test_block_sweep_by_hand() -> None:
    # One request, prompt 2, final 5: it holds 3, 4, 5 tokens.
    one, two, four = block_size_sweep(np.array([2]), np.array([5]), (1, 2, 4))
    assert (one.tail_waste_share, one.mean_table_entries, one.mean_live_entries) == (0.0, 5, 4)
    # Blocks of 2: 4 + 4 + 6 slots for 3 + 4 + 5 tokens.
    assert two.tail_waste_share == pytest.approx(2 / 14)
    assert (two.mean_tail_slots, two.mean_table_entries) == (1.0, 3.0)
    assert two.mean_live_entries == pytest.approx(7 / 3)
    # Blocks of 4: 4 + 4 + 8 slots.
    assert four.tail_waste_share == pytest.approx(4 / 16)
    assert (four.mean_tail_slots, four.max_table_entries) == (3.0, 2)
    assert tables.block_tradeoff_sentence([one, two, four], (1, 2, 4)) == (
        "block size 1: 0.0% tail waste, 5.0 table entries per request at its end; "
        "block size 2: 14.3% tail waste, 3.0 table entries per request at its end; "
        "block size 4: 25.0% tail waste, 2.0 table entries per request at its end.")


def test_block_sweep_closed_form_matches_a_direct_count() -> None:
    rng = np.random.default_rng(5)
    p = rng.integers(1, 300, 40)
    f = p + rng.integers(1, 300, 40)
    for point in block_size_sweep(p, f, (1, 3, 16, 256)):
        b = point.block_size
        alloc = sum(-(-t // b) * b for pi, fi in zip(p, f, strict=True)
                    for t in range(pi + 1, fi + 1))
        toks = sum(t for pi, fi in zip(p, f, strict=True) for t in range(pi + 1, fi + 1))
        assert point.tail_waste_share == pytest.approx((alloc - toks) / alloc, abs=1e-12)


def test_block_sweep_trends_and_errors() -> None:
    points = trace_block_sweep("sharegpt", 500, 0)
    waste = [p.tail_waste_share for p in points]
    entries = [p.mean_table_entries for p in points]
    assert waste == sorted(waste) and waste[0] == 0.0
    assert entries == sorted(entries, reverse=True)
    assert all(p.mean_tail_slots < p.block_size for p in points)
    df = tables.block_sweep_frame(points)
    assert df["block size"].tolist() == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    with pytest.raises(PagedLabError, match="output token"):
        block_size_sweep(np.array([3]), np.array([3]))
    with pytest.raises(PagedLabError, match=r"1\.\.256"):
        block_size_sweep(np.array([1]), np.array([3]), (512,))


def test_the_simulators_fragmentation_names_its_base_beside_the_tables() -> None:
    # The table's tail waste is a share of the slots allocated; the simulator's internal
    # fragmentation a share of the whole capacity. Unnamed, 21.4% and 19.9% for block
    # size 256 read as one figure given twice, and wrong once.
    runs = [simulate_workload("alpaca", SimConfig("paged", 2048, bs), requests=60, rate=50.0)
            for bs in (256, 16)]
    small, large = runs[1], runs[0]
    assert tables.block_batch_sentence(runs) == (
        f"In the simulator, block size 16: mean batch {small.mean_batch_size:.1f}, "
        f"{percent(small.memory['internal_fragmentation'])} of the KV capacity lost to "
        f"internal fragmentation; block size 256: mean batch {large.mean_batch_size:.1f}, "
        f"{percent(large.memory['internal_fragmentation'])} of the KV capacity lost to "
        "internal fragmentation (time-averaged over the run; the table's tail waste is a "
        "share of the slots allocated, averaged over each request's life, so the two "
        "differ).")
    assert "internal fragmentation of capacity" in tables.block_batch_frame(runs).columns


# ---- sharing and the calculator ---------------------------------------------------------------


def test_sharing_sentence_and_frame() -> None:
    def result(kind: str, n: int, used: int) -> SharingResult:
        low, high = (0.061, 0.098) if kind == "parallel" else (0.376, 0.552)
        t = SharingTrace(10, used, 100, n, used, 100)
        return SharingResult(kind, n, 16, 5, t.saved_fraction, t, low, high)

    results = [result("parallel", 2, 97), result("parallel", 6, 92),
               result("beam", 2, 60), result("beam", 6, 40)]
    assert tables.sharing_sentence(results) == (
        "Parallel sampling (2, 6) saved 3.0% to 8.0% of block memory (paper: 6.1% to 9.8%); "
        "beam search (2, 6) saved 40.0% to 60.0% of block memory (paper: 37.6% to 55.2%).")
    df = tables.sharing_frame(results)
    assert df["paper range"].tolist()[0] == "6.1% - 9.8%"
    assert df["saved"].tolist() == pytest.approx([0.03, 0.08, 0.40, 0.60])
    # The columns it is computed from are shown beside it.
    assert (1 - df["block-steps held"] / df["block-steps unshared"]).tolist() == \
        pytest.approx(df["saved"].tolist())


def test_memory_calculator_tables() -> None:
    assert tables.human_bytes(819_200) == "800 KiB"
    assert tables.human_bytes(1536) == "1.5 KiB"
    assert tables.human_bytes(7) == "7 B"
    models = tables.models_frame().set_index("model")
    assert models.loc["OPT-13B", "bytes per token"] == 819_200
    assert models.loc["OPT-13B", "per 16-token block"] == "12.5 MiB"
    # 40 GiB - 10% - 26 GB of weights = 12,654,705,664 bytes of KV.
    cap = kv_capacity("OPT-13B", 40)
    assert cap.kv_bytes == 12_654_705_664
    df = tables.capacity_blocks_frame(cap).set_index("block size")
    assert df.loc[16, "blocks"] == 965          # 12,654,705,664 // 13,107,200
    assert df.loc[16, "KV tokens"] == 15_440
    assert df.loc[16, "requests that fit"] == 7  # 965 // 128 blocks per 2048 tokens


def test_every_chart_builds() -> None:
    ex = seed_example()
    arena = seed_views.seed_arena_slots(ex)
    strip = charts.slot_strip(arena, "arena").to_dict()
    # 34 px a stage in pixels, fitting only the column's width: a step height under
    # Streamlit's "fit" makes Vega-Lite warn on every draw, and a pixel height under "fit"
    # would hold the legend and axes too and squeeze the rows.
    assert strip["height"] == 34 * arena["stage"].nunique()
    assert strip["autosize"] == {"type": "fit-x", "contains": "padding"}
    points = trace_block_sweep("alpaca", 100, 0)
    sweep = tables.block_sweep_frame(points)
    # Every field the chart encodes is a column of its frame (a renamed column would
    # leave an axis empty, silently).
    assert _fields(charts.block_sweep_lines(sweep).to_dict()) <= set(sweep.columns)
    # The log axis of table entries ticks at 1, 2, 5, 10, ... around the figures shown.
    ticks = charts.block_sweep_lines(sweep).to_dict()["hconcat"][1]["encoding"]["y"]["axis"]
    entries = sweep["table entries at finish"]
    assert set(ticks["values"]) <= {m * 10**e for e in range(-1, 8) for m in (1, 2, 5)}
    assert min(ticks["values"]) <= entries.min() and max(ticks["values"]) >= entries.max()
    results = [simulate_workload("alpaca", SimConfig(p), requests=50) for p in ("max", "paged")]
    long = views.memory_long(results)
    bars = charts.breakdown_bars(long).to_dict()
    assert _fields(bars) <= set(long.columns)
    assert bars["height"] == 34 * 2 and bars["autosize"]["type"] == "fit-x"
    m = views.policy_metrics(results)
    spec = charts.policy_bars(m, "token states", "Token-state share", percent=True,
                              paper_field="paper token states").to_dict()
    # Bars, labels above bars too short to hold one (here both), the paper's ticks: no
    # label layer that labels nothing (Vega-Lite warns of its empty extent).
    assert [x["mark"]["type"] for x in spec["layer"]] == ["bar", "text", "tick"]
    both = pd.DataFrame({"policy": ["max", "paged"], "share": [0.05, 0.9],
                         "paper": [0.204, 0.963]})
    spec = charts.policy_bars(both, "share", "Share", percent=True,
                              paper_field="paper").to_dict()
    # One label at the foot of the tall bar, in white; one above the short one.
    assert [x["mark"]["type"] for x in spec["layer"]] == ["bar", "text", "text", "tick"]
    assert [x["transform"][0]["filter"] for x in spec["layer"][1:3]] == [
        "datum['share'] >= 0.11556", "datum['share'] < 0.11556"]
    batch = tables.block_batch_frame(results[1:])
    assert _fields(charts.block_batch_line(batch).to_dict()) <= set(batch.columns)
    sharing = [SharingResult("beam", 2, 16, 1, 0.5, SharingTrace(1, 1, 2, 0, 1, 2), 0.376,
                             0.552)]
    shared = tables.sharing_frame(sharing)
    assert _fields(charts.sharing_bars(shared).to_dict()) <= set(shared.columns)
    color = charts.memory_map(views.map_segments(replay_maps(
        small_trace("alpaca", 5, 20.0, 0, 64), "oracle", 256, max_len=64))[0],
        "m", 256, (0, 10)).to_dict()["encoding"]["color"]
    assert color["scale"]["domain"] == ["token states", "reservation", "internal fragmentation",
                                        "external fragmentation", "free"]


def test_swap_or_recompute_table_and_words_from_hand_built_runs() -> None:
    def run(bs: int, mode: str, swapped: int = 0, swap_ms: float = 0.0,
            rec_ms: float = 0.0) -> PreemptionRun:
        return PreemptionRun(bs, mode, 64, 20, 10.0, 0 if mode == "roomy" else 3,
                             40 if mode == "recompute" else 0, rec_ms, swapped, swap_ms, True)

    runs = [run(1, "roomy"), run(1, "recompute", rec_ms=5.0),
            run(1, "swap", swapped=100, swap_ms=0.5), run(4, "roomy"),
            run(4, "recompute", rec_ms=5.0), run(4, "swap", swapped=25, swap_ms=9.0)]
    df = swap_recompute.runs_frame(runs)
    per = df["µs per block"]
    # Only a run that swapped has a cost per block; the others are empty cells, not "None".
    assert per.dtype == float and per.isna().tolist() == [True, True, False, True, True, False]
    assert per[2] == 5.0 and per[5] == 360.0
    said = swap_recompute.summary(runs, "cpu")
    assert "Swapping copied 100 blocks at block size 1 and 25 at 4: 5.0 µs per block " in said
    assert said.startswith("Both methods made the same decisions, preempting the same "
                           "requests at the same steps at every block size (3 preemptions at "
                           "block size 1); ")
    # As many preemptions in as many steps, but of other requests: not the same decisions.
    other = dataclasses.replace(runs[2], preempted=((3, "r1"), (5, "r0"), (7, "r2")))
    rec = dataclasses.replace(runs[1], preempted=((3, "r0"), (5, "r1"), (7, "r2")))
    assert swap_recompute.summary([runs[0], rec, other, *runs[3:]], "cpu").startswith(
        "The two methods' runs took different decisions; ")
    # The paper's point is per slot moved: said only where these runs show it.
    assert ("or 5.00 µs per token slot against 90.00 µs. Per slot moved, small blocks did "
            "not cost more here, unlike the paper's finding. ") in said
    cheap = swap_recompute.summary([*runs[:5], run(4, "swap", swapped=25, swap_ms=0.1)], "cpu")
    # One block size swapped: its figures, and no verdict drawn from one point.
    alone = swap_recompute.summary([*runs[:5], run(4, "swap")], "cpu")
    assert ("Swapping copied 100 blocks, only at block size 1: 5.0 µs per block, 5.00 µs "
            "per token slot. ") in alone and "Per slot moved" not in alone
    assert ("or 5.00 µs per token slot against 1.00 µs. Per slot moved, small blocks cost "
            "more: each copy's fixed overhead weighs most at small blocks") in cheap
    assert ("Swapping spent less time on its preemptions than recomputing did at block "
            "size 1 (the runs' wall times include everything else). ") in said
    # Judged over every size that swapped: ends that agree with the paper and a size
    # between that does not are told with every figure, not as the paper's point.
    between = [run(16, "roomy"), run(16, "recompute", rec_ms=5.0),
               run(16, "swap", swapped=10, swap_ms=0.8)]
    ordered = swap_recompute.summary([*runs[:3], *runs[3:5],
                                      run(4, "swap", swapped=25, swap_ms=0.1), *between],
                                     "cpu")
    assert ("or 5.00 µs per token slot against 5.00 µs. Per slot moved, small blocks did "
            "not cost more here") in ordered
    low_end = [run(16, "roomy"), run(16, "recompute", rec_ms=5.0),
               run(16, "swap", swapped=10, swap_ms=0.4)]
    told = swap_recompute.summary([*runs[:3], *runs[3:5],
                                   run(4, "swap", swapped=25, swap_ms=1.0), *low_end], "cpu")
    assert ("Per slot moved, the smallest block cost more than the largest, as in the paper, "
            "but not at every size between (5.00 µs at 1, 10.00 µs at 4, 2.50 µs at 16): "
            "copies this short are timed with noise. ") in told
    assert "the paper's point" not in told
    said = swap_recompute.summary([*runs[:3], run(4, "recompute", rec_ms=50.0), runs[5]], "cpu")
    assert "than recomputing did at block sizes 1, 4 (the runs' wall times" in said
    # Recomputation's cost per token, as measured at every size, not as the paper says.
    said = swap_recompute.summary(runs, "cpu")
    assert ("Recomputation re-prefilled 40 tokens at block size 1 and 40 at 4; µs per token: "
            "125.0 at 1, 125.0 at 4. About the same at every size (the highest 1.00× the "
            "lowest, under 1.5×), as the paper's flat cost. ") in said
    said = swap_recompute.summary([*runs[:3], run(4, "recompute", rec_ms=50.0), runs[5]], "cpu")
    assert ("µs per token: 125.0 at 1, 1250.0 at 4. Not the same at every size here (the "
            "highest 10.0× the lowest; each is one timed run). ") in said
    # A peak between the ends is not hidden by ends that agree.
    peak = swap_recompute.summary([*runs, run(16, "recompute", rec_ms=20.0),
                                   run(64, "recompute", rec_ms=5.0)], "cpu")
    assert ("µs per token: 125.0 at 1, 125.0 at 4, 500.0 at 16, 125.0 at 64. Not the same at "
            "every size here (the highest 4.0× the lowest") in peak
    assert "About the same" not in peak
    never = PreemptionRun(4, "recompute", 64, 20, 10.0, 0, 0, 0.0, 0, 0.0, True)
    only = swap_recompute.summary([*runs[:3], run(4, "roomy"), never, runs[5]], "cpu")
    assert "Recomputation re-prefilled 40 tokens, only at block size 1 (125.0 µs per token). " \
        in only
    # Times too short to measure are said so, not compared.
    untimed = swap_recompute.summary([*runs[:3], run(4, "roomy"), run(4, "recompute"),
                                      runs[5]], "cpu")
    assert ("µs per token: 125.0 at 1, 0.0 at 4. Too quick to time at block size 4, so the "
            "sizes are not compared. ") in untimed
    zero = swap_recompute.summary([run(1, "recompute"), run(1, "swap", swapped=10, swap_ms=1.0),
                                   run(4, "recompute"), run(4, "swap", swapped=5, swap_ms=1.0)],
                                  "cpu")
    assert ("µs per token: 0.0 at 1, 0.0 at 4. Too quick to time at block sizes 1, 4, so "
            "the sizes are not compared. ") in zero
    # 64 blocks hold 64 slots at block size 1 but 256 at 4: more than the 64 asked for.
    said = swap_recompute.summary(runs, "cpu", 64)
    assert ("To hold the longest request, with a block to spare, the pool took more than the "
            "64 slots asked for at block size 4 (256 slots). ") in said
    assert "took more than" not in swap_recompute.summary(runs, "cpu", 256)


def test_the_preemption_note_says_whether_this_paged_run_preempted() -> None:
    roomy = simulate_workload("alpaca", SimConfig("paged", capacity_tokens=1 << 16),
                              requests=30)
    tight = simulate_workload("sharegpt", SimConfig("paged", capacity_tokens=2048),
                              requests=60, rate=50.0)
    assert roomy.preemptions == 0 and tight.preemptions > 0
    assert preemptions.preemption_note([roomy]).endswith(
        "recomputed. In this run it never ran out (below: why).")
    assert preemptions.preemption_note([tight]).endswith(
        "recomputed (below: what sets each preemption off, and whom they hit).")
    contiguous = simulate_workload("alpaca", SimConfig("max"), requests=30)
    # Without a paged run, the all-zero bars are said as such, and what would show some.
    alone = preemptions.preemption_note([contiguous])
    assert alone.startswith("No contiguous policy preempts") and "Only paged" not in alone
    assert alone.endswith("add it to the policies to see it.")
    # With no preemption anywhere, the bars' scale still starts at the plot's foot.
    m = views.policy_metrics([contiguous, roomy])
    y = charts.policy_bars(m, "preemptions", "Preemptions", integer=True).to_dict()
    y = y["layer"][0]["encoding"]["y"]
    assert y["scale"] == {"domain": [0, 1]} and y["axis"]["values"] == [0, 1]


def test_the_control_sentence_says_what_its_logit_comparison_found() -> None:
    def report(positions: int, diff: float) -> ControlReport:
        return ControlReport((RequestComparison("A", [1, 2, 3], [1, 2, 3], None, positions,
                                                diff),), (), EngineConfig())

    start = "Same: all 3 tokens that both runs reached are identical in a control run"
    said = control_sentence(report(0, 0.0))
    assert said.startswith(start)
    assert said.endswith("The next-token logits were compared at no position: they are "
                         "compared after each operation, for the requests then running with "
                         "their prompt computed, so a request admitted and finished within "
                         "one operation (a step of several iterations) is never compared. "
                         "Identical tokens alone can miss a K/V difference too small to "
                         "change a token.")
    # Equal logits need no excuse of arithmetic order.
    assert control_sentence(report(2, 0.0)).endswith(
        "The next-token logits, compared at 2 positions, are exactly equal.")
    assert control_sentence(report(1, 0.0)).endswith(
        "The next-token logits, compared at 1 position, are exactly equal.")
    assert control_sentence(report(2, 3e-5)).endswith(
        "differ by at most 3.0e-05: float arithmetic in another order (tolerance 1e-03).")


def _fields(spec: object) -> set[str]:
    """The data fields an Altair spec's encodings name, anywhere in it."""
    if isinstance(spec, dict):
        own = {spec["field"]} if isinstance(spec.get("field"), str) else set()
        return own.union(*(_fields(v) for k, v in spec.items() if k != "datasets"))
    if isinstance(spec, list):
        return set().union(*(_fields(v) for v in spec))
    return set()


def test_the_finish_sentence_writes_its_counts_as_the_page_does() -> None:
    from types import SimpleNamespace

    def run(iteration: int, preemptions: int, policy: str) -> Any:
        return SimpleNamespace(frames=[SimpleNamespace(iteration=iteration)],
                               mean_batch_size=2.5, preemptions=preemptions, policy=policy)

    assert views.finish_sentence(run(2623, 1, "max"), run(614, 34, "paged")) == (
        "The last request finished in iteration 2,623 (mean batch 2.5, 1 preemption) in "
        "contiguous memory (max) and in iteration 614 (mean batch 2.5, 34 preemptions) in "
        "paged memory.")
