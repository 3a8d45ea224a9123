"""The Playground's timeline and scheduler budgets through AppTest.

The timeline section counts the engine's rows, charts them and downloads them
with the latency table; picking a row shows its step's kept state in the views
while the engine stays as it is. The sidebar's Scheduler fields set vLLM's
budgets through the same confirm step as every config field.
"""

from __future__ import annotations

import io

import pandas as pd
from streamlit.testing.v1 import AppTest

from backend.io.snapshot import export_snapshot
from backend.sessions.forms import config_from_fields
from backend.sessions.history import History
from tests.test_app import add, click, engine, markdown, metrics, start, status
from tests.test_exports_app import Media, media  # noqa: F401  (the fixture)
from ui.session import CONFIG_KEYS, config_fields


def caption(at: AppTest, text: str) -> str:
    found = [c.value for c in at.caption if text in c.value]
    assert len(found) == 1, [c.value for c in at.caption]
    return found[0]


def step_n(at: AppTest, n: int) -> AppTest:
    at.number_input(key="batch_n").set_value(n)
    return click(at, "btn_step_n")


def open_details(at: AppTest) -> AppTest:
    # The expander runs its content only while open (on_change="rerun"): open it.
    at.session_state["tl_open"] = True
    at.run()
    assert not at.exception
    return at


def charts(at: AppTest) -> list[str]:
    return [str(getattr(c, "key", "")) for c in at.get("vega_lite_chart")]


def pick(at: AppTest, iteration: int | None) -> AppTest:
    at.number_input(key="tl_iteration").set_value(iteration).run()
    assert not at.exception
    return at


def requests_table(at: AppTest) -> pd.DataFrame:
    """The block tables (the page has other tables with a request column)."""
    df: pd.DataFrame = next(d.value for d in at.dataframe
                            if "block table (logical→physical)" in d.value.columns)
    return df.set_index("request")


# ---- the timeline ---------------------------------------------------------------------

def test_an_empty_timeline_is_a_caption_without_a_chart() -> None:
    at = open_details(start())
    assert "Nothing run yet" in caption(at, "Nothing run yet")
    assert "not saved with the session" in caption(at, "Nothing run yet")
    assert len(at.get("vega_lite_chart")) == 1                   # the grid only
    assert not [b for b in at.get("download_button") if b.key.startswith("tl_")]


def test_the_timeline_counts_its_rows_and_downloads_them_with_the_latencies(
        media: Media) -> None:  # noqa: F811
    at = add(add(start()), "abcdefgh", max_new=2)
    step_n(at, 3)
    # Two adds (one row each) and a step of 3 iterations; B finished after two tokens.
    assert engine(at).step == 3
    text = caption(at, "rows, iterations")
    assert text.startswith("5 rows, iterations 0–4: 3 scheduler iterations and 2 other "
                           "operations.")
    assert "not saved with the session" in text
    open_details(at)
    assert len(at.get("vega_lite_chart")) == 4      # grid, translator, timeline, picker strip
    # The charts that take a click name the field that does the same from the keyboard.
    assert caption(at, "Click a bar").startswith(
        "Click a bar, or enter its iteration under *Show the state after iteration*:")
    assert caption(at, "Click a block").startswith(
        "Click a block, or type its id under *Inspect a block*, to see who holds it")
    keys = {b.key for b in at.get("download_button")}
    assert {"tl_dl_timeline_csv", "tl_dl_timeline_parquet", "tl_dl_latency_csv",
            "tl_dl_latency_parquet"} <= keys
    tl = pd.read_csv(io.BytesIO(media.download(at, "tl_dl_timeline_csv")))
    assert list(tl["iteration"]) == [0, 1, 2, 3, 4]
    assert list(tl["step"]) == [1, 2, 3, 3, 3]
    assert list(tl["scheduled"]) == [0, 0, 1, 1, 1]
    # The last row is the engine's state now.
    assert f"{tl['used_blocks'].iloc[-1]} / 32" == metrics(at)["Used blocks"]
    parquet = pd.read_parquet(io.BytesIO(media.download(at, "tl_dl_timeline_parquet")))
    assert len(parquet) == 5 and "prefix_hit_rate" in parquet.columns
    lat = pd.read_parquet(io.BytesIO(media.download(at, "tl_dl_latency_parquet")))
    assert list(lat["request"]) == ["A", "B"]
    b = lat.set_index("request").loc["B"]
    assert (b["generated"], b["ttft_iterations"], b["tpot_iterations"]) == (2, 1, 1.0)
    assert b["ttft_ms"] > 0
    csv = pd.read_csv(io.BytesIO(media.download(at, "tl_dl_latency_csv")))
    assert list(csv["request"]) == ["A", "B"]
    shown = [d.value for d in at.dataframe if "ttft_iterations" in d.value.columns]
    assert len(shown) == 1 and list(shown[0]["request"]) == ["A", "B"]


def test_the_open_timeline_follows_every_operation_and_a_reset() -> None:
    """Its charts are built again only when the timeline changed (ui/timeline.py _charts):
    a rerun with nothing new draws the same specs, an operation or a new engine others."""
    def specs(at: AppTest) -> list[tuple[str, list[bytes]]]:
        return [(c.proto.spec, [d.data.data for d in c.proto.datasets])
                for c in at.get("vega_lite_chart") if "iteration" in c.proto.spec]

    at = open_details(click(add(start()), "btn_step"))
    before = specs(at)
    assert len(before) == 2                             # the timeline and the strip
    at.run()
    assert specs(at) == before                          # reused: nothing changed
    at.session_state["tl_charts"] = None
    at.run()
    assert specs(at) == before                          # built anew: the same specs
    for key in ("btn_step", "btn_grow", "btn_fork", "btn_finish"):
        click(at, key)
        now = specs(at)
        assert now != before and "iterations 0–" in caption(at, "belongs to this engine"), key
        before = now
    rows = len(engine(at).timeline.rows)
    assert f"{rows} rows" in caption(at, "belongs to this engine")
    click(click(at, "btn_reset"), "btn_reset_confirm")
    assert "Nothing run yet" in caption(at, "Nothing run yet") and not specs(at)
    open_details(click(add(at), "btn_step"))           # (a reset closes the section)
    assert len(specs(at)) == 2 and specs(at) != before
    # Closed, the section keeps nothing: a long timeline's frame is megabytes.
    at.session_state["tl_open"] = False
    at.run()
    assert "tl_charts" not in at.session_state


def test_picking_an_earlier_iteration_shows_that_steps_state_and_leaves_the_engine() -> None:
    at = add(add(start()), "abcdefgh-ijklmnop")
    e = engine(at)
    live = export_snapshot(e)
    history: History = at.session_state["history"]
    first = history[0]["metrics"]["used_blocks"]
    assert first < live["metrics"]["used_blocks"]
    assert metrics(at)["Used blocks"] == f"{live['metrics']['used_blocks']} / 32"
    pick(at, 0)
    # The views show the state after step 1: A alone, fewer used blocks.
    assert metrics(at)["Used blocks"] == f"{first} / 32"
    assert list(requests_table(at).index) == ["A"]
    assert any("the state after step 1" in i.value for i in at.info)
    assert any("no longer kept" not in i.value for i in at.info)
    # The kernel's figures are that step's, and say so.
    assert "As of step 1, the state shown:\n\n- Last model step ran on" in markdown(at)
    # The engine was only read.
    assert engine(at) is e and export_snapshot(e) == live
    click(at, "tl_live_top")
    assert at.number_input(key="tl_iteration").value is None
    assert metrics(at)["Used blocks"] == f"{live['metrics']['used_blocks']} / 32"
    assert list(requests_table(at).index) == ["A", "B"]
    assert not at.info
    assert "As of step" not in markdown(at)
    # Where it went is said once, in the banner's place (a screen reader hears it).
    back = "Back to the live state, after step 2."
    assert back in [c.value for c in at.caption]
    at.run()
    assert back not in [c.value for c in at.caption]


def test_the_latest_iteration_is_the_live_state_and_an_operation_returns_to_it() -> None:
    at = add(add(start()), "abcdefgh")
    pick(at, 1)
    assert any("this is the live state" in i.value for i in at.info)
    pick(at, 0)
    assert any("the state after step 1" in i.value for i in at.info)
    add(at, "zzzz")
    # What the operation did is shown: the pick is cleared.
    assert at.number_input(key="tl_iteration").value is None
    assert list(requests_table(at).index) == ["A", "B", "C"]
    assert status(at)[1].startswith("Step 3: add C")


def test_an_iteration_past_the_timeline_is_refused_by_the_fields_name() -> None:
    at = add(add(start()), "abcdefgh")
    pick(at, 99)
    said = [e.value for e in at.error if "Show the state after iteration" in e.value]
    assert said == ["Show the state after iteration: 99 is not a row of this timeline; "
                    "enter 0 to 1. Showing the live state."]
    # The live state, the field blank, the engine as it was.
    assert at.number_input(key="tl_iteration").value is None
    assert not at.info and list(requests_table(at).index) == ["A", "B"]
    pick(at, 0)
    assert any("the state after step 1" in i.value for i in at.info)
    assert not [e for e in at.error if "Show the state after iteration" in e.value]


def test_a_step_the_history_no_longer_keeps_is_named_and_the_views_stay_live() -> None:
    at = start()
    # A history of two operations stands for the newest MAX_HISTORY ones.
    at.session_state["history"] = History(max_steps=2)
    at = add(add(add(at), "abcdefgh"), "ijklmnop")
    pick(at, 0)
    warned = [w.value for w in at.warning if "no longer kept" in w.value]
    assert len(warned) == 1 and "(steps 2–3)" in warned[0]
    assert list(requests_table(at).index) == ["A", "B", "C"]       # live
    click(at, "tl_live_top")
    assert not at.warning and at.number_input(key="tl_iteration").value is None


def test_a_multi_iteration_step_shows_the_state_after_the_whole_step() -> None:
    at = add(start(), max_new=8)
    step_n(at, 3)
    pick(at, 1)         # the first of step 2's three iterations: its state is the step's end
    assert [i.value for i in at.info if "belongs to" in i.value] == [
        "Iteration 1 belongs to step 2 (a step of 3 iterations), the latest: this is the live "
        "state, after its last iteration (the history keeps the state after each operation, "
        "not each iteration)."]
    assert requests_table(at).loc["A", "generated"] == 3
    step_n(at, 1)
    pick(at, 1)
    assert next(i.value for i in at.info if "belongs to" in i.value).startswith(
        "Showing the past: the state after step 2. Iteration 1 belongs to step 2 (a step of 3 "
        "iterations); the history keeps the state after each operation, not each iteration.")
    # A step of one iteration: its pick shows that iteration's own state, said plainly.
    pick(at, 0)
    assert [i.value for i in at.info if "belongs to" in i.value] == [
        "Showing the past: the state after step 1. Iteration 0 belongs to step 1, its only "
        "iteration. The live engine is unchanged, and the controls above act on it."]


# ---- scheduler budgets ---------------------------------------------------------------

def test_a_token_budget_prefills_a_long_prompt_over_steps_and_the_table_says_so() -> None:
    at = start()
    at.sidebar.number_input(key="cfg_max_num_batched_tokens").set_value(10).run()
    assert engine(at).config.max_num_batched_tokens == 10      # empty engine: applied at once
    add(at)                                                    # PROMPT: 23 tokens
    assert requests_table(at).loc["A", "status"] == "running (prefill 10/23)"
    click(at, "btn_step")
    assert requests_table(at).loc["A", "status"] == "running (prefill 20/23)"
    click(at, "btn_step")
    row = requests_table(at).loc["A"]
    assert (row["status"], row["generated"]) == ("running", 1)
    open_details(at)
    lat = next(d.value for d in at.dataframe if "ttft_iterations" in d.value.columns)
    # The add prefilled the first chunk but is no scheduler iteration; the two steps are.
    assert lat.set_index("request").loc["A", "ttft_iterations"] == 2


def test_max_num_seqs_keeps_requests_waiting_and_a_change_asks_before_resetting() -> None:
    at = start()
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(1).run()
    add(add(at), "abcdefgh")
    table = requests_table(at)
    assert (table.loc["A", "status"], table.loc["B", "status"]) == ("running", "waiting")
    # The status line says why B waits, naming the setting as the sidebar does (a
    # waiting add said only "add B (...)").
    assert status(at) == ("success", "Step 2: add B ('abcdefgh') · B waits: 1 request is "
                                     "running, and Max running requests (sidebar, Scheduler) "
                                     "is 1; finish one first")
    kept = engine(at)
    at.sidebar.number_input(key="cfg_watermark_blocks").set_value(4).run()
    assert any("leave the page and stay saved" in w.value for w in at.warning)
    assert engine(at) is kept and kept.config.watermark_blocks is None
    click(at, "btn_apply_config")
    new = engine(at)
    assert new is not kept and (new.config.max_num_seqs, new.config.watermark_blocks) == (1, 4)
    # A blank field is no limit (AppTest cannot blank a number field: its set_value(None)
    # sends no value, so the fields' mapping is checked directly).
    fields = config_fields(new.config)
    assert fields["cfg_max_num_seqs"] == 1 and fields["cfg_max_num_batched_tokens"] is None
    blank = {CONFIG_KEYS["cfg_max_num_seqs"]: None}
    assert config_from_fields(blank, new.config).max_num_seqs is None


def test_an_operation_refused_by_a_scheduler_setting_names_it_as_the_sidebar_does() -> None:
    at = start()
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(1).run()
    at.number_input(key="add_n").set_value(2)
    add(at)
    assert status(at) == ("error", "Refused: 2 parallel samples run as 2 sequences, but Max "
                                   "running requests (sidebar, Scheduler) is 1: they could "
                                   "never start")
    assert not engine(at).requests


def test_a_bad_budget_is_refused_with_its_reason_and_nothing_changes() -> None:
    at = add(start())
    kept = engine(at)
    before = export_snapshot(kept)
    at.sidebar.number_input(key="cfg_watermark_blocks").set_value(32).run()
    assert [e.value for e in at.sidebar.error] == [
        "Watermark (32) must be less than Pool size (32): admission keeps that many blocks "
        "free, so no request could ever start"]
    assert not at.session_state["config_pending"]
    assert engine(at) is kept and export_snapshot(kept) == before
    assert kept.config.watermark_blocks is None
    assert not [w for w in at.warning if "discarded" in w.value]


def test_a_budget_is_removed_by_0_as_the_browser_cannot_blank_a_field_again() -> None:
    at = start()
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(2).run()
    at.sidebar.number_input(key="cfg_max_new").set_value(5).run()
    assert engine(at).config.max_num_seqs == 2 and engine(at).config.max_new_tokens == 5
    # The new engine's line says the scheduler settings it runs with.
    assert any(s.value.endswith("kernel torch on cpu; at most 2 running.")
               for s in at.info), [s.value for s in at.info]
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(0).run()
    at.sidebar.number_input(key="cfg_max_new").set_value(0).run()
    assert not at.sidebar.error
    assert engine(at).config.max_num_seqs is None and engine(at).config.max_new_tokens is None
    # The field keeps its 0, which describes the applied config: nothing is pending.
    assert at.sidebar.number_input(key="cfg_max_num_seqs").value == 0
    assert not at.session_state["config_pending"] and not at.warning


def test_the_scheduler_fields_say_what_vllm_means() -> None:
    at = start()
    helps = {k: at.sidebar.number_input(key=k).help for k in
             ("cfg_max_num_seqs", "cfg_max_num_batched_tokens", "cfg_watermark_blocks")}
    assert "max_num_seqs" in helps["cfg_max_num_seqs"]
    assert "chunked prefill" in helps["cfg_max_num_batched_tokens"]
    assert "admitted only if" in helps["cfg_watermark_blocks"]
    # A field that held a number takes it back when cleared: each says what its 0 means.
    assert "0: no limit" in helps["cfg_max_num_seqs"]
    assert "0: no limit" in helps["cfg_max_num_batched_tokens"]
    assert "0: none" in helps["cfg_watermark_blocks"]
