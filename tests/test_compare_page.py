"""The "Contiguous vs paged" page through Streamlit's AppTest: every section, concrete values,
and bad input answered with a message instead of a traceback."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import trace_block_sweep
from backend.lab.compare.seed_example import seed_example
from backend.lab.memory_calc import kv_capacity
from backend.lab.sim.simulator import SimConfig, SimRun, simulate_workload
from backend.lab.workloads import make_trace
from backend.views.compare import frames as views
from backend.views.compare import tables
from tests.compare_support import (
    BLOCK_SIZE,
    CALCULATOR,
    MAPS,
    PAGE,
    SEED,
    SHARING,
    SIMULATOR,
    SWAP,
    open_tab,
    start,
    text,
)
from ui.compare import TAB_KEY, TABS, background
from ui.compare.block_size import BLOCK_SIM_JOB as JOB
from ui.compare.sim_runs import run_cached


def metric(at: AppTest, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert len(found) == 1, f"expected one metric {label!r}, found {len(found)}"
    return str(found[0])


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert len(found) == 1, f"expected one table with column {column!r}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def page() -> dict[str, AppTest]:
    """The page opened on each tab."""
    return {tab: start(tab) for tab in TABS}


def test_only_the_open_tab_is_drawn_and_the_address_names_it() -> None:
    at = start()
    assert [t.label for t in at.tabs] == [
        "The seed's example", "One workload, two memories", "Trace simulator",
        "Real deployment", "Block size", "Swap or recompute", "Sharing", "Memory calculator"]
    # The first tab's fields and none of another's: a field's change reruns one section.
    assert at.number_input(key="cmp_seed_new_len").value == 5
    assert not [n for n in at.number_input if n.key == "cmp_calc_gpu"]
    assert TAB_KEY not in at.query_params
    # (The address names it too: AppTest does not mirror that; the browser tests check it.)
    open_tab(at, CALCULATOR)
    assert [n.key for n in at.number_input if n.key == "cmp_calc_gpu"] == ["cmp_calc_gpu"]
    assert not [n for n in at.number_input if n.key == "cmp_seed_new_len"]
    # A field keeps its number while its tab is not drawn.
    at.number_input(key="cmp_calc_gpu").set_value(80.0).run()
    open_tab(at, SEED)
    assert open_tab(at, CALCULATOR).number_input(key="cmp_calc_gpu").value == 80.0
    # A name no tab has opens the first tab and leaves the address.
    odd = AppTest.from_file(PAGE, default_timeout=120)
    odd.query_params[TAB_KEY] = "<b>Sharing</b>"
    odd.run()
    assert not odd.exception and not odd.error
    assert TAB_KEY not in odd.query_params
    assert odd.number_input(key="cmp_seed_new_len").value == 5


def test_default_render_shows_every_section(page: dict[str, AppTest]) -> None:
    for at in page.values():
        assert not at.error
    seed = page[SEED]
    # The seed's example: B's release leaves 5 free slots in holes of 3 and 2.
    assert metric(seed, "Free slots") == "5"
    assert metric(seed, "Largest hole") == "3"
    says = "\n".join(text(at) for at in page.values())
    assert ("A request that will reach 5 tokens (a region of 5 slots) does not fit: 5 slots "
            "are free in total but the largest hole is 3 (external fragmentation)") in says
    assert "block table [11, 12, 13, 14]" in says
    assert metric(seed, "Free blocks after D") == "4"
    # The memory calculator on OPT-13B: the paper's 800 KB per token.
    assert "819,200 bytes per token (800 KiB)" in says
    assert "the paper's 800 KB per token" in says
    # Per layer: 819,200 / 40 layers, and a 16-token block's slice of one layer.
    assert ("20,480 bytes per token per layer, 327,680 bytes for a 16-token block in each "
            "layer") in says
    cap = kv_capacity("OPT-13B", 40.0)
    assert metric(page[CALCULATOR], "KV tokens that fit") == f"{cap.kv_tokens:,}" == "15,447"
    assert metric(page[CALCULATOR], "Requests of 2,048 tokens") == "7"
    # The disclaimer and the paper's numbers sit beside ours.
    assert "not from the paper's testbed" in says
    assert "Orca (Max) 20.4%, Orca (Pow2) 26.8%, Orca (Oracle) 38.2%, vLLM 96.3%" in says
    # The page's opening ratio is the paper's shares divided, not its throughput headline.
    assert f"keeps 96.3%, {96.3 / 38.2:.1f} to {96.3 / 20.4:.1f} times that share" in says


def test_memory_maps_table_orders_like_figure_2(page: dict[str, AppTest]) -> None:
    df = frame_with(page[MAPS], "measure").set_index("measure")
    assert df.columns.tolist() == ["max", "pow2", "oracle", "paged"]
    assert "paper: token states" in df.index
    shares = [float(v.rstrip("%")) for v in df.loc["token states"]]
    assert shares == sorted(shares) and len(set(shares)) == 4
    batches = [float(v) for v in df.loc["mean batch"]]
    assert batches[-1] == max(batches)
    assert "The last request finished in iteration" in text(page[MAPS])
    # What each state holds is said where the states are drawn.
    assert views.STATES_NOTE in [c.value for c in page[MAPS].caption]


def test_the_held_row_is_explained_only_beside_its_tables(page: dict[str, AppTest]) -> None:
    # Before any run only the memory maps' tab has a breakdown table with the row; the
    # note beside it says what its denominator leaves out and what it keeps.
    for tab, at in page.items():
        held = [c.value for c in at.caption if "token states (held)" in c.value]
        assert held == ([views.HELD_NOTE] if tab == MAPS else []), tab
    assert "free slots left out and external fragmentation" in views.HELD_NOTE
    # The share is of all memory but the free slots: external fragmentation stays in.
    r = simulate_workload("sharegpt", SimConfig("oracle"), requests=300, rate=4.0, seed=0)
    m = r.memory
    assert m["external_fragmentation"] > 0
    assert views.held_token_share(r) == pytest.approx(m["token_states"] / (
        m["token_states"] + m["reservation"] + m["internal_fragmentation"]
        + m["external_fragmentation"]), rel=1e-12)


def test_block_size_and_sharing_sections_show_backend_numbers(
        page: dict[str, AppTest]) -> None:
    points = trace_block_sweep("sharegpt", 1000, 0)
    expected = tables.block_tradeoff_sentence(points)
    assert "block size 16:" in expected
    assert expected in text(page[BLOCK_SIZE])
    # The table's tail waste is in percent, the sentence's unit.
    sweep = next(d.value for d in page[BLOCK_SIZE].dataframe
                 if "largest table at finish" in d.value.columns)
    assert sweep["tail waste"].round(7).tolist() == [round(100 * p.tail_waste_share, 7)
                                                     for p in points]
    from backend.engine.sharing import recorded_results
    from backend.lab.sharing import sharing_experiment

    sharing = page[SHARING]
    frames = [d.value for d in sharing.dataframe if "copy-on-write copies" in d.value.columns]
    _, recorded = recorded_results()
    estimate = [*sharing_experiment("parallel", (2, 4, 6), requests=100, block_size=16),
                *sharing_experiment("beam", (2, 4, 6), requests=100, block_size=16)]
    # The engine's recorded measurement first, then the labelled estimate.
    assert len(frames) == 2
    for df, results in zip(frames, (recorded, estimate), strict=True):
        assert df["n"].tolist() == [2, 4, 6, 2, 4, 6]
        # The table shows the share in percent (one decimal, as the sentence says it).
        assert df["saved"].round(7).tolist() == [round(100 * r.saved_fraction, 7)
                                                 for r in results]
    assert tables.sharing_sentence(recorded) in text(sharing)
    assert "(paper: 6.1% to 9.8%)" in text(sharing)
    assert "(paper: 37.6% to 55.2%)" in text(sharing)
    # Each chart's shaded band is named: the paper's range.
    assert text(sharing).count("Shaded band: the paper's range for the same kind of sharing") \
        == 2
    assert "What differs from the paper, and why" in text(sharing)
    assert "An estimate, not a run: beam choices are modelled stochastically" in text(sharing)


def test_sharing_measures_on_the_live_engine_when_asked() -> None:
    from backend.engine.sharing import instruction_prompts, measure_sharing

    at = start(SHARING)
    at.selectbox(key="cmp_share_model").set_value("tiny-byte")
    at.number_input(key="cmp_share_prompts").set_value(2)
    at.number_input(key="cmp_share_new").set_value(8).run()
    before = len([d for d in at.dataframe if "copy-on-write copies" in d.value.columns])
    at.button(key="cmp_share_run").click().run()
    assert not at.exception and not at.error
    frames = [d.value for d in at.dataframe if "copy-on-write copies" in d.value.columns]
    assert len(frames) == before + 1
    want = [*measure_sharing("parallel", (2, 4, 6), instruction_prompts()[:2], max_new_tokens=8),
            *measure_sharing("beam", (2, 4, 6), instruction_prompts()[:2], max_new_tokens=8)]
    live = frames[1]
    assert live["saved"].round(7).tolist() == [round(100 * r.saved_fraction, 7) for r in want]
    assert live["copy-on-write copies"].tolist() == [r.trace.cow_copies for r in want]
    # The result says what it measured, and still does once a field has changed.
    ran = ("Last run: tiny-byte, 2 instruction prompts, block size 16, up to 8 new tokens.")
    assert ran in [c.value for c in at.caption]
    at.number_input(key="cmp_share_new").set_value(16).run()
    assert ran in [c.value for c in at.caption]


def test_block_size_simulation_button() -> None:
    at = start(BLOCK_SIZE)
    at.number_input(key="cmp_blk_requests").set_value(200)
    at.button(key="cmp_blk_sim").click().run()
    assert not at.exception and not at.error
    ends = [simulate_workload("sharegpt", SimConfig("paged", block_size=b), requests=200,
                              rate=4.0, seed=0) for b in (1, 256)]
    assert tables.block_batch_sentence(ends) in text(at)
    assert ends[0].mean_batch_size > ends[1].mean_batch_size


def test_seed_example_follows_its_controls() -> None:
    at = start()
    at.segmented_control(key="cmp_seed_block_size").set_value(2).run()
    assert not at.exception
    assert "block table [6, 7]" in text(at)
    at.selectbox(key="cmp_seed_policy").set_value("pow2").run()
    ex = seed_example("pow2", 2, 5)
    assert ex.fit.message[:1].upper() + ex.fit.message[1:] in text(at)
    assert ex.fit.message.endswith("does not fit: no slot is free")
    # The seed text's one kind of waste, mapped onto the paper's two the arena shows.
    assert "The seed text calls both together internal fragmentation (its own example: " \
           "room reserved for sixteen tokens while nine are present, which scenario 15 on " \
           "the Scenarios page steps through)." in text(at)


def test_simulator_run_orders_policies_like_figure_2() -> None:
    at = start(SIMULATOR)
    at.number_input(key="cmp_sim_requests").set_value(300)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    m = frame_with(at, "paper token states")
    assert m["policy"].tolist() == ["max", "pow2", "oracle", "paged"]
    shares = m["token states"].tolist()
    assert shares[0] < shares[1] < shares[2] < shares[3]
    batch = m["mean batch size"].tolist()
    assert batch[3] > batch[2] > batch[0]
    # The page shows exactly what the backend computes for the same parameters.
    direct = simulate_workload("sharegpt", SimConfig("paged"), requests=300, rate=4.0, seed=0)
    assert shares[3] == pytest.approx(direct.memory["token_states"], abs=1e-12)
    assert f"Paged memory ran a mean batch of {direct.mean_batch_size:.1f} requests" in text(at)
    assert "Last run: sharegpt, 300 requests" in text(at)
    # The max policy's regions all take 2,048 of the 15,360 slots: the 1,024 left over
    # could never hold one, even in one piece, so they are free, never external
    # fragmentation; the caption under the breakdown says which is which.
    table = frame_with(at, "measure").set_index("measure")
    assert table.loc["external fragmentation", "max"] == "0.0%"
    assert table.loc["external fragmentation", "oracle"] != "0.0%"
    assert views.STATES_NOTE in [c.value for c in at.caption]
    assert views.HELD_NOTE in [c.value for c in at.caption]


def test_bad_input_gets_a_message_not_a_traceback() -> None:
    at = start(SIMULATOR)
    # A 1000-slot KV cache cannot hold ShareGPT's longest requests.
    at.number_input(key="cmp_sim_requests").set_value(300)
    at.number_input(key="cmp_sim_capacity").set_value(1000)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception
    assert any(e.value.startswith("The longest request cannot run") and
               e.value.endswith("can never fit in an arena of 1,000 slots") for e in at.error)
    at.multiselect(key="cmp_sim_policies").set_value([])
    at.button(key="cmp_sim_run").click().run()
    assert any(e.value == "Choose at least one policy." for e in at.error)
    # 16 slots cannot hold requests of up to 256 tokens.
    open_tab(at, MAPS).number_input(key="cmp_map_capacity").set_value(16).run()
    assert not at.exception
    assert any(e.value.endswith("can never fit in an arena of 16 slots") for e in at.error)
    # A 70B model's weights do not fit in 40 GiB.
    open_tab(at, CALCULATOR).selectbox(key="cmp_calc_model").set_value("Llama-3.1-70B").run()
    assert not at.exception
    assert any("do not leave room for KV in 40 GiB" in e.value for e in at.error)


def refusals(at: AppTest) -> list[list[str]]:
    """Each error box's lines (a box names every refused field of its section)."""
    return [e.value.split("  \n") for e in at.error]


def test_a_number_past_a_fields_range_stops_its_section_with_the_fields_name() -> None:
    at = start(SWAP)
    runs = len([b for b in at.button if b.key == "cmp_swap_run"])
    assert runs == 1
    # The browser sends the number as typed (the fields carry no bounds), so the section
    # refuses it by name instead of running on the last number in range.
    at.number_input(key="cmp_swap_requests").set_value(100).run()
    assert not at.exception
    assert ["Requests must be 2 to 64; got 100"] in refusals(at)
    assert not [b for b in at.button if b.key == "cmp_swap_run"]
    # The fields after the refused one stay on screen, and a second refusal joins the first.
    at.number_input(key="cmp_swap_slots").set_value(10).run()
    assert ["Requests must be 2 to 64; got 100",
            "Device pool (token slots) must be 64 to 8,192; got 10"] in refusals(at)
    open_tab(at, SEED).number_input(key="cmp_seed_new_len").set_value(40).run()
    assert ["D's final length must be 2 to 16; got 40"] in refusals(at)
    open_tab(at, CALCULATOR).number_input(key="cmp_calc_gpu").set_value(0.5).run()
    assert ["GPU memory (GiB) must be 1 to 4,096; got 0.5"] in refusals(at)
    # The calculator's request length, drawn after the GPU field, is still there to fix.
    at.number_input(key="cmp_calc_len").set_value(0).run()
    assert ["GPU memory (GiB) must be 1 to 4,096; got 0.5",
            "Request length (tokens) must be 1 to 1,000,000; got 0"] in refusals(at)
    # Another tab's section is drawn as usual, this one still refuses when opened again,
    # and numbers in range bring it back.
    assert [b for b in open_tab(at, SIMULATOR).button if b.key == "cmp_sim_run"]
    open_tab(at, SWAP)
    assert ["Requests must be 2 to 64; got 100",
            "Device pool (token slots) must be 64 to 8,192; got 10"] in refusals(at)
    at.number_input(key="cmp_swap_requests").set_value(8).run()
    assert ["Device pool (token slots) must be 64 to 8,192; got 10"] in refusals(at)
    assert not [b for b in at.button if b.key == "cmp_swap_run"]
    at.number_input(key="cmp_swap_slots").set_value(512).run()
    assert [b for b in at.button if b.key == "cmp_swap_run"]
    assert not [r for r in refusals(at) if any("Device pool" in line for line in r)]


def test_each_part_of_the_sharing_tab_stops_on_its_own_numbers() -> None:
    at = start(SHARING)
    at.number_input(key="cmp_share_new").set_value(1000).run()
    assert ["Max new tokens must be 4 to 256; got 1,000"] in refusals(at)
    assert not [b for b in at.button if b.key == "cmp_share_run"]
    # The modelled estimate below it is drawn as usual.
    assert at.number_input(key="cmp_share_requests").value == 100
    assert any(i.value.startswith("An estimate, not a run") for i in at.info)


def test_swap_or_recompute_runs_the_engines_and_says_what_they_did() -> None:
    at = start(SWAP)
    assert any("Press Run" in c.value for c in at.caption)
    at.multiselect(key="cmp_swap_sizes").set_value([2, 8])
    at.number_input(key="cmp_swap_requests").set_value(8)
    at.number_input(key="cmp_swap_slots").set_value(192)
    at.button(key="cmp_swap_run").click().run()
    assert not at.exception and not at.error
    df = frame_with(at, "swapped blocks")
    assert list(df["mode"]) == ["roomy", "recompute", "swap"] * 2
    # The modes' column says what each one is (the page uses "roomy" nowhere else).
    (table,) = [d for d in at.dataframe if "swapped blocks" in d.value.columns]
    assert json.loads(table.proto.columns)["mode"]["help"].startswith(
        "roomy: a pool large enough never to preempt, whose tokens the others must match")
    assert df["same tokens"].all()
    swap = df[df["mode"] == "swap"]
    assert (swap["swapped blocks"] > 0).all() and (swap["recomputed tokens"] == 0).all()
    says = text(at)
    assert "every request generated exactly the tokens of the run that never preempted" in says
    assert "preempting the same requests at the same steps at every block size" in says
    # The runs say what was run, and still do once a field has changed.
    ran = "Last run: block sizes 2, 8; 8 requests; 192 token slots."
    assert ran in [c.value for c in at.caption]
    at.number_input(key="cmp_swap_requests").set_value(16).run()
    assert ran in [c.value for c in at.caption]


def test_sharing_shows_a_bar_while_it_measures_and_none_once_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000 requests take some 10 s per kind on a small CPU: the page must say what
    # it is doing meanwhile, and a rerun that finds both kinds measured draws nothing.
    from backend.lab.sharing import sharing_experiment
    from ui.compare import sharing

    shown: list[tuple[float, str] | str] = []

    class Bar:
        def progress(self, value: float, text: str) -> None:
            shown.append((value, text))

        def empty(self) -> None:
            shown.append("empty")

    def progress(value: float, text: str) -> Bar:
        shown.append((value, text))
        return Bar()

    monkeypatch.setattr(sharing, "_DONE", type(sharing._DONE)())
    monkeypatch.setattr(sharing.st, "progress", progress)
    got = sharing._sharing(7, 16)
    assert shown == [
        (0.0, "Measuring parallel sampling (n = 2, 4, 6) over 7 requests in blocks of 16: "
              "1 of 2"),
        (0.5, "Measuring beam search (n = 2, 4, 6) over 7 requests in blocks of 16: 2 of 2"),
        "empty"]
    assert got == [*sharing_experiment("parallel", (2, 4, 6), requests=7, block_size=16),
                   *sharing_experiment("beam", (2, 4, 6), requests=7, block_size=16)]
    shown.clear()
    assert sharing._sharing(7, 16) == got and shown == []


def test_in_the_app_its_sidebar_says_what_it_runs_not_the_playgrounds_pool() -> None:
    app = str(Path(PAGE).parents[1] / "app.py")
    at = AppTest.from_file(app, default_timeout=120).run()
    at.sidebar.number_input(key="cfg_num_blocks").set_value(64).run()
    assert at.session_state["settings"].config.num_blocks == 64
    at.switch_page("pages/compare.py").run()
    assert not at.exception and at.title[0].value == "Contiguous vs paged"
    # The Playground's fields would change nothing here: none is drawn, nor Reset engine.
    assert not at.sidebar.number_input and not at.sidebar.toggle and not at.sidebar.radio
    assert not at.sidebar.button and not at.sidebar.segmented_control
    said = "\n".join(m.value for m in at.sidebar.markdown)
    assert "Bookkeeping only: no K/V tensors." in said and "runs nothing" in said
    assert f"with the torch kernel on {'cuda' if torch.cuda.is_available() else 'cpu'}" in said
    # Back on the Playground, its settings are there as they were.
    at.switch_page("pages/playground.py").run()
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 64
    assert not at.warning


def test_a_max_length_past_half_the_arena_is_said_to_run_one_at_a_time() -> None:
    at = start(MAPS)
    assert not [c for c in at.caption if "holds one request at a time" in c.value]
    at.number_input(key="cmp_map_max_len").set_value(8192).run()
    assert not at.exception
    assert ("The max policy reserves the whole 768-slot arena for each request: it holds one "
            "request at a time.") in [c.value for c in at.caption]
    at.number_input(key="cmp_map_max_len").set_value(400).run()
    assert ("The max policy reserves 400 slots, more than half the 768-slot arena, for each "
            "request: it holds one request at a time.") in [c.value for c in at.caption]


def _sweep_runs(seed: int) -> list[SimRun]:
    configs = [SimConfig("paged", 2048, bs, 4096) for bs in (1, 2, 4, 8, 16, 32, 64, 128)]
    return run_cached(("synthetic", "alpaca", 50, 4.0, seed),
                      make_trace("alpaca", 50, 4.0, seed), configs, lambda f, t: None)


def _end_later(job: background.Job, seconds: float, **outcome: object) -> None:
    """End `job` from another thread after `seconds`, as its work would."""
    def end() -> None:
        time.sleep(seconds)
        for name, value in outcome.items():
            setattr(job, name, value)
        job.ended.set()
    threading.Thread(target=end, daemon=True).start()


def test_a_run_at_work_while_its_tab_was_closed_is_followed_and_shown() -> None:
    # The sweep runs in a thread the session keeps: a page run stopped by a click on
    # another tab leaves it at work, and the next run that draws its tab follows it to
    # its end and records its result, with the inputs it was started with.
    at = start(SWAP)
    runs = _sweep_runs(3)
    job = background.Job(("alpaca", 50, 3), "Simulating...")
    at.session_state[JOB] = job
    _end_later(job, 0.5, result=runs)
    open_tab(at, BLOCK_SIZE)
    assert "Last run: alpaca, 50 requests, seed 3" in text(at)
    assert tables.block_batch_sentence([r.result for r in runs]) in text(at)
    # Recorded once: the job is gone, and the result stays with the page.
    assert JOB not in at.session_state
    assert "Last run: alpaca, 50 requests, seed 3" in text(open_tab(at, BLOCK_SIZE))


def test_a_click_while_a_run_is_at_work_says_so_and_changes_nothing() -> None:
    at = start(BLOCK_SIZE)
    job = background.Job(("alpaca", 50, 3), "Simulating...", "alpaca, 50 requests, seed 3")
    at.session_state[JOB] = job
    _end_later(job, 0.5, result=_sweep_runs(3))
    at.number_input(key="cmp_blk_seed").set_value(7)
    at.button(key="cmp_blk_sim").click().run()
    assert [w.value for w in at.warning] == [background.STILL_GOING.format(
        what="alpaca, 50 requests, seed 3")]
    # The run at work is the one shown, said to be from before the fields' seed 7.
    assert "Last run: alpaca, 50 requests, seed 3" in text(at)
    assert "seed 7" in text(at)


def test_a_refused_run_is_said_once_and_then_let_go() -> None:
    at = start(SWAP)
    job = background.Job(("alpaca", 50, 3), "Simulating...")
    at.session_state[JOB] = job
    _end_later(job, 0.2, error=PagedLabError("the trace is empty"))
    open_tab(at, BLOCK_SIZE)
    assert [e.value for e in at.error] == ["The trace is empty"]
    assert JOB not in at.session_state
    at.run()
    assert not at.error


def test_the_server_runs_two_long_runs_at_most() -> None:
    at = start(BLOCK_SIZE)
    taken = [background._SLOTS.acquire(blocking=False) for _ in range(background.MAX_JOBS)]
    try:
        assert all(taken)
        at.button(key="cmp_blk_sim").click().run()
        assert [w.value for w in at.warning] == [background.BUSY.format(n=background.MAX_JOBS)]
        assert JOB not in at.session_state
    finally:
        for _ in taken:
            background._SLOTS.release()
    at.button(key="cmp_blk_sim").click().run()
    assert not at.warning and "Last run: sharegpt, 1,000 requests, seed 0" in text(at)


def test_a_job_whose_session_ended_stops_at_its_next_report() -> None:
    owner = background._Owner()
    job = background.Job(None, "")
    owner.jobs.add(job)
    job.advance(0.5, "half")
    del owner
    gc.collect()
    with pytest.raises(background.StoppedError):
        job.advance(0.6, "more")
