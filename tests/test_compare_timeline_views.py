"""View models of the simulator's timeline, its preemption explanation and the deployment
preset: frames, binning, charts and sentences, on hand-checked runs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from backend.lab import deployment as dep
from backend.lab.sim.simulator import SimConfig, SimResult, simulate_run, simulate_workload
from backend.lab.workloads import Trace, make_trace
from backend.views.compare import deployment as dep_views
from backend.views.compare import preemptions
from backend.views.compare.timeline import binned, timeline_chart, timeline_frame


def hand_trace(prompts: list[int], outputs: list[int]) -> Trace:
    n = len(prompts)
    return Trace("hand", 1.0, 0, np.zeros(n), np.asarray(prompts, dtype=np.int64),
                 np.asarray(outputs, dtype=np.int64))


def test_timeline_frame_by_hand() -> None:
    # The hand-worked preemption of test_simulator: 4 blocks of 2, r1 preempted in it2.
    run = simulate_run(hand_trace([2, 2], [4, 3]),
                       SimConfig("paged", 8, 2, watermark=0.0, iteration_s=1.0))
    assert run.timeline is not None
    df = timeline_frame(run.timeline)
    assert df["iteration"].tolist() == [0, 1, 2, 3, 4]
    assert df["running"].tolist() == [2, 2, 1, 1, 1]
    assert df["waiting"].tolist() == [0, 0, 1, 1, 0]
    assert df["admitted"].tolist() == [2, 0, 0, 0, 1]
    assert df["prefill_tokens"].tolist() == [4, 0, 0, 0, 4]
    assert df["decode_tokens"].tolist() == [0, 2, 1, 1, 0]
    assert df["preemptions"].tolist() == [0, 0, 1, 0, 0]
    assert df["used_blocks"].tolist() == [4, 4, 3, 3, 3]
    assert df["free_blocks"].tolist() == [0, 0, 1, 1, 1]
    assert df["token_slots"].tolist() == [6, 8, 5, 6, 5]
    assert df["time_s"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert (df["free_slots"] == 8 - df["allocated_slots"]).all()
    # A contiguous run has no blocks: empty cells, not -1.
    oracle = simulate_run(hand_trace([2, 2], [4, 3]), SimConfig("oracle", 16, iteration_s=1.0))
    assert oracle.timeline is not None
    assert timeline_frame(oracle.timeline)["used_blocks"].isna().all()


def test_each_panels_lines_and_legend_share_one_legend_of_dashed_coloured_strokes() -> None:
    run = simulate_run(hand_trace([2, 2], [4, 3]),
                       SimConfig("paged", 8, 2, watermark=0.0, iteration_s=1.0))
    assert run.timeline is not None
    spec = timeline_chart(timeline_frame(run.timeline), paged=True).to_dict()
    lines = [p for p in spec["vconcat"] if p["mark"]["type"] == "line"]
    assert len(lines) == 3
    for panel in lines:
        color, dash = panel["encoding"]["color"], panel["encoding"]["strokeDash"]
        # The same legend on both channels of the same field: Vega-Lite merges them into
        # one (one of them without a legend made it warn of a conflict).
        assert color["field"] == dash["field"] == "series"
        assert color["legend"] == dash["legend"] and color["legend"]["symbolType"] == "stroke"
        assert color["sort"] == dash["sort"]


def test_binned_keeps_sums_and_means() -> None:
    run = simulate_run(make_trace("sharegpt", 300, 4.0), SimConfig("paged"))
    assert run.timeline is not None
    df = timeline_frame(run.timeline)
    small, per = binned(df, max_points=100)
    span = int(df["iteration"].iloc[-1] - df["iteration"].iloc[0]) + 1
    assert len(small) <= 100 and per == -(-span // 100)
    assert small["preemptions"].sum() == df["preemptions"].sum() == run.result.preemptions
    assert small["finished"].sum() == 300
    # Means over every iteration of a point, idle ones (unrecorded) counting as none.
    sizes = np.minimum(per, span - np.arange(len(small)) * per)
    assert (small["running"] * sizes).sum() == pytest.approx(df["running"].sum())
    chart = timeline_chart(df, paged=True).to_dict()
    # A binned panel's note is its subtitle: the title is then an object.
    titles = [p["title"]["text"] if isinstance(p["title"], dict) else p["title"]
              for p in chart["vconcat"]]
    assert titles[0].startswith("Requests") and titles[1].startswith("Blocks")
    assert titles[3].startswith("Preemptions")
    # At most 600 points per series reach the browser.
    assert all(len(d) <= 3 * 600 for d in chart["datasets"].values())
    json.dumps(chart)


def test_preemption_story_uses_the_runs_own_figures() -> None:
    run = simulate_run(make_trace("sharegpt", 1000, 4.0), SimConfig("paged"))
    story = preemptions.preemption_story(run)
    assert story.startswith("**Why 937 preemptions for 1,000 requests.**")
    for words in ("the victim is the most recently admitted request",
                  "running requests are served before waiting ones",
                  "9 of 960 blocks kept free", "482 were never preempted",
                  "518 at least once, 3 requests as many as 6 times",
                  "at most 13 iterations before",
                  "0.94 preemptions per finished request"):
        assert words in story
    # The work lost counts every token a victim held (prompt too), against all computed.
    r = run.result
    assert r.recomputed_tokens == 175_420
    assert r.prompt_tokens + r.output_tokens + r.recomputed_tokens == 668_277
    assert ("The work lost is 175,420 tokens computed again (26.2% of the 668,277 computed "
            "in all, counting each prompt and output token once plus these)") in story
    assert "of the output" not in story and "chunks" not in story
    # With a token budget a prompt may be preempted part way through its chunks.
    chunked = preemptions.work_lost(replace(r, max_num_batched_tokens=64))
    assert chunked.endswith("part way through its prompt's chunks loses the chunks done.")
    counts = preemptions.preemption_counts(run)
    assert counts["requests"].tolist() == [482, 252, 158, 78, 18, 9, 3]
    assert preemptions.preemption_histogram(counts).to_dict()["layer"]
    # Where no request was preempted twice, the story says so rather than counting.
    once = simulate_run(make_trace("sharegpt", 400, 1.0), SimConfig("paged"))
    assert once.result.max_preemptions_per_request == 1
    assert (f"{once.result.preempted_requests} at least once, each of them once;"
            in preemptions.preemption_story(once))
    calm = simulate_run(make_trace("sharegpt", 200, 0.5), SimConfig("paged"))
    assert preemptions.preemption_story(calm).startswith("**No preemption.**")
    oracle = simulate_run(make_trace("sharegpt", 50, 4.0), SimConfig("oracle"))
    assert preemptions.preemption_story(oracle).startswith("Contiguous memory never preempts")
    table = preemptions.watermark_frame([run.result])
    assert table.iloc[0]["preemptions"] == 937 and table.iloc[0]["watermark blocks"] == 9


def test_deployment_words() -> None:
    d = dep.deployment("azure-conv", requests=300)
    words = dep_views.preset_sentence(d)
    assert "**Llama-3-8B on one H200.** 131,072 bytes of KV per token" in words
    assert ("909,659 token slots** for the contiguous policies, **56,853 blocks of 16** "
            "for paged (909,648 slots; the 11 left over fill no block)") in words
    # The slot count checks out by hand from the figures the sentence gives.
    assert ("14.96 GiB of bf16 weights leave 111.04 GiB (119,230,947,328 bytes / 131,072): "
            "**909,659 token slots**") in words and 119_230_947_328 // 131_072 == 909_659
    assert "compressed 50 times" in words
    runs = [simulate_run(d.trace, c) for c in d.configs()]
    note = dep_views.length_note(d, runs)
    assert "fits 111 requests at most" in note
    fake = [simulate_run(make_trace("alpaca", 50, 4.0), SimConfig(p)).result
            for p in ("max", "pow2", "oracle", "paged")]
    df = dep_views.figure13_frame(fake)
    assert df["system"].tolist() == ["Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM"]
    assert isinstance(df, pd.DataFrame)
    sentence = dep_views.figure13_sentence(fake)
    assert sentence.startswith("Mean batched requests: Orca (Max) ")
    assert dep_views.figure13_holds(fake) == sentence.endswith(
        ": the direction of the paper's Figure 13.")
    assert dep_views.figure13_chart(df).to_dict()


def test_an_idle_stretch_reads_as_idle_not_as_the_last_busy_iteration() -> None:
    # Two requests far apart: between them nothing runs, and no iteration is recorded.
    trace = Trace("gap", 1.0, 0, np.asarray([0.0, 50.0]), np.asarray([4, 4], dtype=np.int64),
                  np.asarray([3, 3], dtype=np.int64))
    run = simulate_run(trace, SimConfig("paged", 64, 4, watermark=0.0, iteration_s=0.5))
    assert run.timeline is not None
    df = timeline_frame(run.timeline)
    assert df["iteration"].diff().max() > 10, "the trace should leave a gap"
    shown, per = binned(df, max_points=600)
    assert per == 1 and len(shown) == df["iteration"].iloc[-1] + 1   # every iteration
    idle = shown[~shown["iteration"].isin(df["iteration"])]
    assert len(idle) > 10
    assert (idle["running"] == 0).all() and (idle["decode_tokens"] == 0).all()
    assert (idle["used_blocks"] == 0).all() and (idle["free_blocks"] == 16).all()
    # Coarser points average the quiet iterations in, and the clock runs through them.
    coarse, per = binned(df, max_points=4)
    assert per > 1 and coarse["running"].max() < df["running"].max()
    assert coarse["time_s"].is_monotonic_increasing


def test_the_watermark_sentence_says_what_the_runs_did() -> None:
    run = simulate_workload("sharegpt", SimConfig("paged"), requests=30)

    def at(blocks: int, preempted: int, recomputed: int, batch: float) -> SimResult:
        return replace(run, watermark_blocks=blocks, preemptions=preempted,
                       recomputed_tokens=recomputed, mean_batch_size=batch)
    # Given in any order; a larger watermark that left the batch as it was is named.
    runs = [at(204, 0, 0, 46.52), at(40, 130, 2573, 46.52), at(409, 0, 0, 46.47),
            at(81, 17, 300, 46.52)]
    assert preemptions.watermark_sentence(runs) == (
        "The same trace through paged memory, keeping more blocks free at admission: from "
        "40 to 409 blocks, 130 preemptions became 0 and 2,573 recomputed tokens 0, and the "
        "mean batch went from 46.52 to 46.47 (still 46.52 at 204 blocks).")
    # No smaller batch at all: not claimed.
    assert preemptions.watermark_sentence(runs[:2]).endswith(
        "from 40 to 204 blocks, 130 preemptions became 0 and 2,573 recomputed tokens 0, "
        "and the mean batch stayed at 46.52.")
    assert preemptions.watermark_sentence(runs[:1]) == ""
    # Ends alike, a size between not: said, not "from 46.52 to 46.52".
    dip = [at(40, 130, 2573, 46.52), at(81, 17, 300, 46.4), at(204, 0, 0, 46.52)]
    assert preemptions.watermark_sentence(dip).endswith(
        "and the mean batch was 46.52 at both ends, 46.40 at 81 blocks between.")
