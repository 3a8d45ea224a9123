"""Control runs in the app (AppTest): the Scenarios page's panel follows the scenario step by
step, and the Playground replays its operations on demand; both show what the backend's
comparison computes, and a session without a fresh start says why it has none."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from backend.engine.control import compare_with_control
from backend.engine.ops import parse_op
from backend.views.control import control_sentence
from tests.test_app import add, click, engine, start
from tests.test_app import shown as shown_text
from tests.test_scenarios_app import open_tour, run_of
from ui import control_run


def panel(at: AppTest) -> list[str]:
    return [x.label for x in at.expander if x.label.startswith("Control run")]


def test_the_scenarios_control_run_follows_each_step_and_agrees() -> None:
    at = open_tour("12-preemption", step="8")
    run = run_of(at)
    assert run.taken == 8 and len(panel(at)) == 1
    report = run.frame(8).control
    assert report is not None and report.agrees
    ops = [s.op for s in run.scenario.steps]
    assert report == compare_with_control(run.scenario.config, ops)
    assert [s.value for s in at.success if s.value.startswith("Same:")] == [
        control_sentence(report)]
    table = next(d.value for d in at.dataframe if "logits compared" in d.value.columns)
    assert list(table["request"]) == ["A", "B", "C"]
    assert list(table["same tokens"]) == ["yes", "yes", "yes"]
    # Both runs' text over the tokens compared, side by side.
    e = run.engine
    assert list(table["text"]) == [e.text(r) for r in "ABC"]
    assert list(table["control's text"]) == list(table["text"])
    # The panel opens by itself once the run has preempted a request.
    assert next(x for x in at.expander if x.label.startswith("Control run")).proto.expanded
    assert not [c for c in at.caption if "happened so far" in c.value]


def test_a_scenario_with_nothing_perturbed_says_what_its_control_waits_for() -> None:
    # Scenario 01 moves no block, preempts nothing and hits no prefix: its panel, closed,
    # names the perturbations in its title and says that none has happened yet.
    at = open_tour("01-contiguous-problem", step="2")
    assert panel(at) == [control_run.TITLE]
    assert "no block moves, preemption or prefix hits" in control_run.TITLE
    assert not next(x for x in at.expander if x.label == control_run.TITLE).proto.expanded
    assert [c for c in at.caption if "no prefix hit happened so far: the panel opens by "
            "itself at the first of these." in c.value]


def test_the_playground_replays_its_operations_beside_a_control() -> None:
    at = start()
    add(at, "Paging moves nothing:", max_new=12)
    add(at, "Blocks of another text", max_new=12)
    click(at, "btn_shuffle")
    click(at, "btn_step")
    assert len(panel(at)) == 1
    click(at, "btn_control")
    e = engine(at)
    ops = [parse_op(op) for op in at.session_state["oplog"].ops]
    want = compare_with_control(e.config, ops)
    assert want.agrees and want.not_replayed
    assert [s.value for s in at.success if s.value.startswith("Same:")] == [
        control_sentence(want)]
    assert any("shuffle (no block moves in the control)" in c.value for c in at.caption)
    # Another operation: the shown comparison says it is older than the session.
    click(at, "btn_step")
    assert ("As of 4 operations; the session has 5 now: run it again to include the "
            "newest.") in [c.value for c in at.caption]


def test_the_playground_s_replay_stops_at_its_time_limit_saying_how_far_it_got(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay redoes every operation on two engines: a session of long steps on a real
    model held the page (and a server thread) for as long again, twice, with no limit."""
    at = start()
    add(at, "Paging moves nothing:", max_new=12)
    add(at, "Blocks of another text", max_new=12)
    click(at, "btn_step")
    # No time at all: the first operation is replayed, then the limit is found passed.
    monkeypatch.setattr(control_run, "REPLAY_LIMIT_S", 0)
    click(at, "btn_control")
    assert [w.value for w in at.warning if w.value.startswith("Stopped")] == [
        "Stopped at the 0 s limit after replaying 1 of 3 operations whole: the comparison "
        "covers the tokens both runs reached by then."]
    # Still a comparison, over what both reached: A's prompt.
    assert [s.value for s in at.success if s.value.startswith("Same:")]
    monkeypatch.setattr(control_run, "REPLAY_LIMIT_S", 120)
    click(at, "btn_control")
    assert not [w for w in at.warning if w.value.startswith("Stopped")]
    assert [s.value for s in at.success if s.value.startswith("Same:")]


def test_the_playground_reads_a_request_in_physical_order_on_a_copy() -> None:
    from backend.engine.whatif import physical_order
    from backend.views.whatif import outcome

    at = start()
    add(at, "Paging moves nothing:", max_new=12)
    add(at, "Blocks of another text", max_new=12)
    click(at, "btn_step")
    click(at, "btn_shuffle")
    e = engine(at)
    before = [r.tokens[:] for r in e.requests.values()]
    # The panel runs its content only while open.
    assert "whatif_pick" not in [s.key for s in at.selectbox]
    at.session_state["whatif_open"] = True
    at.run()
    at.selectbox(key="whatif_pick").set_value("A").run()
    click(at, "btn_whatif")
    want = physical_order(e, "A")
    shown = "\n".join(m.value for m in at.markdown)
    assert f"Table order**: table {want.table_order.table}" in shown
    assert f"Physical order**: table {want.physical_order.table}" in shown
    assert f"moved by at most {max(want.attention_diff):.3g}" in shown
    # Said by how far the logits moved: here, past float rounding.
    assert want.physical_changed and outcome(want) in shown
    assert "Next token (the engine's seeded draw)" in shown
    # A draw from past the five most likely tokens says so (it looked like a mismatch).
    beyonds = []
    for r in (want.table_order, want.physical_order):
        beyond = all(t != r.next_token for t, _ in r.top)
        beyonds.append(beyond)
        assert beyond == (f"not among the {len(r.top)} most likely below" in
                          shown.split("Physical order**")[r is want.physical_order])
    # tiny-byte's random weights spread the probability over 256 bytes: both are.
    assert beyonds == [True, True]
    # Each column marks the slot this forward writes; sorted, it lands on another token's.
    codes = [c.value for c in at.get("code")]
    assert len(codes) == 2 and all(c.count("▸") == 1 for c in codes)
    at_pos = want.overwritten(want.physical_order.table)
    assert at_pos is not None and want.overwritten(want.table_order.table) is None
    tokens = e.requests["A"].tokens
    over, new = e.token_pieces([tokens[at_pos]])[0], e.token_pieces([tokens[-1]])[0]
    assert codes[1].endswith("▸" + new)
    last = len(tokens) - 1
    said = (f"▸ This forward writes the K/V of '{new}' (position {last}) over that of "
            f"'{over}' (position {at_pos}): position {last} is read twice, position "
            f"{at_pos} not at all.")
    assert said in [shown_text(c.value) for c in at.caption]
    # A copy of the pool: the engine generated nothing and moved nothing.
    assert [r.tokens for r in e.requests.values()] == before
    # With a past step on show, the panel reads nothing: the K/V tensors hold the newest
    # state, whose tokens beside the past state's tables read as that state's.
    at.number_input(key="tl_iteration").set_value(0).run()
    assert not at.exception
    assert not [m for m in at.markdown if "Table order**" in m.value]
    assert "whatif_pick" not in [s.key for s in at.selectbox]
    assert (f"The page shows step 1's state; this reads a request's blocks from the live "
            f"K/V tensors, which hold the newest state, step {e.step}: go back to the live "
            "state to use it.") in [shown_text(c.value) for c in at.caption]
    click(at, "tl_live_top")
    assert [m for m in at.markdown if "Table order**" in m.value]
    # A new engine at the same step, with a request A of its own: the reading was of the
    # old engine's A, so it is gone, not shown as this one's.
    click(at, "btn_reset")
    click(at, "btn_reset_confirm")
    add(at, "Something else entirely", max_new=12)
    add(at, "Blocks of another text", max_new=12)
    click(at, "btn_step")
    click(at, "btn_shuffle")
    assert engine(at) is not e and engine(at).step == e.step
    assert not [m for m in at.markdown if "Table order**" in m.value]
    assert not at.get("code")


def test_a_beams_reading_names_no_draw_the_beam_search_does_not_make() -> None:
    # A beam's next token is the search's pick among its group's extensions by cumulative
    # log-probability; the seeded draw the panel named for it was a token the engine never
    # takes (the beam could be dropped on the next step).
    at = start()
    at.number_input(key="add_beam").set_value(3)
    add(at, "hello there", rid="A", max_new=20)
    click(at, "btn_step")
    click(at, "btn_step")
    at.session_state["whatif_open"] = True
    at.run()
    at.selectbox(key="whatif_pick").set_value("A.0").run()
    click(at, "btn_whatif")
    shown = "\n".join(m.value for m in at.markdown)
    assert "seeded draw" not in shown
    assert shown.count("Next token: the beam search's choice, not a draw: it keeps the "
                       "group's extensions with the highest cumulative log-probability") == 2
    # A request that samples still has its draw named.
    add(at, "Blocks of another text", rid="B", max_new=12)
    at.selectbox(key="whatif_pick").set_value("B").run()
    click(at, "btn_whatif")
    assert "Next token (the engine's seeded draw)" in "\n".join(m.value for m in at.markdown)


def test_a_control_run_of_a_replaced_engine_is_not_shown() -> None:
    at = start()
    add(at, "Paging moves nothing:", max_new=12)
    click(at, "btn_control")
    assert [s.value for s in at.success if s.value.startswith("Same:")]
    click(at, "btn_reset")
    click(at, "btn_reset_confirm")
    add(at, "Something else entirely", max_new=12)
    assert len(at.session_state["oplog"].ops) == 1
    assert not [s.value for s in at.success if s.value.startswith("Same:")]
