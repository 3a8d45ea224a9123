"""The compiled CPU decode operator (backend.kernels.native) against the reference.

Fresh random decode batches (seeded per test) over shuffled pools whose unowned blocks,
tails and table padding hold NaN, as in test_kernels: every head size the operator
specializes (16, 32, 64, 128) and others, block sizes from 1 up, grouped-query ratios,
all three dtypes, strided queries, outputs and tables. Bad lengths and block ids are
refused without reading through them; concurrent calls from several threads agree with
the reference; the loader refuses a library that does not match its source.

`make test` builds the operator first, so here it must be loaded: a build that failed
fails these tests rather than skipping them. PAGEDLAB_NATIVE=0 (the operator turned off
on purpose) skips them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import torch

from backend.core.errors import PagedLabError
from backend.kernels import native, reference_paged_attention, select_kernels
from backend.kernels.torch_path import torch_paged_attention
from tests.test_kernels import CUDA, NAN, TOL, Batch, make_batch

pytestmark = [
    pytest.mark.skipif(CUDA, reason="the operator is for CPU tensors; test_kernels covers "
                       "the GPU"),
    pytest.mark.skipif(os.environ.get(native.ENV_SWITCH) == "0",
                       reason=f"{native.ENV_SWITCH}=0 turns the operator off"),
]


def _op() -> Callable[..., None]:
    op = native.decode_op()
    assert op is not None, f"the native operator is not loaded: {native.status().reason}"
    return op


def _decode(batch: Batch, out: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.full_like(batch.query, NAN) if out is None else out
    _op()(batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
          batch.scale, out)
    return out


def _reference(batch: Batch) -> torch.Tensor:
    return reference_paged_attention(*batch.args())


def test_the_operator_is_built_and_loaded() -> None:
    status = native.status()
    assert status.loaded, status.reason
    assert str(native.LIBRARY) in status.reason


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128, 8, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_the_reference(head_dim: int, dtype: torch.dtype) -> None:
    """Specialized head sizes and the general loop, every dtype, random batches."""
    for _ in range(4):
        n = int(torch.randint(1, 7, ()))
        kvh = int(torch.randint(1, 4, ()))
        group = [1, 2, 3, 4][int(torch.randint(0, 4, ()))]
        block_size = [1, 3, 4, 16, 32][int(torch.randint(0, 5, ()))]
        lens = torch.randint(1, 120, (n,)).tolist()
        batch = make_batch([1] * n, lens, num_heads=kvh * group, num_kv_heads=kvh,
                           head_dim=head_dim, block_size=block_size, dtype=dtype)
        torch.testing.assert_close(_decode(batch).float(), _reference(batch), **TOL[dtype])


def test_long_contexts_and_many_blocks() -> None:
    """A few thousand positions: the softmax's max and sum over many blocks."""
    batch = make_batch([1, 1, 1], [3000, 1, 2049], num_heads=8, num_kv_heads=2,
                       head_dim=64, block_size=16)
    torch.testing.assert_close(_decode(batch), _reference(batch), **TOL[torch.float32])


def test_large_scores_do_not_overflow() -> None:
    """Scores in the hundreds: exp is taken of score - max, never of the score."""
    batch = make_batch([1, 1], [50, 33], num_heads=4, num_kv_heads=1, head_dim=32)
    batch = Batch(batch.query * 40, *batch.args()[1:6], scale=1.0)
    got = _decode(batch)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _reference(batch), **TOL[torch.float32])


def test_strided_query_out_and_tables() -> None:
    """Views of wider buffers: query and out by their strides, tables by their row stride."""
    batch = make_batch([1] * 4, [9, 40, 1, 23], num_heads=6, num_kv_heads=3, head_dim=16,
                       block_size=4)
    wide_q = torch.randn(4, 6, 48)
    wide_q[:, :, 16:32] = batch.query
    wide_table = torch.full((4, batch.block_tables.shape[1] + 5), -1, dtype=torch.int32)
    wide_table[:, :batch.block_tables.shape[1]] = batch.block_tables
    strided = Batch(wide_q[:, :, 16:32], batch.k_cache, batch.v_cache,
                    wide_table[:, :batch.block_tables.shape[1]], batch.seq_lens,
                    batch.query_start_loc, batch.scale)
    wide_out = torch.full((4, 6, 48), NAN)
    _decode(strided, wide_out[:, :, 8:24])
    torch.testing.assert_close(wide_out[:, :, 8:24], _reference(batch), **TOL[torch.float32])
    assert torch.isnan(wide_out[:, :, :8]).all() and torch.isnan(wide_out[:, :, 24:]).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_split_sequences_or_heads(threads: int) -> None:
    """One sequence with several KV heads is split by head across threads; many
    sequences go whole: both give the reference's answer."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for lens in ([700], [5, 70, 300, 2, 64]):
            batch = make_batch([1] * len(lens), lens, num_heads=8, num_kv_heads=4,
                               head_dim=32, block_size=8)
            torch.testing.assert_close(_decode(batch), _reference(batch),
                                       **TOL[torch.float32])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("what,value", [
    ("block id", 10_000), ("block id", -1), ("length", 0), ("length", 10_000),
])
def test_bad_tables_and_lengths_are_refused(what: str, value: int) -> None:
    """With bounds checks off (the app's default), a bad entry in the part of a table a
    length uses, or a bad length, is refused by the operator before it reads through
    it: a PagedLabError, not a crash or a read outside the caches."""
    batch = make_batch([1, 1], [9, 6], block_size=4)
    tables, lens = batch.block_tables.clone(), batch.seq_lens.clone()
    if what == "block id":
        tables[1, 1] = value
    else:
        lens[1] = value
    with pytest.raises(PagedLabError, match="sequence 1 has a length or block id out of range"):
        torch_paged_attention(batch.query, batch.k_cache, batch.v_cache, tables, lens,
                              batch.query_start_loc, batch.scale)
    backend = select_kernels("cpu", "torch")
    with pytest.raises(PagedLabError, match="out of range"):
        backend.paged_attention(batch.query, batch.k_cache, batch.v_cache, tables, lens,
                                batch.query_start_loc, batch.scale, check_bounds=False)


def test_the_operator_checks_its_own_arguments() -> None:
    """Called directly, past the backend's validation, a malformed call is refused by
    the operator's own checks (it never guesses at a layout)."""
    batch = make_batch([1, 1], [9, 6], block_size=4)
    op = _op()
    out = torch.empty_like(batch.query)
    args = [batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.scale, out]
    bad = {
        3: (batch.block_tables.long(), "must be int32"),
        4: (batch.seq_lens[:1], "one table row and one length per query row"),
        1: (batch.k_cache.double(), "share one dtype"),
        6: (out[:, :, :8], r"query and out must both be \[n, H, D\]"),
        0: (batch.query.transpose(1, 2).contiguous().transpose(1, 2),
            "rows must be contiguous in D"),
    }
    for index, (value, message) in bad.items():
        call = list(args)
        call[index] = value
        with pytest.raises(RuntimeError, match=message):
            op(*call)


def test_concurrent_calls_from_threads() -> None:
    """Sessions share the operator: calls from several threads at once stay correct."""
    batches = [make_batch([1] * 3, torch.randint(1, 400, (3,)).tolist(), num_heads=4,
                          num_kv_heads=2, head_dim=64, block_size=16) for _ in range(4)]
    expected = [_reference(b) for b in batches]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.inference_mode():
                for _ in range(20):
                    torch.testing.assert_close(_decode(batches[i]), expected[i],
                                               **TOL[torch.float32])
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_the_torch_path_uses_it_for_decode_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode batches and a mixed batch's decode rows run the operator; turned off on
    this thread, the same calls gather instead, with the same answer."""
    calls: list[int] = []
    op = _op()

    def counting(*args: object) -> None:
        calls.append(int(args[0].shape[0]))  # type: ignore[attr-defined]
        op(*args)

    monkeypatch.setattr(native, "_op", counting)
    decode = make_batch([1, 1, 1], [20, 3, 9])
    mixed = make_batch([1, 6, 1], [20, 6, 9])
    for batch in (decode, mixed):
        got = torch_paged_attention(*batch.args())
        torch.testing.assert_close(got, _reference(batch), **TOL[torch.float32])
    assert calls == [3, 2]
    with native.turned_off():
        assert native.decode_op() is None
        for batch in (decode, mixed):
            torch.testing.assert_close(torch_paged_attention(*batch.args()),
                                       _reference(batch), **TOL[torch.float32])
    assert calls == [3, 2]
    assert native.decode_op() is counting


def test_turned_off_is_per_thread() -> None:
    seen: list[object] = []
    with native.turned_off():
        worker = threading.Thread(target=lambda: seen.append(native.decode_op()))
        worker.start()
        worker.join()
        assert native.decode_op() is None
    assert seen[0] is not None


def test_the_loader_refuses_what_does_not_match(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: object) -> None:
    """Only a library stamped with this source, these flags and this torch is loaded."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "lib.so")
    monkeypatch.setattr(native, "STAMP", tmp_path / "stamp.txt")
    assert native._load().reason == "not built (run `make native`)"
    (tmp_path / "lib.so").write_bytes(b"not a library")
    (tmp_path / "stamp.txt").write_text("0" * 64 + "\n")
    assert native._load().reason == "built from another source, torch or CPU (run `make native`)"
    (tmp_path / "stamp.txt").write_text(native.fingerprint() + "\n")
    refused = native._load()
    assert not refused.loaded and refused.reason.startswith("could not be loaded")
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native._load().reason == f"turned off ({native.ENV_SWITCH}=0)"


def test_the_stamp_names_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build is for the CPU it was made on (-march=native): other features, another
    fingerprint, so a build directory copied to another machine is not loaded there."""
    here = native.fingerprint()
    monkeypatch.setattr(native, "_cpu_features", lambda: "sse2")
    assert native.fingerprint() != here
