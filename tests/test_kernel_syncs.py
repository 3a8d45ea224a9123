"""No host synchronisation in the kernel path of a model step, with bounds checks off.

On a GPU, reading a tensor on the host (`.item()`, `.tolist()`, `.cpu()`, `bool(t)`,
`int(t)`, `torch.nonzero`, ...) waits for every kernel queued before it. This machine
may have no GPU, so the test counts the calls that would synchronise instead: the
torch.Tensor methods and torch functions that read a tensor's values to the host are
wrapped, and calls are counted while the engine is inside a kernel backend method
(write_kv, paged_attention, copy_blocks). Steps cover prefill, decode, a copy-on-write
after a fork and a block shuffle.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork, Op, Shuffle, Step
from backend.kernels import CHECKS_ENV, StepPlan, reference_paged_attention, select_kernels

# What reads a tensor's data back to the host (on a GPU: what waits for the device).
TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
                  "__index__", "nonzero", "unique")
TORCH_FUNCTIONS = ("nonzero", "unique", "masked_select", "argwhere")
BACKEND_METHODS = ("write_kv", "paged_attention", "copy_blocks")


class SyncCounter:
    """Counts host reads made while a kernel backend method is running."""

    def __init__(self) -> None:
        self.depth = 0
        self.calls: Counter[str] = Counter()
        self.backend_calls: Counter[str] = Counter()
        self.current = ""

    def wrap_reader(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def reader(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                self.calls[f"{self.current}: {name}"] += 1
            return original(*args, **kwargs)
        return reader

    def wrap_to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            target = kwargs.get("device", args[0] if args else None)
            if self.depth and isinstance(target, (str, torch.device)) and \
                    torch.device(target).type == "cpu":
                self.calls[f"{self.current}: to(cpu)"] += 1
            return original(tensor, *args, **kwargs)
        return to

    def wrap_backend(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            self.current = name
            self.backend_calls[name] += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
        return method


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncCounter]:
    counter = SyncCounter()
    for name in TENSOR_METHODS:
        monkeypatch.setattr(torch.Tensor, name,
                            counter.wrap_reader(f"Tensor.{name}", getattr(torch.Tensor, name)))
    for name in TORCH_FUNCTIONS:
        monkeypatch.setattr(torch, name, counter.wrap_reader(f"torch.{name}",
                                                            getattr(torch, name)))
    monkeypatch.setattr(torch.Tensor, "to", counter.wrap_to(torch.Tensor.to))
    yield counter


def engine_with_counter(kernel: str, counter: SyncCounter) -> Engine:
    engine = Engine(EngineConfig(num_blocks=64, block_size=4), device="cpu", kernel=kernel)
    for name in BACKEND_METHODS:
        setattr(engine.kernels, name,
                counter.wrap_backend(name, getattr(engine.kernels, name)))
    return engine


def run(engine: Engine, counter: SyncCounter, ops: list[Op]) -> Counter[str]:
    counter.calls.clear()
    counter.backend_calls.clear()
    for op in ops:
        engine.apply(op)
    return Counter(counter.calls)


PREFILL: list[Op] = [Add("a", prompt_len=9), Add("b", prompt_len=5), Step(1)]
DECODE_AND_COPIES: list[Op] = [Step(2), Fork("a", "a2"), Step(1), Shuffle(seed=3), Step(1)]


@pytest.mark.parametrize("kernel", ["triton", "torch"])
def test_no_host_reads_in_the_kernel_path_with_checks_off(
        monkeypatch: pytest.MonkeyPatch, counter: SyncCounter, kernel: str) -> None:
    monkeypatch.delenv(CHECKS_ENV, raising=False)
    engine = engine_with_counter(kernel, counter)
    prefill = run(engine, counter, PREFILL)
    prefill_calls = Counter(counter.backend_calls)
    steady = run(engine, counter, DECODE_AND_COPIES)
    assert counter.backend_calls["copy_blocks"] > 0 and counter.backend_calls["write_kv"] > 0
    counter.backend_calls = prefill_calls
    assert steady == Counter(), f"{kernel}: host reads in decode / copy steps: {steady}"
    # The torch path runs prefill chunks one by one, with their offsets and lengths from
    # the step's plan (the host lists the batch was built from), not read back.
    assert prefill == Counter(), f"{kernel}: host reads in a prefill step: {prefill}"


def test_torch_path_reads_offsets_once_per_plan_and_per_call_without_one(
        counter: SyncCounter) -> None:
    """A mixed batch: with no plan every call reads the offsets; a plan without host
    lists reads them on its first call only; one with host lists never does."""
    backend = select_kernels("cpu", "torch")
    bs, lens = 4, [9, 5, 7]  # q_lens 9 (a whole prompt), 1 (a decode), 3 (a chunk)
    tables = torch.tensor([[0, 1, 2], [3, 4, -1], [5, 6, -1]], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    starts = [0, 9, 10, 13]
    qsl = torch.tensor(starts, dtype=torch.int32)
    query = torch.randn(13, 4, 16)
    k, v = torch.randn(2, 8, bs, 2, 16).unbind(0)
    bare = StepPlan(tables, seq_lens, qsl)
    hosted = StepPlan(tables, seq_lens, qsl, seq_lens_host=lens, query_starts_host=starts)
    outs = {}
    for name, plan in (("none", None), ("bare", bare), ("hosted", hosted)):
        counter.calls.clear()
        counter.depth = 1  # count as if inside a backend method
        counter.current = name
        try:
            outs[name] = [backend.paged_attention(query, k, v, tables, seq_lens, qsl, 0.25,
                                                  plan=plan) for _ in range(3)]
        finally:
            counter.depth = 0
        reads = sum(counter.calls.values())
        assert reads == {"none": 3, "bare": 1, "hosted": 0}[name], (name, counter.calls)
    ref = reference_paged_attention(query, k, v, tables, seq_lens, qsl, 0.25)
    for name, results in outs.items():
        for out in results:
            torch.testing.assert_close(out, ref, msg=name)


def test_checks_on_do_read_the_host(monkeypatch: pytest.MonkeyPatch,
                                    counter: SyncCounter) -> None:
    """The counter sees what the bounds checks read (so the test above can fail)."""
    monkeypatch.setenv(CHECKS_ENV, "1")
    engine = engine_with_counter("triton", counter)
    reads = run(engine, counter, PREFILL + DECODE_AND_COPIES)
    for method in BACKEND_METHODS:
        assert any(key.startswith(method) for key in reads), (method, reads)
