"""Engines under concurrency: the interpreter shared by threads, one engine driven by two.

The app serves many browser sessions from one process, so two engines step in
two threads at once; and Streamlit may run two callbacks of one session at
once. These are real concurrent runs, repeated so that a race has chances to
show; each one is checked against the same operations applied sequentially.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Shuffle, Step
from backend.io.snapshot import export_snapshot
from backend.sessions.playground import Settings, apply_or_recover


def _state(engine: Engine) -> dict[str, Any]:
    """The snapshot, less what is measured rather than computed: the time, and the kernel's
    difference from its reference, whose last bit depends on how torch's threads split a
    reduction while other threads run (it must stay within float32 rounding)."""
    snap = export_snapshot(engine)
    snap["kernel"].pop("time_ms", None)
    err = snap["kernel"].pop("max_abs_err", None)
    assert err is None or err < 2e-5, err   # the kernel tests' float32 tolerance
    return snap


def _ops(seed: int) -> list[Op]:
    return [Add(f"R{j}", prompt_len=6 + (seed + j) % 5, max_new_tokens=12) for j in range(3)] + [
        Step(2), Fork("R0", "R0.1"), Grow("R0.1", 2), Step(3), Shuffle(seed), Step(2),
        Finish("R1"), Step(2)]


def _run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> None:
        barrier.wait()
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread hung"
    return errors


def test_interpreted_engines_in_threads_compute_what_they_compute_alone() -> None:
    # Triton's interpreter keeps its launch state process-wide: without the lock
    # in kernels/launch.py this fails with "x >= grid_dim[0]" or "Did you forget
    # to add @triton.jit?" and leaves the engines half-applied.
    configs = [EngineConfig(num_blocks=24, block_size=4, seed=s) for s in range(3)]
    alone = []
    for s, c in enumerate(configs):
        e = Engine(c, kernel="triton")
        for op in _ops(s):
            e.apply(op)
        alone.append(_state(e))
    for _ in range(2):
        engines = [Engine(c, kernel="triton") for c in configs]

        def drive(e: Engine, s: int) -> Callable[[], None]:
            return lambda: [e.apply(op) for op in _ops(s)] and None

        errors = _run_threads([drive(e, s) for s, e in enumerate(engines)])
        assert errors == []
        for e, want in zip(engines, alone, strict=True):
            e.check_integrity()
            assert _state(e) == want


def test_two_threads_on_one_engine_run_one_operation_at_a_time() -> None:
    # Two clicks of one session: a long Step and, meanwhile, a refused Grow and a
    # valid one. Each operation must run whole, before or after the other.
    config = EngineConfig(num_blocks=32, block_size=4)
    setup: list[Op] = [Add("A", prompt_len=6, max_new_tokens=40),
                       Add("B", prompt_len=5, max_new_tokens=40)]
    long_step: list[Op] = [Step(12)]
    clicks: list[Op] = [Grow("nobody"), Grow("B", 2)]

    def sequential(first: list[Op], second: list[Op]) -> dict[str, Any]:
        e = Engine(config, kernel="torch")
        for op in [*setup, *first, *second]:
            with contextlib.suppress(PagedLabError):
                e.apply(op)
        return _state(e)

    orders = [sequential(long_step, clicks), sequential(clicks, long_step)]
    for _ in range(6):
        e = Engine(config, kernel="torch")
        for op in setup:
            e.apply(op)
        refused: list[str] = []

        def click(e: Engine = e, refused: list[str] = refused) -> None:
            for op in clicks:
                try:
                    e.apply(op)
                except PagedLabError as exc:
                    refused.append(str(exc))

        errors = _run_threads([lambda e=e: e.apply(long_step[0]) and None, click])
        assert errors == []
        assert refused == ["request 'nobody' does not exist"]
        e.check_integrity()
        state = _state(e)
        # Steps interleaved with the grow would give a third state, neither of these.
        assert state["step"] == 4 and state in orders


def test_an_operation_that_fails_half_way_is_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EngineConfig(num_blocks=16, block_size=4)
    settings = Settings(config, "cpu", "torch")
    e = Engine(config, device="cpu", kernel="torch")
    for op in [Add("A", prompt="The cat sat", max_new_tokens=20), Step(2)]:
        e.apply(op)
    before = export_snapshot(e)
    forward = e.model.forward
    calls = {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:   # the third forward of the Step below: half-way through it
            raise RuntimeError("simulated device failure")
        return forward(*args, **kwargs)

    monkeypatch.setattr(e.model, "forward", failing)
    applied = apply_or_recover(e, Step(5), before, settings, "test-owner")
    assert applied.result is None and "simulated device failure" in (applied.failure or "")
    # The failed engine refuses everything from now on instead of running on.
    assert e.broken is not None
    with pytest.raises(PagedLabError, match="stopped half-way"):
        e.apply(Step(1))
    # The new engine holds exactly the state before the operation, and goes on
    # exactly as an engine that never failed.
    restored = applied.engine
    assert export_snapshot(restored) == before
    restored.check_integrity()
    clean = Engine(config, device="cpu", kernel="torch")
    for op in [Add("A", prompt="The cat sat", max_new_tokens=20), Step(2), Step(5)]:
        clean.apply(op)
    restored.apply(Step(5))
    assert [r.tokens for r in restored.requests.values()] == \
        [r.tokens for r in clean.requests.values()]


def test_a_step_stopped_between_iterations_is_the_step_that_ran() -> None:
    config = EngineConfig(num_blocks=32, block_size=4)
    e = Engine(config, kernel="torch")
    e.apply(Add("A", prompt="stop me", max_new_tokens=50))
    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> bool:
        seen.append((done, total))
        return done < 3

    result = e.apply(Step(10), progress=progress)
    assert seen == [(1, 10), (2, 10), (3, 10)]
    assert result.op == Step(3) and len(result.generated) == 3
    e.check_integrity()
    # The recorded operation replays to exactly the same state.
    replay = Engine(config, kernel="torch")
    for op in [Add("A", prompt="stop me", max_new_tokens=50), result.op]:
        replay.apply(op)
    assert _state(replay) == _state(e)
