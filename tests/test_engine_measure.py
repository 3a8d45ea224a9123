"""Swap against recompute on the live engine: the runs must do what their names say."""

from __future__ import annotations

import pytest

from backend.core.config import EngineConfig
from backend.engine import measure
from backend.engine.engine import Engine
from backend.engine.measure import Workload, swap_vs_recompute


def test_swap_and_recompute_runs_differ_only_in_how_they_preempt() -> None:
    runs = swap_vs_recompute((2, 8), workload=Workload.overloaded(10, seed=3),
                             capacity_tokens=256)
    assert [(r.block_size, r.mode) for r in runs] == [
        (2, "roomy"), (2, "recompute"), (2, "swap"), (8, "roomy"), (8, "recompute"),
        (8, "swap")]
    by = {(r.block_size, r.mode): r for r in runs}
    for bs in (2, 8):
        roomy, rec, swap = by[bs, "roomy"], by[bs, "recompute"], by[bs, "swap"]
        # Paging, preemption and swapping change when tokens come, never which.
        assert roomy.same_tokens and rec.same_tokens and swap.same_tokens
        assert roomy.preemptions == 0 and roomy.recomputed_tokens == 0
        assert rec.preemptions > 0, "the small pool should preempt"
        # The same decisions either way: the same victims at the same steps.
        assert swap.preemptions == rec.preemptions and swap.steps == rec.steps
        assert swap.preempted == rec.preempted and len(rec.preempted) == rec.preemptions
        assert roomy.preempted == ()
        assert rec.recomputed_tokens > 0 and rec.swapped_blocks == 0 and rec.swap_ms == 0
        assert swap.recomputed_tokens == 0 and swap.swapped_blocks > 0
        assert swap.num_blocks * bs >= 256 and roomy.num_blocks > swap.num_blocks
    # Smaller blocks: more of them to copy for the same tokens.
    assert by[2, "swap"].swapped_blocks > by[8, "swap"].swapped_blocks


def test_progress_can_stop_between_runs() -> None:
    seen: list[tuple[int, int]] = []

    def stop_after_two(done: int, total: int) -> bool:
        seen.append((done, total))
        return done < 2

    runs = swap_vs_recompute((4, 16), workload=Workload.overloaded(4), progress=stop_after_two)
    assert seen == [(1, 6), (2, 6)]
    assert len(runs) == 2


def test_every_block_size_is_warmed_up_before_it_is_timed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each size's configurations first run untimed (a two-request warm-up), then timed:
    # the first size timed must not carry the process's cold start.
    workload = Workload.overloaded(4)
    calls: list[tuple[int, str, bool, int]] = []
    real = measure.run_workload

    def recorded(w: Workload, config: EngineConfig, **kw: str) -> tuple[Engine, float]:
        e, ms = real(w, config, **kw)
        calls.append((config.block_size, config.preemption, w != workload,
                      e.manager.preemptions))
        return e, ms

    monkeypatch.setattr(measure, "run_workload", recorded)
    runs = measure.swap_vs_recompute((1, 16), workload=workload, capacity_tokens=128)
    assert [(r.block_size, r.mode) for r in runs] == [
        (1, "roomy"), (1, "recompute"), (1, "swap"), (16, "roomy"), (16, "recompute"),
        (16, "swap")]
    # Per size: three warm-up runs, then the three timed ones, in that order.
    assert [(bs, warm) for bs, _, warm, _ in calls] == [
        (1, True)] * 3 + [(1, False)] * 3 + [(16, True)] * 3 + [(16, False)] * 3
    # The warm-up preempts by both methods, so recompute and swap run before timing.
    warm = [(mode, p) for _, mode, w, p in calls if w]
    assert [mode for mode, _ in warm] == ["recompute", "recompute", "swap"] * 2
    assert all(p > 0 for _, p in warm[1:3] + warm[4:6])
