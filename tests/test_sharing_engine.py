"""Figure 15 measured on the engine: the counts behind the saved fractions.

`run_sharing` counts blocks from the allocator after every step; here the
same run is recounted from each step's snapshot (used blocks, and the
running requests' block tables), and the edge cases pin what "saved" means:
one sequence saves nothing, beams share more than samples.
"""

from __future__ import annotations

import json

import pytest

from backend.core.config import EngineConfig
from backend.engine import sharing as se
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step
from backend.io.snapshot import export_snapshot
from backend.lab.sharing import SharingTrace

PROMPT = "Give three tips for staying healthy."


def recount(kind: str, width: int, new: int) -> SharingTrace:
    """`run_sharing`'s numbers, from snapshots instead of the allocator."""
    e = Engine(EngineConfig.from_json({"num_blocks": 64, "block_size": 16,
                                       "prefix_caching": False, "max_new_tokens": new}),
               kernel="torch", check_reference=False)
    e.apply(Add("Q", prompt=PROMPT, n=width if kind == "parallel" else None,
                beam_width=width if kind == "beam" else None))
    steps = used = unshared = 0
    while e.running:
        e.apply(Step())
        snap = export_snapshot(e)
        live = [r for r in snap["requests"] if r["status"] == "running"]
        if not live:
            break
        steps += 1
        used += sum(1 for b in snap["blocks"] if b["state"] == "used")
        unshared += sum(len(r["block_table"]) for r in live)
    cow = export_snapshot(e)["metrics"]["cow_copies"]
    return SharingTrace(steps, used, unshared, cow, 0, 0)


@pytest.mark.parametrize("kind", ["parallel", "beam"])
def test_the_counts_are_what_each_steps_snapshot_shows(kind: str) -> None:
    got = se.run_sharing(kind, 3, PROMPT, block_size=16, max_new_tokens=20)
    want = recount(kind, 3, 20)
    assert (got.steps, got.used_block_steps, got.unshared_block_steps, got.cow_copies) == (
        want.steps, want.used_block_steps, want.unshared_block_steps, want.cow_copies)
    assert 0 < got.saved_fraction < 1


def test_one_sequence_saves_nothing_and_beams_share_more_than_samples() -> None:
    for kind in ("parallel", "beam"):
        assert se.run_sharing(kind, 1, PROMPT, max_new_tokens=12).saved_fraction == 0.0
    parallel = se.measure_sharing("parallel", (2, 6), se.instruction_prompts()[:3],
                                  max_new_tokens=24)
    beam = se.measure_sharing("beam", (2, 6), se.instruction_prompts()[:3], max_new_tokens=24)
    assert [r.n for r in parallel] == [2, 6] and all(r.requests == 3 for r in parallel)
    # More sequences share the same prompt: a larger share saved.
    assert parallel[0].saved_fraction < parallel[1].saved_fraction
    assert beam[0].saved_fraction < beam[1].saved_fraction
    assert beam[1].saved_fraction > parallel[1].saved_fraction


def test_a_stopped_measurement_keeps_only_the_widths_it_finished() -> None:
    calls: list[tuple[int, int]] = []

    def stop_after_three(done: int, total: int) -> bool:
        calls.append((done, total))
        return done < 3

    out = se.measure_sharing("beam", (2, 4), se.instruction_prompts()[:2],
                             max_new_tokens=6, progress=stop_after_three)
    assert calls == [(1, 4), (2, 4), (3, 4)]
    assert [r.n for r in out] == [2]


def test_the_recorded_smollm2_measurement_loads_and_round_trips() -> None:
    meta, results = se.recorded_results()
    assert meta["model"] == "smollm2-135m"
    assert [(r.kind, r.n) for r in results] == [
        ("parallel", 2), ("parallel", 4), ("parallel", 6), ("beam", 2), ("beam", 4),
        ("beam", 6)]
    for r in results:
        assert 0 < r.saved_fraction < 1
        assert r.trace.used_block_steps < r.trace.unshared_block_steps
    again = json.loads(json.dumps(se.results_json(results, **meta)))
    assert se.results_json(results, **meta) == again
    raw = json.loads(se.RECORDED_FILE.read_text())
    assert raw == again
