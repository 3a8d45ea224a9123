"""Every shipped scenario runs, and every number its narration promises is what the engine shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Grow, Shuffle
from backend.io.cli import main
from backend.io.expect import check_expectations
from backend.io.expect_paths import (
    BLOCK_FIELDS,
    METRIC_FIELDS,
    SNAPSHOT_FIELDS,
    SWAP_METRIC_FIELDS,
    SWAP_SNAPSHOT_FIELDS,
)
from backend.io.scenario import load_scenario, parse_scenario, run_steps
from backend.io.snapshot import export_snapshot

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "assets" / "scenarios").glob("*.json"))
NAMES = [p.stem for p in SCENARIOS]


def test_every_claim_of_the_seed_has_a_scenario() -> None:
    topics = ["contiguous-problem", "block-table", "growth", "tail-waste", "continuous-batching",
              "prefix-sharing", "exact-tokens", "fork-copy-on-write", "parallel-sampling",
              "beam-search", "moving-blocks", "preemption", "cache-revival",
              "internal-fragmentation", "cache-salt"]
    for topic in topics:
        assert any(topic in n for n in NAMES), topic


@pytest.mark.parametrize("path", SCENARIOS, ids=NAMES)
def test_scenario_narrates_every_step_with_numbers(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.name and sc.description
    assert sc.steps
    for step in sc.steps:
        assert step.narration and len(step.narration) > 10
        assert step.expect, f"{path.name}: a step without numbers to check"
    assert sc.notes() == []   # no expectation that can never be met


@pytest.mark.parametrize("path", SCENARIOS, ids=NAMES)
def test_scenario_numbers_hold(path: Path) -> None:
    sc = load_scenario(path)
    engine = Engine(sc.config)  # the default kernel: Triton (interpreted on a CPU)
    mirror = sc.mirror()
    checked = 0
    # A `step` count past the last request's end runs iterations with nothing in them,
    # which the step's line ("step ×6 · generated 3 tokens") leaves unexplained.
    empty: list[str] = []

    def keep_going(done: int, total: int) -> bool:
        if engine.idle and done < total:
            empty.append(f"{done} of {total} iterations leave the batch empty")
        return True

    for i, step, result in run_steps(engine, sc.steps, mirror=mirror, keep_going=keep_going):
        assert not empty, f"step {i}: {empty[0]}"
        assert step.expect is not None
        failures = check_expectations(step.expect, export_snapshot(engine), engine, result,
                                      mirror)
        assert failures == [], f"step {i}: {failures}"
        checked += len(step.expect)
        engine.check_integrity()
    assert checked >= len(sc.steps)


@pytest.mark.parametrize("path", SCENARIOS[:3], ids=NAMES[:3])
def test_scenarios_run_from_the_command_line(path: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = main(["run", str(path), "--check", "--out", str(out), "--kernel", "torch"])
    assert (code, capsys.readouterr().err) == (0, "")
    assert json.loads(out.read_text())["step"] == len(load_scenario(path).steps)


def _texts(data: dict, **config: object) -> dict[str, list[int]]:
    data = dict(data, config={**data["config"], **config})
    sc = parse_scenario(data)
    engine = Engine(sc.config, kernel="torch")
    for _ in run_steps(engine, sc.steps):
        pass
    return {r.id: r.tokens for r in engine.requests.values()}


def _load(stem: str) -> dict:
    return json.loads(next(p for p in SCENARIOS if stem in p.stem).read_text())


def test_moving_blocks_scenario_matches_a_run_without_the_move() -> None:
    data = _load("moving-blocks")
    assert any(s["op"] == "shuffle" for s in data["steps"])
    without = dict(data, steps=[s for s in data["steps"] if s["op"] != "shuffle"])
    assert _texts(data) == _texts(without)


def test_preemption_scenario_matches_a_run_with_room_to_spare() -> None:
    data = _load("preemption")
    tight = parse_scenario(data)
    engine = Engine(tight.config, kernel="torch")
    for _ in run_steps(engine, tight.steps):
        pass
    assert engine.manager.preemptions >= 1
    assert _texts(data) == _texts(data, num_blocks=64)


@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16, 32])
def test_tail_waste_never_exceeds_block_size_minus_one(block_size: int) -> None:
    engine = Engine(EngineConfig(num_blocks=64, block_size=block_size), kernel="torch")
    engine.apply(Add("A", prompt="x"))
    worst = 0
    for _ in range(2 * block_size + 1):
        worst = max(worst, engine.metrics().allocator.internal_waste_slots)
        engine.apply(Grow("A"))
    assert worst == block_size - 1


def test_shuffle_with_nothing_used_is_harmless() -> None:
    engine = Engine(EngineConfig(), kernel="torch")
    engine.apply(Shuffle(3))
    engine.check_integrity()
    assert engine.metrics().allocator.used_blocks == 0


# A float the engine holds, expected as something no float can equal. Each is raw
# JSON text, so the huge integer reaches the check as a Python int.
NOT_A_FLOAT = ['"abc"', "1" + "0" * 400, "[1]", "null", '{"x": 1}']


@pytest.mark.parametrize("want", NOT_A_FLOAT, ids=["str", "huge-int", "list", "null", "object"])
def test_a_non_numeric_expectation_is_a_mismatch(tmp_path: Path, want: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scenario.json"
    path.write_text('{"steps": [{"op": "add", "request": "A", "prompt": "hello", '
                    '"expect": {"kernel.max_abs_err": ' + want + '}}]}')
    out = tmp_path / "out.json"
    code = main(["run", str(path), "--check", "--out", str(out), "--kernel", "torch"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("mismatch: step 1 (add): kernel.max_abs_err: expected ")
    assert json.loads(out.read_text())["step"] == 1


def test_paths_that_lead_nowhere_are_mismatches_not_crashes() -> None:
    sc = parse_scenario({"contiguous": {"capacity": 16, "policy": "oracle"}, "steps": [
        {"op": "add", "request": "A", "prompt": "hello"}]})
    engine = Engine(sc.config, kernel="torch")
    mirror = sc.mirror()
    _, _, result = next(run_steps(engine, sc.steps, mirror=mirror))
    expect = {"contiguous.capacity.x": 1, "text.A.x": 1, "blocks.-1.id": 31,
              "requests.A.tokens.-1": 111, "metrics.used_blocks": 2}
    failures = check_expectations(expect, export_snapshot(engine), engine, result, mirror)
    # Negative positions are not block ids or list positions (they used to
    # count from the end, so "blocks.-1.id": 31 passed).
    assert [f.split(":")[0] for f in failures] == [
        "contiguous.capacity.x", "text.A.x", "blocks.-1.id", "requests.A.tokens.-1"]
    assert all("not found" in f for f in failures)


def test_an_event_kind_no_event_has_is_a_mismatch_not_a_zero() -> None:
    """A misspelt kind ("alloc_block", "COW", "") counted 0, so an expectation of 0
    passed whatever ran."""
    sc = parse_scenario({"steps": [{"op": "add", "request": "A", "prompt": "hello"}]})
    engine = Engine(sc.config, kernel="torch")
    _, _, result = next(run_steps(engine, sc.steps))
    expect = {"events.alloc": 2, "step_events.alloc": 2, "events.alloc_block": 0,
              "step_events.COW": 0, "events.": 0}
    failures = check_expectations(expect, export_snapshot(engine), engine, result)
    assert [f.split(": not found (no event kind ")[0] for f in failures] == [
        "events.alloc_block", "step_events.COW", "events."]
    assert "(the kinds: alloc, free, share, cow, " in failures[0]


def test_a_contiguous_region_is_named_by_an_id_with_dots() -> None:
    """Samples and beams are ID.k: "contiguous.regions.B.3" read as region "B"."""
    sc = parse_scenario({"contiguous": {"capacity": 32, "policy": "oracle"}, "steps": [
        {"op": "add", "request": "A", "prompt": "hello", "max_new_tokens": 2},
        {"op": "add", "request": "B.3", "prompt": "hi", "max_new_tokens": 2},
        {"op": "add", "request": "B", "prompt": "ho", "max_new_tokens": 2}]})
    engine = Engine(sc.config, kernel="torch")
    mirror = sc.mirror()
    *_, (_, _, result) = run_steps(engine, sc.steps, mirror=mirror)
    regions = mirror.state()["regions"]
    assert set(regions) == {"A", "B.3", "B"}
    expect = {"contiguous.regions.B.3.tokens": regions["B.3"]["tokens"],
              "contiguous.regions.B.3": regions["B.3"], "contiguous.regions.A.start": 0,
              "contiguous.regions.B.4": 1, "contiguous.regions.B.4.tokens": 1,
              "requests.B.4.block_table": [], "requests.B.3.bogus": 1,
              "requests.B.3.statu": "running",
              "contiguous.out_of_step.A.x": 1}
    failures = check_expectations(expect, export_snapshot(engine), engine, result, mirror)
    # A missing id is named whole, up to the field after it, also beside a shorter id
    # ('B.4' beside 'B' is no field '4' of 'B').
    assert failures == ["contiguous.regions.B.4: not found (no region 'B.4')",
                        "contiguous.regions.B.4.tokens: not found (no region 'B.4')",
                        "requests.B.4.block_table: not found (no request 'B.4')",
                        "requests.B.3.bogus: not found (no field 'bogus')",
                        "requests.B.3.statu: not found (no field 'statu'; did you mean "
                        "'status'?)",
                        "contiguous.out_of_step.A.x: not found (there is no request out of "
                        "step at all)"]


def test_a_position_that_is_no_number_or_past_the_list_says_so_in_words() -> None:
    sc = parse_scenario({"steps": [{"op": "add", "request": "A", "prompt": "hello"}]})
    engine = Engine(sc.config, kernel="torch")
    _, _, result = next(run_steps(engine, sc.steps))
    expect = {"blocks.1e3": 1, "blocks.99999999999999999999": 1, "blocks.1_0": 1,
              "address.A.x": 1}
    failures = check_expectations(expect, export_snapshot(engine), engine, result)
    assert failures == [
        "blocks.1e3: not found ('1e3' is no position in a list (0, 1, ...))",
        "blocks.99999999999999999999: not found (position 99,999,999,999,999,999,999 is past "
        f"the list's {engine.config.num_blocks} entries)",
        "blocks.1_0: not found ('1_0' is no position in a list (0, 1, ...))",
        "address.A.x: not found ('x' is no token position (0, 1, ...))"]


def test_true_and_false_match_only_themselves_also_inside_lists() -> None:
    sc = parse_scenario({"config": {"block_size": 4},
                         "steps": [{"op": "add", "request": "A", "prompt": "hello"}]})
    engine = Engine(sc.config, kernel="torch")
    _, _, result = next(run_steps(engine, sc.steps))
    snap = export_snapshot(engine)
    table = snap["requests"][0]["block_table"]
    assert len(table) == 2 and snap["metrics"]["used_blocks"] == 2
    expect = {"metrics.used_blocks": 2, "requests.A.block_table": table,
              "requests.A.block_table.0": table[0]}
    assert check_expectations(expect, snap, engine, result) == []
    # True == 1 in Python; a file's true is no count of 1.
    wrong = {"metrics.used_blocks": True,
             "requests.A.num_tokens": 5.0 + 1e-12,        # floats keep their tolerance
             "requests.A.block_table": [float(b) for b in table]}
    failures = check_expectations(wrong, snap, engine, result)
    assert [f.split(":")[0] for f in failures] == ["metrics.used_blocks"]


def test_same_tells_true_from_1_at_any_depth() -> None:
    from backend.io.expect import same

    assert not same([1, 2], [True, 2]) and not same({"a": 1}, {"a": True})
    assert not same(1, True) and same(True, True) and same([False], [False])
    assert same([1.0 + 1e-12, 2], [1, 2]) and same((1, 2), [1, 2])
    assert not same([1, 2], [1, 2, 3]) and not same({"a": 1}, {"b": 1})


@pytest.mark.parametrize("swap", [False, True], ids=["recompute", "swap"])
def test_the_fields_expectation_paths_are_checked_against_are_a_snapshots(swap: bool) -> None:
    """expect_paths.py's lists name exactly what export_snapshot writes, host pool or not."""
    config = (EngineConfig(num_blocks=8, preemption="swap", num_cpu_blocks=4) if swap
              else EngineConfig(num_blocks=8))
    engine = Engine(config, kernel="torch")
    engine.apply(Add("A", prompt="hello"))
    snap = export_snapshot(engine)
    assert set(snap) == SNAPSHOT_FIELDS | (SWAP_SNAPSHOT_FIELDS if swap else set())
    assert set(snap["metrics"]) == METRIC_FIELDS | (SWAP_METRIC_FIELDS if swap else set())
    assert {key for b in snap["blocks"] + snap.get("cpu_blocks", []) for key in b} \
        == BLOCK_FIELDS


@pytest.mark.parametrize("want, said", [
    ("NaN", "NaN (not a number; JSON has no such value)"),
    ("Infinity", "Infinity (or a number too large to hold, such as 1e400)"),
    ("1e400", "Infinity (or a number too large to hold, such as 1e400)"),
    ('[1, {"x": -Infinity}]', "-Infinity (or a number too large to hold, such as -1e400)"),
])
def test_an_expected_value_json_has_no_words_for_is_refused_by_name(
        tmp_path: Path, want: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Python's reader takes them; with --check they read as "expected Infinity" for a file
    # that says 1e400, and without it they passed without a word.
    path = tmp_path / "scenario.json"
    path.write_text('{"steps": [{"op": "add", "request": "A", "prompt": "hello", '
                    '"expect": {"metrics.used_blocks": ' + want + '}}]}')
    out = tmp_path / "out.json"
    assert main(["run", str(path), "--out", str(out), "--kernel", "torch"]) == 2
    where = "expect['metrics.used_blocks']" + ("[1]['x']" if want.startswith("[") else "")
    assert capsys.readouterr().err == f"error: step 1 (add): {where} is {said}: no snapshot " \
                                      "holds it\n"
    # Refused as the file is read: the state written is the one before the step.
    assert json.loads(out.read_text())["step"] == 0


def test_a_runaway_expectation_path_is_cut_short_where_it_is_quoted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"steps": [{"op": "add", "request": "A", "prompt": "hi",
                                           "expect": {"x" * 100_000: 1}}]}))
    assert main(["run", str(path), "--check", "--kernel", "torch"]) == 1
    err = capsys.readouterr().err
    cut = "x" * 120 + "… (100,000 characters)"
    assert err == (f"mismatch: step 1 (add): {cut}: not found (no field '{'x' * 40}…')\n"
                   f"note: this expectation can never be met, and fails when its step runs: "
                   f"step 1's {cut} (no field '{'x' * 40}…')\n")


def test_an_expectation_no_run_could_meet_is_named_when_the_file_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt path said "not found" only when its step ran, perhaps a long run later."""
    expect = {"metric.used_blocks": 1, "metrics.used_blocks": 1, "events.evicted": 0,
              "events.alloc": 1, "blocks.8.ref_count": 1, "blocks.7.refcount": 1,
              "blocks.7.ref_count": 0, "contiguous.free": 3, "metrics.swap_outs": 0,
              "address.A.x": 1, "address.A.0": {}, "requests.A.status": "running",
              "requests.Z.nothing": 1, "kernel.max_abs_err": 0}
    sc = parse_scenario({"config": {"num_blocks": 8}, "steps": [
        {"op": "add", "request": "A", "prompt": "hi"}, {"op": "step", "expect": expect}]})
    assert [(step, path) for step, path, _ in sc.unmeetable] == [
        (2, "metric.used_blocks"), (2, "events.evicted"), (2, "blocks.8.ref_count"),
        (2, "blocks.7.refcount"), (2, "contiguous.free"), (2, "metrics.swap_outs"),
        (2, "address.A.x")]
    assert sc.notes() == [
        "these expectations can never be met, and fail when their steps run: "
        "step 2's metric.used_blocks (no field 'metric'; did you mean 'metrics'?); "
        "step 2's events.evicted (no event kind 'evicted'; did you mean 'evict'?); "
        "step 2's blocks.8.ref_count (block 8 is past the pool's 8 blocks); and 4 more"]
    reasons = {path: reason for _, path, reason in sc.unmeetable}
    assert reasons["blocks.7.refcount"] == "no block field 'refcount'; did you mean 'ref_count'?"
    assert reasons["contiguous.free"] == "the scenario names no contiguous arena"
    assert reasons["metrics.swap_outs"] == ("the metric 'swap_outs' is kept only with swap "
                                            "preemption")
    # Each does fail when its step runs, as the note says: what the file reader names
    # is what the run-time check finds missing.
    engine = Engine(sc.config, kernel="torch")
    *_, (_, _, result) = run_steps(engine, sc.steps)
    failures = check_expectations(expect, export_snapshot(engine), engine, result)
    missing = [f.split(":")[0] for f in failures if "not found" in f]
    assert missing[:-1] == [path for _, path, _ in sc.unmeetable]
    assert missing[-1] == "requests.Z.nothing"   # an id: left to the run
    # The command line says so before it runs, once, as a note.
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"steps": [{"op": "add", "request": "A", "prompt": "hi",
                                           "expect": {"metric.used_blocks": 1}}]}))
    assert main(["run", str(path), "--kernel", "torch"]) == 0
    assert capsys.readouterr().err == (
        "note: this expectation can never be met, and fails when its step runs: step 1's "
        "metric.used_blocks (no field 'metric'; did you mean 'metrics'?)\n")
