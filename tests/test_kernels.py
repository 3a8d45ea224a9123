"""Kernels against the reference: paged attention, K/V writes, block copies, selection.

Every attention test draws fresh random inputs (seeded per test), scatters each sequence
over a shuffled pool (tables look like [9, 2, 14]), and poisons what must not be read or
left unwritten with NaN: pool blocks no sequence owns, slots past a sequence's length,
table padding that points at such blocks, and the output itself. On a GPU the Triton
kernels run compiled and the shapes grow; on the CPU they run in Triton's interpreter at
small shapes. Under the interpreter every attention test runs both attention kernels: the
batched one (the CPU default) and the GPU-shaped tiled one. Bounds checks are on for
every test here (PAGEDLAB_KERNEL_CHECKS=1), as they are off by default in the app.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from backend.core.errors import PagedLabError
from backend.kernels import (
    CHECKS_ENV,
    KernelBackend,
    TorchKernels,
    TritonKernels,
    attention,
    available_devices,
    native,
    reference_paged_attention,
    select_kernels,
)
from backend.kernels.torch_path import torch_paged_attention

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
REPO = Path(__file__).resolve().parents[1]
# The interpreter runs each program in Python: the CPU gets "long" = a few hundred tokens.
LONG = 3000 if CUDA else 700
NAN = float("nan")

# Against an fp32 reference computed from the same (already rounded) inputs:
# - float32: only the order of additions differs (IEEE products, no TF32), so ~1e-6.
# - float16: the output is rounded to fp16 (2^-11 relative) and, compiled, the softmax
#   probabilities are rounded to fp16 before P @ V; outputs are O(1), so 2e-3.
# - bfloat16: 8 significant bits, so rounding the output alone costs up to 2^-8 relative
#   (~4e-3 at |o| ~ 1), and compiled P is rounded to bf16 too; 1.6e-2.
TOL: dict[torch.dtype, dict[str, Any]] = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


@pytest.fixture(autouse=True)
def _full_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounds checks on: the rejection tests rely on them (the app runs with them off)."""
    monkeypatch.setenv(CHECKS_ENV, "1")


# On a GPU "triton" is the compiled tiled kernel; on a CPU the interpreter's default is the
# batched kernel, so the tiled one is run in the interpreter as well. On a CPU "torch"
# runs its decodes through the compiled operator (backend.kernels.native) and
# "torch-gather" runs the same backend with it turned off, gathering for SDPA.
BACKENDS = ["triton", "torch"] if CUDA else ["triton", "triton-tiled", "torch", "torch-gather"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[KernelBackend]:
    if request.param == "triton-tiled":
        yield TritonKernels(torch.device(DEVICE), attention_variant="tiled")
    elif request.param == "torch-gather":
        with native.turned_off():
            yield select_kernels(DEVICE, "torch")
    else:
        yield select_kernels(DEVICE, request.param)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Batch:
    """One paged-attention call's inputs, on DEVICE."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, torch.Tensor, float]:
        return (self.query, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, self.scale)


def make_batch(
    q_lens: Sequence[int],
    seq_lens: Sequence[int],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    spare_blocks: int = 3,
    device: str = DEVICE,
) -> Batch:
    """Random K/V for each sequence's positions, in blocks drawn from a shuffled pool.

    Pool blocks no sequence owns and the slots past each seq_len hold NaN, so a kernel
    that uses a position it should not turns its output NaN. Table padding is -1 for even
    rows and a NaN-filled spare block for odd ones.
    """
    assert len(q_lens) == len(seq_lens) and all(1 <= q <= s for q, s in zip(q_lens, seq_lens,
                                                                              strict=True))
    blocks = [cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(blocks) + spare_blocks
    perm = torch.randperm(num_blocks).tolist()
    spare = perm[sum(blocks):]
    cols = max(blocks) + 2
    table = torch.empty((len(seq_lens), cols), dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, NAN)
    v_cache = torch.full(shape, NAN)
    used = 0
    for b, (seq_len, n) in enumerate(zip(seq_lens, blocks, strict=True)):
        mine = perm[used:used + n]
        used += n
        pad = -1 if b % 2 == 0 or not spare else spare[0]
        table[b] = torch.tensor(mine + [pad] * (cols - n), dtype=torch.int32)
        for pos in range(0, seq_len, block_size):
            fill = min(block_size, seq_len - pos)
            blk = mine[pos // block_size]
            k_cache[blk, :fill] = torch.randn(fill, num_kv_heads, head_dim)
            v_cache[blk, :fill] = torch.randn(fill, num_kv_heads, head_dim)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_heads, head_dim)
    return Batch(
        query=query.to(device, dtype),
        k_cache=k_cache.to(device, dtype),
        v_cache=v_cache.to(device, dtype),
        block_tables=table.to(device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        scale=head_dim ** -0.5,
    )


def check_against_reference(backend: KernelBackend, batch: Batch, **kwargs: object) -> None:
    """The backend's output (written into a NaN-poisoned `out`) matches the reference."""
    ref = reference_paged_attention(*batch.args())
    assert torch.isfinite(ref).all(), "the reference read a poisoned slot"
    out = torch.full_like(batch.query, NAN)
    got = backend.paged_attention(*batch.args(), out=out, **kwargs)  # type: ignore[arg-type]
    assert got is out
    assert got.dtype == batch.query.dtype
    torch.testing.assert_close(got.float(), ref, **TOL[batch.query.dtype])


# ----------------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
def test_reference_equals_dense_sdpa(num_heads: int, num_kv_heads: int) -> None:
    """The oracle itself: on a contiguous layout it is torch's causal SDPA, per sequence."""
    seq_lens, q_lens, d = [37, 5, 64], [37, 1, 9], 32
    batch = make_batch(q_lens, seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=d, block_size=8)
    ref = reference_paged_attention(*batch.args())
    bs = batch.k_cache.shape[1]
    for b, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        table = batch.block_tables[b, :cdiv(seq_len, bs)].long()
        keys = batch.k_cache[table].flatten(0, 1)[:seq_len]  # contiguous [L, kvh, D]
        values = batch.v_cache[table].flatten(0, 1)[:seq_len]
        start = int(batch.query_start_loc[b])
        q = batch.query[start:start + q_len]
        # Bottom-right causal mask: query i sits at position seq_len - q_len + i.
        mask = torch.ones(q_len, seq_len, dtype=torch.bool, device=q.device).tril(
            seq_len - q_len)
        dense = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, enable_gqa=True, scale=batch.scale).transpose(0, 1)
        torch.testing.assert_close(ref[start:start + q_len], dense, atol=1e-5, rtol=1e-5)


def test_reference_sees_the_worked_example() -> None:
    """Block size 4, table [9, 2, 14], 9 tokens: the query at position 8 reads every token."""
    k_cache = torch.full((16, 4, 1, 16), NAN)
    v_cache = torch.full((16, 4, 1, 16), NAN)
    keys = torch.randn(9, 1, 16)
    values = torch.randn(9, 1, 16)
    for pos in range(9):
        blk = [9, 2, 14][pos // 4]
        k_cache[blk, pos % 4] = keys[pos]
        v_cache[blk, pos % 4] = values[pos]
    query = torch.randn(1, 1, 16)
    table = torch.tensor([[9, 2, 14]], dtype=torch.int32)
    out = reference_paged_attention(query, k_cache, v_cache, table,
                                    torch.tensor([9], dtype=torch.int32),
                                    torch.tensor([0, 1], dtype=torch.int32), 0.25)
    probs = torch.softmax((keys[:, 0] @ query[0, 0]) * 0.25, dim=0)
    torch.testing.assert_close(out[0, 0], probs @ values[:, 0])


@pytest.mark.parametrize("gather", [False, True], ids=["native", "gather"])
def test_torch_fast_path_matches_reference_on_random_batches(gather: bool) -> None:
    """The vectorized path over many random shapes (cheap: no interpreter involved), its
    decodes by the compiled operator and, turned off, by gathers for SDPA."""
    if gather:
        with native.turned_off():
            _random_torch_batches()
    else:
        _random_torch_batches()


def _random_torch_batches() -> None:
    for _ in range(25):
        batch_size = int(torch.randint(1, 6, ()))
        block_size = int(torch.randint(1, 20, ()))
        kvh = int(torch.randint(1, 4, ()))
        group = [1, 2, 3, 4][int(torch.randint(0, 4, ()))]
        seq_lens = torch.randint(1, 90, (batch_size,)).tolist()
        q_lens = [int(torch.randint(1, s + 1, ())) if torch.rand(()) < 0.5 else 1
                  for s in seq_lens]
        batch = make_batch(q_lens, seq_lens, num_heads=kvh * group, num_kv_heads=kvh,
                           head_dim=int(torch.randint(1, 40, ())), block_size=block_size)
        ref = reference_paged_attention(*batch.args())
        got = torch_paged_attention(*batch.args())
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("block_size", [1, 4, 12, 16, 64])
def test_context_lengths_across_block_sizes(backend: KernelBackend, block_size: int) -> None:
    """Lengths 1, an exact multiple of the block, long, and a chunk with earlier context."""
    seq_lens = [1, 3 * block_size, LONG, 2 * block_size + 3]
    q_lens = [1, 1, 1, 5]
    batch = make_batch(q_lens, seq_lens, block_size=block_size)
    check_against_reference(backend, batch)


SCENARIOS: dict[str, tuple[list[int], list[int]]] = {
    # (q_lens, seq_lens)
    "decode": ([1, 1, 1, 1], [1, 16, 45, LONG]),
    "prefill-with-context": ([20], [57]),
    "prefill-from-scratch": ([33], [33]),
    "mixed": ([1, 7, 1, 12, 1], [30, 7, LONG, 40, 1]),
}


@pytest.mark.parametrize("scenario", ["decode", "prefill-with-context", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_and_query_lengths(backend: KernelBackend, dtype: torch.dtype,
                                  scenario: str) -> None:
    q_lens, seq_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, seq_lens, num_heads=8, num_kv_heads=2, head_dim=64,
                       block_size=16 if dtype != torch.float16 else 12, dtype=dtype)
    check_against_reference(backend, batch)


@pytest.mark.parametrize("group,dtype", [(1, torch.float16), (2, torch.bfloat16),
                                         (4, torch.float32), (8, torch.bfloat16)])
@pytest.mark.parametrize("scenario", ["decode", "mixed"])
def test_grouped_query_ratios(backend: KernelBackend, group: int, dtype: torch.dtype,
                              scenario: str) -> None:
    q_lens, seq_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, seq_lens, num_heads=2 * group, num_kv_heads=2, head_dim=32,
                       block_size=4, dtype=dtype)
    check_against_reference(backend, batch)


@pytest.mark.parametrize("head_dim,dtype", [(16, torch.float32), (64, torch.float16),
                                            (80, torch.bfloat16), (80, torch.float32),
                                            (256, torch.bfloat16)])
def test_head_dims(backend: KernelBackend, head_dim: int, dtype: torch.dtype) -> None:
    """Powers of two, the largest, and 80, which the kernel pads to 128 with masks."""
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = make_batch(q_lens, seq_lens, head_dim=head_dim, block_size=16, dtype=dtype)
    check_against_reference(backend, batch)


def _sampled_combinations(count: int) -> list[tuple[Any, ...]]:
    """A fixed sample of the full product, so that interactions get exercised too.

    Every value of every axis appears; pairs are drawn at random (seeded, so the test
    ids are stable): block size x group x head_dim x dtype x scenario x splits.
    """
    import random

    rng = random.Random(20240)
    axes: list[list[Any]] = [
        [1, 4, 12, 16, 64], [1, 2, 4, 8], [16, 64, 80], ["float32", "float16", "bfloat16"],
        ["decode", "prefill-with-context", "prefill-from-scratch", "mixed"], [1, 2, 3]]
    picks = [tuple(axis[i % len(axis)] for axis in axes) for i in range(6)]
    while len(picks) < count:
        picks.append(tuple(rng.choice(axis) for axis in axes))
    return picks


@pytest.mark.parametrize("block_size,group,head_dim,dtype,scenario,num_splits",
                         _sampled_combinations(24))
def test_sampled_combinations(block_size: int, group: int, head_dim: int, dtype: str,
                              scenario: str, num_splits: int) -> None:
    q_lens, seq_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, seq_lens, num_heads=2 * group, num_kv_heads=2,
                       head_dim=head_dim, block_size=block_size, dtype=getattr(torch, dtype))
    check_against_reference(select_kernels(DEVICE, "triton"), batch, num_splits=num_splits)
    if not CUDA and num_splits == 1:  # the default above ran the batched kernel
        check_against_reference(TritonKernels(torch.device(DEVICE), attention_variant="tiled"),
                                batch, num_splits=num_splits)


@pytest.mark.parametrize("block_n", [16, 32, 256])
def test_tile_size_does_not_change_the_result(block_n: int) -> None:
    """Many tiles per context, tiles that straddle blocks of 12, one tile for everything."""
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = make_batch(q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=32,
                       block_size=12)
    triton_kernels = select_kernels(DEVICE, "triton")
    assert isinstance(triton_kernels, TritonKernels)
    config = attention.AttentionConfig(block_m=64, block_n=block_n, num_warps=4, num_stages=2)
    out = attention.paged_attention(*batch.args(), interpret=triton_kernels.interpret,
                                    config=config)
    torch.testing.assert_close(out, reference_paged_attention(*batch.args()),
                               **TOL[torch.float32])


@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize("scenario", ["decode", "prefill-from-scratch", "mixed"])
def test_split_k_with_poisoned_partials(num_splits: int, scenario: str) -> None:
    """Forced splits, including splits with no tile at all (contexts of one tile).

    The partial (max, sum, acc) buffers are filled with NaN before the launch, so a split
    program that skipped its write would poison the reduce.
    """
    q_lens, seq_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, seq_lens, num_heads=6, num_kv_heads=2, head_dim=48,
                       block_size=12, dtype=torch.bfloat16)
    triton_kernels = select_kernels(DEVICE, "triton")
    assert isinstance(triton_kernels, TritonKernels)
    out = torch.full_like(batch.query, NAN)
    out, launches = attention.plan_paged_attention(*batch.args(), out=out,
                                                   num_splits=num_splits,
                                                   interpret=triton_kernels.interpret,
                                                   variant="tiled")
    assert len(launches) == (2 if num_splits > 1 else 1)
    if num_splits > 1:
        for partial in launches[0].args[7:10]:
            assert partial.dtype == torch.float32
            partial.fill_(NAN)
    for launch in launches:
        launch.run()
    ref = reference_paged_attention(*batch.args())
    torch.testing.assert_close(out.float(), ref, **TOL[torch.bfloat16])


@pytest.mark.parametrize("num_splits", [None, 2])
def test_torch_backend_accepts_split_hint(num_splits: int | None) -> None:
    batch = make_batch([1, 3], [9, 20])
    check_against_reference(select_kernels(DEVICE, "torch"), batch, num_splits=num_splits)


@pytest.mark.parametrize("fills_gpu", [False, True])
def test_automatic_split_choice(fills_gpu: bool) -> None:
    """num_splits=None: the heuristic's choice is applied and the result is still right.

    One sequence is far too few programs for a GPU (split); on a GPU the second case has
    as many (sequence, KV head) programs as the GPU keeps resident (no split). The
    interpreter never splits unless asked.
    """
    num_kv_heads = 2
    args = {"num_heads": 4 * num_kv_heads, "num_kv_heads": num_kv_heads, "head_dim": 64,
            "block_size": 16, "dtype": torch.bfloat16}
    triton_kernels = select_kernels(DEVICE, "triton")
    assert isinstance(triton_kernels, TritonKernels)
    probe = make_batch([1], [600], **args)  # only its signature matters for the capacity
    capacity = attention.resident_capacity(attention.plan_paged_attention(
        *probe.args(), num_splits=1, variant="tiled")[1][0], probe.query.device)
    batch_size = 6 if capacity is None else -(-capacity // num_kv_heads)
    batch_size = batch_size if fills_gpu else 1
    seq_lens = [LONG + 37 * b for b in range(batch_size)] if not fills_gpu or not CUDA else \
        [600] * batch_size
    batch = make_batch([1] * batch_size, seq_lens, **args)
    _, launches = attention.plan_paged_attention(*batch.args(),
                                                 interpret=triton_kernels.interpret,
                                                 variant="tiled")
    splits = launches[0].grid[2]
    expected = attention.choose_num_splits(num_programs=batch_size * num_kv_heads,
                                           max_context=batch.block_tables.shape[1] * 16,
                                           capacity=capacity)
    assert splits == expected
    if capacity is None:
        assert splits == 1
    else:
        assert (splits > 1) == (not fills_gpu)
    check_against_reference(triton_kernels, batch)


@pytest.mark.parametrize("variant,num_splits", [("tiled", 1), ("tiled", 3), ("batched", 1)])
def test_triton_reads_only_what_sequences_own(monkeypatch: pytest.MonkeyPatch, variant: str,
                                              num_splits: int) -> None:
    """Record every address the interpreted kernel loads and check each against the batch.

    NaN poisoning cannot see a stray read whose value is masked away afterwards (a key
    that gets score -inf, a table entry whose block is never used). Here the contract is
    checked directly: table entries only below ceil(seq_len / block_size), cache slots
    only at positions below seq_len of the sequence that owns the block.
    """
    from triton.runtime import interpreter

    loaded: list[object] = []
    original = interpreter.interpreter_builder.create_masked_load

    def recording_load(ptrs, mask, *args, **kwargs):  # type: ignore[no-untyped-def]
        loaded.append(ptrs.data[mask.data].copy())
        return original(ptrs, mask, *args, **kwargs)

    monkeypatch.setattr(interpreter.interpreter_builder, "create_masked_load", recording_load)
    block_size = 12
    q_lens, seq_lens = [1, 7, 1, 1], [30, 20, 1, 61]
    batch = make_batch(q_lens, seq_lens, block_size=block_size, dtype=torch.float16,
                       device="cpu")
    out, launches = attention.plan_paged_attention(*batch.args(), num_splits=num_splits,
                                                   interpret=True, variant=variant)
    for launch in launches:
        launch.run()
    torch.testing.assert_close(out.float(), reference_paged_attention(*batch.args()),
                               **TOL[torch.float16])

    table, k, v = batch.block_tables, batch.k_cache, batch.v_cache
    allowed_entries: set[int] = set()
    allowed_slots: set[int] = set()
    for b, seq_len in enumerate(seq_lens):
        for j in range(cdiv(seq_len, block_size)):
            allowed_entries.add(table.data_ptr() + (b * table.stride(0) + j) * 4)
            blk = int(table[b, j])
            allowed_slots.update(blk * block_size + o
                                 for o in range(min(block_size, seq_len - j * block_size)))
    row_bytes = k.stride(1) * k.element_size()

    def span(t: torch.Tensor) -> range:
        return range(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())

    # The split partials (tiled) and the tile map (batched) are the kernels' own inputs.
    own = launches[0].args[7:10] if num_splits > 1 else \
        launches[0].args[7:9] if variant == "batched" else ()
    others = [span(t) for t in (batch.query, batch.seq_lens, batch.query_start_loc, *own)]
    for addresses in loaded:
        for a in map(int, addresses.reshape(-1)):  # type: ignore[attr-defined]
            if a in span(table):
                assert a in allowed_entries, f"read table entry {(a - table.data_ptr()) // 4}"
            elif a in span(k) or a in span(v):
                base = k.data_ptr() if a in span(k) else v.data_ptr()
                assert (a - base) // row_bytes in allowed_slots, \
                    f"read cache slot {(a - base) // row_bytes}"
            else:
                assert any(a in r for r in others), f"read {a:#x}, outside every input"
    assert len(loaded) > (10 if variant == "tiled" else 5)  # the batched kernel loads less


def test_moving_blocks_changes_nothing(backend: KernelBackend) -> None:
    """Same logical history in other physical blocks: bit-identical output."""
    batch = make_batch([1, 6, 1], [23, 30, 9], block_size=4, spare_blocks=0)
    first = backend.paged_attention(*batch.args())
    num_blocks = batch.k_cache.shape[0]
    perm = torch.randperm(num_blocks, device=DEVICE)  # block b moves to perm[b]
    k_moved = torch.empty_like(batch.k_cache)
    v_moved = torch.empty_like(batch.v_cache)
    k_moved[perm] = batch.k_cache
    v_moved[perm] = batch.v_cache
    table = batch.block_tables.long()
    moved_table = torch.where(table >= 0, perm[table.clamp(min=0)], -1).to(torch.int32)
    moved = replace(batch, k_cache=k_moved, v_cache=v_moved, block_tables=moved_table)
    assert not torch.equal(moved_table, batch.block_tables)
    second = backend.paged_attention(*moved.args())
    assert torch.equal(first, second)


def test_strided_query_and_out_views(backend: KernelBackend) -> None:
    """Queries sliced out of a fused projection, output written into a wider buffer."""
    batch = make_batch([1, 4], [17, 9], num_heads=4, num_kv_heads=2, head_dim=16)
    fused = torch.randn(batch.query.shape[0], 8, 16, device=DEVICE)
    fused[:, :4] = batch.query
    query = fused[:, :4]
    wide = torch.full((batch.query.shape[0], 4, 40), NAN, device=DEVICE)
    out = wide[:, :, 8:24]
    assert not query.is_contiguous() and not out.is_contiguous()
    got = backend.paged_attention(query, *batch.args()[1:], out=out)
    ref = reference_paged_attention(*batch.args())
    torch.testing.assert_close(got, ref, **TOL[torch.float32])
    assert torch.isnan(wide[:, :, :8]).all() and torch.isnan(wide[:, :, 24:]).all()


def test_allocates_output_and_runs_under_inference_mode(backend: KernelBackend) -> None:
    batch = make_batch([2, 1], [5, 3], dtype=torch.float16)
    with torch.inference_mode():
        got = backend.paged_attention(*batch.args())
    assert got.shape == batch.query.shape and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), reference_paged_attention(*batch.args()),
                               **TOL[torch.float16])


# ----------------------------------------------------------------------------- write / copy


@pytest.mark.parametrize("num_tokens,num_kv_heads,head_dim,dtype", [
    (19, 2, 16, torch.float32),
    (19, 3, 80, torch.bfloat16),
    (300, 8, 128, torch.float16),  # several programs of tokens
])
def test_write_kv_changes_only_target_slots(backend: KernelBackend, num_tokens: int,
                                            num_kv_heads: int, head_dim: int,
                                            dtype: torch.dtype) -> None:
    shape = (cdiv(2 * num_tokens, 12), 12, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=DEVICE).to(dtype)
    v_cache = torch.randn(shape, device=DEVICE).to(dtype)
    slots = torch.randperm(shape[0] * 12, device=DEVICE)[:num_tokens]
    # K and V sliced out of one fused projection: strided, as a model produces them.
    fused = torch.randn(num_tokens, 2, num_kv_heads, head_dim, device=DEVICE).to(dtype)
    key, value = fused[:, 0], fused[:, 1]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.view(-1, num_kv_heads, head_dim)[slots] = key
    expected_v.view(-1, num_kv_heads, head_dim)[slots] = value
    backend.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_write_kv_with_no_tokens_is_a_no_op(backend: KernelBackend) -> None:
    k_cache = torch.randn(4, 4, 2, 16, device=DEVICE)
    v_cache = torch.randn(4, 4, 2, 16, device=DEVICE)
    before = k_cache.clone(), v_cache.clone()
    empty = torch.empty(0, 2, 16, device=DEVICE)
    backend.write_kv(empty, empty, k_cache, v_cache,
                     torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


@pytest.mark.parametrize("id_dtype,block_shape", [
    (torch.int32, (12, 3, 80)),
    (torch.int64, (64, 8, 256)),  # 131072 elements: a block spans several programs
])
def test_copy_blocks_within_one_cache(backend: KernelBackend, id_dtype: torch.dtype,
                                      block_shape: tuple[int, int, int]) -> None:
    """Copy-on-write: blocks 3, 5, 0 are copied to 7, 1, 9; everything else is untouched."""
    cache = torch.randn(10, *block_shape, device=DEVICE).to(torch.bfloat16)
    expected = cache.clone()
    src, dst = [3, 5, 0], [7, 1, 9]
    expected[dst] = expected[src]
    backend.copy_blocks(cache, cache, torch.tensor(src, dtype=id_dtype, device=DEVICE),
                        torch.tensor(dst, dtype=id_dtype, device=DEVICE))
    assert torch.equal(cache, expected)


def test_copy_blocks_through_a_staging_cache(backend: KernelBackend) -> None:
    """A move that permutes blocks 2 -> 6 -> 9 -> 2 through a smaller staging cache."""
    cache = torch.randn(10, 4, 2, 16, device=DEVICE)
    staging = torch.full((3, 4, 2, 16), NAN, device=DEVICE)
    expected = cache.clone()
    src, dst = [2, 6, 9], [6, 9, 2]
    expected[dst] = cache[src]
    idx = torch.arange(3, device=DEVICE)
    backend.copy_blocks(cache, staging, torch.tensor(src, device=DEVICE), idx)
    assert torch.equal(staging, cache[src])
    backend.copy_blocks(staging, cache, idx, torch.tensor(dst, device=DEVICE))
    assert torch.equal(cache, expected)


# ----------------------------------------------------------------------------- validation


def _valid() -> Batch:
    return make_batch([1, 3], [9, 6], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)


def _table_entry(row: int, col: int, value: int) -> Callable[[Batch], Batch]:
    def change(b: Batch) -> Batch:
        table = b.block_tables.clone()
        table[row, col] = value
        return replace(b, block_tables=table)
    return change


BAD_ATTENTION_CALLS: dict[str, tuple[Callable[[Batch], Batch], str]] = {
    "2-d query": (lambda b: replace(b, query=b.query[:, 0]), "query must be [T, num_heads"),
    "heads not a multiple": (lambda b: replace(b, query=b.query[:, :3]), "not a multiple"),
    "head_dim mismatch": (lambda b: replace(b, query=b.query[..., :8].contiguous()),
                          "head_dim"),
    "int64 table": (lambda b: replace(b, block_tables=b.block_tables.long()),
                    "block_tables must be int32"),
    "int64 seq_lens": (lambda b: replace(b, seq_lens=b.seq_lens.long()),
                       "seq_lens must be int32"),
    "cache dtype": (lambda b: replace(b, k_cache=b.k_cache.half(), v_cache=b.v_cache.half()),
                    "must match the query dtype"),
    "strided cache": (lambda b: replace(b, k_cache=b.k_cache.transpose(1, 2).contiguous()
                                        .transpose(1, 2)), "contiguous"),
    "entry past the pool": (_table_entry(0, 2, 10**6), "block_tables[0, 2] = 1000000"),
    # The first id past the pool: the kernel would read the block after the cache's end.
    "entry one past the pool": (lambda b: _table_entry(0, 2, b.k_cache.shape[0])(b),
                                r"block_tables[0, 2] = \d+ is not a block of the pool"),
    "-1 in a used column": (_table_entry(1, 0, -1), "block_tables[1, 0] = -1"),
    "q_len 0": (lambda b: replace(b, query_start_loc=torch.tensor(
        [0, 0, 4], dtype=torch.int32, device=DEVICE)), "q_len 0"),
    "last start wrong": (lambda b: replace(b, query_start_loc=torch.tensor(
        [0, 1, 3], dtype=torch.int32, device=DEVICE)), "query_start_loc[-1]"),
    "seq_len below q_len": (lambda b: replace(b, seq_lens=torch.tensor(
        [9, 2], dtype=torch.int32, device=DEVICE)), "seq_len 2 < its q_len 3"),
    "too few columns": (lambda b: replace(b, block_tables=b.block_tables[:, :2]),
                        "needs 3 blocks"),
    "seq_lens shape": (lambda b: replace(b, seq_lens=b.seq_lens[:1]), "seq_lens must have"),
}


@pytest.mark.parametrize("case", list(BAD_ATTENTION_CALLS))
def test_attention_rejects_bad_arguments(backend: KernelBackend, case: str) -> None:
    change, message = BAD_ATTENTION_CALLS[case]
    bad = change(_valid())
    with pytest.raises(PagedLabError, match=message.replace("[", r"\[")):
        backend.paged_attention(*bad.args())


def test_attention_rejects_bad_out_and_splits(backend: KernelBackend) -> None:
    batch = _valid()
    with pytest.raises(PagedLabError, match="out must have"):
        backend.paged_attention(*batch.args(), out=batch.query[:1])
    with pytest.raises(PagedLabError, match="out dtype"):
        backend.paged_attention(*batch.args(), out=batch.query.double())
    with pytest.raises(PagedLabError, match="num_splits"):
        backend.paged_attention(*batch.args(), num_splits=0)


def test_check_bounds_false_skips_only_data_checks() -> None:
    batch = _table_entry(0, 2, 10**6)(_valid())
    shape = attention.validate_paged_attention(*batch.args(), check_bounds=False)
    assert shape.num_seqs == 2 and shape.block_size == 4
    with pytest.raises(PagedLabError, match="block_tables must be int32"):
        attention.validate_paged_attention(*replace(batch, block_tables=batch.block_tables
                                                    .long()).args(), check_bounds=False)


def _kv_call(**changes: torch.Tensor) -> dict[str, torch.Tensor]:
    call = {
        "key": torch.randn(3, 2, 16, device=DEVICE),
        "value": torch.randn(3, 2, 16, device=DEVICE),
        "k_cache": torch.zeros(4, 4, 2, 16, device=DEVICE),
        "v_cache": torch.zeros(4, 4, 2, 16, device=DEVICE),
        "slot_mapping": torch.tensor([0, 5, 15], device=DEVICE),
    }
    call.update(changes)
    return call


BAD_WRITES: dict[str, tuple[dict[str, torch.Tensor], str]] = {
    "slot past the cache": ({"slot_mapping": torch.tensor([0, 5, 16])}, "slot_mapping\\[2\\]"),
    "negative slot": ({"slot_mapping": torch.tensor([0, -1, 3])}, "slot_mapping\\[1\\] = -1"),
    "slot twice": ({"slot_mapping": torch.tensor([0, 5, 5])}, "twice"),
    "int32 slots": ({"slot_mapping": torch.tensor([0, 5, 7], dtype=torch.int32)}, "int64"),
    "key dtype": ({"key": torch.randn(3, 2, 16).half()}, "key dtype"),
    "key heads": ({"key": torch.randn(3, 1, 16)}, "key has shape"),
    "value tokens": ({"value": torch.randn(2, 2, 16)}, "value has 2"),
}


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_write_kv_rejects_bad_arguments_and_writes_nothing(backend: KernelBackend,
                                                           case: str) -> None:
    changes, message = BAD_WRITES[case]
    call = _kv_call(**{k: v.to(DEVICE) for k, v in changes.items()})
    with pytest.raises(PagedLabError, match=message):
        backend.write_kv(**call)
    assert not call["k_cache"].any() and not call["v_cache"].any()


def test_copy_blocks_rejects_bad_arguments(backend: KernelBackend) -> None:
    cache = torch.zeros(6, 4, 2, 16, device=DEVICE)

    def ids(*xs: int) -> torch.Tensor:
        return torch.tensor(xs, device=DEVICE)

    with pytest.raises(PagedLabError, match="both a source and a destination"):
        backend.copy_blocks(cache, cache, ids(1, 2), ids(2, 3))
    with pytest.raises(PagedLabError, match="dst_ids\\[1\\] = 6"):
        backend.copy_blocks(cache, cache, ids(1, 2), ids(3, 6))
    with pytest.raises(PagedLabError, match="names a block twice"):
        backend.copy_blocks(cache, cache, ids(1, 2), ids(3, 3))
    with pytest.raises(PagedLabError, match="same block shape"):
        backend.copy_blocks(cache, torch.zeros(6, 4, 2, 8, device=DEVICE), ids(1), ids(0))
    with pytest.raises(PagedLabError, match="src_ids has 2 ids"):
        backend.copy_blocks(cache, cache, ids(1, 2), ids(3))
    with pytest.raises(PagedLabError, match="1-D int32 or int64"):
        backend.copy_blocks(cache, cache, ids(1).float(), ids(3))


# ----------------------------------------------------------------------------- selection


def test_select_kernels_names_and_devices() -> None:
    auto = select_kernels()
    assert isinstance(auto, KernelBackend)
    if CUDA:
        assert available_devices() == ["cpu", "cuda"]
        assert (auto.name, auto.device.type) == ("triton", "cuda")
    else:
        assert available_devices() == ["cpu"]
        assert (auto.name, auto.device.type) == ("triton-interpreter", "cpu")
    cpu_triton = select_kernels("cpu", "triton")
    assert isinstance(cpu_triton, TritonKernels) and cpu_triton.name == "triton-interpreter"
    cpu_torch = select_kernels("cpu", "torch")
    assert isinstance(cpu_torch, TorchKernels) and cpu_torch.name == "torch"
    assert select_kernels("auto", "torch").device == auto.device


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_select_kernels_refuses_cuda_without_a_gpu() -> None:
    with pytest.raises(PagedLabError) as info:
        select_kernels("cuda")
    assert str(info.value) == ("device 'cuda' requested but torch sees no CUDA GPU; "
                               "use --device cpu or auto")


def test_select_kernels_rejects_unknown_names() -> None:
    with pytest.raises(PagedLabError, match="unknown device 'tpu'"):
        select_kernels("tpu")
    with pytest.raises(PagedLabError, match="unknown kernel 'cuda'"):
        select_kernels("cpu", "cuda")


def test_backend_refuses_tensors_on_another_device() -> None:
    if not CUDA:
        pytest.skip("needs a GPU to have two devices")
    batch = make_batch([1], [5])
    with pytest.raises(PagedLabError, match="backend runs on cpu"):
        select_kernels("cpu", "triton").paged_attention(*batch.args())


def test_split_heuristic() -> None:
    choose = attention.choose_num_splits
    # No GPU: never split unless forced.
    assert choose(num_programs=8, max_context=16384, capacity=None) == 1
    # H200 (132 SMs) with a kernel of 4 resident programs per SM: 528 slots. A batch of
    # 64 x 8 KV heads nearly fills them, and a split would need a second wave.
    assert choose(num_programs=512, max_context=4096, capacity=528) == 1
    assert choose(num_programs=600, max_context=4096, capacity=528) == 1
    # One sequence of 8 KV heads does not: splits of >= 256 positions, one wave at most.
    assert choose(num_programs=8, max_context=4096, capacity=528) == 4096 // 256
    assert choose(num_programs=8, max_context=65536, capacity=528) == attention.MAX_SPLITS
    assert choose(num_programs=8, max_context=65536, capacity=264) == 33
    assert choose(num_programs=8, max_context=300, capacity=528) == 1


# ----------------------------------------------------------------------------- other modes

_CHILD_ENV = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO)}


def _run_child(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                            env=_CHILD_ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_interpreter_wraps_kernels_decorated_for_the_compiler() -> None:
    """A GPU machine decorates the kernels for the compiler; a CPU run must still work.

    With TRITON_INTERPRET=0 the package leaves the kernels compiled-style even without a
    GPU, which is exactly the situation of `--device cpu --kernel triton` on a GPU machine.
    """
    out = _run_child("""
        import torch
        from backend.kernels import (TritonKernels, attention, reference_paged_attention,
                                     select_kernels)
        assert not attention.is_interpreted(attention._paged_attention_kernel)
        k = select_kernels("cpu", "triton")
        assert k.name == "triton-interpreter", k.name
        torch.manual_seed(0)
        kc = torch.randn(6, 4, 2, 32).bfloat16(); vc = torch.randn(6, 4, 2, 32).bfloat16()
        q = torch.randn(4, 4, 32).bfloat16()
        bt = torch.tensor([[5, 1, 3], [0, 2, -1]], dtype=torch.int32)
        sl = torch.tensor([11, 6], dtype=torch.int32)
        qsl = torch.tensor([0, 3, 4], dtype=torch.int32)
        tiled = TritonKernels(torch.device("cpu"), attention_variant="tiled")
        ref = reference_paged_attention(q, kc, vc, bt, sl, qsl, 0.2)
        for backend, splits in ((k, 1), (k, 2), (tiled, 1)):  # batched, tiled split, tiled
            got = backend.paged_attention(q, kc, vc, bt, sl, qsl, 0.2, num_splits=splits)
            torch.testing.assert_close(got.float(), ref, atol=1.6e-2, rtol=1.6e-2)
        k.copy_blocks(kc, kc, torch.tensor([5]), torch.tensor([4]))
        assert torch.equal(kc[4], kc[5])
        k.write_kv(q[:, :2], q[:, 2:], kc, vc, torch.tensor([0, 1, 2, 23]))
        assert torch.equal(kc.view(-1, 2, 32)[23], q[3, :2])
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.slow
def test_kernels_compile_for_hopper() -> None:
    """Lower every kernel to sm_90 machine code with Triton's bundled ptxas (no GPU needed).

    Catches what the interpreter cannot: code the compiler rejects, and resources past an
    SM's budget: no register spills, shared memory within the 227 KiB a program may
    have, at least one resident program per SM (two for the decode shape, so split-K has
    room). For the benchmark's decode shape (bf16, head_dim 128, block 16) it also checks
    that K/V tiles are fetched as 16-byte asynchronous copies, the access pattern the
    bandwidth target relies on, and that block ids are loaded once per block.
    """
    out = _run_child("""
        import re, torch
        from backend.kernels import attention, cache_ops, launch as L
        def attn(dtype, q_lens, heads, kvh, d, bs, splits):
            ctx = 4096
            kc = torch.empty(16, bs, kvh, d, dtype=dtype)
            q = torch.empty(sum(q_lens), heads, d, dtype=dtype)
            bt = torch.zeros(len(q_lens), ctx // bs, dtype=torch.int32)
            sl = torch.full((len(q_lens),), ctx, dtype=torch.int32)
            qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
            interp = attention.kernel_variant(attention._paged_attention_kernel, True)
            assert attention.is_interpreted(interp)
            cfg = attention.choose_config(head_dim=d, num_queries_per_kv=heads // kvh,
                                          decode_only=len(q_lens) == sum(q_lens),
                                          interpret=False)
            # Planned in the interpreter with the GPU's tile sizes; only the dot operands
            # differ from what a GPU run launches.
            _, launches = attention.plan_paged_attention(
                q, kc, kc, bt, sl, qsl, 0.1, num_splits=splits, check_bounds=False,
                interpret=True, config=cfg, variant="tiled")
            main = launches[0]
            cst = dict(main.constexprs, DOT_FP32=False,
                       DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
            main = attention.Launch(main.kernel, main.grid, main.args, cst, main.num_warps,
                                    main.num_stages)
            return [main, *launches[1:]]
        def budget(name, launch, min_programs=1):
            res = L.offline_resources(attention.compile_for_gpu(launch), launch.num_warps)
            per_sm = L.programs_per_sm(res)
            print(f"{name}: {res.registers} registers, {res.spill_bytes} B spilled, "
                  f"{res.shared_bytes} B shared, {launch.num_warps} warps: "
                  f"{per_sm} programs per SM")
            assert res.spill_bytes == 0 and res.shared_bytes <= 227 * 1024, res
            assert per_sm >= min_programs, (res, per_sm)
        decode = attn(torch.bfloat16, [1] * 64, 32, 8, 128, 16, 1)
        assert decode[0].constexprs["TABLE_LOADS"] == "per_block"
        ptx = attention.compile_for_gpu(decode[0]).asm["ptx"]
        copy16 = r"cp\\.async\\.cg\\.shared\\.global \\[[^]]*\\], \\[[^]]*\\], 0x10"
        vec = len(re.findall(copy16, ptx))
        print("decode 16-byte async copies:", vec)
        assert vec >= 16, ptx[:2000]
        budget("decode bf16 d128 block 16", decode[0], min_programs=2)
        cases = {"split decode": attn(torch.bfloat16, [1] * 8, 32, 8, 128, 16, 4),
                 "one block per sequence": attn(torch.bfloat16, [1], 32, 8, 128, 4096, 1),
                 "fp16 d80 block 12 prefill": attn(torch.float16, [100, 1, 1], 8, 8, 80, 12, 1),
                 "fp32 d256 block 64 split": attn(torch.float32, [1, 37], 16, 2, 256, 64, 3)}
        assert cases["one block per sequence"][0].constexprs["TABLE_LOADS"] == "per_tile"
        assert cases["fp16 d80 block 12 prefill"][0].constexprs["TABLE_LOADS"] == "per_token"
        for name, launches in cases.items():
            budget(name, launches[0])
            for launch in launches[1:]:
                attention.compile_for_gpu(launch)
        kc = torch.empty(8, 16, 8, 128, dtype=torch.bfloat16)
        key = torch.empty(5, 8, 128, dtype=torch.bfloat16)
        slots = torch.arange(5)
        for launch in (cache_ops.plan_write_kv(key, key, kc, kc, slots, interpret=True),
                       cache_ops.plan_copy_blocks(kc, kc, torch.tensor([1]), torch.tensor([2]),
                                                  interpret=True)):
            attention.compile_for_gpu(launch)
        print("ok")
    """)
    print(out)
    assert out.strip().endswith("ok")


@pytest.mark.slow
def test_a_compile_waits_for_an_interpreted_launch_in_another_thread() -> None:
    """On a GPU server the sidebar offers Device cpu (the interpreter) beside cuda. The
    interpreter swaps its own functions into triton.language while it runs, so a GPU
    session compiling a new shape at that moment built with them and failed
    ("'block_argument' object has no attribute 'dtype'"): compiles take its lock."""
    out = _run_child("""
        import threading, time, triton.compiler, torch
        from triton.runtime.jit import JITFunction
        from backend.core.config import EngineConfig
        from backend.engine.engine import Engine
        from backend.engine.ops import Add, Step
        from backend.kernels import attention, cache_ops, launch as L
        assert not attention.is_interpreted(attention._paged_attention_kernel)
        # The compile a JIT kernel binds at its first launch is the locked one.
        from triton.compiler import compile as bound
        import importlib, triton
        assert getattr(bound, "pagedlab_lock", None) is L.INTERPRETER_LOCK
        assert triton.compile is bound
        # A reload of the module keeps one lock for compiles and interpreted launches.
        lock = L.INTERPRETER_LOCK
        assert importlib.reload(L).INTERPRETER_LOCK is lock
        kc = torch.empty(16, 16, 2, 32)
        write = cache_ops.plan_write_kv(torch.empty(5, 2, 32), torch.empty(5, 2, 32), kc, kc,
                                        torch.arange(5), interpret=True)
        # While an interpreted launch holds the lock, a compile waits for it.
        held, release, compiled = threading.Event(), threading.Event(), threading.Event()
        def interpreted_launch():
            with L.INTERPRETER_LOCK:
                held.set()
                release.wait(60)
        def compile_():
            attention.compile_for_gpu(write)
            compiled.set()
        threading.Thread(target=interpreted_launch).start()
        held.wait(60)
        worker = threading.Thread(target=compile_)
        worker.start()
        assert not compiled.wait(2), "compiled while an interpreted launch ran"
        release.set()
        worker.join(120)
        assert compiled.is_set()
        # And for real: interpreted engines stepping in one thread, compiles in another.
        errors, done = [], threading.Event()
        def engines():
            n = 0
            while not done.is_set():
                try:
                    e = Engine(EngineConfig(num_blocks=32, block_size=4, seed=n), device="cpu",
                               kernel="triton")
                    e.apply(Add("A", prompt_len=12, max_new_tokens=50))
                    for _ in range(4):
                        e.apply(Step(1))
                    n += 1
                except Exception as exc:
                    errors.append(repr(exc)[:300])
            print("interpreted engine runs:", n)
        stepping = threading.Thread(target=engines)
        stepping.start()
        time.sleep(1)
        try:
            for _ in range(3):
                attention.compile_for_gpu(write)
        except Exception as exc:
            errors.append(repr(exc)[-300:])
        done.set()
        stepping.join(300)
        assert not errors, errors
        print("ok")
    """)
    print(out)
    assert out.strip().endswith("ok")
