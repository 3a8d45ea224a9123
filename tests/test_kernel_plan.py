"""A step's plan shared by every layer: the same answers as without it, on fresh inputs.

The torch path keeps in a StepPlan what it derives from the tables and lengths (gather
slots, mask, decode rows, host offsets) and the verdict of its argument checks. These
tests run several "layers" (fresh random K/V and queries over the same metadata) through
one plan and compare each with the per-sequence reference; they also show that a plan
over other tensors is ignored, that a differently shaped call is still checked, and that
a model step through the engine matches a contiguous recomputation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step
from backend.kernels import StepPlan, native, reference_paged_attention, select_kernels
from backend.kernels import torch_path as tp
from tests.test_kernels import NAN, Batch, make_batch

TORCH = select_kernels("cpu", "torch")


@pytest.fixture(autouse=True)
def _gather(request: pytest.FixtureRequest) -> Iterator[None]:
    """What a plan keeps is the gather path's (the compiled decode operator needs none of
    it), so the operator is off here unless a test's `path` parameter asks for it."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("path") == "native":
        yield
    else:
        with native.turned_off():
            yield


def host_plan(batch: Batch, q_lens: Sequence[int], seq_lens: Sequence[int]) -> StepPlan:
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return StepPlan(batch.block_tables, batch.seq_lens, batch.query_start_loc,
                    seq_lens_host=seq_lens, query_starts_host=starts)


def layers(batch: Batch, count: int) -> list[Batch]:
    """`count` batches over the same metadata tensors with their own K/V and queries,
    poisoned where the original is (NaN outside what sequences own)."""
    out = []
    for _ in range(count):
        k = torch.where(batch.k_cache.isnan(), NAN, torch.randn_like(batch.k_cache))
        v = torch.where(batch.v_cache.isnan(), NAN, torch.randn_like(batch.v_cache))
        out.append(Batch(torch.randn_like(batch.query), k, v, batch.block_tables,
                         batch.seq_lens, batch.query_start_loc, batch.scale))
    return out


def run_layers(batch: Batch, plan: StepPlan | None, count: int = 3) -> None:
    for layer in layers(batch, count):
        ref = reference_paged_attention(*layer.args())
        out = torch.full_like(layer.query, NAN)
        got = TORCH.paged_attention(*layer.args(), out=out, plan=plan)
        assert got is out
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["gather", "native"])
@pytest.mark.parametrize("kind", ["decode ragged", "decode equal", "mixed", "prefill only"])
@pytest.mark.parametrize("hosted", [False, True])
def test_layers_through_one_plan_match_the_reference(kind: str, hosted: bool,
                                                     path: str) -> None:
    for _ in range(6):
        n = int(torch.randint(1, 6, ()))
        bs = int(torch.randint(1, 17, ()))
        if kind == "decode equal":
            seq_lens = [int(torch.randint(1, 80, ()))] * n
        else:
            seq_lens = torch.randint(1, 80, (n,)).tolist()
        if kind.startswith("decode"):
            q_lens = [1] * n
        elif kind == "prefill only":
            q_lens = [int(torch.randint(2, s + 1, ())) if s > 1 else 1 for s in seq_lens]
        else:
            q_lens = [1 if b % 2 else int(torch.randint(1, s + 1, ()))
                      for b, s in enumerate(seq_lens)]
        kvh = int(torch.randint(1, 3, ()))
        batch = make_batch(q_lens, seq_lens, num_heads=kvh * int(torch.randint(1, 4, ())),
                           num_kv_heads=kvh, head_dim=int(torch.randint(1, 33, ())),
                           block_size=bs)
        plan = host_plan(batch, q_lens, seq_lens) if hosted else \
            StepPlan(batch.block_tables, batch.seq_lens, batch.query_start_loc)
        run_layers(batch, plan)


def test_equal_lengths_with_host_lists_drop_the_mask_and_the_tail() -> None:
    """Equal lengths known on the host: gather exactly L positions, no mask; the slots
    past each length (NaN here) are never read."""
    seq_lens, q_lens = [10, 10, 10], [1, 1, 1]
    batch = make_batch(q_lens, seq_lens, block_size=4)
    plan = host_plan(batch, q_lens, seq_lens)
    run_layers(batch, plan)
    (g,) = (v for k, v in plan._memo.items() if k[0] == "decode")
    assert g.mask is None and g.slots.shape == (3, 10)
    # Every layer gathered into the same two buffers, of exactly 3 x 10 token rows.
    (ready,) = (v for k, v in plan._memo.items() if k[0] == "ready")
    kvh, d = batch.k_cache.shape[2:]
    assert ready.k_rows.shape == ready.v_rows.shape == (30, kvh * d)
    assert ready.k.shape == (3, kvh, 10, d)
    assert ready.k_rows.data_ptr() != ready.v_rows.data_ptr()
    # Without the host lists: the tables' capacity, masked.
    bare = StepPlan(batch.block_tables, batch.seq_lens, batch.query_start_loc)
    run_layers(batch, bare)
    (g,) = (v for k, v in bare._memo.items() if k[0] == "decode")
    assert g.mask is not None and g.slots.shape[1] == batch.block_tables.shape[1] * 4


def test_long_context_slices_and_groups_with_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounded-memory paths (slices merged by log-sum-exp, groups of sequences) take
    the plan's slots too."""
    monkeypatch.setattr(tp, "GATHER_BYTES", 2048)
    for seq_lens in ([300, 7, 120], [40, 41, 39, 40]):
        q_lens = [1] * len(seq_lens)
        batch = make_batch(q_lens, seq_lens, block_size=8)
        for plan in (None, host_plan(batch, q_lens, seq_lens)):
            run_layers(batch, plan, count=2)
    # The 300-token batch is cut into slices once for both layers: one slot tensor per
    # SLICE_MIN_POSITIONS positions, the last one ending past the longest sequence.
    batch = make_batch([1] * 3, [300, 7, 120], block_size=8)
    plan = host_plan(batch, [1] * 3, [300, 7, 120])
    run_layers(batch, plan, count=2)
    (cut,) = (v for k, v in plan._memo.items() if k[0] == "slices")
    assert cut.width == tp.SLICE_MIN_POSITIONS
    assert len(cut.flats) == -(-300 // cut.width)


def test_a_plan_over_other_tensors_is_not_used() -> None:
    """Same values, other tensor objects: the plan does not cover the call, so nothing of
    it is read, and the answer comes from the call's own tables."""
    seq_lens, q_lens = [9, 14], [1, 1]
    batch = make_batch(q_lens, seq_lens, block_size=4)
    other = make_batch(q_lens, [5, 3], block_size=4)
    plan = host_plan(other, q_lens, [5, 3])
    assert not plan.covers(batch.block_tables, batch.seq_lens, batch.query_start_loc)
    run_layers(batch, plan)
    assert not plan._memo  # nothing was computed into it


def test_a_plan_still_checks_a_differently_shaped_call() -> None:
    """The kept verdict is for one call signature: another dtype or shape is validated."""
    seq_lens, q_lens = [9, 14], [1, 1]
    batch = make_batch(q_lens, seq_lens, block_size=4)
    plan = host_plan(batch, q_lens, seq_lens)
    TORCH.paged_attention(*batch.args(), plan=plan)
    with pytest.raises(PagedLabError, match="dtype"):
        TORCH.paged_attention(batch.query.half(), *batch.args()[1:], plan=plan)
    with pytest.raises(PagedLabError, match="head_dim"):
        TORCH.paged_attention(batch.query[..., :8], *batch.args()[1:], plan=plan)
    with pytest.raises(PagedLabError, match="out"):
        TORCH.paged_attention(*batch.args(), out=torch.empty(3, 4, 16), plan=plan)
    # Not tensors at all: no signature, so the full checks name the argument.
    with pytest.raises(PagedLabError, match="out must have"):
        TORCH.paged_attention(*batch.args(), out=[1.0], plan=plan)  # type: ignore[arg-type]
    with pytest.raises(PagedLabError, match=r"query must be a torch\.Tensor, got list"):
        TORCH.paged_attention(batch.query.tolist(), *batch.args()[1:], plan=plan)  # type: ignore[arg-type]


def test_passed_checks_are_kept_for_the_process_and_refusals_never(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's first layer skips the argument checks for a call shaped like one that
    passed before, in any plan or none; another shape is checked; a bad call is refused
    every time, since only passes are kept."""
    import backend.kernels as kernels
    from backend.kernels import attention
    from backend.kernels.validate import Verdicts

    checked: list[int] = []
    real = attention.validate_paged_attention

    def counting(*args: object, **kwargs: object) -> object:
        checked.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "validate_paged_attention", counting)
    monkeypatch.setattr(kernels, "_VERDICTS", Verdicts(limit=2))
    batch = make_batch([1, 1], [9, 14], block_size=4)
    for plan in (None, host_plan(batch, [1, 1], [9, 14]), host_plan(batch, [1, 1], [9, 14])):
        TORCH.paged_attention(*batch.args(), plan=plan, check_bounds=False)
    assert len(checked) == 1
    other = make_batch([1, 1, 1], [3, 4, 5], block_size=4)
    TORCH.paged_attention(*other.args(), check_bounds=False)
    assert len(checked) == 2
    for _ in range(2):
        with pytest.raises(PagedLabError, match="scale must be a finite number"):
            TORCH.paged_attention(*batch.args()[:6], float("nan"), check_bounds=False)
    assert len(checked) == 4 and len(kernels._VERDICTS) == 2
    # A third passing shape: past the limit of 2 the cache starts again, not grows.
    TORCH.paged_attention(*batch.args(), num_splits=2, check_bounds=False)
    assert len(kernels._VERDICTS) == 1
    # Equal but of another type (2 == 2.0, one hash): still checked, still refused.
    with pytest.raises(PagedLabError, match="num_splits must be an int"):
        TORCH.paged_attention(*batch.args(), num_splits=2.0,  # type: ignore[arg-type]
                              check_bounds=False)
    assert len(checked) == 6
    # Bounds checks asked for: always checked in full.
    TORCH.paged_attention(*batch.args(), check_bounds=True)
    assert len(checked) == 7


def test_engine_steps_with_plans_match_a_contiguous_recomputation() -> None:
    """Prefill, chunked prefill beside decodes, and decodes: every layer's attention goes
    through the step's plan, and the cache and logits equal a from-scratch recompute."""
    engine = Engine(EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=12),
                    device="cpu", kernel="torch")
    engine.apply(Add("a", prompt_len=9))
    engine.apply(Step(1))
    engine.apply(Add("b", prompt_len=20))
    engine.apply(Add("c", prompt_len=3))
    engine.apply(Step(4))
    v = engine.verify_recomputation()
    assert v.num_requests == 3
    assert v.max_kv_err < 1e-5 and v.max_logit_err < 1e-4
