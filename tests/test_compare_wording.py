"""The "Contiguous vs paged" page says what its numbers show: Figure 13's ordering compared
as shown, the memory note and the preemption story only where the run bears them out, rates,
scales, sizes and counts written to be read, chart axes with sensible ticks, and inputs that
stop a button saying why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from backend.lab import deployment as dep
from backend.lab.memory_calc import MODELS, binary_size
from backend.lab.sim.simulator import SimConfig, SimResult, simulate_run
from backend.lab.traces import recorded_trace, replay_trace
from backend.lab.workloads import Trace, make_trace
from backend.views.compare import charts, preemptions, tables
from backend.views.compare import deployment as dep_views
from backend.views.compare.frames import STATES_NOTE
from backend.views.compare.timeline import timeline_chart, timeline_frame
from tests.compare_support import CALCULATOR, SHARING, SIMULATOR, SWAP, open_tab, start


@pytest.fixture(scope="module")
def four() -> list[SimResult]:
    """One result per policy (their mean batches are set per test)."""
    return [simulate_run(make_trace("alpaca", 30, 4.0), SimConfig(p)).result
            for p in ("max", "pow2", "oracle", "paged")]


def batches(results: list[SimResult], *values: float) -> list[SimResult]:
    return [replace(r, mean_batch_size=v) for r, v in zip(results, values, strict=True)]


# ---- defect 1: Figure 13 compared as shown ------------------------------------------


def test_equal_batches_are_said_equal_not_ordered(four: list[SimResult]) -> None:
    # The real-deployment tab at time scale 1: every policy batched 29.132...
    same = dep_views.figure13_sentence(batches(four, 29.132, 29.132, 29.132, 29.132))
    assert same.startswith("Mean batched requests: Orca (Max) 29.1 = Orca (Pow2) 29.1 = "
                           "Orca (Oracle) 29.1 = vLLM 29.1: equal, so memory is not the "
                           "limit at this load")
    assert "<" not in same and "NOT" not in same
    # Values that differ below the shown precision are equal as shown, not ordered.
    near = batches(four, 29.13, 29.14, 29.12, 29.149)
    assert "<" not in dep_views.figure13_sentence(near)
    assert not dep_views.figure13_holds(near)


def test_each_pair_is_compared_as_it_is(four: list[SimResult]) -> None:
    held = batches(four, 109.3, 389.2, 514.7, 636.4)
    assert dep_views.figure13_holds(held)
    assert dep_views.figure13_sentence(held) == (
        "Mean batched requests: Orca (Max) 109.3 < Orca (Pow2) 389.2 < Orca (Oracle) 514.7 "
        "< vLLM 636.4: the direction of the paper's Figure 13.")
    # Bars within 5% of paged memory's are said to be close, with how often requests
    # waited for room under each policy (azure-code at time / 400: 121.5 < 123.5 < 124.1).
    close = [replace(r, memory_wait_iterations=w, iterations=1000) for r, w in
             zip(batches(four, 83.4, 121.5, 123.5, 124.1), (721, 392, 296, 246), strict=True)]
    assert dep_views.figure13_sentence(close) == (
        "Mean batched requests: Orca (Max) 83.4 < Orca (Pow2) 121.5 < Orca (Oracle) 123.5 "
        "< vLLM 124.1: the direction of the paper's Figure 13, but Orca (Pow2), Orca "
        "(Oracle) and vLLM lie within 2.1% of one another.")
    # Why, in a paragraph of its own (the ranking alone is bold on the page).
    assert dep_views.figure13_waits(close) == (
        "Requests waited for room in 72.1% of the busy iterations under Orca (Max), 39.2% "
        "under Orca (Pow2), 29.6% under Orca (Oracle) and 24.6% under vLLM: only there can "
        "memory hold a batch back, and in the other iterations every request that had "
        "arrived was running, whatever the policy, so the means differ little (below: why "
        "the gaps are small on this trace).")
    assert dep_views.figure13_waits(held) == ""
    backwards = dep_views.figure13_sentence(batches(four, 50.0, 40.0, 60.0, 70.0))
    assert backwards == ("Mean batched requests: Orca (Max) 50.0 > Orca (Pow2) 40.0 < "
                         "Orca (Oracle) 60.0 < vLLM 70.0: NOT the direction of the paper's "
                         "Figure 13.")
    # Only Orca (Max) limited by memory (azure-conv, time / 5): the others level.
    level = dep_views.figure13_sentence(batches(four, 108.48, 142.73, 142.73, 142.73))
    assert level.startswith("Mean batched requests: Orca (Max) 108.5 < Orca (Pow2) 142.7 = "
                            "Orca (Oracle) 142.7 = vLLM 142.7: the paper's direction where "
                            "the values differ, but Orca (Pow2), Orca (Oracle) and vLLM batch "
                            "the same")
    assert "NOT" not in level
    # An exact half (1.25, 1.3 as shown) and 1.3 read the same in the sentence, on the
    # bars' labels and in the chart's description: halves up, written server-side.
    tie = batches(four, 1.0, 1.25, 1.3, 2.0)
    assert "Orca (Pow2) 1.3 = Orca (Oracle) 1.3" in dep_views.figure13_sentence(tie)
    spec = dep_views.figure13_chart(dep_views.figure13_frame(tie)).to_dict()
    labels = [row["label"] for row in next(iter(spec["datasets"].values()))]
    assert labels == ["1.0", "1.3", "1.3", "2.0"]
    assert spec["layer"][1]["encoding"]["text"]["field"] == "label"
    assert "Orca (Pow2) 1.3, Orca (Oracle) 1.3" in spec["description"]


def test_the_length_note_says_memory_was_full_only_where_it_filled() -> None:
    light = dep.deployment("azure-conv", time_scale=1.0, requests=400)
    runs = [simulate_run(light.trace, c) for c in light.configs()]
    note = dep_views.length_note(light, runs)
    assert "memory never filled" in note and "Once memory is full" not in note
    assert dep_views.memory_filled(runs) == []
    heavy = dep.deployment("azure-conv", time_scale=200.0, requests=3000)
    runs = [simulate_run(heavy.trace, c) for c in heavy.configs()]
    filled = dep_views.memory_filled(runs)
    assert filled and "Orca (Max)" in filled
    said = dep_views.length_note(heavy, runs)
    assert "never filled" not in said
    assert ("Once memory is full" in said) == (len(filled) == 4)
    # No timeline, no claim either way.
    bare = [simulate_run(light.trace, c, timeline=False) for c in light.configs()]
    assert dep_views.memory_filled(bare) is None
    assert "memory" not in dep_views.length_note(light, bare).split("power of two.")[-1]


# ---- defect 2: the preemption story is true to the run ---------------------------------


def test_a_watermark_that_outlasts_the_gap_between_finishes_is_not_said_to_run_out() -> None:
    run = simulate_run(make_trace("sharegpt", 1000, 4.0), SimConfig("paged", watermark_blocks=96))
    r = run.result
    assert r.preemptions == 53
    story = preemptions.preemption_story(run)
    # Before: "the watermark lasts about 56 iterations before the newest request is pushed
    # out again: 0.05 preemptions per finished request", one a finish, which 53 are not.
    assert "pushed out again" not in story
    assert ("so the watermark lasts about 56 iterations, while a request finished every "
            "12.2 iterations on average: a finish usually frees blocks before the watermark "
            "is used up") in story
    assert ("The 53 preemptions fell in 53 of the 12,151 busy iterations: one preemption per "
            "19 finished requests.") in story


def test_no_watermark_has_no_duration() -> None:
    run = simulate_run(make_trace("sharegpt", 1000, 4.0), SimConfig("paged", watermark_blocks=0))
    story = preemptions.preemption_story(run)
    assert "lasts" not in story and "0 of 960 blocks kept free" not in story
    assert "(no block is kept free: a watermark of 0)" in story
    assert "1.41 preemptions per finished request" in story
    calm = simulate_run(make_trace("sharegpt", 200, 0.5), SimConfig("paged", watermark_blocks=0))
    assert preemptions.preemption_story(calm) == (
        "**No preemption.** The running requests always found a free block for their next "
        "token: admission kept no block back (a watermark of 0), yet a finish always freed "
        "blocks in time.")


def test_the_overloaded_story_still_tells_the_cycle() -> None:
    run = simulate_run(make_trace("sharegpt", 1000, 4.0), SimConfig("paged"))
    story = preemptions.preemption_story(run)
    assert ("so the watermark lasts about 5 iterations, and a request finished every 11.5 "
            "iterations on average: the watermark runs out first, and the newest request is "
            "pushed out again, about once per finish while a queue waits") in story
    assert "a queue waited in 81.2% of the iterations" in story
    # A rare preemption whose count does not follow the cycle gets no duration at all.
    rare = simulate_run(make_trace("sharegpt", 400, 1.0), SimConfig("paged"))
    said = preemptions.preemption_story(rare)
    assert rare.result.preemptions == 2
    assert "lasts" not in said and "one preemption per 200 finished requests" in said


# ---- defect 3: rates, scales, sizes and counts ------------------------------------------


@pytest.mark.parametrize(("rate", "shown"), [
    (5.5312, "5.53"), (276.18, "276"), (1027.4, "1,027"), (0.05531, "0.0553"), (4.0, "4"),
    (9.996, "10"), (2_566_395.2, "2,566,395")])
def test_rate_text(rate: float, shown: str) -> None:
    assert dep_views.rate_text(rate) == shown


@pytest.mark.parametrize(("scale", "said"), [
    (1.0, "not compressed"), (50.0, "compressed 50 times"), (2.5, "compressed 2.5 times"),
    (1e6, "compressed 1,000,000 times"), (0.01, "spread out 100 times"),
    (0.3, "spread out 3.33 times")])
def test_compression(scale: float, said: str) -> None:
    assert dep_views.compression(scale) == said


def test_the_deployment_sentence_reads_the_rate_as_the_simulator_does() -> None:
    d = dep.deployment("azure-conv", time_scale=1.0)
    words = dep_views.preset_sentence(d)
    assert "arrivals not compressed (mean 5.53 requests/s)" in words
    assert "1 request longer than the 8,192-token context left out" in words
    slow = dep_views.preset_sentence(dep.deployment("azure-conv", time_scale=0.01))
    assert "arrivals spread out 100 times (mean 0.0553 requests/s)" in slow
    fast = dep_views.preset_sentence(dep.deployment("azure-code", time_scale=1e6))
    assert "arrivals compressed 1,000,000 times" in fast and "e+" not in fast


@pytest.mark.parametrize(("n", "shown"), [
    (7, "7 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (819_200, "800 KiB"),
    (5_505_024, "5.25 MiB"), (2_752_512, "2.625 MiB"), (26_000_000_000, "24.2 GiB"),
    (12_654_705_664, "11.8 GiB")])
def test_binary_size(n: int, shown: str) -> None:
    assert binary_size(n) == shown


def test_gemma_block_is_not_rounded_down() -> None:
    block = MODELS["Gemma-2-9B"].kv_bytes_per_block(16)
    assert block == 5_505_024 and binary_size(block) == "5.25 MiB"


def calculator(at: AppTest, model: str, kv: int, length: int) -> AppTest:
    at.selectbox(key="cmp_calc_model").set_value(model)
    at.selectbox(key="cmp_calc_kv").set_value(kv)
    at.number_input(key="cmp_calc_len").set_value(length)
    return at.run()


def test_the_page_writes_counts_and_sizes_to_be_read() -> None:
    at = start(SHARING)
    # Sharing: the recording's machine, not "1 thread(s)".
    recorded = [c.value for c in at.caption if "instruction prompts" in c.value]
    assert len(recorded) == 1 and "thread(s)" not in recorded[0]
    assert "x86_64, 1 thread in" in recorded[0]
    calculator(open_tab(at, CALCULATOR), "Gemma-2-9B", 1, 1)
    assert not at.exception
    assert [m.label for m in at.metric if m.label.startswith("Requests of")] == [
        "Requests of 1 token"]
    says = "\n".join(m.value for m in at.markdown)
    assert "x 256 x 1 byte = **172,032 bytes per token (168 KiB)**" in says
    models = next(d.value for d in at.dataframe if "per 16-token block" in d.value.columns)
    assert models.set_index("model").loc["Gemma-2-9B", "per 16-token block"] == "2.625 MiB"
    blocks = next(d.value for d in at.dataframe if "per block" in d.value.columns)
    assert blocks.set_index("block size").loc[16, "per block"] == "2.625 MiB"
    # The model table's bytes are at the chosen dtype, and its caption says which.
    assert any(c.value.startswith("KV bytes at the KV dtype chosen above, fp8 (1 byte).")
               for c in at.caption)
    calculator(at, "Gemma-2-9B", 2, 2048)
    models = next(d.value for d in at.dataframe if "per 16-token block" in d.value.columns)
    assert models.set_index("model").loc["Gemma-2-9B", "per 16-token block"] == "5.25 MiB"
    assert any(c.value.startswith("KV bytes at the KV dtype chosen above, fp16 / bf16 "
                                  "(2 bytes).") for c in at.caption)
    assert "x 256 x 2 bytes = " in "\n".join(m.value for m in at.markdown)
    # Gemma's sliding window is said where its figures are: exact within the window,
    # and past it, how much less a request needs than the figures show.
    window = [c.value for c in at.caption if "attend only within the last 4,096" in c.value]
    assert len(window) == 1 and window[0].endswith("At 2,048 tokens, within the window, that "
                                                   "is exact.")
    calculator(at, "Gemma-2-9B", 2, 8192)
    assert any(c.value.endswith("At 8,192 tokens a request's K/V with the window is 0.75 of "
                                "what is shown ((21 x 8,192 + 21 x 4,096) / (42 x 8,192)).")
               for c in at.caption)
    assert any("Gemma-2-9B: every other layer attends within a 4096-token window" in c.value
               for c in at.caption if c.value.startswith("KV bytes at the KV dtype"))
    calculator(at, "OPT-13B", 2, 8192)
    assert not [c for c in at.caption if "attend only within" in c.value]


def test_the_requests_metric_says_it_is_slot_exact_beside_the_blocked_table() -> None:
    # Llama-3.1-70B, 80 GiB, 4-bit weights, fp8 KV, requests of 100 tokens: 2,565 by
    # dividing the KV tokens, 2,290 in whole 16-token blocks. Both are said, with why.
    at = open_tab(start(SHARING), CALCULATOR)
    at.number_input(key="cmp_calc_gpu").set_value(80.0)
    at.selectbox(key="cmp_calc_bits").set_value(4)
    calculator(at, "Llama-3.1-70B", 1, 100)
    assert not at.exception
    assert [m.value for m in at.metric if m.label == "Requests of 100 tokens"] == ["2,565"]
    blocks = next(d.value for d in at.dataframe if "per block" in d.value.columns)
    assert blocks.set_index("block size").loc[16, "requests that fit"] == 2290
    assert ("Slot-exact: 256,546 KV tokens ÷ 100 = 2,565 requests, with no block rounding. "
            "In blocks of 16 (the table's row) each request takes 7 whole blocks (12 slots "
            "of its last one empty) of 16,034, so 2,290 requests fit.") in [
                c.value for c in at.caption]


# ---- defect 4: chart axes -----------------------------------------------------------------


def test_equal_batches_get_a_readable_scale(four: list[SimResult]) -> None:
    flat = tables.block_batch_frame([replace(four[3], block_size=b, mean_batch_size=9.319595)
                                     for b in (1, 16, 256)])
    y = charts.block_batch_line(flat).to_dict()["encoding"]["y"]
    assert y["scale"] == {"domain": [9, 10]}
    assert y["axis"]["format"] == ",.2~f"
    apart = tables.block_batch_frame([replace(four[3], block_size=b, mean_batch_size=v)
                                      for b, v in ((1, 20.0), (256, 30.0))])
    assert charts.block_batch_line(apart).to_dict()["encoding"]["y"]["scale"] == {"zero": False}


def panels(chart: dict[str, Any]) -> list[dict[str, Any]]:
    return list(chart["vconcat"])


def test_a_light_traces_timeline_has_ticks_beyond_zero() -> None:
    # The page's 1,000 ShareGPT requests at 0.01/s: each point averages some 4,000
    # iterations, mostly idle, so every count's mean stays below one.
    run = simulate_run(make_trace("sharegpt", 1000, 0.01), SimConfig("paged"))
    assert run.timeline is not None
    df = timeline_frame(run.timeline)
    spec = timeline_chart(df, paged=True).to_dict()
    requests, blocks, tokens, preempted = panels(spec)
    for panel in (requests, tokens):
        assert panel["encoding"]["y"]["scale"] == {"domain": [0, 1]}
        assert panel["encoding"]["y"]["axis"]["format"] == ",d"
    # The blocks panel holds the whole pool: its own scale.
    assert "scale" not in blocks["encoding"]["y"]
    # Iteration numbers with thousands separators: the axis, the tooltips, the titles.
    assert requests["encoding"]["x"]["axis"]["format"] == ",d"
    tips = {t["field"]: t.get("format") for t in requests["encoding"]["tooltip"]}
    assert tips["iteration"] == ",d"
    per = -(-(int(df["iteration"].iloc[-1] - df["iteration"].iloc[0]) + 1) // 600)
    assert per >= 1000
    assert requests["title"]["text"] == "Requests"
    assert requests["title"]["subtitle"].startswith(f"(mean of {per:,} iterations per point")
    assert preempted["title"].startswith(f"Preemptions (per {per:,} iterations)")


def test_a_busy_timeline_keeps_its_own_scale() -> None:
    trace = Trace("hand", 1.0, 0, np.zeros(3), np.asarray([4, 4, 4], dtype=np.int64),
                  np.asarray([5, 5, 5], dtype=np.int64))
    run = simulate_run(trace, SimConfig("paged", 64, 4, watermark=0.0, iteration_s=1.0))
    assert run.timeline is not None
    requests = panels(timeline_chart(timeline_frame(run.timeline), paged=True).to_dict())[0]
    assert "scale" not in requests["encoding"]["y"]


# ---- defect 5: a disabled button says why ---------------------------------------------------


def test_swap_or_recompute_without_block_sizes_says_why() -> None:
    at = start(SWAP)
    captions = [c.value for c in at.caption]
    assert ("Press Run: 4 block sizes, three engine runs each; a bar shows their "
            "progress.") in captions
    at.multiselect(key="cmp_swap_sizes").set_value([]).run()
    assert not at.exception
    button = next(b for b in at.button if b.key == "cmp_swap_run")
    assert button.disabled
    captions = [c.value for c in at.caption]
    assert ("Choose at least one block size to run: each is run on the engine three times "
            "(never preempting, swapping, recomputing).") in captions
    assert not [c for c in captions if c.startswith("Press Run")]
    at.multiselect(key="cmp_swap_sizes").set_value([16]).run()
    assert any(c.value.startswith("Press Run: 1 block size, three") for c in at.caption)


def test_the_simulators_label_says_the_rate_as_the_deployment_tab_does() -> None:
    full = recorded_trace("azure-conv")
    assert dep_views.rate_text(full.rate) == "5.53"
    at = start(SIMULATOR, timeout=180)
    at.selectbox(key="cmp_sim_workload").set_value("azure-conv").run()
    at.number_input(key="cmp_sim_trace_requests_azure-conv").set_value(400)
    at.number_input(key="cmp_sim_time_scale").set_value(0.01)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    last = [c.value for c in at.caption if c.value.startswith("Last run")]
    slow = replay_trace(full, requests=400, time_scale=0.01)
    # Three significant digits, where two decimals read "0.03/s".
    assert len(last) == 1 and (f"(mean {dep_views.rate_text(slow.rate)}/s, time / 0.01)"
                               in last[0])
    assert "0.0" in dep_views.rate_text(slow.rate) and len(dep_views.rate_text(slow.rate)) > 4


def test_one_request_is_one_request_in_the_last_runs_caption() -> None:
    assert dep_views.synthetic_label("sharegpt", 1, 4.0, 0) == "sharegpt, 1 request at 4/s, seed 0"
    assert dep_views.synthetic_label("alpaca", 1000, 2.5, 7) == (
        "alpaca, 1,000 requests at 2.5/s, seed 7")
    at = start(SIMULATOR)
    at.number_input(key="cmp_sim_requests").set_value(1)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    last = [c.value for c in at.caption if c.value.startswith("Last run")]
    assert last and last[0].startswith("Last run: sharegpt, 1 request at 4/s, seed 0")


def test_the_states_note_defines_paged_internal_fragmentation_as_the_simulator_counts_it() -> None:
    """One request of exactly three blocks (17 + 31 = 48 tokens, blocks of 16) leaves no
    slot that never holds a token, yet the paged run counts internal fragmentation: the
    empty slots of its last block, which its next tokens fill. The note said "slots held
    that will never hold a token" for both memories."""
    one = Trace("one", 1.0, 0, np.array([0.0]), np.array([17]), np.array([31]))
    paged = simulate_run(one, SimConfig("paged", capacity_tokens=1024, block_size=16)).result
    oracle = simulate_run(one, SimConfig("oracle", capacity_tokens=1024)).result
    assert paged.memory["internal_fragmentation"] > 0 == paged.memory["reservation"]
    assert oracle.memory["internal_fragmentation"] == 0 < oracle.memory["reservation"]
    assert "which will never hold a token (contiguous)" in STATES_NOTE
    assert "which its next tokens may still fill (paged)" in STATES_NOTE


def test_no_waits_paragraph_under_bars_said_equal(four: list[SimResult]) -> None:
    """The waits paragraph explains bars that lie close; under a sentence saying every
    bar is equal (memory is not the limit) it read as a reason for a gap there is not."""
    equal = [replace(r, memory_wait_iterations=5, iterations=100)
             for r in batches(four, 29.132, 29.132, 29.132, 29.132)]
    assert "equal, so memory is not the limit" in dep_views.figure13_sentence(equal)
    assert dep_views.figure13_waits(equal) == ""


def test_the_output_share_is_of_the_tokens_a_request_holds_at_its_end() -> None:
    """azure-conv's outputs over prompt plus output tokens (over the prompts alone the
    page said 28.5% where 22.2% is right)."""
    d = dep.deployment("azure-conv", requests=300)
    out, prompt = int(d.trace.output_len.sum()), int(d.trace.prompt_len.sum())
    assert f"{100 * out / (out + prompt):.1f}%" == "22.2%"
    assert "the outputs are 22.2% of the tokens" in dep_views.length_note(d, [])
