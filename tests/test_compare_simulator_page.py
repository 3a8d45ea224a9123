"""The page's trace simulator and real-deployment tab through AppTest: Azure traces, uploads,
budgets, the preemption explanation, timelines, and issue 13's crash and progress text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from backend.lab import deployment as dep
from backend.lab.sim.simulator import SimConfig, simulate, simulate_workload
from backend.lab.traces import recorded_trace, replay_trace
from backend.lab.workloads import make_trace
from backend.views.compare import deployment as dep_views
from backend.views.compare import preemptions, tables
from tests import compare_support as support
from tests.compare_support import BLOCK_SIZE, CALCULATOR, DEPLOYMENT, SIMULATOR, open_tab, text
from tests.test_app_reliability import unescaped_images
from ui import bars as ui_bars
from ui.compare import sim_runs
from ui.compare.sim_inputs import MAX_UPLOAD_BYTES, RECORDED_CREDIT
from ui.compare.sim_runs import RUNS
from ui.compare.simulator import TRACE_NOTE


def start(tab: str = SIMULATOR) -> AppTest:
    return support.start(tab, timeout=180)


def chart_titles(at: AppTest) -> list[str]:
    """The titles of every chart drawn (and of the charts inside each), in order."""
    def titles(spec: dict[str, Any]) -> list[str]:
        t = spec.get("title")
        out = [t if isinstance(t, str) else t["text"]] if t else []
        return out + [x for k in ("layer", "hconcat", "vconcat") for s in spec.get(k, [])
                      for x in titles(s)]
    return [x for e in at.get("vega_lite_chart") for x in titles(json.loads(e.proto.spec))]


def test_simulate_every_block_size_after_a_run_does_not_crash() -> None:
    # Issue 13: the simulator's cached function drew its progress bar; once cached, the
    # block-size button replayed that drawing and crashed every session on the server.
    RUNS.clear()
    at = start()
    at.number_input(key="cmp_sim_requests").set_value(200)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    # A synthetic trace's run carries no credit for the recorded ones.
    assert TRACE_NOTE not in [c.value for c in at.caption]
    open_tab(at, BLOCK_SIZE).number_input(key="cmp_blk_requests").set_value(200)
    at.button(key="cmp_blk_sim").click().run()
    assert not at.exception and not at.error
    ends = [simulate_workload("sharegpt", SimConfig("paged", block_size=b), requests=200,
                              rate=4.0) for b in (1, 256)]
    assert tables.block_batch_sentence(ends) in text(at)
    # A fresh session on the same server, with everything cached.
    fresh = start(BLOCK_SIZE)
    fresh.number_input(key="cmp_blk_requests").set_value(200)
    fresh.button(key="cmp_blk_sim").click().run()
    assert not fresh.exception and not fresh.error
    assert tables.block_batch_sentence(ends) in text(fresh)


class _Bar:
    def __init__(self, value: float, text: str) -> None:
        self.shown: list[tuple[float, str]] = [(value, text)]

    def progress(self, value: float, text: str) -> None:
        self.shown.append((value, text))

    def empty(self) -> None:
        pass


def test_the_progress_text_agrees_with_its_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 13: "paged: 800 of 20,000 requests finished" under a bar counting all policies.
    bars: list[_Bar] = []

    def progress(value: float, text: str) -> _Bar:
        bars.append(_Bar(value, text))
        return bars[-1]

    monkeypatch.setattr(ui_bars.st, "progress", progress)
    RUNS.clear()
    trace = make_trace("sharegpt", 500, 4.0)
    configs = [SimConfig(p) for p in ("max", "pow2", "oracle", "paged")]  # type: ignore[arg-type]
    with ui_bars.progress_bar("Simulating...") as advance:
        sim_runs.run_cached(("test", 500), trace, configs, advance)
    [bar] = bars
    updates = bar.shown[1:]
    assert len(updates) > 40 and updates[-1][0] == 1.0
    for value, words in updates:
        # The text opens with the bar's own percentage and the count it stands for.
        assert words.startswith(f"{value:.0%}: ")
        done, total = words.split(": ", 1)[1].split(" requests")[0].split(" of ")
        assert int(done.replace(",", "")) / int(total.replace(",", "")) == pytest.approx(value)
    assert any(w.startswith("80%") and "(paged, policy 4 of 4: 100 of 500)" in w
               for _, w in updates)


def test_an_azure_trace_with_budgets_on_the_page() -> None:
    at = start()
    at.selectbox(key="cmp_sim_workload").set_value("azure-conv").run()
    at.number_input(key="cmp_sim_trace_requests_azure-conv").set_value(400)
    at.number_input(key="cmp_sim_time_scale").set_value(10.0)
    # The trace's own defaults: room for its longest request (14,089 tokens) in every policy.
    assert at.number_input(key="cmp_sim_capacity_16384").value == 65_536
    assert at.number_input(key="cmp_sim_max_len_16384").value == 16_384
    assert ("This trace's longest request holds 14,089 tokens: Capacity and Max reservation "
            "start at 65,536 and 16,384 for it") in text(at)
    # Credited as its license asks, where it is chosen, before any run.
    assert RECORDED_CREDIT in [c.value for c in at.caption]
    assert "[AzurePublicDataset](https://github.com/Azure/AzurePublicDataset)" in RECORDED_CREDIT
    at.number_input(key="cmp_sim_capacity_16384").set_value(60_000)
    # The budgets are whole numbers: a fraction is refused by its field's name, and
    # nothing runs on a number nobody typed.
    for key in ("max_num_seqs", "max_num_batched_tokens", "watermark_blocks"):
        at.number_input(key=f"cmp_sim_{key}").set_value(2.5)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        "max_num_seqs must be a whole number; got 2.5  \n"
        "max_num_batched_tokens must be a whole number; got 2.5  \n"
        "watermark_blocks (paged) must be a whole number; got 2.5"]
    assert "Last run" not in text(at)
    at.number_input(key="cmp_sim_watermark_blocks").set_value(None)
    at.number_input(key="cmp_sim_max_num_batched_tokens").set_value(2048)
    at.number_input(key="cmp_sim_max_num_seqs").set_value(64).run()
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    says = text(at)
    assert "Last run: azure-conv, the first 400 of 19,366 requests" in says
    assert "max_num_seqs 64, max_num_batched_tokens 2,048" in says
    trace = replay_trace(recorded_trace("azure-conv"), requests=400, time_scale=10.0)
    direct = simulate(trace, SimConfig("paged", 60_000, 16, 16_384, max_num_seqs=64,
                                       max_num_batched_tokens=2048))
    assert f"Why {direct.preemptions:,} preemptions for 400 requests." in says or (
        direct.preemptions == 0 and "**No preemption.**" in says)
    assert "Splitwise" in says and "CC BY" in says
    assert TRACE_NOTE in [c.value for c in at.caption]
    # The paper's measure is said in words where its column is.
    (metrics,) = [d for d in at.dataframe if "normalized latency (s/token)" in d.value.columns]
    assert json.loads(metrics.proto.columns)["normalized latency (s/token)"]["help"] == (
        "the mean over requests of each one's time from arrival to its last token, divided "
        "by its output tokens: the paper's measure")
    # The timeline's downloads are there; the policy picker switches it.
    labels = [b.label for b in at.get("download_button")]
    assert "Timeline (CSV)" in labels and "Timeline (Parquet)" in labels
    at.selectbox(key="cmp_sim_tl_policy").set_value("oracle").run()
    assert not at.exception
    # Refused parameters keep the earlier run on screen, said to be from before them.
    at.number_input(key="cmp_sim_watermark_blocks").set_value(99_999)
    at.button(key="cmp_sim_run").click().run()
    assert any("A watermark of 99,999 blocks" in e.value for e in at.error)
    assert ("Last run, from before the refused parameters: azure-conv, the first 400 of "
            "19,366 requests") in text(at)
    assert f"Why {direct.preemptions:,} preemptions for 400 requests." in text(at) or (
        direct.preemptions == 0)


def test_an_uploaded_trace_is_checked_whole() -> None:
    at = start()
    at.selectbox(key="cmp_sim_workload").set_value("upload").run()
    # Past the page's limit the browser still sends the file, to be refused on the page.
    assert at.file_uploader(key="cmp_sim_upload").proto.max_upload_size_mb << 20 \
        >= 2 * MAX_UPLOAD_BYTES
    at.button(key="cmp_sim_run").click().run()
    assert any(e.value == "Upload a trace first." for e in at.error)
    bad = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n1,100,-3\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("mine.csv", bad, "text/csv")).run()
    assert not at.exception
    assert any(e.value == "mine.csv: row 2 (line 3): GeneratedTokens must be an integer in "
               "1..16,777,216, got '-3'" for e in at.error)
    # Run with the refused file still in the uploader: said as such, not "upload one".
    at.button(key="cmp_sim_run").click().run()
    said = [e.value for e in at.error]
    assert "Upload a trace first." not in said
    assert ("The uploaded trace was refused (the reason is under the uploader): upload a "
            "corrected file.") in said, said
    # A trace whose requests fit the usual reservation keeps the usual fields, and what was
    # typed in them, without a word about defaults.
    at.number_input(key="cmp_sim_capacity").set_value(12_000)
    good = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,300,40\n2,50,10\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("mine.csv", good, "text/csv")).run()
    assert "longest request holds" not in text(at)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    assert "Last run: mine.csv, the first 3 of 3 requests (mean 1/s), 12,000 token slots" \
        in text(at)
    # One arrival has no rate to give.
    one = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("one.csv", one, "text/csv")).run()
    at.button(key="cmp_sim_run").click().run()
    assert "Last run: one.csv, its one request (one arrival, no rate)" in text(at)
    # Nor do arrivals all at one moment: not "mean 0/s".
    same = b"TIMESTAMP,ContextTokens,GeneratedTokens\n5,100,50\n5,200,20\n5,30,3\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("same.csv", same, "text/csv")).run()
    at.button(key="cmp_sim_run").click().run()
    assert ("Last run: same.csv, the first 3 of 3 requests (all 3 arriving at once, no rate)"
            in text(at))
    # A request as long as a trace may hold: the page's own defaults stay within the
    # fields' range (they were 4x it, refused before anything was typed) and the run says
    # what cannot fit.
    huge = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,16777216,5\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("long.csv", huge, "text/csv")).run()
    assert not at.exception and not at.error
    assert at.number_input(key="cmp_sim_capacity_16777216").value == 16_777_216
    # Its caption promises no policy can hold it; the run below says why not.
    assert [c.value for c in at.caption if "longest request holds" in c.value] == [
        "This trace's longest request holds 16,777,221 tokens: Capacity and Max reservation "
        "start at 16,777,216 and 16,777,216 for it, the largest the fields take, which the "
        "paged policy's blocks of 16 cannot hold it in: the run says what would (fields of "
        "its own: the usual ones keep what was typed in them)."]
    at.button(key="cmp_sim_run").click().run()
    assert [e.value for e in at.error] == [
        "The longest request cannot run: a request of 16,777,221 tokens can never fit in an "
        "arena of 16,777,216 slots"]
    # One the largest capacity holds only without the watermark: said before the run.
    near = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,16000000,700000\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("near.csv", near, "text/csv")).run()
    assert [c.value for c in at.caption if "longest request holds" in c.value] == [
        "This trace's longest request holds 16,700,000 tokens: Capacity and Max reservation "
        "start at 16,777,216 and 16,777,216 for it, the largest the fields take, but the "
        "paged policy's watermark keeps too many of its blocks of 16 free for it: set "
        "watermark_blocks (Scheduler budgets) to 0 (fields of its own: the usual ones keep "
        "what was typed in them)."]
    # A trace the default fields hold says so.
    fine = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,3000,100\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("fine.csv", fine, "text/csv")).run()
    assert next(c.value for c in at.caption if "longest request holds" in c.value).endswith(
        "for it, so that every policy can hold it (fields of its own: the usual ones keep "
        "what was typed in them).")


def test_the_real_deployment_tab_reproduces_figure_13_on_the_code_trace() -> None:
    at = start(DEPLOYMENT)
    at.selectbox(key="cmp_dep_trace").set_value("azure-code").run()
    d = dep.deployment("azure-code")
    assert dep_views.preset_sentence(d) in text(at)
    # The trace's figures come with its credit, the paper cited in full, before a replay.
    assert TRACE_NOTE in [c.value for c in at.caption]
    assert ('Pratyush Patel, Esha Choukse, Chaojie Zhang, Aashaka Shah, Íñigo Goiri, Saeed '
            'Maleki, Ricardo Bianchini. "Splitwise: Efficient generative LLM inference using '
            'phase splitting", ISCA 2024.') in TRACE_NOTE
    assert "CC BY 4.0" in TRACE_NOTE and "AzurePublicDataset" in TRACE_NOTE
    # Before a replay: what it will run, and no time promised (it depends on the server).
    assert (f"Press Replay the whole trace: 4 policies, {len(d.trace):,} requests each; a "
            "bar shows their progress.") in [c.value for c in at.caption]
    RUNS.clear()    # the time said is this click's: no run of another test is reused
    at.button(key="cmp_dep_run").click().run()
    assert not at.exception and not at.error
    # (tests/test_traces.py checks the same replays against the backend directly.)
    last: dict[str, Any] = at.session_state["cmp_dep_last"]
    results = [r.result for r in last["runs"]]
    wall = sum(r.wall_s for r in results)
    assert (f"Last run: azure-code, time / 400; the four replays took {wall:.1f} s on this "
            "server.") in [c.value for c in at.caption]
    # Another session's replay of the same trace is the server's cache: said so, not
    # claimed as the time this click took.
    other = start(DEPLOYMENT)
    other.selectbox(key="cmp_dep_trace").set_value("azure-code").run()
    other.button(key="cmp_dep_run").click().run()
    assert ("Last run: azure-code, time / 400; the four replays had run on this server "
            "before (in this session or another) and are shown from its cache; they took "
            f"{wall:.1f} s then.") in [c.value for c in other.caption]
    assert [r.policy for r in results] == ["paged", "max", "pow2", "oracle"]
    assert all(r.requests == len(d.trace) and r.capacity_tokens == 909_659 for r in results)
    says = text(at)
    assert dep_views.figure13_sentence(results) in says
    assert "the direction of the paper's Figure 13" in says
    # The code trace's three upper bars are close, and the line says so, with the waits.
    assert "Orca (Pow2), Orca (Oracle) and vLLM lie within 2.1% of one another" in says
    waits = dep_views.figure13_waits(results)
    assert waits.startswith("Requests waited for room in ")
    # The ranking alone is bold; the waits are a paragraph of their own.
    assert waits in [m.value for m in at.markdown]
    intro = text(at)
    assert "makes memory the limit" not in intro
    assert dep_views.length_note(d, last["runs"]) in says
    # Figure 13's chart is the tab's mean batch chart: the comparison below draws no other.
    titles = chart_titles(at)
    assert "Mean batched requests (cf. the paper's Figure 13)" in titles
    assert "Mean batch size" not in titles and "Token states of memory held" in titles


def test_an_uploaded_traces_file_name_is_shown_as_text() -> None:
    at = start()
    at.selectbox(key="cmp_sim_workload").set_value("upload").run()
    name = "![x](http://example.invalid/a.png).csv"
    bad = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n1,100,-3\n"
    at.file_uploader(key="cmp_sim_upload").set_value((name, bad, "text/csv")).run()
    assert not at.exception
    # Wherever the name is said (the refusal, the last run's caption), it is escaped text.
    refused = [e.value for e in at.error if "example" in e.value]
    assert len(refused) == 1 and not unescaped_images(refused[0]), refused
    good = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,300,40\n"
    at.file_uploader(key="cmp_sim_upload").set_value((name, good, "text/csv")).run()
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    last = [c.value for c in at.caption if c.value.startswith("Last run")]
    assert len(last) == 1 and "example" in last[0] and not unescaped_images(last[0]), last


def test_a_trace_is_known_by_its_content_not_its_file_name() -> None:
    # A CSV saved as .txt is replayed; a picture is refused with the trace reader's reason.
    at = start()
    at.selectbox(key="cmp_sim_workload").set_value("upload").run()
    good = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,300,40\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("trace.txt", good, "text/plain")).run()
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("Last run") and "trace.txt" in c.value for c in at.caption)
    at.file_uploader(key="cmp_sim_upload").set_value(
        ("picture.png", b"\x89PNG\r\n\x1a\n\x00", "image/png")).run()
    assert not at.exception
    assert any("picture.png: not UTF-8 text (byte 0x89 at offset 0); it may be a binary file"
               in e.value for e in at.error), [e.value for e in at.error]


def test_two_sessions_uploading_one_file_under_two_names_each_keep_their_own_name() -> None:
    # Runs are shared by content between sessions; a run carries the trace's name, and
    # another session's file name is not this session's to see.
    data = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,300,40\n2,50,10\n"
    for name in ("first-name.csv", "second-name.csv"):
        at = start()
        at.selectbox(key="cmp_sim_workload").set_value("upload").run()
        at.file_uploader(key="cmp_sim_upload").set_value((name, data, "text/csv")).run()
        at.button(key="cmp_sim_run").click().run()
        assert not at.exception and not at.error
        runs = at.session_state["cmp_sim_last"]["runs"]
        assert runs and {r.result.workload for r in runs} == {name}
    # In one session too: the same bytes uploaded again under another name are that name.
    at.file_uploader(key="cmp_sim_upload").set_value(("renamed.csv", data, "text/csv")).run()
    at.button(key="cmp_sim_run").click().run()
    assert "Last run: renamed.csv, the first 3 of 3 requests" in text(at)


def test_an_uploaded_trace_is_replayed_again_after_another_tab() -> None:
    # An uploader forgets its file when its tab is not drawn; the trace parsed from it
    # is kept, said to be, and replayed, until the person removes or replaces it.
    at = start()
    at.selectbox(key="cmp_sim_workload").set_value("upload").run()
    good = b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,20\n0.5,300,40\n2,50,10\n"
    at.file_uploader(key="cmp_sim_upload").set_value(("mine.csv", good, "text/csv")).run()
    open_tab(at, CALCULATOR)
    open_tab(at, SIMULATOR)
    assert at.file_uploader(key="cmp_sim_upload").value is None
    said = [c.value for c in at.caption]
    assert any(c.startswith("Replaying mine.csv, uploaded before") for c in said), said
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    assert "Last run: mine.csv, the first 3 of 3 requests" in text(at)
    # Still kept on the runs after (the uploader is drawn, and still shows no file).
    at.run()
    assert any(c.value.startswith("Replaying mine.csv") for c in at.caption)
    # A file removed from a drawn uploader is gone.
    at.file_uploader(key="cmp_sim_upload").set_value(("other.csv", good, "text/csv")).run()
    assert not any(c.value.startswith("Replaying") for c in at.caption)
    at.file_uploader(key="cmp_sim_upload").set_value(None).run()
    assert not at.exception
    assert "Upload a trace to replay it, one row per request." in [c.value for c in at.caption]
    at.button(key="cmp_sim_run").click().run()
    assert any(e.value == "Upload a trace first." for e in at.error)


def test_the_watermark_sweep_replays_paged_memory_and_keeps_its_table() -> None:
    at = start()
    at.number_input(key="cmp_sim_requests").set_value(300)
    at.button(key="cmp_sim_run").click().run()
    assert not at.exception and not at.error
    last = at.session_state["cmp_sim_last"]
    paged = next(r for r in last["runs"] if r.result.policy == "paged")
    assert paged.result.preemptions > 0
    at.button(key="cmp_sim_watermarks").click().run()
    assert not at.exception and not at.error
    table = next(d.value for d in at.dataframe if "watermark blocks" in d.value.columns)
    cfg = next(c for c in last["configs"] if c.policy == "paged")
    blocks = cfg.capacity_tokens // cfg.block_size
    assert len(table) == len({int(f * blocks) for f in (0.01, 0.02, 0.05, 0.1)}
                             | {int(cfg.watermark * blocks)})
    # Its caption is read from the runs in the table, not a general claim.
    said = preemptions.watermark_sentence(last["watermarks"])
    assert said.startswith("The same trace through paged memory, keeping more blocks free")
    assert said in [c.value for c in at.caption]
    # Kept with the run it extends, after another tab.
    open_tab(at, CALCULATOR)
    again = [d.value for d in open_tab(at, SIMULATOR).dataframe
             if "watermark blocks" in d.value.columns]
    assert len(again) == 1 and again[0].equals(table)
