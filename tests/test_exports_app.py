"""Downloads and snapshot uploads in the app (AppTest): exact bytes, round trips, refusals.

A download button's bytes live in Streamlit's media file manager, which
AppTest makes afresh for every run and drops afterwards. The `media` fixture
keeps a reference to each one (a subclass that only records itself; nothing
about serving the files changes), so a test reads exactly the bytes a
browser would download, and runs a deferred button's builder as a click would.
"""

from __future__ import annotations

import copy
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.runtime.media_file_storage import MediaFileStorage
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1 import app_test as app_test_module

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add
from backend.io.cli import main
from backend.io.export import blocks_table, events_table, snapshot_bytes, to_csv
from backend.io.snapshot import MAX_SNAPSHOT_BYTES, export_snapshot, snapshot_json
from backend.sessions.playground import kept_snapshot
from backend.sessions.tour import TourRun
from tests.test_app import add, click, engine, shown, start

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")


class Media:
    """The media file managers of an AppTest's runs, newest last."""

    def __init__(self) -> None:
        self.managers: list[MediaFileManager] = []

    def download(self, at: AppTest, key: str) -> bytes:
        """The bytes a click on the download button `key` would deliver."""
        proto = at.get("download_button")
        button = next(b for b in proto if getattr(b, "key", None) == key)
        mgr = self.managers[-1]
        url = button.proto.url
        if button.proto.deferred_file_id:
            url = mgr.execute_deferred(button.proto.deferred_file_id)
        assert url.startswith("/mock/media/"), url
        stored = mgr.read_file(url.rsplit("/", 1)[1].split(".")[0])
        assert stored is not None, url
        return stored.content

    def file_name(self, at: AppTest, key: str) -> str:
        button = next(b for b in at.get("download_button") if getattr(b, "key", None) == key)
        mgr = self.managers[-1]
        if button.proto.deferred_file_id:
            return str(mgr._deferred_callables[button.proto.deferred_file_id]["filename"])
        stored = mgr.read_file(button.proto.url.rsplit("/", 1)[1].split(".")[0])
        assert stored is not None
        return str(stored.filename)


@pytest.fixture
def media(monkeypatch: pytest.MonkeyPatch) -> Iterator[Media]:
    found = Media()

    class Recording(MediaFileManager):
        def __init__(self, storage: MediaFileStorage) -> None:
            super().__init__(storage)
            found.managers.append(self)

    monkeypatch.setattr(app_test_module, "MediaFileManager", Recording)
    yield found


def upload(at: AppTest, data: bytes, name: str = "snap.json") -> AppTest:
    at.file_uploader(key="import_snapshot").set_value((name, data, "application/json")).run()
    assert not at.exception
    return at


def playground_state(at: AppTest) -> bytes:
    return snapshot_bytes(export_snapshot(engine(at)))


def shared_state(kernel: str = "torch") -> AppTest:
    """A playground with two requests sharing a prompt, forked, and the child grown."""
    at = add(add(start(kernel)))
    at.selectbox(key="req_pick").select("A")
    at.text_input(key="req_child").input("A2")
    at.button(key="btn_fork").click().run()
    at.button(key="btn_grow").click().run()
    assert not at.exception and engine(at).step == 4
    return at


# ---- downloads ----------------------------------------------------------------------------

def test_playground_snapshot_download_is_the_cli_file_for_that_state(media: Media) -> None:
    at = shared_state()
    got = media.download(at, "dl_snapshot")
    assert got == snapshot_bytes(export_snapshot(engine(at)))
    assert got == snapshot_json(engine(at)).encode()     # what `run --out` writes
    assert json.loads(got)["step"] == 4
    assert media.file_name(at, "dl_snapshot") == "playground-step-0004.json"


def test_a_past_step_picked_on_the_timeline_is_what_the_playground_downloads(
        media: Media) -> None:
    at = shared_state()
    at.number_input(key="tl_iteration").set_value(0).run()
    assert not at.exception
    (banner,) = [i.value for i in at.info if i.value.startswith("Showing the past")]
    step = int(re.search(r"the state after step (\d+)\.", banner).group(1))
    assert step < engine(at).step
    kept = kept_snapshot(at.session_state["history"], step)
    assert kept is not None
    got = media.download(at, "past_dl_snapshot")
    assert got == snapshot_bytes(kept) and json.loads(got)["step"] == step
    assert media.file_name(at, "past_dl_snapshot") == f"playground-step-{step:04d}.json"
    assert media.download(at, "past_dl_blocks_csv") == to_csv(blocks_table(kept))
    assert any(f"the snapshot, grid and tables below are of step {step}'s state" in c.value
               for c in at.caption)
    # Back to live: the live state's files again.
    at.button(key="tl_live_top").click().run()
    assert media.download(at, "dl_snapshot") == snapshot_bytes(export_snapshot(engine(at)))


def test_playground_tables_images_and_run_zip(media: Media) -> None:
    at = shared_state()
    snap = export_snapshot(engine(at))
    assert media.download(at, "dl_blocks_csv") == to_csv(blocks_table(snap))
    events = pd.read_parquet(io.BytesIO(media.download(at, "dl_events_parquet")))
    pd.testing.assert_frame_equal(events, events_table(snap))
    assert len(events) == len(snap["events"]) and "cow" in set(events["kind"])
    requests = pd.read_csv(io.BytesIO(media.download(at, "dl_requests_csv")),
                           keep_default_na=False)
    assert list(requests["id"]) == ["A", "B", "A2"]
    png = media.download(at, "dl_png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    svg = media.download(at, "dl_svg").decode()
    assert svg.lstrip().startswith("<svg") and "Physical blocks 0–31" in svg
    # The run: one snapshot per operation since the engine started.
    with zipfile.ZipFile(io.BytesIO(media.download(at, "dl_zip"))) as zf:
        assert zf.namelist() == [f"step-{i:04d}.json" for i in range(1, 5)]
        assert zf.read("step-0004.json") == snapshot_bytes(snap)
        assert json.loads(zf.read("step-0003.json"))["metrics"]["shared_blocks"] == 6
    # Named by its steps, as every other download by its own.
    assert media.file_name(at, "dl_zip") == "playground-run-steps-0001-0004.zip"


def open_tour(stem: str, step: int) -> AppTest:
    at = start()
    at.query_params["scenario"] = stem
    at.query_params["step"] = str(step)
    at.switch_page("pages/scenarios.py").run()
    assert not at.exception
    return at


def test_scenario_step_downloads_hold_the_viewed_step(media: Media, tmp_path: Path) -> None:
    at = open_tour("08-fork-copy-on-write", 4)
    at.button(key="tour_back").click().run()          # view step 3; step 4 stays computed
    run: TourRun = at.session_state["tour"].run
    frame = run.frame(3)
    got = media.download(at, "tour_dl_snapshot")
    assert got == snapshot_bytes(frame.snapshot)
    assert json.loads(got)["step"] == 3
    assert media.file_name(at, "tour_dl_snapshot") == "08-fork-copy-on-write-step-0003.json"
    # The same state as the command line reaches: equal in everything but the timing.
    out = tmp_path / "cli"
    code = main(["run", str(ROOT / "assets" / "scenarios" / "08-fork-copy-on-write.json"),
                 "--kernel", "torch", "--snapshots", str(out)])
    assert code == 0
    cli = json.loads((out / "step-0003.json").read_text())
    mine = json.loads(got)
    for snap in (cli, mine):
        snap["kernel"]["time_ms"] = None
    assert mine == cli
    # The run's zip holds every step computed so far, named as --snapshots names them.
    with zipfile.ZipFile(io.BytesIO(media.download(at, "tour_dl_zip"))) as zf:
        assert zf.namelist() == [f"step-{i:04d}.json" for i in range(1, 5)]
        assert zf.read("step-0003.json") == got
    csv = pd.read_csv(io.BytesIO(media.download(at, "tour_dl_blocks_csv")),
                      keep_default_na=False)
    assert csv.loc[3, "holders"] == "A2" and csv.loc[0, "ref_count"] == 2


# ---- export, import, export -----------------------------------------------------------

def test_export_import_export_gives_the_same_file(media: Media) -> None:
    # Export from the Scenarios page, import on a fresh playground, export again.
    at = open_tour("06-prefix-sharing", 5)
    exported = media.download(at, "tour_dl_snapshot")
    other = start()
    upload(other, exported, "prefix.json")
    assert [s.value for s in other.success] == [
        "Restored the snapshot in 'prefix.json': step 5, 3 requests, 48 blocks of 4 slots; "
        "K/V recomputed from the tokens. Keep working from here."]
    assert playground_state(other) == exported
    assert media.download(other, "dl_snapshot") == exported
    assert "Last upload, prefix.json: restored." in [c.value for c in other.caption]
    # Its timeline starts there, and says where rather than that nothing ran.
    assert any(c.value.startswith("Nothing run since this engine was restored at step 5: ")
               for c in other.caption)
    assert ("Scenario file: not available, no operation has been applied since this state "
            "was restored (step 5): the snapshot export holds it.") in [
        c.value for c in other.caption]
    # The config came with it; the sidebar shows it and nothing is pending.
    assert other.sidebar.number_input(key="cfg_num_blocks").value == 48
    assert not other.warning
    # And work continues from that state, with K/V that give the reference's outputs.
    other.button(key="btn_step").click().run()
    e = engine(other)
    assert e.step == 6 and e.kernel_report.max_abs_err is not None
    assert e.kernel_report.max_abs_err < 1e-4
    e.check_integrity()
    # The playground's run starts at the imported state.
    with zipfile.ZipFile(io.BytesIO(media.download(other, "dl_zip"))) as zf:
        assert zf.namelist() == ["step-0005.json", "step-0006.json"]
        assert zf.read("step-0005.json") == exported
    # The note stays through work on that state, and goes once another engine replaces
    # it: "restored." beside a new session would describe a state no longer shown.
    assert "Last upload, prefix.json: restored." in [c.value for c in other.caption]
    other.button(key="btn_new_session").click().run()
    assert not [c.value for c in other.caption if c.value.startswith("Last upload")]
    # The file goes with its note: held on, it read as loaded into the new session.
    # (A file uploader is emptied only under a new key.)
    assert [u.key for u in other.file_uploader] == ["import_snapshot_1"]
    assert other.file_uploader(key="import_snapshot_1").value is None
    upload_key = "import_snapshot_1"
    other.file_uploader(key=upload_key).set_value(("again.json", exported,
                                                   "application/json")).run()
    assert "Last upload, again.json: restored." in [c.value for c in other.caption]
    assert engine(other).step == 5


# ---- refused uploads ------------------------------------------------------------------


def _bump_ref_count(snap: dict[str, Any]) -> None:
    snap["blocks"][0]["ref_count"] += 1


def _wrong_state(snap: dict[str, Any]) -> None:
    snap["blocks"][0]["state"] = "free"


def _tokens_do_not_fit(snap: dict[str, Any]) -> None:
    req = snap["requests"][0]
    req["tokens"] += [65] * 8
    req["num_tokens"] = len(req["tokens"])


def _wrong_used_count(snap: dict[str, Any]) -> None:
    snap["metrics"]["used_blocks"] += 1


def _block_in_two_states(snap: dict[str, Any]) -> None:
    # Block 0 is used (three tables hold it), yet the free queue lists it too.
    snap["free_queue"].insert(0, 0)


def _free_block_in_a_table(snap: dict[str, Any]) -> None:
    # Block 9 is free, yet A's table lists it instead of block 1.
    snap["requests"][0]["block_table"][1] = 9


@pytest.mark.parametrize(("change", "message"), [
    (_bump_ref_count, "inconsistent snapshot: block 0 has ref_count 4 but 3 block tables "
                      "hold it"),
    (_wrong_state, "inconsistent snapshot: block 0 is listed as 'free' but its ref_count and "
                   "hash make it 'used'"),
    (_tokens_do_not_fit, "snapshot.requests[0]: 31 tokens do not fit its table of 6 blocks "
                         "of 4"),
    (_wrong_used_count, "inconsistent snapshot: metrics.used_blocks is 9 but the blocks "
                        "give 8"),
    (_block_in_two_states, "inconsistent snapshot: free_queue must list every block with "
                           "ref_count 0 exactly once"),
    (_free_block_in_a_table, "inconsistent snapshot: block 1 has ref_count 3 but 2 block "
                             "tables hold it"),
], ids=["ref-count-bumped", "block-in-wrong-state", "tokens-do-not-fit", "counts-disagree",
        "block-in-two-states", "free-block-in-a-table"])
def test_an_inconsistent_snapshot_is_refused_and_the_state_kept(change: Any,
                                                                 message: str) -> None:
    at = shared_state()
    before = playground_state(at)
    snap = copy.deepcopy(export_snapshot(engine(at)))
    change(snap)
    upload(at, snapshot_bytes(snap), "bad.json")
    assert [e.value for e in at.error] == [
        f"Refused the snapshot in 'bad.json': {message}. The playground is unchanged."]
    assert playground_state(at) == before
    assert engine(at).step == 4


@pytest.mark.parametrize(("data", "message"), [
    (b"{\"schema_version\": 1,", "snapshot is not valid JSON: Expecting property name enclosed "
                                 "in double quotes: line 1 column 22 (char 21)"),
    (b"{\"a\": \"\xc3\x28\"}", "snapshot is not valid JSON: it is not UTF-8 text (byte "
                              "0xc3 at offset 7); it may be a binary file"),
    (b"\x89PNG\r\n\x1a\n", "snapshot is not valid JSON: it is not UTF-8 text (byte 0x89 at "
                           "offset 0); it may be a binary file"),
    (b"\xff\xfe{\"schema_version\": 1}", "snapshot is not valid JSON: its first bytes mark "
                                        "it as UTF-16-LE text, which it is not; it may be a "
                                        "binary file, or else save it as UTF-8"),
    (b"[]", "snapshot must be a JSON object, got an array"),
    (b"{}", "snapshot: missing field 'schema_version'"),
    (b'{"name": "s", "config": {}, "steps": []}', "snapshot: missing field "
     "'schema_version'; this is a scenario file (it has 'steps'): open it on the Scenarios "
     "page, or run it with python -m backend run"),
], ids=["truncated", "not-utf8", "png", "utf-16-mark", "a-list", "empty-object",
        "a-scenario"])
def test_a_malformed_snapshot_is_refused(data: bytes, message: str) -> None:
    at = shared_state()
    before = playground_state(at)
    upload(at, data, "bad.json")
    assert [e.value for e in at.error] == [
        f"Refused the snapshot in 'bad.json': {message}. The playground is unchanged."]
    assert playground_state(at) == before


def test_a_snapshot_of_another_schema_version_is_refused() -> None:
    at = shared_state()
    before = playground_state(at)
    snap = export_snapshot(engine(at))
    snap["schema_version"] = 2
    upload(at, snapshot_bytes(snap), "future.json")
    assert [e.value for e in at.error] == [
        "Refused the snapshot in 'future.json': snapshot schema_version is 2; this PagedLab "
        "reads version 1. The playground is unchanged."]
    assert playground_state(at) == before
    note = ("Last upload, future.json: refused: snapshot schema_version is 2; this PagedLab "
            "reads version 1. The playground is unchanged.")
    assert note in [c.value for c in at.caption]
    # The next operation replaces the status line at the top; the note beside the file
    # still says why it was refused, not where to look.
    click(at, "btn_step")
    assert not at.error and note in [c.value for c in at.caption]
    # Another page, and back: the uploader is empty again, and the note about its file
    # is gone with it.
    at.switch_page("pages/scenarios.py").run()
    at.switch_page("pages/playground.py").run()
    assert at.file_uploader(key="import_snapshot").value is None
    assert note not in [c.value for c in at.caption]


def test_an_oversized_snapshot_is_refused_unread() -> None:
    at = shared_state()
    before = playground_state(at)
    # Past the limit, the browser still sends the file, to be refused here on the page.
    assert at.file_uploader(key="import_snapshot").proto.max_upload_size_mb << 20 \
        >= 2 * MAX_SNAPSHOT_BYTES
    # The uploader's own line says 64MB; its help gives PagedLab's limit.
    assert "At most 32 MiB: " in at.file_uploader(key="import_snapshot").proto.help
    upload(at, b" " * (MAX_SNAPSHOT_BYTES + 1), "huge.json")
    assert [e.value for e in at.error] == [
        f"Refused the snapshot in 'huge.json': it is {MAX_SNAPSHOT_BYTES + 1:,} bytes; the "
        "limit is 32 MiB. The playground is unchanged."]
    assert playground_state(at) == before


def test_after_a_refusal_a_good_snapshot_still_imports() -> None:
    at = add(start())
    good = playground_state(at)
    target = shared_state()
    upload(target, b"nonsense", "bad.json")
    assert target.error
    upload(target, good, "good.json")
    assert not target.error and playground_state(target) == good


def test_a_snapshot_is_known_by_its_content_not_its_file_name() -> None:
    # A snapshot saved as .txt is restored; a picture is refused with PagedLab's reason
    # beside it, not a file-type chip that stays beside later uploads.
    good = playground_state(add(start()))
    target = shared_state()
    target.file_uploader(key="import_snapshot").set_value(
        ("saved.txt", good, "text/plain")).run()
    assert not target.exception and not target.error
    assert playground_state(target) == good
    target.file_uploader(key="import_snapshot").set_value(
        ("picture.png", b"\x89PNG\r\n\x1a\n\x00", "image/png")).run()
    assert playground_state(target) == good
    assert ("Last upload, picture.png: refused: snapshot is not valid JSON: it is not UTF-8 "
            "text (byte 0x89 at offset 0); it may be a binary file. The playground is "
            "unchanged.") in [c.value for c in target.caption]


def test_a_restored_greedy_config_says_so_and_its_temperature_can_be_changed() -> None:
    # A scenario's or snapshot's temperature 0 (greedy) is part of the state restored: the
    # line says so and the sidebar shows it, rather than parallel samples that all agree
    # for no visible reason.
    e = Engine(EngineConfig(num_blocks=32, block_size=4, temperature=0), kernel="torch")
    e.apply(Add("A", prompt="The cat"))
    at = upload(start(), snapshot_bytes(export_snapshot(e)), "greedy.json")
    said = [s.value for s in at.success]
    assert len(said) == 1 and "; greedy (temperature 0: every sample takes the most likely " \
                               "token); K/V recomputed" in said[0], said
    assert at.sidebar.number_input(key="cfg_temperature").value == 0
    assert at.sidebar.number_input(key="cfg_top_p").value is None
    at.sidebar.number_input(key="cfg_temperature").set_value(0.7).run()
    click(at, "btn_apply_config")
    assert engine(at).config.temperature == 0.7 and not engine(at).requests
    # The restored state stays saved, and the message says so after the settings.
    # (Session ids are random; one may hold Markdown syntax, which the source escapes.)
    assert any("; temperature 0.7. The state it replaced stays saved as session "
               in shown(i.value) for i in at.info), [i.value for i in at.info]
    # A refused value names the field as the sidebar does.
    at.sidebar.number_input(key="cfg_temperature").set_value(-1.0).run()
    assert [shown(e.value) for e in at.sidebar.error] == [
        "Temperature must be >= 0 (0, or anything under 1e-05, is greedy), got -1.0"]
    assert engine(at).config.temperature == 0.7


def test_the_models_own_sampling_comes_back_with_one_button() -> None:
    # A number field that held a number takes it back when cleared, so blank (the model's
    # own) could not be typed back once a temperature was set; the button blanks both.
    at = start()
    assert "btn_model_sampling" not in [b.key for b in at.sidebar.button]
    at.sidebar.number_input(key="cfg_temperature").set_value(0.7).run()
    at.sidebar.number_input(key="cfg_top_p").set_value(0.5).run()
    assert (engine(at).config.temperature, engine(at).config.top_p) == (0.7, 0.5)
    add(at)
    click(at, "btn_model_sampling")
    # A busy engine asks first, as for any field; nothing changes until it is confirmed.
    assert (engine(at).config.temperature, engine(at).config.top_p) == (0.7, 0.5)
    assert engine(at).requests
    assert at.sidebar.number_input(key="cfg_temperature").value is None
    assert at.sidebar.number_input(key="cfg_top_p").value is None
    click(at, "btn_apply_config")
    assert (engine(at).config.temperature, engine(at).config.top_p) == (None, None)
    assert not engine(at).requests
    assert "btn_model_sampling" not in [b.key for b in at.sidebar.button]
