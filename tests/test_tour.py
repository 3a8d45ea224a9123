"""A scenario run kept for time travel (backend/sessions/tour.py) and its views."""

from __future__ import annotations

import json
import re

import altair as alt
import pytest

from backend.core.errors import PagedLabError
from backend.io.scenario import parse_scenario
from backend.io.snapshot import export_snapshot
from backend.sessions.budget import MIB, KVBudget
from backend.sessions.tour import TourRun, check_rows, parse_scenario_upload, shipped_scenario
from backend.views import tour as tv
from backend.views.metrics import metric_items
from ui.tour_progress import Timed


def test_frames_keep_every_state_and_the_engine_only_moves_forward() -> None:
    run = TourRun(shipped_scenario("08-fork-copy-on-write"), "08", "t", kernel="torch")
    assert (run.total, run.taken, run.can_advance) == (6, 0, True)
    assert run.frame(0).snapshot["step"] == 0 and run.frame(0).label == "start"
    assert run.run_to(3) == 3
    f2, f3 = run.frame(2), run.frame(3)
    assert (f2.label, f3.label) == ("fork A -> A2", "grow A2 +1")
    assert f2.snapshot["metrics"]["shared_blocks"] == 3
    assert f3.snapshot["metrics"]["cow_copies"] == 1
    assert f3.summary == "Step 3: grow A2 +1 · generated 1 token · events: 1 cow"
    assert f3.all_ok and len(f3.checks) == 6
    # A frame is what the engine showed then: later steps do not change it.
    before = json.dumps(f2.snapshot)
    run.run_to(6)
    assert json.dumps(f2.snapshot) == before
    assert run.frame(6).snapshot == export_snapshot(run.engine)
    assert not run.can_advance and run.advance() is None
    assert [s["step"] for s in run.snapshots()] == [1, 2, 3, 4, 5, 6]
    # Out-of-range views are clamped to what exists.
    assert run.frame(99).step == 6 and run.frame(-1).step == 0


def test_the_status_line_tells_dropped_beams_from_finished_ones() -> None:
    run = TourRun(shipped_scenario("10-beam-search"), "10", "t", kernel="torch")
    run.run_to(run.total)
    dropped = finished = 0
    for frame in (run.frame(i) for i in range(1, run.total + 1)):
        reasons = {r["id"]: r["finish_reason"] for r in frame.snapshot["requests"]}
        for part in frame.summary.split(" · "):
            verb, _, ids = part.partition(" ")
            if verb == "dropped":
                dropped += 1
                assert {reasons[i] for i in ids.split(", ")} == {"dropped"}, frame.summary
                # Listed by number: B.7 before B.11 (a round drops them in score order).
                numbers = [int(i.rsplit(".", 1)[1]) for i in ids.split(", ")]
                assert numbers == sorted(numbers), frame.summary
            elif verb == "finished":
                finished += 1
                assert "dropped" not in {reasons[i] for i in ids.split(", ")}, frame.summary
    assert dropped and finished
    # The metrics panel says how many of its finished requests are dropped beams.
    snap = run.frame(run.total).snapshot
    items = {m.label: m for m in metric_items(snap)}
    reasons = [r["finish_reason"] for r in snap["requests"]]
    gone = reasons.count("dropped")
    assert items["Finished requests"].value == str(len(reasons)) and 1 < gone < len(reasons)
    assert items["Finished requests"].help.endswith(
        f" Of them, {gone} are beams a beam search dropped.")


def test_checks_show_what_the_engine_shows_and_flag_mismatches() -> None:
    run = TourRun(shipped_scenario("02-block-table"), "02", "t", kernel="torch")
    run.run_to(2)
    snap = run.frame(2).snapshot
    rows = check_rows({"requests.A.block_table": [9, 2, 14], "metrics.used_blocks": 99,
                       "requests.Z.status": "running", "address.A.6": {
                           "logical_block": 1, "offset": 2, "physical_block": 2, "slot": 10}},
                      snap, run.engine, None, None)
    by_path = {r.path: r for r in rows}
    assert by_path["requests.A.block_table"].ok
    assert by_path["requests.A.block_table"].got == [9, 2, 14]
    bad = by_path["metrics.used_blocks"]
    assert (bad.ok, bad.got, bad.problem) == (False, 3, None)
    missing = by_path["requests.Z.status"]
    assert not missing.ok and missing.got is None
    # The row names the path: its problem is the reason alone, not the path again.
    assert missing.problem == "not found (no request 'Z')"
    assert by_path["address.A.6"].ok
    html = tv.checks_html(rows)
    assert html.count("data-ok='1'") == 2 and html.count("data-ok='0'") == 2
    assert "expected <b>99</b>, the engine shows <b>3</b>" in html
    assert "expected <b>running</b>, not found (no request &#x27;Z&#x27;)" in html


def test_a_refused_step_stops_the_run_with_the_cli_message() -> None:
    sc = parse_scenario({"config": {"num_blocks": 8}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "grow", "request": "B"},
        {"op": "finish", "request": "A"}]})
    run = TourRun(sc, "upload", "mine", kernel="torch")
    assert run.run_to(3) == 1
    assert run.error == "step 2 (grow): request 'B' does not exist"
    assert not run.can_advance and run.engine.step == 1
    assert run.next_label(1) == "grow B +1"


def test_a_step_that_stops_half_way_ends_the_run_at_the_step_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug, or the server out of memory, in the middle of an operation: the page says
    # so and draws the step before (no generic "An error occurred" box).
    from backend.engine import operations

    def broken_shuffle(*_: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(operations, "shuffle", broken_shuffle)
    sc = parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "shuffle", "seed": 1},
        {"op": "finish", "request": "A"}]})
    run = TourRun(sc, "upload", "mine", kernel="torch")
    assert run.run_to(3) == 1
    assert run.error is None and run.stopped == (
        "Step 2, shuffle (seed 1), stopped half-way (RuntimeError: out of memory): a "
        "failure of PagedLab or of the server, not of the scenario. The run ends at step 1; "
        "Reset starts it again.")
    assert not run.can_advance and not run.engine_at_newest
    assert run.frames[-1].snapshot["step"] == 1


def test_a_step_past_the_time_limit_stops_between_iterations_and_ends_the_run() -> None:
    # An uploaded file may ask for 100,000 iterations: the page must not hold a core of the
    # shared server that long. A limit of 0 s stops the step after its first iteration.
    sc = parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step"},
        {"op": "step", "count": 100000},
        {"op": "finish", "request": "A"}]})
    run = TourRun(sc, "upload", "mine", kernel="torch", step_time_limit_s=0.0)
    # A step of one iteration is never cut: the limit is checked between two.
    assert run.run_to(4) == 2
    assert run.error is None and run.stopped == (
        "Step 3, step ×100,000, was stopped at the 0 s limit, at iteration 1 of 100,000: this "
        "page gives one step at most 0 s of the shared server. The run ends at step 2; the "
        "command line (python -m backend run) takes the file whole.")
    assert not run.can_advance and run.advance() is None
    # The engine went one iteration past the newest frame, which stays the state shown.
    assert not run.engine_at_newest
    assert run.engine.step == 3 and run.frames[-1].snapshot["step"] == 2
    assert len(run.snapshots()) == 2
    # A grow of many tokens stops the same way, between two of them.
    grow = TourRun(parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "grow", "request": "A", "tokens": 50}]}), "upload", "mine", kernel="torch",
        step_time_limit_s=0.0)
    assert grow.run_to(2) == 1 and grow.stopped is not None
    assert grow.stopped.startswith("Step 2, grow A +50, was stopped at the 0 s limit, after 1 "
                                   "of its 50 tokens")
    assert grow.engine.requests["A"].num_tokens == 5
    # Within the limit the same step runs whole.
    whole = TourRun(parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step", "count": 5}]}), "upload", "mine", kernel="torch")
    assert whole.run_to(2) == 2 and whole.stopped is None and whole.engine_at_newest
    assert whole.engine.step == whole.frames[-1].snapshot["step"] == 2


def test_a_step_reports_each_iteration_and_a_grow_each_token_to_its_bar() -> None:
    # The Scenarios page draws a bar from these (ui.progress.timed) while a long step runs.
    run = TourRun(parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step", "count": 3},
        {"op": "grow", "request": "A", "tokens": 2}]}), "upload", "mine", kernel="torch")
    heard: list[tuple[int, int]] = []

    def hear(done: int, total: int) -> bool:
        heard.append((done, total))
        return True

    for _ in range(3):
        assert run.advance(hear) is not None
    # A grow is asked between two tokens (whether to go on), so not after its last. The
    # control's share of each (the same operation on the control engine) asks the same,
    # with the bar kept full.
    assert heard == [(1, 3), (2, 3), (3, 3), (3, 3), (3, 3), (3, 3), (1, 2), (2, 2)]


def test_a_step_its_user_stops_ends_the_run_at_the_step_before() -> None:
    # The Scenarios page's "Stop this step": the progress callback says no.
    run = TourRun(parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step", "count": 50}]}), "upload", "mine", kernel="torch")
    assert run.advance() is not None
    assert run.advance(lambda done, total: done < 3) is None
    assert run.stopped == ("Step 2, step ×50, was stopped as you asked, at iteration 3 of "
                           "50. The run ends at step 1; Reset runs the scenario again from "
                           "step 0.")
    assert run.error is None and not run.can_advance and run.taken == 1


def test_the_control_goes_no_further_than_a_request_the_run_finished() -> None:
    """A request that fills the scenario's whole pool finishes there ("capacity"); the
    control's roomy pool would let it decode every remaining iteration of a long step
    (100,000 here: minutes of work, with no time limit). It stops at the same length."""
    run = TourRun(parse_scenario({"config": {"num_blocks": 8, "block_size": 4}, "steps": [
        {"op": "add", "request": "A", "prompt_len": 4},
        {"op": "step", "count": 100_000},
        {"op": "add", "request": "B", "prompt_len": 4}]}), "upload", "mine", kernel="torch")
    assert run.control is not None
    assert run.run_to(3) == 3
    user, control = run.engine.requests["A"], run.control.control.requests["A"]
    assert user.finish_reason == "capacity" and user.num_tokens == 32
    assert control.status == "finished" and control.tokens == user.tokens
    report = run.frame(3).control
    assert report is not None and report.agrees and report.not_replayed == ()


def test_a_control_step_its_user_stops_ends_the_control_there() -> None:
    # The same Stop stops the control's share of a step; it then follows no later step.
    run = TourRun(parse_scenario({"config": {"num_blocks": 64}, "steps": [
        {"op": "add", "request": "A", "prompt": "abcd"},
        {"op": "step", "count": 50},
        {"op": "step", "count": 2}]}), "upload", "mine", kernel="torch")
    assert run.advance() is not None
    heard: list[tuple[int, int]] = []

    def stop_in_the_control(done: int, total: int) -> bool:
        heard.append((done, total))
        # The run's own 50 iterations, then the control's: stopped at its third.
        return len(heard) < 53

    frame = run.advance(stop_in_the_control)
    assert frame is not None and run.stopped is None
    assert frame.control is not None and frame.control.not_replayed == (
        "step 2: the control was stopped part-way through it, so it follows no later step",)
    assert run.control is not None and run.control.stopped_at == 2
    control_tokens = list(run.control.control.requests["A"].tokens)
    assert run.advance() is not None
    assert run.control.control.requests["A"].tokens == control_tokens


def test_kernels_can_change_between_steps() -> None:
    run = TourRun(shipped_scenario("03-growth"), "03", "t", kernel="torch")
    run.run_to(2)
    run.set_kernels("auto", "auto")
    assert run.engine.kernels.name == "triton-interpreter"
    run.run_to(4)
    assert run.frame(4).all_ok
    assert run.frame(4).snapshot["kernel"]["backend"] == "triton-interpreter"
    assert run.frame(2).snapshot["kernel"]["backend"] == "torch"


def test_scenario_uploads_are_parsed_as_bounded_json() -> None:
    sc = parse_scenario_upload(json.dumps({"steps": [{"op": "step"}]}).encode(), "s.json")
    assert sc.steps[0].op.op == "step"
    with pytest.raises(PagedLabError, match=r"^s.json: step 1 \(grow\): missing field"):
        parse_scenario_upload(b'{"steps": [{"op": "grow"}]}', "s.json")
    with pytest.raises(PagedLabError, match="is not valid JSON"):
        parse_scenario_upload(b'{"steps": [1, ]}', "s.json")
    with pytest.raises(PagedLabError, match="holds an integer of more than 4,300 digits"):
        parse_scenario_upload(b'{"steps": [1' + b"0" * 5000 + b"]}", "s.json")
    with pytest.raises(PagedLabError, match="a scenario may be at most 4 MiB"):
        parse_scenario_upload(b" " * ((4 << 20) + 1), "s.json")
    with pytest.raises(PagedLabError, match="there is no scenario 'nope'"):
        shipped_scenario("nope")
    # A snapshot is the other JSON file PagedLab reads: the refusal says where it goes.
    snap = json.dumps(export_snapshot(TourRun(shipped_scenario("08-fork-copy-on-write"), "08",
                                              "t", kernel="torch").engine)).encode()
    with pytest.raises(PagedLabError) as refused:
        parse_scenario_upload(snap, "s.json")
    assert str(refused.value) == ("s.json is a snapshot (it has 'schema_version'), not a "
                                  "scenario: upload it on the Playground to continue from its "
                                  "state")


def test_the_arena_map_follows_the_contiguous_mirror() -> None:
    run = TourRun(shipped_scenario("01-contiguous-problem"), "01", "t", kernel="torch")
    run.run_to(5)
    arena = run.frame(5).arena
    assert arena is not None
    df = tv.arena_frame(arena, run.frame(5).snapshot)
    assert list(zip(df["x0"], df["x1"], df["kind"], strict=True)) == [
        (0, 4, "tokens"), (4, 6, "reserved for future tokens"),
        (6, 9, "hole too small for the next request (external fragmentation)"),
        (9, 13, "tokens"), (13, 14, "reserved for future tokens"),
        (14, 16, "hole too small for the next request (external fragmentation)")]
    assert list(df["text"]) == ["A", "A reserved", "hole", "C", "(C)", "hole"]
    # A request has one colour in both memories (the grid's palette, by arrival).
    assert df.loc[0, "color"] == tv.PALETTE[0] and df.loc[3, "color"] == tv.PALETTE[2]
    assert tv.arena_message(arena) == (
        "D waits with 4 tokens: a request that will reach 5 tokens (a region of 5 slots) does "
        "not fit: 5 slots are free in total but the largest hole is 3 (external "
        "fragmentation).")
    assert tv.arena_caption(arena) == (
        "16 slots, reservations of the exact final length as in the paper's Orca (Oracle), "
        "first fit: 8 holding tokens · 3 reserved for future "
        "tokens · 0 reserved, never used · 5 external fragmentation · 0 free. Reserved but "
        "empty now: 3, all for future tokens, which the text calls internal fragmentation "
        "(unused space inside an allocation); the paper calls none of them so, since each "
        "will be used.")
    data, spec = tv.arena_spec(arena, run.frame(5).snapshot)
    # Valid Vega-Lite (raises if not), as wide as a 16-column block grid.
    alt.LayerChart.from_dict({**spec, "data": {"values": data.to_dict("records")}})
    assert spec["width"] == 16 * 46
    # Drawn, the labels are the frame's at full width, and shorter ones where a phone
    # draws it narrower: "A reserved" would run out of its two slots.
    import vl_convert as vlc

    def drawn(width: int) -> list[str]:
        svg = vlc.vegalite_to_svg({**spec, "width": width,
                                   "data": {"values": data.to_dict("records")}})
        return [t for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)
                if not t.isdigit() and t != "slot"]

    assert drawn(16 * 46) == list(df["text"])
    assert drawn(340) == ["A", "(A)", "hole", "C", "hole"]   # (C) in one slot: none
    # Before the arena holds anything it is one free run.
    empty = run.frame(0).arena
    assert empty is not None and empty["segments"] == [
        {"start": 0, "length": 16, "owner": None, "kind": "free"}]
    assert tv.arena_message(empty) is None


def test_the_arena_says_who_waits_and_who_fell_behind_the_paged_pool() -> None:
    run = TourRun(shipped_scenario("15-internal-fragmentation"), "15", "t", kernel="torch")
    run.run_to(5)
    at = [run.frame(i).arena for i in (3, 4, 5)]
    assert all(a is not None for a in at)
    assert [tv.arena_message(a) for a in at if a is not None] == [
        "C waits with 4 tokens: a request that will reach 6 tokens (a region of 16 slots) "
        "does not fit: no slot is free.",
        "C holds 4 tokens here and 5 in the paged pool: it waited here for a region.",
        "C holds 5 tokens here and the paged pool finished it at 6: it waited here for a "
        "region."]


def test_paths_read_as_words() -> None:
    assert tv.describe_path("requests.A.block_table") == "A's block table"
    assert tv.describe_path("blocks.2.ref_count") == "block 2: ref count"
    assert tv.describe_path("cpu_blocks.1.ref_count") == "host block 1: ref count"
    assert tv.describe_path("metrics.swap_outs") == "host pool: swap-outs so far"
    assert tv.describe_path("metrics.cpu_used_blocks") == (
        "host pool: blocks holding swapped-out K/V")
    assert tv.describe_path("blocks.3.num_filled") == "block 3: filled slots"
    assert tv.describe_path("requests.A.num_tokens") == "A's token count"
    # A metric as its card on the page names it, so a student can find it there.
    assert tv.describe_path("metrics.cow_copies") == "Copy-on-write copies"
    assert tv.describe_path("metrics.internal_waste_slots") == "Internal waste"
    assert tv.describe_path("metrics.prefix_hit_tokens") == "Prefix-cache hits (tokens)"
    assert tv.describe_path("kernel.num_seqs") == "kernel: sequences in its last step"
    assert tv.describe_path("metrics.some_count") == "some count"
    assert tv.describe_path("address.A.6") == "address of A's token 6"
    # Sample and beam ids hold dots: the id runs to the field after it.
    assert tv.describe_path("requests.B.13.finish_reason") == "B.13's finish reason"
    assert tv.describe_path("requests.S.3.block_table.0") == "S.3's block table [0]"
    assert tv.describe_path("text.B.13") == "B.13's text"
    assert tv.describe_path("address.S.0.6") == "address of S.0's token 6"
    assert tv.describe_path("requests.7") == "requests.7"
    assert tv.describe_path("step_events.cow") == "cow events in this step"
    assert tv.describe_path("contiguous.breakdown.free") == "contiguous arena: breakdown free"
    assert tv.describe_path("odd") == "odd"
    assert tv.format_value("x" * 500).endswith("…") and len(tv.format_value("x" * 500)) == 120


def test_a_uploaded_narration_is_escaped_in_the_checks() -> None:
    sc = parse_scenario({"steps": [{"op": "add", "request": "<b>", "prompt": "hi",
                                    "expect": {"requests.<b>.status": "running"}}]})
    run = TourRun(sc, "upload", "t", kernel="torch")
    run.advance()
    html = tv.checks_html(run.frame(1).checks)
    assert "<b>'s" not in html and "&lt;b&gt;&#x27;s status" in html
    assert re.search(r"data-ok='1'", html)


def test_a_control_run_over_the_session_budget_is_left_out_and_named() -> None:
    scenario = shipped_scenario("08-fork-copy-on-write")
    size = scenario.config.kv_bytes
    ample = KVBudget(per_session=64 * MIB, per_server=64 * MIB)
    run = TourRun(scenario, "08", "t", kernel="torch", owner="s1", budget=ample)
    assert run.control is not None and run.control_problem is None
    control_bytes = run.control.control.cache.total_bytes
    assert control_bytes >= size and ample.in_use("s1") == size + control_bytes
    # Room for the scenario's engine but not for its control beside it: the run goes
    # ahead without a control, says why, and counts only the engine it built.
    tight = KVBudget(per_session=size + control_bytes - 1, per_server=64 * MIB)
    run = TourRun(scenario, "08", "t", kernel="torch", owner="s2", budget=tight)
    assert run.control is None and run.control_problem is not None
    assert "this session's engines already hold" in run.control_problem
    assert tight.in_use("s2") == size
    assert run.run_to(6) == 6 and run.frame(6).all_ok


def test_a_run_that_replaces_another_gets_its_room() -> None:
    scenario = shipped_scenario("08-fork-copy-on-write")
    size = scenario.config.kv_bytes
    probe = TourRun(scenario, "08", "t", kernel="torch", owner="s0",
                    budget=KVBudget(per_session=64 * MIB, per_server=64 * MIB))
    assert probe.control is not None
    one_run = size + probe.control.control.cache.total_bytes
    # Room for one run, engine and control: picking another scenario (here the same)
    # replaces the run, whose engines the page still holds while the new one is built.
    budget = KVBudget(per_session=one_run, per_server=64 * MIB)
    first = TourRun(scenario, "08", "t", kernel="torch", owner="s1", budget=budget)
    with pytest.raises(PagedLabError, match="this session's engines already hold"):
        TourRun(scenario, "08", "t", kernel="torch", owner="s1", budget=budget)
    second = TourRun(scenario, "08", "t", kernel="torch", owner="s1", budget=budget,
                     replacing=first)
    assert second.control is not None and second.control_problem is None
    assert budget.in_use("s1") == one_run and first.engine is not second.engine


def test_a_bar_says_when_its_step_waits_for_the_control_run() -> None:
    # Without a control, the time after the last iteration is the step's own.
    alone = Timed("Step 2, step ×3", "iteration", 60.0)
    alone.moved(3, 3)
    assert alone.all_done is not None
    alone.all_done -= 2.5
    assert alone.text().startswith("Step 2, step ×3: 3 iterations of 3 done, ")
    bar = Timed("Step 2, step ×3", "iteration", 60.0, has_control=True)
    bar.moved(2, 3)
    assert bar.text().startswith("Step 2, step ×3: 2 iterations of 3 done, ")
    bar.moved(3, 3)
    assert bar.text().startswith("Step 2, step ×3: 3 iterations of 3 done, ")
    assert bar.all_done is not None
    bar.all_done -= 2.5       # the control run has taken 2.5 s so far
    assert bar.text() == ("Step 2, step ×3: all 3 iterations done; its control run (the same "
                          "operation with no block moves, preemption or prefix hits): 3 s of "
                          "the 60 s limit")


@pytest.mark.parametrize(("future", "never", "said"), [
    (0, 0, "Reserved but empty now: none."),
    (0, 4, "Reserved but empty now: 4, none of them ever to be used: internal fragmentation "
           "in the text's sense and the paper's."),
    (3, 4, "Reserved but empty now: 7 (3 + 4), which the text calls internal fragmentation "
           "(unused space inside an allocation); the paper counts only the 4 never used."),
])
def test_the_arena_caption_says_each_meaning_of_internal_fragmentation_once(
        future: int, never: int, said: str) -> None:
    breakdown = {"token_states": 9, "reservation": future, "internal_fragmentation": never,
                 "external_fragmentation": 0, "free": 16 - 9 - future - never}
    text = tv.arena_caption({"capacity": 16, "policy": "max", "breakdown": breakdown})
    assert text.endswith(said), text
