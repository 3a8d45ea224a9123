"""Snapshots, restore and --from on the real model, with seeded sampling (temperature, top_p)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import SMOLLM2, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork, Grow, Op, Shuffle, Step
from backend.io import export
from backend.io.cli import main
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot, snapshot_json

pytestmark = pytest.mark.slow

SYSTEM = ("system", "You are a patient tutor who answers in one sentence.")
FIRST: list[Op] = [
    Add("A", messages=(SYSTEM, ("user", "What is a block table?")), max_new_tokens=12),
    Add("B", messages=(SYSTEM, ("user", "Why page the KV cache?")), max_new_tokens=12),
    Step(3),
    Fork("A", "A2"),
]
SECOND: list[Op] = [Grow("A2", 2), Shuffle(3), Step(4)]


def config(**extra: Any) -> EngineConfig:
    return EngineConfig.for_model(SMOLLM2, block_size=4, num_blocks=40, temperature=0.7,
                                  top_p=0.9, **extra)


def run(ops: list[Op], engine: Engine | None = None, **extra: Any) -> Engine:
    engine = engine or Engine(config(**extra), kernel="torch")
    for op in ops:
        engine.apply(op)
    return engine


def without_timing(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot less what depends on timing and rounding: restored K/V come from the
    contiguous pass, equal to the paged prefill's up to float rounding."""
    snap = copy.deepcopy(snap)
    snap["kernel"].pop("time_ms")
    snap["kernel"].pop("max_abs_err")
    return snap


@pytest.fixture(scope="module")
def middle() -> dict[str, Any]:
    engine = run(FIRST)
    assert engine.manager.prefix_hit_blocks >= 4     # the shared system prompt
    return export_snapshot(engine)


def test_the_snapshot_names_the_model_and_carries_decoded_text(middle: dict[str, Any]) -> None:
    cfg = middle["config"]
    assert (cfg["model"], cfg["num_layers"], cfg["temperature"], cfg["top_p"]) == (
        SMOLLM2, 30, 0.7, 0.9)
    assert cfg["bytes_per_block"] == 2 * 30 * 3 * 64 * 4 * 4
    a = next(r for r in middle["requests"] if r["id"] == "A")
    assert a["text"].startswith("<|im_start|>system\nYou are a patient tutor")
    assert max(max(r["tokens"]) for r in middle["requests"]) > 255


def test_export_restore_export_is_the_same_file(middle: dict[str, Any]) -> None:
    engine = restore_engine(json.loads(json.dumps(middle)), kernel="torch")
    assert json.loads(snapshot_json(engine)) == middle
    engine.check_integrity()
    check = engine.verify_recomputation()
    assert check.max_kv_err < 1e-4 and check.max_logit_err < 1e-3


def test_a_restored_engine_samples_what_the_uninterrupted_one_does(
        middle: dict[str, Any]) -> None:
    straight = run(FIRST + SECOND)
    resumed = run(SECOND, restore_engine(copy.deepcopy(middle), kernel="torch"))
    assert without_timing(export_snapshot(resumed)) == without_timing(export_snapshot(straight))
    # Seeded: another seed draws other tokens (temperature 0.7 over 49,152 ids).
    other = run(FIRST + SECOND, seed=1)
    assert ([r.tokens for r in other.requests.values()]
            != [r.tokens for r in straight.requests.values()])


def test_from_on_the_command_line(middle: dict[str, Any], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / "mid.json"
    snap.write_text(json.dumps(middle))
    steps = tmp_path / "more.json"
    steps.write_text(json.dumps({"config": {"model": SMOLLM2}, "steps": [
        {"op": "step", "count": 2}]}))
    out = tmp_path / "out.json"
    assert main(["run", str(steps), "--from", str(snap), "--out", str(out),
                 "--kernel", "torch"]) == 0
    assert json.loads(out.read_text())["step"] == middle["step"] + 1
    # Bare steps (no config at all) keep the snapshot's: its model, its pool, and its
    # vocabulary for token ids (tiny-byte's 0..255 would refuse SmolLM2's 9,906).
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"steps": [
        {"op": "add", "request": "Z", "prompt": "Hi"},
        {"op": "add", "request": "Y", "prompt_tokens": [9906, 300, 49151]}]}))
    assert main(["run", str(bare), "--from", str(snap), "--out", str(out),
                 "--kernel", "torch"]) == 0
    after = json.loads(out.read_text())
    assert after["config"] == middle["config"] and after["config"]["model"] == SMOLLM2
    assert {"Z", "Y"} <= {r["id"] for r in after["requests"]}
    assert next(r for r in after["requests"] if r["id"] == "Y")["tokens"][:3] == [
        9906, 300, 49151]
    # Without a snapshot, the scenario's own model (tiny-byte) bounds them.
    assert main(["run", str(bare), "--kernel", "torch"]) == 2
    assert "prompt_tokens[0] must be an integer in 0..255, got 9,906" in capsys.readouterr().err
    wrong = tmp_path / "tiny.json"
    wrong.write_text(json.dumps({"config": {"model": "tiny-byte"}, "steps": []}))
    assert main(["run", str(wrong), "--from", str(snap), "--kernel", "torch"]) == 2
    assert 'config.model is "tiny-byte" but the snapshot was taken with "smollm2-135m"' in \
        capsys.readouterr().err


def _tamper(middle: dict[str, Any], change: str) -> dict[str, Any]:
    data = copy.deepcopy(middle)
    a = next(r for r in data["requests"] if r["id"] == "A")
    if change == "text":
        a["text"] = a["text"] + "!"
    elif change == "vocab":
        a["tokens"][0] = 49_152
    elif change == "eos":
        a["tokens"][-1] = 2
        a.pop("text")
    elif change == "dims":
        data["config"]["num_heads"] = 8
    return data


@pytest.mark.parametrize(("change", "match"), [
    ("text", r"requests\[0\]\.text does not match its tokens"),
    ("vocab", r"tokens\[0\] must be an integer in 0\.\.49,151"),
    ("eos", "generated the end-of-sequence token"),
    ("dims", "num_heads is 8 but smollm2-135m has num_heads 9"),
])
def test_inconsistent_real_model_snapshots_are_refused(middle: dict[str, Any], change: str,
                                                       match: str) -> None:
    with pytest.raises(PagedLabError, match=match):
        restore_engine(_tamper(middle, change), kernel="torch")


def test_exports_of_a_real_model_snapshot(middle: dict[str, Any]) -> None:
    for name in export.TABLES:
        df = export.table(middle, name)
        assert len(df) and export.to_csv(df) and export.to_parquet(df)
    assert export.run_zip([middle, {**middle, "step": middle["step"] + 1}])
