"""A session's operation log as JSON, and as a scenario file that replays and checks itself.

`op_to_json` must be the inverse of `parse_op`; an exported scenario run by
`python -m backend run FILE --check` must pass its own checks and reproduce
the session's snapshot (also from a restored snapshot, with `--from`); a log
that passed its bounds, or does not reach the state, is not exported.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Shuffle, Step, parse_op
from backend.io.cli import main
from backend.io.expect import check_expectations
from backend.io.restore import restore_engine
from backend.io.scenario import parse_scenario
from backend.io.scenario_export import export_scenario, op_to_json, scenario_json
from backend.io.snapshot import export_snapshot
from backend.sessions import oplog as oplog_mod
from backend.sessions.oplog import OpLog

OPS: list[Op] = [
    Add("A", prompt="The cat sat on the mat."),
    Add("B", prompt_len=9, max_new_tokens=20),
    Add("C", prompt_tokens=(84, 104, 101, 32, 99), max_new_tokens=None),
    Add("P", prompt="pinned", blocks=(30, 31)),
    Step(3),
    Fork("A", "A.1"),
    Grow("A.1", 2),
    Shuffle(),
    Shuffle(7),
    Step(2),
    Finish("B"),
    Step(1),
]


@pytest.mark.parametrize("op", [*OPS, Add("M", messages=(("system", "be brief"),
                                                         ("user", "hi"))),
                                Add("S", prompt="samples", n=3),
                                Add("G", prompt="Once upon a time", beam_width=3,
                                    max_new_tokens=5)],
                         ids=lambda op: repr(op)[:40])
def test_op_to_json_is_what_parse_op_reads_back(op: Op) -> None:
    data = op_to_json(op)
    assert parse_op(json.loads(json.dumps(data))) == op


def _state(snap: dict[str, Any]) -> dict[str, Any]:
    # The wall time of the last model step is the one field a replay cannot repeat.
    return {**snap, "kernel": {**snap["kernel"], "time_ms": None}}


def _session(config: EngineConfig, ops: list[Op], engine: Engine | None = None,
             ) -> tuple[Engine, OpLog, list[dict[str, Any]]]:
    """A Playground session's run: the engine, its log, the snapshot after each op."""
    if engine is None:
        engine = Engine(config, kernel="torch")
        log = OpLog()
    else:
        log = OpLog(export_snapshot(engine))
    known = []
    for op in ops:
        result = engine.apply(op)
        assert log.append(result.op) is not None
        known.append(export_snapshot(engine))
    return engine, log, known


def _run(*args: str | Path) -> int:
    return main([str(a) for a in args])


def test_an_exported_session_replays_checked_to_the_same_snapshot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = EngineConfig(num_blocks=32, block_size=4)
    engine, log, known = _session(config, OPS)
    final = export_snapshot(engine)
    scenario = log.scenario(config, final, known, name="mine", description="explored")
    # Every step says what it does; the last expects the outcome, requests included.
    assert all(s["narration"].startswith(f"Step {i}: ")
               for i, s in enumerate(scenario["steps"], start=1))
    last = scenario["steps"][-1]["expect"]
    assert last["requests.A.num_tokens"] == final["requests"][0]["num_tokens"]
    assert last["requests.C.block_table"] == next(r for r in final["requests"]
                                                  if r["id"] == "C")["block_table"]
    assert not any(".A.1." in path for path in last)   # a dotted id has no path
    assert scenario["steps"][0]["expect"] == {"metrics.used_blocks": known[0]["metrics"][
        "used_blocks"], "metrics.cached_blocks": 0,
        "metrics.filled_slots": known[0]["metrics"]["filled_slots"]}
    path = tmp_path / "exported.json"
    path.write_text(scenario_json(scenario))
    parse_scenario(json.loads(path.read_text()))
    out = tmp_path / "replayed.json"
    assert _run("run", path, "--check", "--kernel", "torch", "--out", out) == 0
    assert capsys.readouterr().err == ""
    assert _state(json.loads(out.read_text())) == _state(final)


def test_a_wrong_expectation_makes_check_fail(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = EngineConfig(num_blocks=16, block_size=4)
    engine, log, known = _session(config, [*OPS[:1], Step(2)])
    scenario = log.scenario(config, export_snapshot(engine), known, name="x", description="")
    scenario["steps"][-1]["expect"]["requests.A.num_tokens"] += 1
    path = tmp_path / "bad.json"
    path.write_text(scenario_json(scenario))
    assert _run("run", path, "--check", "--kernel", "torch") == 1
    assert "mismatch: step 2 (step): requests.A.num_tokens" in capsys.readouterr().err


def test_a_session_from_a_restored_snapshot_replays_from_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = EngineConfig(num_blocks=32, block_size=4, seed=3)
    first, _, _ = _session(config, OPS[:5])
    base = export_snapshot(first)
    # A copy: the restore keeps the snapshot's token lists as its requests'.
    restored = restore_engine(copy.deepcopy(base), kernel="torch")
    engine, log, known = _session(config, OPS[5:], engine=restored)
    assert log.base_step == 5
    final = export_snapshot(engine)
    scenario = log.scenario(config, final, known, name="later", description="",
                            base_file="base.json")
    assert scenario["steps"][0]["narration"].startswith("Step 6: fork A -> A.1")
    # The file names what it continues, so nothing replays it on a fresh engine.
    assert scenario["from_snapshot"] == {"step": 5, "file": "base.json"}
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "s.json").write_text(scenario_json(scenario))
    out = tmp_path / "out.json"
    assert _run("run", tmp_path / "s.json", "--from", tmp_path / "base.json", "--check",
                "--kernel", "torch", "--out", out) == 0, capsys.readouterr().err
    assert _state(json.loads(out.read_text())) == _state(final)
    # Without --from: refused before anything runs, with the command that replays it.
    out.unlink()
    assert _run("run", tmp_path / "s.json", "--kernel", "torch", "--out", out) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 's.json'} continues a snapshot of step 5 (its from_snapshot: "
        f"base.json), so its steps replay only from that state: python -m backend run "
        f"{tmp_path / 's.json'} --from base.json --check\n")
    assert not out.exists()
    # From a snapshot of another step: refused, the snapshot's state written as it was.
    (tmp_path / "other.json").write_text(json.dumps(known[0]))
    assert _run("run", tmp_path / "s.json", "--from", tmp_path / "other.json",
                "--kernel", "torch", "--out", out) == 2
    assert capsys.readouterr().err.endswith(
        f"error: {tmp_path / 's.json'} continues a snapshot of step 5 (its from_snapshot), "
        "but the --from snapshot is at step 6\n")
    # A session from a restored snapshot of a fresh engine (step 0: the Scenarios page's
    # Continue in the Playground before its first step) replays on a fresh engine, as
    # before: the file names no snapshot, and runs without --from.
    empty = restore_engine(export_snapshot(Engine(config, kernel="torch")), kernel="torch")
    fresh, log0, known0 = _session(config, OPS[:8], engine=empty)
    assert not log0.needs_base and log.needs_base
    plain = log0.scenario(config, export_snapshot(fresh), known0, name="x", description="",
                          base_file="unused.json")
    assert "from_snapshot" not in plain
    (tmp_path / "fresh.json").write_text(scenario_json(plain))
    assert _run("run", tmp_path / "fresh.json", "--check", "--kernel", "torch") == 0, (
        capsys.readouterr().err)


@pytest.mark.parametrize(("value", "said"), [
    ([], "from_snapshot must be an object, got an array"),
    ({}, "from_snapshot needs its \"step\": the step of the snapshot the scenario continues"),
    ({"step": -1}, "from_snapshot.step must be an integer in 0.."),
    ({"step": 1, "file": 7}, "from_snapshot.file must be a string, got an integer"),
    ({"step": 1, "file": "a\nb"}, "from_snapshot.file must be a file name of 1 to 200 "
                                  "printable characters"),
    ({"step": 1, "path": "x"}, "unknown field 'path' in from_snapshot (its fields: step, "
                               "file)"),
])
def test_a_malformed_from_snapshot_is_refused_by_name(value: object, said: str) -> None:
    with pytest.raises(PagedLabError, match=re.escape(said)):
        parse_scenario({"from_snapshot": value, "steps": []})


def test_the_final_expectations_hold_on_the_session_itself() -> None:
    config = EngineConfig(num_blocks=32, block_size=4)
    engine, log, known = _session(config, OPS)
    final = export_snapshot(engine)
    scenario = export_scenario(config, log.ops, final, known)
    assert check_expectations(scenario["steps"][-1]["expect"], final, engine) == []


def test_a_log_that_does_not_reach_the_state_is_not_exported() -> None:
    config = EngineConfig(num_blocks=16, block_size=4)
    engine, log, _ = _session(config, OPS[:2])
    engine.apply(Step(1))          # applied but never logged
    with pytest.raises(PagedLabError, match="final snapshot is step 3"):
        log.scenario(config, export_snapshot(engine), [], name="x", description="")


def test_a_log_past_its_bounds_is_dropped_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oplog_mod, "MAX_OPS", 3)
    log = OpLog()
    for _ in range(3):
        assert log.append(Step(1)) == {"op": "step", "count": 1}
    assert log.append(Step(1)) is None
    assert not log.complete and log.ops == [] and log.nbytes == 0
    assert log.append(Step(1)) is None
    problem = log.why_not_exportable()
    assert problem is not None and "no longer kept" in problem
    with pytest.raises(PagedLabError, match="cannot be exported"):
        log.scenario(EngineConfig(), {"step": 4}, [], name="x", description="")
    # Bytes count too: one prompt over the budget stops the log.
    monkeypatch.setattr(oplog_mod, "MAX_OP_BYTES", 100)
    small = OpLog()
    assert small.append(Add("A", prompt="x" * 200)) is None and not small.complete


def test_a_null_from_snapshot_or_file_is_read_as_left_out() -> None:
    # As `contiguous` is (CONTRACT.md's PagedLab section): nothing given.
    assert parse_scenario({"from_snapshot": None, "steps": []}).from_snapshot is None
    given = parse_scenario({"from_snapshot": {"step": 4, "file": None}, "steps": []})
    assert given.from_snapshot is not None and given.from_snapshot.to_json() == {"step": 4}
    with pytest.raises(PagedLabError,
                       match=r"from_snapshot\.step must be an integer in 0\.\.[\d,]+, got null"):
        parse_scenario({"from_snapshot": {"step": None}, "steps": []})
