"""Beam search from the Playground's Add form, through AppTest: the engine runs it, the
request table shows each beam's score, and the beam panel its text, best first; an
uploaded snapshot whose beam score the model does not give is refused."""

from __future__ import annotations

import copy

from backend.engine import beams
from backend.io.export import snapshot_bytes
from backend.io.snapshot import export_snapshot
from tests.test_app import add, click, engine, start, status
from tests.test_app_timeline import requests_table


def test_the_add_form_runs_a_beam_search_and_shows_each_beams_score_and_text() -> None:
    at = start()
    at.number_input(key="add_beam").set_value(3)
    add(at, "Once upon a time", max_new=6)
    assert at.selectbox(key="req_pick").value == "A.0"
    # A one-off, as the salt and pins are: left set, the next add would be a beam search
    # too without a word.
    assert at.number_input(key="add_beam").value is None
    for _ in range(2):
        click(at, "btn_step")
    e = engine(at)
    members = beams.group_members(e.requests, "A")
    alive = sorted((r for r in members if r.status == "running"),
                   key=lambda r: -(r.cum_logprob or 0.0))
    assert len(alive) == 3
    table = requests_table(at)
    for r in members:
        assert table.loc[r.id, "log p"] == f"{r.cum_logprob:.3f}"
    panel = [x for x in at.expander if x.label.startswith("Beam search A: width 3")]
    assert len(panel) == 1 and "3 live" in panel[0].label
    df = panel[0].dataframe[0].value
    assert list(df["beam"][:3]) == [r.id for r in alive]
    assert list(df["generated text"][:3]) == [
        e.model.codec.decode(r.tokens[r.prompt_len:]) for r in alive]
    # Growing a beam by hand is refused with the reason, and nothing changes.
    at.selectbox(key="req_pick").set_value(alive[-1].id).run()
    before = [r.tokens[:] for r in members]
    click(at, "btn_grow")
    assert any("the beam search extends and forks" in x.value for x in at.error)
    assert [r.tokens for r in members] == before


def test_beam_width_without_a_token_limit_is_refused_by_name() -> None:
    at = start()
    at.sidebar.number_input(key="cfg_max_new").set_value(None).run()
    # Set after the sidebar's rerun: a form's fields count only when it is submitted.
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time")
    assert any("Beam width needs a limit on new tokens: give Max new tokens, or set the "
               "sidebar's Default max new tokens" in x.value for x in at.error)
    assert not engine(at).requests
    # With the sidebar's default, the same form adds the beam search.
    at.sidebar.number_input(key="cfg_max_new").set_value(4).run()
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time")
    # (The first beam; its first step forks the second.)
    assert not at.error and list(engine(at).requests) == ["A.0"]
    assert engine(at).requests["A.0"].beam_width == 2


def test_a_beam_groups_id_is_shown_as_written_not_as_markdown() -> None:
    from backend.views.text import plain_md

    rid = "![z](http://example.invalid/z.png)"
    at = start()
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time", rid=rid, max_new=4)
    click(at, "btn_step")
    labels = [x.label for x in at.expander if "Beam search" in x.label]
    assert len(labels) == 1
    assert labels[0].startswith(plain_md(f"Beam search {rid}: width 2"))
    assert "](" not in labels[0].replace("\\](", "")


def test_a_beam_finished_by_hand_is_no_complete_hypothesis() -> None:
    at = start()
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time", max_new=3)
    click(at, "btn_step")
    at.selectbox(key="req_pick").set_value("A.1").run()
    click(at, "btn_finish")
    panel = [x for x in at.expander if x.label.startswith("Beam search A: width 2")]
    assert len(panel) == 1
    assert "1 live, 0 complete, 0 dropped, 1 finished by hand" in panel[0].label
    df = panel[0].dataframe[0].value.set_index("beam")
    # Said as the block tables say it, not "finished (finished)".
    assert df.loc["A.1", "status"] == "finished (by hand)" and df.loc["A.0", "status"] == "running"
    # Run to its end: the survivor is a complete hypothesis, ended by its token limit.
    click(at, "btn_step")
    click(at, "btn_step")
    panel = [x for x in at.expander if x.label.startswith("Beam search A: width 2")]
    assert "0 live, 1 complete, 0 dropped, 1 finished by hand" in panel[0].label
    df = panel[0].dataframe[0].value.set_index("beam")
    assert df.loc["A.0", "status"] == "finished (max new tokens)"


def test_finished_beams_are_pointed_to_their_panel_from_the_finished_list() -> None:
    at = start()
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time", max_new=2)
    at.number_input(key="add_beam").set_value(None)
    add(at, "Plain text", max_new=1)
    at.number_input(key="batch_n").set_value(6)
    click(at, "btn_step_n")
    e = engine(at)
    done = [r for r in e.requests.values() if r.status == "finished"]
    beams_done = [r for r in done if r.beam_width is not None]
    assert beams_done and len(done) > len(beams_done)
    box = [x for x in at.expander if x.label.startswith("Finished: what 1 request generated")]
    assert len(box) == 1
    assert [c.value for c in box[0].caption] == [
        f"{len(beams_done)} more finished beams: see the beam search panels above (collapsed "
        "once a search ends)."]
    assert list(box[0].dataframe[0].value["request"]) == ["B"]


def test_parallel_samples_are_a_one_off_and_a_refused_add_keeps_them() -> None:
    at = start()
    at.number_input(key="add_n").set_value(3)
    add(at, "Once upon a time", max_new=2)
    assert sorted(engine(at).requests) == ["A.0", "A.1", "A.2"]
    # Cleared: the next add is one request, not three more samples.
    assert at.number_input(key="add_n").value is None
    add(at, "Plain text", max_new=1)
    assert engine(at).requests["B"].group is None and len(engine(at).requests) == 4
    # Refused (n with a beam width), both stay for the person to fix.
    at.number_input(key="add_n").set_value(2)
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time", max_new=2)
    assert "C.0" not in engine(at).requests and at.error
    assert at.number_input(key="add_n").value == 2
    assert at.number_input(key="add_beam").value == 2


def test_an_uploaded_snapshot_with_an_edited_beam_score_is_refused_and_the_state_kept() -> None:
    at = start()
    at.number_input(key="add_beam").set_value(2)
    add(at, "Once upon a time", max_new=6)
    click(at, "btn_step")
    click(at, "btn_step")
    before = export_snapshot(engine(at))
    snap = copy.deepcopy(before)
    row = next(r for r in snap["requests"] if r["id"] == "A.1")
    row["cum_logprob"] -= 1.0
    at.file_uploader(key="import_snapshot").set_value(
        ("edited.json", snapshot_bytes(snap), "application/json")).run()
    assert not at.exception
    kind, line = status(at)
    assert kind == "error" and "beam 'A.1' has cum_logprob" in line, line
    assert export_snapshot(engine(at)) == before
