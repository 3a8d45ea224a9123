"""The Scenarios page through Streamlit's AppTest: every shipped scenario, stepped in the app.

Each scenario is opened by its link, stepped to the end with Next, and at every
step the page must show each narrated number with a ✓, and the same numbers in
the ordinary panels (metrics, block tables, the contiguous arena). Most tests
use the torch kernel (one click in the sidebar) to stay fast on a CPU;
`test_a_scenario_on_the_default_triton_kernel` runs the default one.
"""

from __future__ import annotations

import copy
import json
import re
from html import escape
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from backend.core.config import EngineConfig
from backend.engine.ops import describe_op, label_narration
from backend.io.restore import restore_engine
from backend.io.scenario import MAX_SCENARIO_BYTES, load_scenario
from backend.io.scenario_export import scenario_json
from backend.io.snapshot import export_snapshot
from backend.sessions import budget as budget_module
from backend.sessions import tour as tour_session
from backend.sessions.playground import Settings
from backend.sessions.tour import TourRun, shipped_scenario
from backend.views.text import plain_md
from backend.views.tour import value_text
from tests.test_app import click, html, markdown, metrics
from tests.test_restore_scores import counting_forwards
from tests.test_store_scenario import OPS, _session
from ui import history, tour, tour_link
from ui.state_writes import Queued
from ui.tour import upload_link

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
SCENARIOS = sorted((ROOT / "assets" / "scenarios").glob("*.json"))
NAMES = [p.stem for p in SCENARIOS]
PAGE = "pages/scenarios.py"


def open_tour(scenario: str | None = None, step: str | list[str] | None = None,
              kernel: str = "torch", applied: str | None = None) -> AppTest:
    """The app, switched to `kernel` on the Playground, then the Scenarios page by its link."""
    at = AppTest.from_file(APP, default_timeout=180).run()
    assert not at.exception
    if kernel != "auto":
        at.segmented_control(key="dev_kernel").set_value(kernel).run()
    if scenario is not None:
        at.query_params["scenario"] = scenario
    if step is not None:
        at.query_params["step"] = step
    if applied is not None:
        at.query_params["applied"] = applied
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def run_of(at: AppTest) -> TourRun:
    run: TourRun = at.session_state["tour"].run
    return run


def checks(at: AppTest) -> dict[str, tuple[bool, str]]:
    """The 'what you should see' rows: raw path -> (checked ok, the row's HTML)."""
    rows = re.findall(r"<div class='pl-check' data-ok='(\d)' data-path='([^']+)'(.*?)</div>",
                      html(at, "pl-checks"))
    return {path: (ok == "1", body) for ok, path, body in rows}


def viewed_step(at: AppTest) -> int:
    found = re.search(r"\*\*Step (\d+) of (\d+)", markdown(at))
    assert found is not None, markdown(at)
    return int(found.group(1))


def requests_table(at: AppTest) -> Any:
    """The block tables (the control run's table also has a request column)."""
    return next(d.value for d in at.dataframe
                if "block table (logical→physical)" in d.value.columns).set_index("request")


# Metric paths and the label (and format) the metrics panel shows them with.
METRIC_LABELS = {
    "used_blocks": ("Used blocks", "{v} / {n}"),
    "free_blocks": ("Free blocks", "{v}"),
    "cached_blocks": ("Cached blocks", "{v}"),
    "shared_blocks": ("Shared blocks", "{v}"),
    "cow_copies": ("Copy-on-write copies", "{v}"),
    "preemptions": ("Preemptions", "{v}"),
    "internal_waste_slots": ("Internal waste", "{v} slot{s}"),
    "blocks_saved_by_sharing": ("Blocks saved by sharing", "{v}"),
}


def assert_visible_in_panels(at: AppTest, path: str, want: Any, num_blocks: int) -> bool:
    """Where the ordinary panels show `path`, they show `want`. Whether they show it at all."""
    parts = path.split(".")
    if parts[0] == "metrics" and parts[1] in METRIC_LABELS:
        label, fmt = METRIC_LABELS[parts[1]]
        plural = "" if want == 1 else "s"   # "1 slot", as the panel counts
        assert metrics(at)[label] == fmt.format(v=want, n=num_blocks, s=plural), path
        return True
    if parts[0] == "metrics" and parts[1] == "filled_slots":
        assert metrics(at)["Filled slots"].startswith(f"{want} / "), path
        return True
    if parts[0] == "requests" and parts[2] in ("block_table", "num_tokens", "status"):
        row = requests_table(at).loc[parts[1]]
        if parts[2] == "block_table":
            shown = row["block table (logical→physical)"]
            entries = [e.split(" ")[0] for e in shown.split(" · ")] if want else ["—"]
            assert entries == ([f"{i}→{b}" for i, b in enumerate(want)] or ["—"]), (path, shown)
        elif parts[2] == "num_tokens":
            assert row["tokens"] == want, path
        else:
            assert str(row["status"]).startswith(want), path
        return True
    if parts[0] == "contiguous" and parts[1] == "breakdown":
        caption = "\n".join(c.value for c in at.caption)
        label = {"token_states": "holding tokens", "reservation": "reserved for future tokens",
                 "internal_fragmentation": "reserved, never used",
                 "external_fragmentation": "external fragmentation", "free": "free"}[parts[2]]
        assert f"{want} {label}" in caption, (path, caption)
        return True
    return False


# ---- every shipped scenario -------------------------------------------------------------

@pytest.mark.parametrize("path", SCENARIOS, ids=NAMES)
def test_every_scenario_steps_through_with_its_numbers_checked(path: Path) -> None:
    scenario = load_scenario(path)
    at = open_tour(path.stem)
    assert viewed_step(at) == 0
    assert plain_md(scenario.name) in [h.value for h in at.header]
    assert at.query_params == {"scenario": path.stem, "step": "0"}
    n = scenario.config.num_blocks
    visible = 0
    for i, step in enumerate(scenario.steps, start=1):
        click(at, "tour_next")
        assert not at.error, [e.value for e in at.error]
        assert viewed_step(at) == i
        if step.narration:
            # As Markdown that shows it exactly (scenario 07's two spaces included).
            assert plain_md(step.narration) in markdown(at)
        rows = checks(at)
        assert step.expect is not None
        assert set(rows) == set(step.expect)
        for key, want in step.expect.items():
            ok, body = rows[key]
            assert ok, f"step {i}: {key} shows ✗: {body}"
            # The number shown beside the ✓ is the narrated one.
            assert f"<b>{escape(value_text(key, want))}</b>" in body, (key, body)
            visible += assert_visible_in_panels(at, key, want, n)
        said = {1: "The narrated value matches", 2: "Both narrated values match"}.get(
            len(step.expect), f"All {len(step.expect)} narrated values match")
        assert said in markdown(at) or any(said in c.value for c in at.caption)
    assert visible >= 1, "no narrated number was found in the ordinary panels"
    assert at.button(key="tour_next").disabled
    assert at.query_params == {"scenario": path.stem, "step": str(len(scenario.steps))}
    assert run_of(at).engine.kernels.name == "torch"


def test_a_scenario_on_the_default_triton_kernel() -> None:
    at = open_tour("08-fork-copy-on-write", kernel="auto")
    for _ in range(6):
        click(at, "tour_next")
    assert viewed_step(at) == 6
    assert all(ok for ok, _ in checks(at).values())
    text = markdown(at)
    assert "Last model step ran on **triton-interpreter** (cpu)" in text
    found = re.search(r"reference\\\|: \*\*([0-9.e+-]+)\*\*", text)
    assert found is not None and float(found.group(1)) < 1e-4
    assert run_of(at).engine.kernel_report.backend == "triton-interpreter"


# ---- time travel ----------------------------------------------------------------------

def test_back_and_the_slider_show_earlier_states_without_recomputing() -> None:
    at = open_tour("08-fork-copy-on-write")
    for _ in range(3):
        click(at, "tour_next")
    m = metrics(at)
    assert (m["Copy-on-write copies"], m["Shared blocks"], m["Used blocks"]) == \
        ("1", "2", "4 / 32")
    assert escape("A2's block table") + "</span>: <b>[0, 1, 3]</b>" in html(at, "pl-checks")
    engine = run_of(at).engine
    # Back: the fork, before the copy. Nothing is recomputed: the engine stays at step 3.
    click(at, "tour_back")
    assert viewed_step(at) == 2
    m = metrics(at)
    assert (m["Copy-on-write copies"], m["Shared blocks"], m["Used blocks"]) == \
        ("0", "3", "3 / 32")
    assert requests_table(at).loc["A2", "block table (logical→physical)"] == \
        "0→0 · 1→1 · 2→2 (3/4)"
    assert "A2 forks from A" in markdown(at)
    assert run_of(at).taken == 3 and run_of(at).engine is engine and engine.step == 3
    assert at.query_params["step"] == "2"
    # The next step is one the engine has run: Next shows it, and the line says so.
    said = [c.value for c in at.caption]
    assert [c for c in said if c.startswith("Next: step 3, ")
            and c.endswith("(already applied: Next views it).")], said
    # The slider: step 1, A alone in three blocks.
    assert (at.slider(key="tour_slider").min, at.slider(key="tour_slider").max) == (0, 3)
    at.slider(key="tour_slider").set_value(1).run()
    assert viewed_step(at) == 1
    assert metrics(at)["Used blocks"] == "3 / 32"
    assert list(requests_table(at).index) == ["A"]
    # Step 0 is the fresh engine.
    at.slider(key="tour_slider").set_value(0).run()
    assert metrics(at)["Used blocks"] == "0 / 32" and at.button(key="tour_back").disabled
    # Next walks forward through what is computed, then computes the next step.
    for want in (1, 2, 3):
        click(at, "tour_next")
        assert viewed_step(at) == want and run_of(at).taken == 3
    click(at, "tour_next")
    assert viewed_step(at) == 4 and run_of(at).taken == 4
    assert metrics(at)["Copy-on-write copies"] == "1"


def test_the_step_bar_above_the_pool_steps_as_back_and_next_do() -> None:
    at = open_tour("03-growth")
    assert at.button(key="tour_back_pool").disabled
    click(at, "tour_next_pool")
    click(at, "tour_next_pool")
    assert viewed_step(at) == 2 and run_of(at).taken == 2
    assert any("Showing step **2** of 4 below." in c.value for c in at.caption)
    click(at, "tour_back_pool")
    assert viewed_step(at) == 1 and run_of(at).taken == 2
    assert metrics(at)["Used blocks"] == "3 / 16"


def test_reset_starts_the_run_again() -> None:
    at = open_tour("03-growth")
    click(at, "tour_next")
    click(at, "tour_next")
    click(at, "tour_reset")
    assert viewed_step(at) == 0 and run_of(at).taken == 0
    assert metrics(at)["Used blocks"] == "0 / 16"
    assert at.query_params["step"] == "0"
    # Step 0's box says what it shows; the description stays the page's, said once.
    assert ("Nothing has run yet: no request, and the pool's 16 blocks are all free. "
            "**Next** applies the first step.") in markdown(at)
    description = run_of(at).scenario.description
    assert sum(m.value.count(description) for m in at.markdown) == 1


def test_a_scenario_with_no_steps_says_so_at_step_0() -> None:
    at = open_tour()
    upload(at, "none.json", json.dumps({"name": "Nothing", "steps": []}).encode())
    assert run_of(at).total == 0 and viewed_step(at) == 0
    said = markdown(at)
    assert "This scenario has no steps: the fresh engine is all it shows." in said
    assert "applies the first step" not in said
    assert not any("This is the last step." in c.value for c in at.caption)


def test_play_runs_to_the_end_and_stops() -> None:
    at = open_tour("02-block-table")
    at.select_slider(key="tour_speed").set_value(0.25).run()
    click(at, "tour_play")
    # One click plays every step (each rerun shows one), then play turns itself off.
    assert viewed_step(at) == 3 and run_of(at).taken == 3
    assert not at.session_state["tour"].playing
    assert [i.value for i in at.info] == ["Played to the end: step 3 of 3."]
    assert at.button(key="tour_play").disabled
    assert at.query_params["step"] == "3"
    assert all(ok for ok, _ in checks(at).values())


def test_play_from_an_earlier_step_replays_what_is_computed_first() -> None:
    at = open_tour("02-block-table")
    at.select_slider(key="tour_speed").set_value(0.25).run()
    click(at, "tour_next")
    click(at, "tour_next")
    click(at, "tour_back")
    click(at, "tour_back")
    engine = run_of(at).engine
    click(at, "tour_play")
    assert viewed_step(at) == 3 and run_of(at).taken == 3 and run_of(at).engine is engine


# ---- the link ------------------------------------------------------------------------------

def test_a_link_opens_a_given_step() -> None:
    at = open_tour("02-block-table", "2")
    assert viewed_step(at) == 2 and run_of(at).taken == 2
    assert "6 divided by 4 is 1 remainder 2" in markdown(at)
    assert escape("address of A's token 6") in html(at, "pl-checks")
    assert at.query_params == {"scenario": "02-block-table", "step": "2"}
    click(at, "tour_next")
    assert at.query_params == {"scenario": "02-block-table", "step": "3"}
    assert at.selectbox(key="tour_pick").value == "02-block-table"


def test_a_parameter_given_twice_is_said_and_written_back_once() -> None:
    at = open_tour("08-fork-copy-on-write", ["3", "4"])   # &step=3&step=4
    assert viewed_step(at) == 4
    assert "The link gives step twice; the last, '4', is used." in [
        i.value for i in at.info]
    assert at.query_params == {"scenario": "08-fork-copy-on-write", "step": "4"}


def test_the_link_keeps_steps_applied_past_the_view() -> None:
    at = open_tour("03-growth", "3")
    click(at, "tour_back")
    click(at, "tour_back")
    assert at.query_params == {"scenario": "03-growth", "step": "1", "applied": "3"}
    # The link opened afresh (a reload) takes the three steps again and views step 1.
    again = open_tour("03-growth", "1", applied="3")
    assert viewed_step(again) == 1 and run_of(again).taken == 3
    # The same state (the kernel's report has its own timings).
    assert ({k: v for k, v in export_snapshot(run_of(again).engine).items() if k != "kernel"}
            == {k: v for k, v in export_snapshot(run_of(at).engine).items() if k != "kernel"})
    assert again.query_params == {"scenario": "03-growth", "step": "1", "applied": "3"}
    # Next views the next applied step (nothing new is taken); at the newest the count
    # leaves the link.
    click(again, "tour_next")
    click(again, "tour_next")
    assert viewed_step(again) == 3 and run_of(again).taken == 3
    assert again.query_params == {"scenario": "03-growth", "step": "3"}
    # A count that is no step of the scenario is ignored, and the page says so: the
    # view's steps are taken.
    for bad in ("99", "x", "-2"):
        odd = open_tour("03-growth", "2", applied=bad)
        assert not odd.error and viewed_step(odd) == 2 and run_of(odd).taken == 2, bad
        assert [i.value for i in odd.info] == [
            f"The link's applied {bad!r} is not a step of this scenario (0 to "
            f"{run_of(odd).total}); it is ignored."], bad
        assert odd.query_params == {"scenario": "03-growth", "step": "2"}
    # Fewer than the view's step: that step is applied all the same, and the page says the
    # count is ignored; as many is what the view applies, and nothing is said.
    fewer = open_tour("03-growth", "3", applied="1")
    assert not fewer.error and viewed_step(fewer) == 3 and run_of(fewer).taken == 3
    assert [i.value for i in fewer.info] == [
        "The link's applied '1' is fewer than its step 3, whose view applies 3; it is "
        "ignored."]
    assert fewer.query_params == {"scenario": "03-growth", "step": "3"}
    same = open_tour("03-growth", "2", applied="2")
    assert not same.info and viewed_step(same) == 2 and run_of(same).taken == 2
    # A count without a step is said to be ignored too (the scenario opens at step 0).
    alone = open_tour("03-growth", applied="3")
    assert not alone.error and viewed_step(alone) == 0 and run_of(alone).taken == 0
    assert [i.value for i in alone.info] == [
        "The link's applied '3' counts only beside a step; it is ignored."]
    # Alone in the address, it is said to be ignored as well; beside an unknown
    # scenario, the scenario's error covers the step and count it drops.
    bare = open_tour(applied="3")
    assert [i.value for i in bare.info] == [
        "The link's applied '3' counts only beside a scenario and a step; it is ignored."]
    unknown = open_tour("no-such", "2", applied="3")
    assert not unknown.info and len(unknown.error) == 1
    # Beside a step that is no step of the scenario, the step's error says so too.
    past = open_tour("08-fork-copy-on-write", "9", applied="2")
    assert [e.value for e in past.error] == [
        "The link's step '9' is not a step of this scenario (0 to 6); showing step 0. Its "
        "applied '2' is ignored with it."]
    assert viewed_step(past) == 0 and not past.info


@pytest.mark.parametrize("behind", [1, 2])
def test_the_address_of_a_step_a_play_left_does_not_move_the_view_back(behind: int) -> None:
    # A Pause clicked before the browser had the play's newest pages sends the address of
    # a step before them: that is no link a person opened (it read "Viewing step 4 of 9 ·
    # 5 applied so far" in Chromium; on a slow machine, "6 of 9 · 8 applied", two steps
    # behind). Here the play has moved from step 2 to 3 to 4.
    at = open_tour("05-continuous-batching", "3")
    click(at, "tour_next")
    t = at.session_state["tour"]
    assert (t.view, t.url) == (4, ("05-continuous-batching", "4", None))
    t.left_by_play = frozenset({2, 3})
    t.written = (("05-continuous-batching", "2", None), ("05-continuous-batching", "3", None))
    stale = str(4 - behind)
    at.query_params["step"] = stale
    at.run()
    assert viewed_step(at) == 4 and at.query_params["step"] == "4"
    # Nor after a page after the play is complete: within a tab's session the address
    # changes only by the page's writes and by Back or Forward (a link opened anew loads
    # the page in a new session), so an older one of its own is a click's stale copy.
    at.query_params["step"] = stale
    at.run()
    assert viewed_step(at) == 4 and at.query_params["step"] == "4"


def test_a_key_held_on_the_slider_moves_the_view_and_the_address_with_it() -> None:
    # Arrow keys pressed 0.15 s apart: the third press carried the address of the first
    # (the browser had not yet got the second's), which was taken for a link the person
    # opened: the view went back to step 1 while the address, written by the second
    # press's run after it, said step 2 ("Viewing step 1 of 9" at `step=2`), and a
    # reload opened another step than the one shown.
    at = open_tour("10-beam-search", "0")
    for _ in range(6):
        click(at, "tour_next")
    at.slider(key="tour_slider").set_value(0).run()
    at.slider(key="tour_slider").set_value(1).run()
    assert at.query_params["step"] == "1"
    at.slider(key="tour_slider").set_value(2).run()
    assert at.query_params["step"] == "2"
    at.query_params["step"] = "1"          # the browser still at the first press's address
    at.slider(key="tour_slider").set_value(3).run()
    assert viewed_step(at) == 3 and at.slider(key="tour_slider").value == 3
    assert (at.query_params["step"], at.query_params["applied"]) == ("3", "6")


@pytest.mark.parametrize(("scenario", "step", "message", "want_scenario"), [
    ("no-such-story", "2", "The link names no scenario 'no-such-story'; showing “The "
                           "contiguous allocation problem” instead.", "01-contiguous-problem"),
    ("03-growth", "99", "The link's step '99' is not a step of this scenario (0 to 4); "
                        "showing step 0.", "03-growth"),
    ("03-growth", "two", "The link's step 'two' is not a step of this scenario (0 to 4); "
                         "showing step 0.", "03-growth"),
    ("03-growth", "-1", "The link's step '-1' is not a step of this scenario (0 to 4); "
                        "showing step 0.", "03-growth"),
    # Past Python's int() digit limit: refused like 99, not raised.
    ("08-fork-copy-on-write", "9" * 5000, f"The link's step '{'9' * 39}…' is not a step of "
                                          "this scenario (0 to 6); showing step 0.",
     "08-fork-copy-on-write"),
    # Forms int() would take but a step number is not written in.
    ("03-growth", "1e3", "The link's step '1e3' is not a step of this scenario (0 to 4); "
                         "showing step 0.", "03-growth"),
    ("03-growth", " 3", "The link's step ' 3' is not a step of this scenario (0 to 4); "
                        "showing step 0.", "03-growth"),
    ("03-growth", "+3", "The link's step '+3' is not a step of this scenario (0 to 4); "
                        "showing step 0.", "03-growth"),
    ("03-growth", "\uff13", "The link's step '\uff13' is not a step of this scenario (0 to "
                            "4); showing step 0.", "03-growth"),
    ("03-growth", "\u0663", "The link's step '\u0663' is not a step of this scenario (0 to "
                            "4); showing step 0.", "03-growth"),
    ("03-growth", "", "The link's step '' is not a step of this scenario (0 to 4); showing "
                      "step 0.", "03-growth"),
    ("x" * 5000, "1", f"The link names no scenario '{'x' * 39}…'; showing “The contiguous "
                      "allocation problem” instead.", "01-contiguous-problem"),
], ids=["unknown-scenario", "step-too-large", "step-not-a-number", "step-negative",
        "step-of-5000-digits", "step-exponent", "step-with-a-blank", "step-with-a-sign",
        "step-fullwidth-digit", "step-arabic-indic-digit", "step-empty", "scenario-5000-chars"])
def test_a_bad_link_is_explained_and_falls_back(scenario: str, step: str, message: str,
                                                want_scenario: str) -> None:
    at = open_tour(scenario, step)
    assert [e.value for e in at.error] == [message]
    assert viewed_step(at) == 0
    assert at.query_params == {"scenario": want_scenario, "step": "0"}
    assert run_of(at).key == want_scenario


def test_a_step_with_leading_zeros_is_that_step() -> None:
    at = open_tour("03-growth", "03")
    assert not at.error and viewed_step(at) == 3
    assert at.query_params == {"scenario": "03-growth", "step": "3"}


def test_choosing_a_scenario_starts_it_and_updates_the_link() -> None:
    at = open_tour()
    # The first scenario's fresh engine is what a bare address opens: it stays bare.
    assert run_of(at).key == NAMES[0] and dict(at.query_params) == {}
    at.selectbox(key="tour_pick").select("13-cache-revival").run()
    assert "Cached blocks outlive their request" in [h.value for h in at.header]
    assert at.query_params == {"scenario": "13-cache-revival", "step": "0"}
    assert metrics(at)["Used blocks"] == "0 / 10"
    # Nothing was applied: nothing is left behind, and nothing is said.
    assert not at.info
    # A scenario left after some steps is not kept: the page says so, and how to get back.
    click(at, "tour_next")
    click(at, "tour_next")
    at.selectbox(key="tour_pick").select("03-growth").run()
    assert [i.value for i in at.info] == [
        "Left “Cached blocks outlive their request” after 2 of its 8 steps: picking it again "
        "starts it over (the browser's Back returns to it where it was)."]
    assert run_of(at).key == "03-growth" and run_of(at).taken == 0
    # So does an upload's (it stays in the picker, and its address is its own).
    upload(at, "mine.json", json.dumps({"name": "Mine", "steps": [
        {"op": "add", "request": "A", "prompt": "hi"}]}).encode())
    click(at, "tour_next")
    at.selectbox(key="tour_pick").select("03-growth").run()
    assert [i.value for i in at.info] == [
        "Left “Mine (uploaded: mine.json)” after 1 of its 1 step: picking it again starts it "
        "over (the browser's Back returns to it where it was)."]


# ---- uploads -----------------------------------------------------------------------------

def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key="tour_file").set_value((name, data, "application/json")).run()
    assert not at.exception
    return at


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json", "Scenario file refused: bad.json is not valid JSON: Expecting property name "
                   "enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"[1, 2]", "Scenario file refused: bad.json: a scenario must be a JSON object, got an "
                "array"),
    (json.dumps({"config": {"block_size": 0}, "steps": []}).encode(),
     "Scenario file refused: bad.json: config: block_size must be an integer in 1..256, got 0"),
    (json.dumps({"steps": [{"op": "add", "request": "A", "prompt": "hi"},
                           {"op": "grow", "tokens": 2}]}).encode(),
     "Scenario file refused: bad.json: step 2 (grow): missing field 'request'"),
    (json.dumps({"steps": [{"op": "jump"}]}).encode(),
     "Scenario file refused: bad.json: step 1 (jump): unknown op 'jump'; expected one of add, "
     "grow, fork, finish, step, shuffle"),
    (b"[" * 100_000 + b"]" * 100_000,
     "Scenario file refused: bad.json nests arrays or objects deeper than PagedLab reads "
     "(no file of PagedLab's nests more than a few levels)"),
    # A JSON escape can write half of a character's surrogate pair, which no text holds:
    # shown as it was, it stopped the page for the session.
    (json.dumps({"name": "caf\udce9", "steps": []}).encode(),
     "Scenario file refused: bad.json: name is not valid Unicode text (it holds a lone "
     "surrogate)"),
    (json.dumps({"steps": [{"op": "add", "request": "A", "prompt": "hi",
                            "narration": "\ud83d"}]}).encode(),
     "Scenario file refused: bad.json: step 1 (add): narration is not valid Unicode text (it "
     "holds a lone surrogate)"),
    (json.dumps({"steps": [{"op": "add", "request": "A", "prompt": "hi",
                            "expect": {"requests.\ud800": 1}}]}).encode(),
     "Scenario file refused: bad.json: step 1 (add): a key of expect is not valid Unicode "
     "text (it holds a lone surrogate)"),
], ids=["not-json", "not-an-object", "bad-config", "bad-step", "unknown-op", "nested-deep",
        "surrogate-name", "surrogate-narration", "surrogate-expect"])
def test_a_malformed_scenario_upload_names_the_problem(data: bytes, message: str) -> None:
    at = open_tour("03-growth")
    click(at, "tour_next")
    upload(at, "bad.json", data)
    assert [e.value for e in at.error] == [message]
    # The scenario being read is kept, at the step it was.
    assert run_of(at).key == "03-growth" and viewed_step(at) == 1


def test_an_oversized_scenario_upload_is_refused_unread() -> None:
    at = open_tour("03-growth")
    # The browser lets a file past the limit through (twice the limit), so that this
    # refusal, on the page, is what a person sees, not Streamlit's mark on the file's chip.
    assert at.file_uploader(key="tour_file").proto.max_upload_size_mb << 20 \
        >= 2 * MAX_SCENARIO_BYTES
    assert "At most 4 MiB: " in at.file_uploader(key="tour_file").proto.help
    upload(at, "huge.json", b" " * (MAX_SCENARIO_BYTES + 1))
    assert [e.value for e in at.error] == [
        f"Scenario file refused: huge.json is {MAX_SCENARIO_BYTES + 1:,} bytes; the limit is "
        "4 MiB."]
    assert run_of(at).key == "03-growth"


def test_an_uploaded_scenario_of_no_steps_says_there_is_nothing_to_apply() -> None:
    at = open_tour("03-growth")
    upload(at, "empty.json", json.dumps({"name": "Just a pool", "steps": []}).encode())
    assert [s.value for s in at.success] == [
        "Loaded empty.json: “Just a pool”, 0 steps. It has no step to apply: the view shows "
        "its empty pool."]
    # A top-level field no scenario has (a misspelt description) is named, not refused.
    upload(at, "typo.json", json.dumps({"name": "Just a pool", "descripton": "x",
                                        "steps": []}).encode())
    assert [s.value for s in at.success] == [
        "Loaded typo.json: “Just a pool”, 0 steps. It has no step to apply: the view shows "
        "its empty pool. Note: scenario.descripton is not a field PagedLab reads; it was "
        "ignored."]
    assert at.button(key="tour_next").disabled


def test_an_uploaded_expectation_no_run_could_meet_is_named_on_load() -> None:
    at = open_tour("03-growth")
    upload(at, "typo.json", json.dumps({"name": "Typo", "steps": [
        {"op": "add", "request": "A", "prompt": "hi",
         "expect": {"metric.used_blocks": 1}}]}).encode())
    assert [s.value for s in at.success] == [
        "Loaded typo.json: “Typo”, 1 step. Press Next to apply the first. Note: this "
        "expectation can never be met, and fails when its step runs: step 1's "
        "metric.used_blocks (no field 'metric'; did you mean 'metrics'?)."]


def test_a_scenario_is_known_by_its_content_not_its_file_name() -> None:
    at = open_tour("03-growth")
    at.file_uploader(key="tour_file").set_value(
        ("story.txt", json.dumps({"name": "Just a pool", "steps": []}).encode(),
         "text/plain")).run()
    assert not at.exception and not at.error
    assert next(s.value for s in at.success).startswith("Loaded story.txt: “Just a pool”")


def test_an_uploaded_scenario_runs_and_a_refused_step_stops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mine = {
        "name": "My story", "description": "Two steps, then a mistake.",
        "config": {"num_blocks": 8, "block_size": 4},
        "steps": [
            {"op": "add", "request": "A", "prompt": "abcdef", "narration": "A arrives.",
             "expect": {"metrics.used_blocks": 2, "requests.A.num_tokens": 6}},
            {"op": "grow", "request": "A", "tokens": 2, "expect": {"metrics.used_blocks": 3}},
            {"op": "grow", "request": "Z"},
            {"op": "finish", "request": "A"},
        ],
    }
    at = open_tour("03-growth")
    upload(at, "mine.json", json.dumps(mine).encode())
    assert [s.value for s in at.success] == [
        "Loaded mine.json: “My story”, 4 steps. Press Next to apply the first."]
    assert "My story (uploaded: mine.json)" in [h.value for h in at.header]
    assert at.selectbox(key="tour_pick").value == "upload"
    # Its address names it by a digest of the file (an entry of the browser's history
    # for each step, as a shipped scenario's), which a shipped stem never looks like.
    link = upload_link(json.dumps(mine).encode())
    assert at.query_params == {"scenario": link, "step": "0"}
    assert link.startswith("upload-") and link not in NAMES
    click(at, "tour_next")
    assert at.query_params == {"scenario": link, "step": "1"}
    assert "A arrives." in markdown(at) and all(ok for ok, _ in checks(at).values())
    click(at, "tour_next")
    # The second step's expectation is wrong on purpose: the page says so.
    rows = checks(at)
    assert not rows["metrics.used_blocks"][0]
    assert "expected <b>3</b>, the engine shows <b>2</b>" in rows["metrics.used_blocks"][1]
    click(at, "tour_next")
    assert [e.value for e in at.error] == [
        "The engine refused step 3 (grow): request 'Z' does not exist. The run stops there: "
        "step 2 is the state before it."]
    assert viewed_step(at) == 2 and at.button(key="tour_next").disabled
    assert run_of(at).engine.step == 2
    # No "Next: step 3" beside a disabled Next: the narration says the run ends here.
    said = [c.value for c in at.caption]
    assert "Step 3, `grow Z +1`, was refused: the run ends here." in said
    assert not [c for c in said if c.startswith("Next: step 3")]
    # Picking a shipped scenario again works as before.
    at.selectbox(key="tour_pick").select("03-growth").run()
    assert run_of(at).key == "03-growth" and not at.error
    # The upload's link, the browser's Back or Forward to it, runs it again to its step.
    # (The same address sent with a click is a stale copy of one the page wrote.)
    at.query_params.update({"scenario": link, "step": "2"})
    at.run()
    assert run_of(at).key == "03-growth"
    at.query_params.update({"scenario": link, "step": "2"})
    with monkeypatch.context() as m:
        m.setattr(history, "went_back_or_forward", lambda: True)
        at.run()
    assert run_of(at).key == "upload" and viewed_step(at) == 2 and not at.error
    # A link to an upload this tab does not hold (another session's, or a replaced
    # file's) says so, and opens the first scenario.
    other = open_tour()
    other.query_params.update({"scenario": link, "step": "1"})
    other.run()
    assert run_of(other).key == NAMES[0] and viewed_step(other) == 0
    assert [e.value for e in other.error] == [
        "The link names an uploaded scenario this tab no longer holds (an upload is not "
        "saved: a reload forgets it, and another upload replaces it); upload it again. "
        f"Showing “{shipped_scenario(NAMES[0]).name}” instead."]


def test_an_upload_whose_run_is_refused_leaves_the_upload_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    small = json.dumps({"name": "Small", "config": {"num_blocks": 8, "block_size": 4},
                        "steps": [{"op": "add", "request": "A", "prompt": "hi"}]}).encode()
    big = json.dumps({"name": "Big", "config": {"num_blocks": 4096, "block_size": 16},
                      "steps": []}).encode()
    at = open_tour("03-growth")
    upload(at, "small.json", small)
    link = {"scenario": upload_link(small), "step": "0"}
    assert run_of(at).title == "Small (uploaded: small.json)" and at.query_params == link
    # The server's K/V limit refuses the second file's engine: the first stays, shown,
    # named by the address and the picker, and Reset starts it, not the refused file.
    monkeypatch.setattr(budget_module.SERVER_BUDGET, "per_session", 1 << 16)
    upload(at, "big.json", big)
    assert [e.value for e in at.error] and at.error[0].value.startswith(
        "Cannot start that scenario: ")
    assert run_of(at).title == "Small (uploaded: small.json)" and at.query_params == link
    assert at.selectbox(key="tour_pick").value == "upload"
    assert "Small (uploaded: small.json)" in at.selectbox(key="tour_pick").options
    click(at, "tour_reset")
    assert run_of(at).title == "Small (uploaded: small.json)" and not at.exception


def test_an_uploaded_step_past_the_time_limit_is_stopped_and_ends_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A file's step of 100,000 iterations would hold a core of the shared server for
    # minutes: it stops at the limit (0 s here: after its first iteration).
    monkeypatch.setattr(tour_session, "STEP_TIME_LIMIT_S", 0.0)
    long = {"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step", "count": 100000},
        {"op": "finish", "request": "A"}]}
    at = open_tour("03-growth")
    upload(at, "long.json", json.dumps(long).encode())
    click(at, "tour_next")
    click(at, "tour_next")
    # Plain text: a grow's message names its request, the file's own text.
    assert [w.value for w in at.warning] == [plain_md(
        "Step 2, step ×100,000, was stopped at the 0 s limit, at iteration 1 of 100,000: this "
        "page gives one step at most 0 s of the shared server. The run ends at step 1; the "
        "command line (python -m backend run) takes the file whole.")]
    assert viewed_step(at) == 1 and at.button(key="tour_next").disabled
    assert "Step 2, `step ×100,000`, was stopped: the run ends here." in [
        c.value for c in at.caption]
    # The engine went past step 1, so the page draws step 1 from its frame, not the engine,
    # and the translator does not send the reader to the step in view for a key vector.
    assert run_of(at).engine.step == 2 and not at.exception
    said = [c.value for c in at.caption]
    assert any("went on past this state into a step that was stopped part-way" in c
               for c in said), said
    assert not [c for c in said if "view step 1 to see it" in c]


# ---- continue from here -----------------------------------------------------------------

def test_continue_from_here_puts_that_state_into_the_playground() -> None:
    at = open_tour("01-contiguous-problem", "4")
    click(at, "tour_back")                  # a past step: step 3
    frame = run_of(at).frame(3)
    click(at, "tour_continue")
    assert at.title[0].value == "Playground"
    engine = at.session_state["engine"]
    assert export_snapshot(engine) == frame.snapshot
    assert [s.value for s in at.success] == [
        "Restored “The contiguous allocation problem”: step 3, 3 requests, 16 "
        "blocks of 1 slot; prefix caching off; K/V recomputed from the tokens. Keep "
        "working from here."]
    # The sidebar shows the scenario's pool, so nothing asks to apply other settings.
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 16
    assert at.sidebar.number_input(key="cfg_block_size").value == 1
    assert not at.warning
    # The playground continues from there; the scenario run is untouched.
    at.button(key="btn_step").click().run()
    assert engine.step == 4 and not at.exception
    at.switch_page(PAGE).run()
    assert viewed_step(at) == 3 and run_of(at).taken == 4


def test_continue_from_a_beam_search_spends_no_forward_on_its_scores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scenario's frame is the engine's own export: its beams' scores are the engine's,
    so the restore recomputes the K/V alone (restore_engine's check_scores=False)."""
    at = open_tour("10-beam-search", "9")
    frame = run_of(at).frame(9)
    assert sum("beam_width" in r for r in frame.snapshot["requests"]) > 4
    sizes = counting_forwards(monkeypatch)
    restore_engine(copy.deepcopy(frame.snapshot), kernel="torch", check_scores=False)
    own = len(sizes)
    restore_engine(copy.deepcopy(frame.snapshot), kernel="torch")
    assert len(sizes) - own > own            # checking the scores would cost more
    sizes.clear()
    click(at, "tour_continue")
    assert at.title[0].value == "Playground" and not at.exception
    assert export_snapshot(at.session_state["engine"]) == frame.snapshot
    assert len(sizes) == own


# ---- the sidebar on the Scenarios page ----------------------------------------------------

def sidebar_config(at: AppTest) -> dict[str, str]:
    """The scenario's settings as the sidebar lists them: label -> value."""
    bodies = [h.value for h in at.sidebar.html if "pl-scenario-config" in h.value]
    assert len(bodies) == 1, [h.value for h in at.sidebar.html]
    return dict(re.findall(r"data-label='([^']+)'>([^<]+)<", bodies[0]))


def test_the_sidebar_shows_the_scenarios_own_config_not_the_pool_settings() -> None:
    at = open_tour("01-contiguous-problem")
    # The Playground's pool settings would change nothing here: they are not drawn.
    assert not at.sidebar.number_input and not at.sidebar.toggle and not at.sidebar.radio
    assert not [b for b in at.sidebar.button if b.key == "btn_reset"]
    config = sidebar_config(at)
    assert config["Pool size"] == "16 blocks" and config["Block size"] == "1 slot"
    assert config["Prefix caching"] == "off" and config["Model"].startswith("tiny-byte")
    # The kernel picked on the Playground is shown picked here too (it runs this engine).
    assert at.segmented_control(key="dev_kernel").value == "torch"
    assert run_of(at).engine.kernels.name == "torch"
    # The kernel does apply to the scenario's engine, and stays.
    at.segmented_control(key="dev_kernel").set_value("auto").run()
    assert not at.exception and run_of(at).engine.kernels.name == "triton-interpreter"
    # Another scenario: its own config.
    at.selectbox(key="tour_pick").select("06-prefix-sharing").run()
    config = sidebar_config(at)
    assert config["Pool size"] == "48 blocks" and config["Block size"] == "4 slots"
    assert config["Prefix caching"] == "on"
    # Back on the Playground, its own settings are there to change again.
    at.switch_page("pages/playground.py").run()
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 32
    assert at.segmented_control(key="dev_kernel").value == "auto"
    assert not [h for h in at.sidebar.html if "pl-scenario-config" in h.value]


def test_another_scenario_starts_with_nothing_highlighted() -> None:
    at = open_tour("06-prefix-sharing")
    at.number_input(key="tour_focus_block").set_value(40).run()
    assert "Block **40**" in markdown(at) and not at.error
    # 12-preemption's pool has 10 blocks: block 40 was the old run's, not a typed refusal.
    at.selectbox(key="tour_pick").set_value("12-preemption").run()
    assert not at.exception and not at.error
    assert at.number_input(key="tour_focus_block").value is None


class _Superseded:
    """Session state as a run Streamlit stopped while it waited sees it: every access raises."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"session state touched: {name}")

    def __getitem__(self, key: str) -> Any:
        raise AssertionError(f"session state read: {key}")


def test_a_control_that_waited_starts_a_run_without_session_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reset, the scenario picker and an upload read what they need before they wait
    # for the scenario state's lock; a run Streamlit superseded meanwhile cannot read
    # session state, so starting the run after the wait must not.
    t = tour.TourState()
    ctx = tour.LoadContext(Settings(device="cpu", kernel="torch"), "waited", Queued())
    monkeypatch.setattr(tour.st, "session_state", _Superseded())
    monkeypatch.setattr(tour._HELD, "state", t, raising=False)
    assert tour.load("03-growth", ctx)
    assert t.run is not None and t.run.key == "03-growth" and t.view == 0
    # The picker and the views' selections are queued, for the next run to write.
    written: dict[str, Any] = {}
    ctx.queued.apply(written)
    assert written["tour_pick"] == "03-growth" and written["tour_focus_req"] is None


def test_a_session_from_a_restored_snapshot_is_refused_with_the_command_that_replays_it(
) -> None:
    """Its steps continue the snapshot's state: on this page's fresh engine most of its
    checks would fail. Refused, saying so, and the scenario being read is kept."""
    config = EngineConfig(num_blocks=32, block_size=4)
    first, _, _ = _session(config, OPS[:5])
    restored = restore_engine(export_snapshot(first), kernel="torch")
    engine, log, known = _session(config, OPS[5:8], engine=restored)
    data = scenario_json(log.scenario(config, export_snapshot(engine), known, name="later",
                                      description="", base_file="base-0005.json")).encode()
    at = open_tour("03-growth")
    click(at, "tour_next")
    upload(at, "later.json", data)
    assert [e.value for e in at.error] == [
        "Scenario file refused: later.json continues a snapshot of step 5 (its from_snapshot: "
        "base-0005.json), so its steps replay only from that state: python -m backend run "
        "later.json --from base-0005.json --check; this page starts every scenario on a "
        "fresh engine, so it cannot step through it"]
    assert run_of(at).key == "03-growth" and viewed_step(at) == 1


def test_a_session_exported_as_a_scenario_steps_through_here_with_every_check_met() -> None:
    """The Playground's export says to step through its file on this page: it does, and
    every expectation the file carries is met at its step."""
    config = EngineConfig(num_blocks=32, block_size=4)
    engine, log, known = _session(config, OPS[:8])
    data = scenario_json(log.scenario(config, export_snapshot(engine), known, name="mine",
                                      description="explored")).encode()
    at = open_tour("03-growth")
    upload(at, "playground-scenario-step-0008.json", data)
    assert [s.value for s in at.success] == [
        "Loaded playground-scenario-step-0008.json: “mine”, 8 steps. Press Next to apply "
        "the first."]
    for step in range(1, 9):
        click(at, "tour_next")
        rows = checks(at)
        assert viewed_step(at) == step and rows
        assert all(ok for ok, _ in rows.values()), (step, rows)
        # Its narration ("Step 3: step ×3.") only repeats the label above it: said once.
        label = describe_op(OPS[step - 1])
        assert f"**Step {step} of 8:** `{label}`" in markdown(at)
        assert plain_md(label_narration(step, label)) not in [m.value for m in at.markdown]


def test_a_step_viewed_that_ran_on_another_kernel_says_which() -> None:
    # The caption names the kernel the steps to come run on; a step taken before the
    # sidebar's kernel changed ran on the one before, and says so.
    at = open_tour("02-block-table")
    click(at, "tour_next")
    caption = next(c.value for c in at.caption if c.value.startswith("Viewing step"))
    assert caption.endswith("· kernel torch (cpu)"), caption
    at.segmented_control(key="dev_kernel").set_value("auto").run()
    caption = next(c.value for c in at.caption if c.value.startswith("Viewing step"))
    assert caption == ("Viewing step **1** of 3 · 1 applied so far · kernel triton-interpreter "
                       "(cpu); step 1 ran on torch"), caption
    click(at, "tour_next")
    caption = next(c.value for c in at.caption if c.value.startswith("Viewing step"))
    assert caption.endswith("· kernel triton-interpreter (cpu)"), caption


def test_a_step_that_ran_no_model_step_names_no_kernel() -> None:
    # A fork runs no kernel: taken after the switch, it is not said to have run on the
    # kernel before it (the snapshot's kernel report is the last model step's).
    at = open_tour("08-fork-copy-on-write")
    click(at, "tour_next")
    at.segmented_control(key="dev_kernel").set_value("auto").run()
    click(at, "tour_next")
    assert run_of(at).frame(2).label.startswith("fork")
    caption = next(c.value for c in at.caption if c.value.startswith("Viewing step"))
    assert caption == ("Viewing step **2** of 6 · 2 applied so far · kernel triton-interpreter "
                       "(cpu)"), caption
    at.slider(key="tour_slider").set_value(1).run()
    caption = next(c.value for c in at.caption if c.value.startswith("Viewing step"))
    assert caption.endswith("; step 1 ran on torch"), caption


def test_a_back_whose_run_a_stop_replaced_still_goes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Back pressed while a long step runs waits for the step; Stop this step replaces
    # its run with one that carries the Back's address without Streamlit's mark. The
    # address was noted as a Back when it came, so it is not taken for a stale copy.
    at = open_tour("03-growth", "0")
    for _ in range(3):
        click(at, "tour_next")
    assert at.query_params["step"] == "3"
    with monkeypatch.context() as m:
        # The Back's own run notes its address and is then replaced before applying it:
        # here, it raises as Streamlit stops a superseded run, once it has noted it.
        def superseded() -> None:
            raise RuntimeError("superseded")
        m.setattr(history, "went_back_or_forward", lambda: True)
        m.setattr(tour_link, "_apply_link", superseded)
        at.query_params["step"] = "2"
        at.run()
    at.query_params["step"] = "2"
    at.run()
    assert viewed_step(at) == 2 and at.query_params["step"] == "2"
    assert at.query_params["applied"] == "3"


def test_next_on_an_add_says_what_it_does_over_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """An add has no iterations for a bar, and its prefill through a real model takes
    seconds: Next showed nothing meanwhile. A grow of several tokens gets its bar instead."""
    from ui import tour_progress
    said: list[str] = []
    real = tour_progress.floating_spinner

    def recorded(shown: Any, text: str, where: Any = None) -> Any:
        said.append(text)
        return real(shown, text, where)

    monkeypatch.setattr(tour_progress, "floating_spinner", recorded)
    at = open_tour("03-growth")
    click(at, "tour_next")
    assert said == [plain_md(f"Step 1, {describe_op(run_of(at).scenario.steps[0].op)}…")]
    assert said[0].startswith("Step 1, add ")
    click(at, "tour_next")
    assert len(said) == 1 and run_of(at).taken == 2
    # A grow of one token is one model step: a bar would show only once it was done.
    click(at, "tour_next")
    assert said[1:] == [plain_md(f"Step 3, {describe_op(run_of(at).scenario.steps[2].op)}…")]
    # A play draws it under its controls, for the add as for Next.
    click(at, "tour_reset")
    at.select_slider(key="tour_speed").set_value(0.25).run()
    click(at, "tour_play")
    assert run_of(at).taken == 4 and said[2:] == said[:2]


def test_empty_panels_point_to_next_where_the_page_has_no_add() -> None:
    at = open_tour("03-growth")
    assert "No model step yet: press Next." in markdown(at)
    assert "No request is running: press Next to translate its token positions." in [
        c.value for c in at.caption]
    assert "add a request" not in markdown(at).lower()
