"""Importing a snapshot: what the restore says besides restoring it.

Fields PagedLab does not read are restored around and named by path (the
contract lets files carry fields it does not know); a restored kernel report is
marked as the snapshot's, not this engine's; a refusal names the field that was
edited, not a total it upset; and messages end so that a caller can go on after
them.
"""

from __future__ import annotations

import copy
import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Op, Step, parse_op
from backend.io.json_input import FieldReader, decode_json
from backend.io.restore import restore_engine
from backend.io.restore_notes import restore_notes, unread_fields
from backend.io.scenario import load_scenario, run_steps
from backend.io.snapshot import export_snapshot, parse_snapshot_text, snapshot_json
from tests.test_app import engine as app_engine
from tests.test_app import markdown, shown
from tests.test_exports_app import shared_state, upload

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "assets" / "scenarios"


def engine_after(ops: list[Op], **cfg: Any) -> Engine:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4, **cfg}),
               kernel="torch")
    for op in ops:
        e.apply(op)
    return e


@pytest.fixture(scope="module")
def snap() -> dict[str, Any]:
    """A (8 tokens), B sharing A's first block, C finished (its blocks cached), one step."""
    return export_snapshot(engine_after([Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"),
                                         Add("C", prompt="qrstuvwxyz"), Finish("C"), Step()]))


def restored(data: dict[str, Any]) -> Engine:
    return restore_engine(copy.deepcopy(data), kernel="torch")


# ---- fields PagedLab does not read -----------------------------------------------------

def test_a_misspelt_request_field_is_named_and_changes_nothing(snap: dict[str, Any]) -> None:
    typo = copy.deepcopy(snap)
    a = typo["requests"][0]
    del a["max_new_tokens"]
    a["max_new_tokns"] = 5
    e = restored(typo)
    assert unread_fields(e) == ("snapshot.requests[0].max_new_tokns",)
    assert restore_notes(e) == ["snapshot.requests[0].max_new_tokns is not a field PagedLab "
                                "reads; it was ignored"]
    # Restored as if the field were absent: no limit, and the file it exports has no typo.
    assert e.requests["A"].max_new_tokens is None
    assert snapshot_json(e) == snapshot_json(restored(snap))


def test_unknown_fields_everywhere_are_named_in_file_order(snap: dict[str, Any]) -> None:
    odd = copy.deepcopy(snap)
    odd["bogus_field"] = 1
    odd["blocks"][2]["colour"] = "red"
    odd["requests"][1]["x y"] = [1]
    odd["events"][0]["extra"] = None
    odd["metrics"]["k" * 60] = 0
    odd["kernel"]["notes"] = {"a": 1}
    odd["scheduler"]["later"] = []
    odd["allocator"]["seed2"] = 3
    odd["prefix_cache"][0]["depth"] = 0
    e = restored(odd)
    assert unread_fields(e) == (
        "snapshot.blocks[2].colour", "snapshot.requests[1]['x y']", "snapshot.events[0].extra",
        f"snapshot.metrics['{'k' * 40}...']", "snapshot.kernel.notes",
        "snapshot.scheduler.later", "snapshot.prefix_cache[0].depth",
        "snapshot.allocator.seed2", "snapshot.bogus_field")
    assert restore_notes(e) == [
        "snapshot.blocks[2].colour, snapshot.requests[1]['x y'], snapshot.events[0].extra, "
        f"snapshot.metrics['{'k' * 40}...'], snapshot.kernel.notes and 4 more are not fields "
        "PagedLab reads; they were ignored"]
    assert snapshot_json(e) == snapshot_json(restored(snap))


def test_two_unknown_fields_are_named_together(snap: dict[str, Any]) -> None:
    odd = copy.deepcopy(snap)
    odd["bogus"] = 1
    odd["requests"][0]["max_new_tokns"] = 5
    assert restore_notes(restored(odd)) == [
        "snapshot.requests[0].max_new_tokns and snapshot.bogus are not fields PagedLab "
        "reads; they were ignored"]


def test_a_count_written_as_a_float_is_refused_with_the_way_to_write_it(
        snap: dict[str, Any]) -> None:
    for path, value, said in [
            (("step",), 1.0, "snapshot.step must be an integer, got 1.0 (write it as 1, "
                             "without a decimal point or exponent)"),
            (("blocks", 0, "ref_count"), 1e0, "snapshot.blocks[0].ref_count must be an "
                                               "integer, got 1.0 (write it as 1"),
            (("step",), 1.5, "snapshot.step must be an integer, got 1.5")]:
        odd = copy.deepcopy(snap)
        target: Any = odd
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        with pytest.raises(PagedLabError) as refused:
            restored(odd)
        assert str(refused.value).startswith(said), str(refused.value)
        if value == 1.5:
            assert "write it" not in str(refused.value)


def test_an_unknown_config_field_is_still_refused(snap: dict[str, Any]) -> None:
    # A misspelt setting would build another engine than the file meant: refused, as a
    # scenario's config is, rather than noted.
    odd = copy.deepcopy(snap)
    odd["config"]["block_sise"] = 8
    with pytest.raises(PagedLabError, match=r"snapshot\.config: unknown field 'block_sise'"):
        restored(odd)


def _final_snapshot(path: Path) -> dict[str, Any]:
    sc = load_scenario(path)
    e = Engine(sc.config, kernel="torch")
    for _ in run_steps(e, sc.steps):
        pass
    return export_snapshot(e)


def _swapped() -> dict[str, Any]:
    e = Engine(EngineConfig.from_json({"num_blocks": 13, "block_size": 4, "preemption": "swap",
                                       "num_cpu_blocks": 16}), kernel="torch")
    for rid in "ABCD":
        e.apply(parse_op({"op": "add", "request": rid, "prompt": f"request {rid} asks a "
                          "question", "max_new_tokens": 14}))
    while not e.swapped:
        e.apply(Step())
    return export_snapshot(e)


def _prefilling() -> dict[str, Any]:
    e = engine_after([Add("A", prompt_len=23, max_new_tokens=3), Step()], num_blocks=48,
                     max_num_batched_tokens=6)
    snap = export_snapshot(e)
    assert "num_computed_tokens" in snap["requests"][0]
    return snap


TINY_SCENARIOS = sorted(p for p in SCENARIO_DIR.glob("*.json")
                        if "smollm2" not in p.read_text())


@pytest.mark.parametrize("make", [*(lambda p=p: _final_snapshot(p) for p in TINY_SCENARIOS),
                                  _swapped, _prefilling],
                         ids=[*(p.stem for p in TINY_SCENARIOS), "swapped", "prefilling"])
def test_every_field_an_export_writes_is_read(make: Any) -> None:
    # Forks, samples, beams, cached chains, preemption, swap, chunked prefill: restore
    # reads (or re-derives) every field an export writes, so it never notes one.
    e = restored(json.loads(json.dumps(make())))
    assert unread_fields(e) == ()
    assert restore_notes(e) == []


def test_an_engine_that_no_restore_built_has_no_notes() -> None:
    assert restore_notes(Engine(EngineConfig.from_json({"num_blocks": 8}), kernel="torch")) == []


def test_a_field_reader_counts_accepted_and_nested_reads() -> None:
    data = {"a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 4}, {"g": 5}], "h": {"i": 6}, "j": 7}
    top = FieldReader(data, "x")
    top.get("a", int)
    b = top.object("b")
    b.get("c", int)
    assert top.object("b") is b          # one record per object
    for r in top.objects("e"):
        r.accept("f")
    top.accept("h")                      # read some other way: nothing inside is listed
    assert top.unread() == ["x.b.d", "x.e[1].g", "x.j"]


def test_a_swapped_snapshots_derived_counts_are_checked() -> None:
    swapped = _swapped()
    for key in ("swapped_requests", "cpu_used_blocks"):
        bad = copy.deepcopy(swapped)
        bad["metrics"][key] += 1
        with pytest.raises(PagedLabError, match=f"metrics.{key} is"):
            restored(bad)


# ---- the kernel report a snapshot carries ----------------------------------------------

def test_a_restored_kernel_report_is_marked_until_a_step_replaces_it(
        snap: dict[str, Any]) -> None:
    typed = copy.deepcopy(snap)
    typed["kernel"]["max_abs_err"] = 5.0
    e = restored(typed)
    assert e.kernel_report.restored and e.kernel_report.max_abs_err == 5.0
    # Kept as written: the round trip is exact.
    assert snapshot_json(e) == json.dumps(typed, indent=1) + "\n"
    e.apply(Step())
    assert not e.kernel_report.restored
    assert e.kernel_report.max_abs_err is not None and e.kernel_report.max_abs_err < 1e-4


@pytest.mark.parametrize("key", ["num_seqs", "num_query_tokens"])
def test_a_null_kernel_count_is_refused_not_written_back_as_0(snap: dict[str, Any],
                                                              key: str) -> None:
    # A count is 0 before any step, never null: read as 0, the round trip would change
    # the file.
    bad = copy.deepcopy(snap)
    bad["kernel"][key] = None
    with pytest.raises(PagedLabError, match=rf"^snapshot\.kernel\.{key} must be an integer "
                                            r"in 0\.\.[0-9,]+, got null$"):
        restored(bad)


def test_a_fresh_engines_kernel_report_is_its_own() -> None:
    e = engine_after([Add("A", prompt="abcdefgh")])
    assert not e.kernel_report.restored


def test_the_kernel_panel_says_a_restored_figure_is_the_snapshots() -> None:
    at = shared_state()
    snap = export_snapshot(app_engine(at))
    snap["kernel"]["max_abs_err"] = 5.0
    upload(at, (json.dumps(snap, indent=1) + "\n").encode(), "typed.json")
    text = markdown(at)
    assert ("Carried over with the state this engine was restored from, not measured by a "
            "step it ran (the next step replaces it):") in text
    assert "**5.0e+00**" in text
    at.button(key="btn_step").click().run()
    assert not at.exception
    text = markdown(at)
    assert "Carried over with the state" not in text and "**5.0e+00**" not in text


def test_the_playground_says_which_fields_of_an_upload_it_ignored() -> None:
    at = shared_state()
    snap = export_snapshot(app_engine(at))
    snap["requests"][0]["max_new_tokns"] = 5
    upload(at, (json.dumps(snap, indent=1) + "\n").encode(), "typo.json")
    # As shown: the message is escaped whole when the kept session's random id holds
    # Markdown syntax (an underscore at a word's edge).
    said = [shown(s.value) for s in at.success if "Restored" in s.value]
    assert len(said) == 1 and said[0].endswith(
        "Note: snapshot.requests[0].max_new_tokns is not a field PagedLab reads; "
        "it was ignored."), said


# ---- refusals name the field that was edited -------------------------------------------

def test_an_edited_num_filled_is_refused_by_its_block(snap: dict[str, Any]) -> None:
    bad = copy.deepcopy(snap)
    table = bad["requests"][0]["block_table"]
    bad["blocks"][table[-1]]["num_filled"] += 1
    with pytest.raises(PagedLabError) as info:
        restored(bad)
    message = str(info.value)
    assert f"request 'A' logical block {len(table) - 1} (physical {table[-1]}) has" in message
    assert "metrics" not in message


def test_an_edited_block_size_is_refused_with_the_size_it_implies(
        snap: dict[str, Any]) -> None:
    bad = copy.deepcopy(snap)
    bad["config"]["block_size"] = 8
    with pytest.raises(PagedLabError) as info:
        restored(bad)
    assert str(info.value) == (
        "snapshot.config: block_size 8 gives bytes_per_block 4,096 (2 for K and V x 2 layers "
        "x 2 KV heads x head_dim 16 x block_size 8 x 4 bytes of float32), but the snapshot "
        "says 2,048: a setting was changed without the bytes_per_block it implies")


def test_a_malformed_bytes_per_block_is_refused_as_such(snap: dict[str, Any]) -> None:
    bad = copy.deepcopy(snap)
    bad["config"]["bytes_per_block"] = "2048"
    with pytest.raises(PagedLabError, match=r"snapshot\.config\.bytes_per_block must be "
                                            r"an integer"):
        restored(bad)


def test_a_wrong_total_alone_is_still_refused_by_its_name(snap: dict[str, Any]) -> None:
    bad = copy.deepcopy(snap)
    bad["metrics"]["filled_slots"] += 1
    with pytest.raises(PagedLabError, match=r"metrics\.filled_slots is"):
        restored(bad)


# ---- messages end cleanly ------------------------------------------------------------

@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n", b'{"a": "\xe1"}', b"{", b"9" * 5000,
                                  b'{"a": 1, "a": 2}'])
def test_a_json_refusal_ends_without_punctuation(data: bytes) -> None:
    with pytest.raises(PagedLabError) as info:
        decode_json(data, "snapshot")
    assert not str(info.value).endswith((".", "?", "!")), str(info.value)


def test_a_binary_file_is_refused_in_a_statement() -> None:
    with pytest.raises(PagedLabError) as info:
        parse_snapshot_text(b"{\"\xe1\"}")
    assert str(info.value) == ("snapshot is not valid JSON: it is not UTF-8 text (byte 0xe1 "
                               "at offset 2); it may be a binary file")
    # Valid UTF-8 that is no text: a NUL anywhere says so, where the parser said only
    # "Expecting value: line 1 column 1 (char 0)". A tar archive is one; a zip, whose
    # bytes do not decode, is refused as not UTF-8.
    snap = b'{"step": 1}'
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        member = tarfile.TarInfo("snap.json")
        member.size = len(snap)
        archive.addfile(member, io.BytesIO(snap))
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("snap.json", snap)
    nul = "U+0000 at line 1 column 10, which no JSON text has; it may be a binary file"
    for data, said in (
            (tar.getvalue(), nul), (snap + b"\x00", "U+0000 at line 1 column 12, which "
                                                     "no JSON text has; it may be a binary "
                                                     "file"),
            # Another control character where parsing stopped: named with its line and
            # column, without the guess (an escape pasted from a terminal).
            (b'{"a":\n  \x1b[31m1}', "U+001B at line 2 column 3, which no JSON text has"),
            (b'{"a": "x\x01y"}', "U+0001 at line 1 column 9, which no JSON text has")):
        with pytest.raises(PagedLabError) as info:
            parse_snapshot_text(data)
        assert str(info.value) == ("snapshot is not valid JSON: it holds the control "
                                   f"character {said}")
    with pytest.raises(PagedLabError) as info:
        parse_snapshot_text(packed.getvalue())
    assert "it is not UTF-8 text (byte 0x" in str(info.value)
    # A control character after the syntax error does not hide the parser's words.
    with pytest.raises(PagedLabError) as info:
        parse_snapshot_text(b'{"a": 1,} \x1b')
    assert str(info.value) == ("snapshot is not valid JSON: Expecting property name enclosed "
                               "in double quotes: line 1 column 9 (char 8)")
    # Tabs and line ends are JSON's whitespace: a file with them is read.
    assert decode_json(b'{\r\n\t"a": 1\r\n}', "snapshot") == {"a": 1}


def test_a_file_that_starts_with_a_zero_byte_is_said_to_be_read_as_utf16() -> None:
    # Zero bytes among the first four make the reader take UTF-16 or UTF-32; a binary file
    # that begins 0x00 0x01 decodes as UTF-16-BE, and the U+0001 it then stopped at is no
    # character of the file's. The message says how it was read, and that it may be binary.
    for data, encoding, said in (
            (bytes(range(256)) * 10, "UTF-16-BE",
             "it holds the control character U+0001 at line 1 column 1, which no JSON text "
             "has"),
            ('{"a":'.encode("utf-16-be"), "UTF-16-BE",
             "Expecting value: line 1 column 6 (char 5)")):
        with pytest.raises(PagedLabError) as info:
            decode_json(data, "snapshot")
        assert str(info.value) == (f"snapshot is not valid JSON: its first bytes mark it as "
                                   f"{encoding} text, and read as that, {said}; it may be a "
                                   "binary file, or else save it as UTF-8")
    # UTF-16 text (with a byte-order mark, as Windows' "Unicode" saves it, or without)
    # is read as such: a mistake in it is named, with no guess that it is binary.
    for data, encoding in (('{"a" 1}'.encode("utf-16"), "UTF-16"),
                           ('{"a" 1}'.encode("utf-16-le"), "UTF-16-LE")):
        with pytest.raises(PagedLabError) as info:
            decode_json(data, "snapshot")
        assert str(info.value) == (f"snapshot is not valid JSON (read as {encoding} text): "
                                   "Expecting ':' delimiter: line 1 column 6 (char 5)")
    # UTF-16 that is JSON is read.
    assert decode_json('{"a": 1}'.encode("utf-16-le"), "snapshot") == {"a": 1}


def test_a_key_named_twice_is_refused_not_read_as_its_last() -> None:
    with pytest.raises(PagedLabError) as info:
        parse_snapshot_text(b'{"schema_version": 1, "requests": [{"id": "A", "id": "B"}]}')
    assert str(info.value) == ("snapshot is ambiguous: an object in it names 'id' twice (JSON "
                               "readers differ on which one counts)")


def test_true_for_a_text_field_is_named_as_not_text() -> None:
    reader = FieldReader({"name": True, "err": False}, "snapshot.kernel")
    with pytest.raises(PagedLabError, match=r"^snapshot\.kernel\.name must be a string, got true$"):
        reader.get("name", str)
    with pytest.raises(PagedLabError,
                       match=r"^snapshot\.kernel\.err must be a number, got false$"):
        reader.get("err", (int, float))


def test_a_bad_byte_after_a_byte_order_mark_is_placed_counting_the_mark() -> None:
    with pytest.raises(PagedLabError) as info:
        decode_json(b"\xef\xbb\xbf{\"a\": \"\xff\"}", "snapshot")
    assert "(byte 0xff at offset 10)" in str(info.value)


def test_a_long_key_named_twice_is_cut_in_the_message() -> None:
    key = "k" * 1000
    with pytest.raises(PagedLabError) as info:
        decode_json(f'{{"{key}": 1, "{key}": 2}}', "snapshot")
    assert str(info.value) == (f"snapshot is ambiguous: an object in it names '{'k' * 40}...' "
                               "twice (JSON readers differ on which one counts)")


def test_a_whole_files_partial_log_is_noted_when_nothing_else_is() -> None:
    """A full PagedLab file (nothing unread, nothing derived) marked events_partial, its
    first event cut: restore keeps the log as partial, and the user must be told why.
    Noted only alongside unread or derived fields, the partial log went unmentioned, and
    the timeline and counts read from it passed for a whole run's."""
    data = export_snapshot(engine_after([Add("A", prompt_len=6, max_new_tokens=20), Step(2)]))
    first = data["events"][0]
    assert (first["kind"], first["request"], first["block"]) == ("alloc", "A", 0)
    data["events"].pop(0)
    data["events_partial"] = True
    engine = restored(data)
    assert engine.log_partial
    assert unread_fields(engine) == ()
    assert restore_notes(engine) == [
        "the event log does not lead to this state on its own: block 0 has ref_count 1, "
        "but the events leave it at 0 (no event names it, so no request was ever given "
        "it); it is kept as a partial log, so the timeline and the counts read from it "
        "(swap-outs and returns) cover only the events it holds, and this engine's "
        "snapshots say events_partial"]
