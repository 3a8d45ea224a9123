"""When the kernel path checks data: the PAGEDLAB_KERNEL_CHECKS setting, host-side batch
checks, and the sampled per-step reference check (backend.kernels.checks)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backend.core.errors import PagedLabError
from backend.kernels import CHECKS_ENV, ReferenceCheck, attention, cache_ops, checks_enabled
from backend.kernels import checks as kernel_checks
from tests.test_kernels import Batch, make_batch


def _bad_table_batch() -> Batch:
    batch = make_batch([1, 3], [9, 6], block_size=4)
    table = batch.block_tables.clone()
    table[0, 2] = 10**6
    return replace(batch, block_tables=table)


@pytest.mark.parametrize("value,enabled", [(None, False), ("0", False), ("", False),
                                           ("1", True), ("yes", True)])
def test_setting(monkeypatch: pytest.MonkeyPatch, value: str | None, enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv(CHECKS_ENV, raising=False)
    else:
        monkeypatch.setenv(CHECKS_ENV, value)
    assert checks_enabled() is enabled
    assert kernel_checks.resolve_checks(None) is enabled
    assert kernel_checks.resolve_checks(True) is True
    assert kernel_checks.resolve_checks(False) is False


def test_default_plans_without_reading_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks off: a bad entry is not caught (nothing is read); on, it is. Plans only."""
    bad = _bad_table_batch()
    monkeypatch.delenv(CHECKS_ENV, raising=False)
    for variant in ("batched", "tiled"):
        attention.plan_paged_attention(*bad.args(), interpret=True, variant=variant)
    with pytest.raises(PagedLabError, match=r"block_tables\[0, 2\] = 1000000"):
        attention.plan_paged_attention(*bad.args(), interpret=True, check_bounds=True)
    monkeypatch.setenv(CHECKS_ENV, "1")
    with pytest.raises(PagedLabError, match=r"block_tables\[0, 2\] = 1000000"):
        attention.plan_paged_attention(*bad.args(), interpret=True)
    attention.plan_paged_attention(*bad.args(), interpret=True, check_bounds=False)


def test_cache_ops_follow_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = torch.zeros(4, 4, 2, 16)
    key = torch.randn(2, 2, 16)
    twice = torch.tensor([3, 3])
    monkeypatch.delenv(CHECKS_ENV, raising=False)
    assert cache_ops.plan_write_kv(key, key, cache, cache, twice, interpret=True) is not None
    assert cache_ops.plan_copy_blocks(cache, cache, torch.tensor([1]), torch.tensor([1]),
                                      interpret=True) is not None
    monkeypatch.setenv(CHECKS_ENV, "1")
    with pytest.raises(PagedLabError, match="twice"):
        cache_ops.plan_write_kv(key, key, cache, cache, twice, interpret=True)
    with pytest.raises(PagedLabError, match="both a source and a destination"):
        cache_ops.plan_copy_blocks(cache, cache, torch.tensor([1]), torch.tensor([1]),
                                   interpret=True)


def test_shape_checks_always_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECKS_ENV, raising=False)
    batch = make_batch([1], [5])
    with pytest.raises(PagedLabError, match="block_tables must be int32"):
        attention.plan_paged_attention(*replace(batch, block_tables=batch.block_tables.long())
                                       .args(), interpret=True)


def test_host_batch_checks() -> None:
    check = kernel_checks.check_host_batch
    check([[3, 1, 7], [0]], [9, 2], [1, 2], num_blocks=8, block_size=4)
    check([[3, 1, 7, -1]], [9], [9], num_blocks=8, block_size=4)  # padding is never read
    for args, message in [
        (([[3]], [2], [0]), "q_len 0"),
        (([[3]], [2], [3]), "seq_len 2 < its q_len 3"),
        (([[3, 1]], [9], [1]), "needs 3 blocks"),
        (([[3, 8, 1]], [9], [1]), r"block_tables\[0, 1\] = 8"),
        (([[3, -1, 1]], [9], [1]), r"block_tables\[0, 1\] = -1"),
        (([[3]], [2, 2], [1]), "must match"),
    ]:
        with pytest.raises(PagedLabError, match=message):
            check(*args, num_blocks=8, block_size=4)


def test_reference_check_on_a_cpu_checks_every_layer() -> None:
    batch = make_batch([1, 4], [7, 10])
    out = attention.paged_attention(*batch.args(), interpret=True)
    check = ReferenceCheck(True, torch.device("cpu"))
    check.layer(out, *batch.args())
    wrong = out.clone()
    wrong[0, 0, 0] += 0.5
    check.layer(wrong, *batch.args())
    err = check.max_abs_err()
    assert err is not None and 0.49 < err < 0.51
    assert ReferenceCheck(False, torch.device("cpu")).max_abs_err() is None
    assert ReferenceCheck(True, torch.device("cpu")).max_abs_err() == 0.0  # no layer yet


def test_reference_check_on_a_gpu_is_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    """One forward in PAGEDLAB_REFERENCE_EVERY on CUDA (decided without touching a GPU)."""
    cuda = torch.device("cuda")
    monkeypatch.setenv(kernel_checks.REFERENCE_EVERY_ENV, "4")
    due = [kernel_checks.reference_due(cuda) for _ in range(12)]
    assert sum(due) == 3 and due[::4] == [due[0]] * 3
    assert all(kernel_checks.reference_due(torch.device("cpu")) for _ in range(5))
    monkeypatch.setenv(kernel_checks.REFERENCE_EVERY_ENV, "1")
    assert all(kernel_checks.reference_due(cuda) for _ in range(3))
    monkeypatch.setenv(kernel_checks.REFERENCE_EVERY_ENV, "often")
    assert kernel_checks.reference_every() == kernel_checks.DEFAULT_REFERENCE_EVERY
    monkeypatch.delenv(kernel_checks.REFERENCE_EVERY_ENV)
    skipped = [ReferenceCheck(True, cuda) for _ in range(kernel_checks.reference_every())]
    assert sum(c.active for c in skipped) == 1
    assert [c.max_abs_err() for c in skipped if not c.active] == [None] * (len(skipped) - 1)


def test_reference_check_counts_a_nan_layer_as_zero() -> None:
    """As the models' own per-layer maximum did: the report stays finite (a snapshot's
    kernel report must be, to restore)."""
    batch = make_batch([1, 4], [7, 10])
    out = attention.paged_attention(*batch.args(), interpret=True)
    check = ReferenceCheck(True, torch.device("cpu"))
    wrong = out.clone()
    wrong[0, 0, 0] += 0.25
    check.layer(wrong, *batch.args())
    poisoned = out.clone()
    poisoned[0, 0, 0] = float("nan")
    check.layer(poisoned, *batch.args())
    err = check.max_abs_err()
    assert err is not None and 0.24 < err < 0.26
    only_nan = ReferenceCheck(True, torch.device("cpu"))
    only_nan.layer(poisoned, *batch.args())
    assert only_nan.max_abs_err() == 0.0
