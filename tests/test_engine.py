"""The engine against contiguous recomputation, and its all-or-nothing operations.

These run the real model and the real Triton kernels (under the interpreter on
a CPU) at small sizes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Shuffle, Step
from backend.engine.results import Verification
from backend.engine.sampling import sample_token
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot, snapshot_json
from backend.models.batch import ForwardBatch, ForwardOutput
from backend.sessions.summary import summarize
from backend.views.verify import verdict

NAN = float("nan")


def make(kernel: str = "auto", kv_fill: float | None = NAN, **cfg: object) -> Engine:
    # Unwritten cache slots hold NaN: a kernel that reads past a sequence's
    # length, or a block that was never copied, poisons the output.
    return Engine(EngineConfig.from_json(cfg), kernel=kernel, kv_fill=kv_fill)


def run(engine: Engine, ops: list[Op]) -> Engine:
    for op in ops:
        engine.apply(op)
        engine.check_integrity()
    return engine


def kv_through_table(engine: Engine, rid: str) -> list[torch.Tensor]:
    """Every layer's K and V for the request's tokens, read through its block table."""
    slots = engine.manager.slots_of(rid, 0, engine.request(rid).num_tokens)
    layers = [engine.cache.read_slots(layer, slots) for layer in range(engine.config.num_layers)]
    return [k for k, _ in layers] + [v for _, v in layers]


def tokens(engine: Engine) -> dict[str, list[int]]:
    return {r.id: list(r.tokens) for r in engine.requests.values()}


WORKLOAD: list[Op] = [
    Add("A", prompt="The quick brown fox", max_new_tokens=9),
    Add("B", prompt="The quick brown cat jumps", max_new_tokens=6),
    Step(2),
    Add("C", prompt_len=7, max_new_tokens=12),
    Grow("C", 3),
    Step(4),
    Add("D", prompt="The quick brown fox", max_new_tokens=5),
    Step(3),
]


@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize("allocation", ["fifo", "random"])
def test_paged_generation_equals_contiguous_recomputation(kernel: str, allocation: str) -> None:
    e = run(make(kernel, num_blocks=24, block_size=4, allocation=allocation, seed=3), WORKLOAD)
    assert e.kernel_report.max_abs_err is not None and e.kernel_report.max_abs_err < 1e-5
    checked = 0
    for req in e.requests.values():
        ref = e.model.forward_contiguous(req.tokens)
        # Every generated token is what the contiguous model's logits sample.
        for p in range(req.prompt_len, req.num_tokens):
            assert sample_token(ref.logits[p - 1], e.config.seed, req.id, p) == req.tokens[p]
            checked += 1
        if req.status == "running":
            # And the cache holds the contiguous model's K/V, slot by slot.
            got = kv_through_table(e, req.id)
            want = [*ref.keys, *ref.values]
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert checked == 9 + 6 + 10 + 3  # A, B and D reach max_new_tokens; C has 10 so far


def test_shuffle_changes_no_output() -> None:
    plain = run(make(num_blocks=20, block_size=4), WORKLOAD)
    shuffled_ops = [*WORKLOAD[:3], Shuffle(5), *WORKLOAD[3:6], Shuffle(), *WORKLOAD[6:]]
    moved = run(make(num_blocks=20, block_size=4), shuffled_ops)
    assert tokens(moved) == tokens(plain)
    assert sum(1 for e in moved.events if e.kind == "move") > 0
    for rid in moved.running:
        assert moved.block_table(rid) != plain.block_table(rid)
        for a, b in zip(kv_through_table(moved, rid), kv_through_table(plain, rid), strict=True):
            assert torch.equal(a, b)


def test_prefix_hit_gives_the_same_outputs_as_a_cold_run() -> None:
    system = "You are a helpful assistant. Answer briefly. "
    warm = run(make(num_blocks=40, block_size=4),
               [Add("S", prompt=system + "Hi", max_new_tokens=2), Step(2)])
    assert warm.request("S").status == "finished"
    warm.apply(Add("Q", prompt=system + "What is paging?", max_new_tokens=8))
    hits = [e for e in warm.events if e.kind == "prefix_hit" and e.request == "Q"]
    assert len(hits) == len(system.encode()) // 4
    run(warm, [Step(8)])
    cold = run(make(num_blocks=40, block_size=4, prefix_caching=False),
               [Add("Q", prompt=system + "What is paging?", max_new_tokens=8), Step(8)])
    assert warm.request("Q").tokens == cold.request("Q").tokens


def test_prefix_hit_prefill_computes_only_the_suffix() -> None:
    e = run(make(num_blocks=16, block_size=4), [Add("A", prompt="abcdefghijkl", max_new_tokens=3)])
    e.apply(Add("B", prompt="abcdefghijklmn"))
    # 14 tokens, 3 full blocks cached: only the 2 suffix tokens are computed.
    assert e.kernel_report.num_query_tokens == 2
    assert e.metrics().allocator.prefix_hit_blocks == 3


def test_copy_on_write_never_changes_the_other_sharer() -> None:
    e = run(make(num_blocks=16, block_size=4), [Add("A", prompt="The cat sat", max_new_tokens=20),
                                                Fork("A", "A2")])
    before = kv_through_table(e, "A")
    run(e, [Grow("A2", 5)])
    cows = [ev for ev in e.events if ev.kind == "cow"]
    assert len(cows) == 1 and cows[0].request == "A2"
    for a, b in zip(kv_through_table(e, "A"), before, strict=True):
        assert torch.equal(a, b)
    # The child's copy holds the same data in the copied slots.
    assert e.block_table("A")[:2] == e.block_table("A2")[:2]
    child = kv_through_table(e, "A2")
    for a, b in zip(child, before, strict=True):
        assert torch.equal(a[:11], b)
    run(e, [Grow("A", 2)])
    assert e.request("A").tokens[:11] == e.request("A2").tokens[:11]


def test_fork_children_diverge_from_the_parent() -> None:
    e = run(make(num_blocks=32, block_size=4),
            [Add("A", prompt="Once upon a time", max_new_tokens=10), Fork("A", "B"),
             Fork("A", "C"), Step(10)])
    texts = {r.id: r.tokens for r in e.requests.values()}
    assert texts["A"][:16] == texts["B"][:16] == texts["C"][:16]
    assert len({tuple(t) for t in texts.values()}) == 3
    assert all(r.status == "finished" and r.finish_reason == "max_new_tokens"
               for r in e.requests.values())
    assert e.metrics().allocator.used_blocks == 0


def test_preemption_and_recomputation_give_the_same_tokens() -> None:
    ops: list[Op] = [Add(r, prompt_len=6, max_new_tokens=14) for r in "ABCD"] + [Step(16)]
    roomy = run(make(num_blocks=64, block_size=4, prefix_caching=False), ops)
    tight = run(make(num_blocks=12, block_size=4, prefix_caching=False), ops)
    assert tight.manager.preemptions > 0
    assert sum(r.num_preemptions for r in tight.requests.values()) == tight.manager.preemptions
    assert any(e.kind == "preempt" for e in tight.events)
    done = [r for r in tight.requests.values() if r.status == "finished"]
    assert done
    for r in done:
        assert r.tokens == roomy.request(r.id).tokens


def test_most_recently_admitted_is_preempted() -> None:
    e = run(make(num_blocks=6, block_size=2, prefix_caching=False),
            [Add("A", prompt="aaa"), Add("B", prompt="bbb"), Add("C", prompt="c")])
    assert e.apply(Step()).preempted == ()  # every token fits a partly filled block
    # 5 of 6 blocks used; A's growth takes the last free one, B's preempts C.
    r = e.apply(Step())
    assert r.preempted == ("C",)
    assert list(e.waiting) == ["C"]
    assert e.request("C").num_preemptions == 1


def test_continuous_batching_admits_waiting_requests_as_blocks_free_up() -> None:
    e = run(make(num_blocks=3, block_size=4, prefix_caching=False),
            [Add("A", prompt="aaaaaaa", max_new_tokens=2), Add("B", prompt="bbbbbbb")])
    assert e.request("B").status == "waiting"
    # FCFS: a newcomer waits behind B even though it would fit.
    e.apply(Add("C", prompt="c"))
    assert [e.request(x).status for x in "BC"] == ["waiting", "waiting"]
    r = e.apply(Step(2))
    # A's 9th token took the last free block, and A finished in the same step.
    assert r.finished == ("A",) and r.admitted == ()
    r = e.apply(Step())
    assert r.admitted == ("B", "C")
    assert e.request("B").num_tokens == 8 and e.request("C").num_tokens == 2


def test_max_new_tokens_finishes_in_grow_and_releases_blocks() -> None:
    e = run(make(num_blocks=8, block_size=4), [Add("A", prompt="hello", max_new_tokens=3)])
    r = e.apply(Grow("A", 10))
    assert len(r.generated) == 3 and r.finished == ("A",)
    assert e.request("A").num_tokens == 8
    assert e.metrics().allocator.used_blocks == 0
    # The status line says why the Grow made 3 tokens of the 10 it asked for ...
    assert "· finished A (max new tokens reached after 3 of the 10 asked) ·" in summarize(
        r, export_snapshot(e))
    # ... and nothing of the kind when a Grow made all it asked for, finishing with them.
    e = run(make(num_blocks=8, block_size=4), [Add("B", prompt="hello", max_new_tokens=3)])
    r = e.apply(Grow("B", 3))
    assert r.finished == ("B",) and "· finished B ·" in summarize(r, export_snapshot(e))


def test_config_default_max_new_tokens_and_null_override() -> None:
    e = run(make(num_blocks=16, block_size=4, max_new_tokens=2),
            [Add("A", prompt="x"), Add("B", prompt="y", max_new_tokens=None), Step(4)])
    assert e.request("A").status == "finished" and e.request("A").num_generated == 2
    assert e.request("B").status == "running" and e.request("B").num_generated == 4


def test_a_request_that_outgrows_the_whole_pool_finishes() -> None:
    e = run(make(num_blocks=2, block_size=2, prefix_caching=False), [Add("A", prompt="abc")])
    r = e.apply(Step(3))
    assert e.request("A").finish_reason == "capacity" and "A" in r.finished
    assert e.request("A").num_tokens == 4
    # The status line says why, not only the block tables.
    assert "finished A (capacity: too long for the pool)" in summarize(r, export_snapshot(e))


def test_nine_tokens_fill_three_blocks_and_the_thirteenth_takes_a_fourth() -> None:
    e = run(make(num_blocks=16, block_size=4),
            [Add("A", prompt="123456789", blocks=(9, 2, 14))])
    assert e.block_table("A") == [9, 2, 14]
    assert e.metrics().allocator.internal_waste_slots == 3
    r = e.apply(Grow("A", 3))
    assert not any(ev.kind == "alloc" for ev in r.events)
    r = e.apply(Grow("A"))
    assert [ev.kind for ev in r.events] == ["alloc"]
    assert len(e.block_table("A")) == 4
    addr, key, _ = e.read_kv("A", 6)
    assert (addr.logical_block, addr.offset, addr.physical_block, addr.slot) == (1, 2, 2, 10)
    ref = e.model.forward_contiguous(e.request("A").tokens)
    torch.testing.assert_close(key, ref.keys[0][6].float(), atol=1e-5, rtol=1e-5)


REFUSED: list[tuple[Op, str]] = [
    (Grow("nope"), "does not exist"),
    (Grow("W"), "has not started"),
    (Grow("F"), "finished"),
    (Grow("A", 30), "free block"),
    (Grow("A", 40), "pool has only 10"),
    (Fork("W", "X"), "has not started"),
    (Fork("A", "B"), "already exists"),
    (Finish("F"), "already finished"),
    (Add("A", prompt="again"), "already exists"),
    (Add("F", prompt="again"), "already exists"),
    (Add("Z", prompt_len=80), "can never fit"),
    (Add("Z", prompt="abcdef", blocks=(0, 1)), "not free"),
    (Add("Z", prompt="abcdef", blocks=(3,)), "needs 2 blocks"),
    (Add("Z", prompt="abcdef", blocks=(3, 99)), "does not exist"),
    # An Add built in Python, not parsed from a scenario, is checked as one.
    (Add("Z", messages=(("tool", "hi"),)),
     r"messages\[0\]\.role must be one of system, user, assistant, got 'tool'"),
    (Add("Z", messages=(("user", 5),)), r"messages\[0\]\.content must be a string"),
    # Any operation built in Python is held to what parse_op holds a file to: these broke
    # the engine half-way (a TypeError), or were applied as empty operations and counted.
    (Step(0), r"count must be an integer in 1\.\.100,000, got 0"),
    (Step(2.5), r"count must be an integer in 1\.\.100,000, got 2\.5"),  # type: ignore[arg-type]
    (Step(10**12), r"count must be an integer in 1\.\.100,000"),
    (Grow("A", 0), r"tokens must be an integer in 1\.\.65,536, got 0"),
    (Grow("A", "2"), r"tokens must be an integer in 1\.\.65,536, got '2'"),  # type: ignore[arg-type]
    (Shuffle(-1), r"seed must be an integer in 0\.\."),
    (Add("Z"), "add needs exactly one of prompt, prompt_tokens, prompt_len, messages"),
    (Add("Z", prompt="ab", prompt_len=2), r"\(got prompt, prompt_len\)"),
    (Add("Z", prompt_len=-3), r"prompt_len must be an integer in 1\.\.65,536, got -3"),
    (Add("Z", prompt="ab", max_new_tokens=0), r"max_new_tokens must be an integer in 1\.\."),
    (Add("Z", prompt="ab", n=0), r"n must be an integer in 1\.\.64, got 0"),
    (Add("Z", prompt="ab", n=2, beam_width=2), "give n .* or beam_width .*, not both"),
    (Add("Z", prompt="\ud800"), "lone surrogate"),
    (Add("Z", prompt=5), "prompt must be a non-empty string, got 5"),  # type: ignore[arg-type]
    (Add("Z", prompt="ab", cache_salt=""), "cache_salt must be a non-empty string"),
    (Add(7, prompt="ab"), "request must be a non-empty string, got 7"),  # type: ignore[arg-type]
    (Fork("A", ""), "child must be a non-empty string"),
]


@pytest.mark.parametrize(("op", "message"), REFUSED, ids=[str(o) for o, _ in REFUSED])
def test_refused_operations_leave_the_engine_exactly_as_it_was(op: Op, message: str) -> None:
    e = run(make(num_blocks=10, block_size=4),
            [Add("A", prompt="abcdefgh", max_new_tokens=50), Add("B", prompt="ab"),
             Add("F", prompt="x"), Finish("F"), Add("W", prompt_len=30)])
    assert e.request("W").status == "waiting"
    before = snapshot_json(e)
    kv_before = kv_through_table(e, "A")
    with pytest.raises(PagedLabError, match=message):
        e.apply(op)
    assert snapshot_json(e) == before and e.broken is None
    for a, b in zip(kv_through_table(e, "A"), kv_before, strict=True):
        assert torch.equal(a, b)


def test_snapshot_round_trip_and_identical_continuation() -> None:
    ops: list[Op] = [Add("A", prompt="The cat sat", max_new_tokens=30), Fork("A", "A2"),
                     Grow("A2", 2), Step(3), Add("B", prompt="The cat sat on a mat"),
                     Finish("A"), Step(2)]
    e = run(make(num_blocks=24, block_size=4, allocation="random", seed=5, kv_fill=0.0), ops)
    text = snapshot_json(e)
    r = restore_engine(export_snapshot(e))
    assert snapshot_json(r) == text
    more: list[Op] = [Step(4), Add("C", prompt="The cat sat on a hat"), Shuffle(), Step(2)]
    run(e, more)
    run(r, more)
    a, b = export_snapshot(e), export_snapshot(r)
    # The kernel's wall time and rounding differ between two runs; nothing else may.
    assert a.pop("kernel")["backend"] == b.pop("kernel")["backend"]
    assert a == b


def test_kernel_report_names_backend_and_device() -> None:
    e = make(num_blocks=8, block_size=4)
    assert e.kernel_report.max_abs_err is None
    e.apply(Add("A", prompt="hi"))
    rep = e.kernel_report
    expect = "triton" if torch.cuda.is_available() else "triton-interpreter"
    assert (rep.backend, rep.device) == (expect, str(e.device))
    assert rep.max_abs_err is not None and rep.max_abs_err < 1e-5
    assert rep.time_ms is not None and rep.time_ms > 0 and not math.isnan(rep.time_ms)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_engine_tracks_the_reference(dtype: str) -> None:
    e = run(make(num_blocks=16, block_size=4, dtype=dtype),
            [Add("A", prompt="half precision", max_new_tokens=4), Step(3)])
    err = e.kernel_report.max_abs_err
    # The kernel accumulates in fp32 but its output is rounded to the dtype
    # (bf16 keeps 8 mantissa bits), while the reference stays fp32.
    assert err is not None and err < (2e-2 if dtype == "bfloat16" else 3e-3)
    assert e.config.bytes_per_block == 2 * 2 * 2 * 16 * 4 * 2


def test_a_prompt_that_leaves_no_room_for_a_token_is_refused() -> None:
    e = make(num_blocks=2, block_size=2, prefix_caching=False)
    with pytest.raises(PagedLabError, match="no block for its first generated token"):
        e.apply(Add("A", prompt="abcd"))
    with pytest.raises(PagedLabError, match="no block for its first generated token"):
        e.apply(Add("A", prompt="abcd", blocks=(1, 0)))
    assert e.requests == {}
    e.apply(Add("B", prompt="abc"))
    r = e.apply(Step(2))
    # Its 4th token fills the pool; a 5th would need a third block.
    assert r.finished == ("B",) and e.request("B").finish_reason == "capacity"


def test_set_kernels_keeps_the_state() -> None:
    e = run(make(num_blocks=8, block_size=4, kv_fill=0.0), [Add("A", prompt="hello")])
    before = snapshot_json(e)
    e.set_kernels("cpu" if not torch.cuda.is_available() else "cuda", "torch")
    assert e.kernels.name == "torch" and snapshot_json(e) == before
    e.apply(Grow("A"))
    assert e.kernel_report.backend == "torch"


def test_long_prompts_are_prefilled_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import backend.engine.runner as runner_module

    # 40 tokens x 4 heads: chunks of at most 3 query tokens at a 480-score budget.
    monkeypatch.setattr(runner_module, "PREFILL_BUDGET", 480)
    e = make(num_blocks=32, block_size=4)
    forward = e.model.forward
    query_lens: list[int] = []

    def counting(batch: ForwardBatch, *args: Any, **kwargs: Any) -> ForwardOutput:
        query_lens.append(int(batch.token_ids.numel()))
        return forward(batch, *args, **kwargs)

    monkeypatch.setattr(e.model, "forward", counting)
    run(e, [Add("A", prompt_len=40, max_new_tokens=5)])
    assert sum(query_lens) == 40 and max(query_lens) == 3 and len(query_lens) == 14
    run(e, [Step(5)])
    ref = e.model.forward_contiguous(e.request("A").tokens)
    for p in range(40, 45):
        assert sample_token(ref.logits[p - 1], e.config.seed, "A", p) == e.request("A").tokens[p]
    assert e.kernel_report.max_abs_err is not None and e.kernel_report.max_abs_err < 1e-5


def test_contiguous_pass_in_row_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import backend.models.tiny_byte as model_module

    e = make(num_blocks=16, block_size=4)
    tokens = list(b"chunked attention rows")
    whole = e.model.forward_contiguous(tokens)
    monkeypatch.setattr(model_module, "SCORE_BUDGET", 4 * 22 * 5)  # 5 rows per chunk
    chunked = e.model.forward_contiguous(tokens)
    torch.testing.assert_close(chunked.logits, whole.logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(chunked.keys, whole.keys, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_rows", [None, 3], ids=["one-pass", "row-chunks"])
def test_a_contiguous_pass_after_a_past_equals_the_whole_pass(
        monkeypatch: pytest.MonkeyPatch, chunk_rows: int | None) -> None:
    """Tokens computed after an earlier pass's keys and values (restore scores beams so,
    the shared prompt once) equal the same positions of one pass over everything."""
    import backend.models.tiny_byte as model_module

    e = make(num_blocks=16, block_size=4)
    tokens = [int(t) for t in torch.randint(32, 127, (23,))]
    whole = e.model.forward_contiguous(tokens)
    if chunk_rows is not None:
        monkeypatch.setattr(model_module, "SCORE_BUDGET", 4 * 23 * chunk_rows)
    past = e.model.forward_contiguous(tokens[:9])
    after = e.model.forward_contiguous(tokens[9:], past=past)
    assert past.length == 9 and after.length == 14
    torch.testing.assert_close(after.logits, whole.logits[9:], atol=1e-5, rtol=1e-5)
    for a, b in zip(after.keys, whole.keys, strict=True):
        torch.testing.assert_close(a, b[9:], atol=1e-5, rtol=1e-5)
    for a, b in zip(after.values, whole.values, strict=True):
        torch.testing.assert_close(a, b[9:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_rows", [None, 2], ids=["one-pass", "row-chunks"])
def test_branches_after_a_past_equal_one_pass_each(monkeypatch: pytest.MonkeyPatch,
                                                   chunk_rows: int | None) -> None:
    """Runs side by side in one pass, each a continuation of the past, give what each
    gives alone: no run sees another's keys, and each starts at the past's end."""
    import backend.models.tiny_byte as model_module

    e = make(num_blocks=16, block_size=4)
    if chunk_rows is not None:
        monkeypatch.setattr(model_module, "SCORE_BUDGET", 4 * 20 * chunk_rows)
    prefix = [int(t) for t in torch.randint(32, 127, (7,))]
    runs = [[int(t) for t in torch.randint(32, 127, (n,))] for n in (5, 1, 7)]
    past = e.model.forward_contiguous(prefix)
    both = e.model.forward_contiguous([t for r in runs for t in r], past=past,
                                      branches=[len(r) for r in runs])
    row = 0
    for run_ in runs:
        alone = e.model.forward_contiguous(prefix + run_)
        torch.testing.assert_close(both.logits[row:row + len(run_)],
                                   alone.logits[len(prefix):], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(both.keys[0][row:row + len(run_)],
                                   alone.keys[0][len(prefix):], atol=1e-5, rtol=1e-5)
        row += len(run_)
    with pytest.raises(ValueError, match="do not split"):
        e.model.forward_contiguous(runs[0], past=past, branches=[2, 2])


def test_verify_recomputation_catches_a_corrupted_block() -> None:
    e = run(make(num_blocks=16, block_size=4, kv_fill=0.0),
            [Add("A", prompt="The cat sat", max_new_tokens=20), Fork("A", "B"), Grow("B", 3),
             Step(2)])
    ok = e.verify_recomputation()
    assert (ok.num_requests, ok.num_tokens) == (2, 13 + 16)
    assert ok.max_kv_err < 1e-5 and ok.max_logit_err < 1e-4
    # Overwrite one slot of B's private copy: the kernel check cannot see it, this can.
    b = e.block_table("B")[2]
    e.cache.k[1][b, 0] += 1.0
    assert e.verify_recomputation().max_kv_err == pytest.approx(1.0, abs=1e-4)


def test_an_overflow_in_the_recomputation_is_not_called_a_paging_bug() -> None:
    """float16 ends at 65,504: logits past it are infinite in the engine and in the
    recomputation alike. Verify leaves those values out and judges the rest, instead of
    calling inf against inf a paging bug."""
    e = make("torch", dtype="float16", temperature=0, num_blocks=16, block_size=4)
    e.model.lm_head.mul_(1e5)         # the real head's logits reach about 3 * 10^5
    run(e, [Add("A", prompt="The cat sat", max_new_tokens=8), Step(2)])
    v = e.verify_recomputation()
    assert (v.kv_left_out, v.logit_values) == (0, 256) and 0 < v.logits_left_out < 256
    assert v.kv_values == 2 * 2 * 13 * 2 * 16        # layers x K,V x tokens x heads x dim
    kind, said = verdict(v, 1e-2, "float16")
    assert kind == "overflow"
    assert (f"{v.logits_left_out} of the 256 logits are NaN or infinite in the recomputation "
            "itself, in float16, and in the blocks too: the model overflows there, paged or "
            "not (float32 has the range to hold them), so they are left out. The rest agree, "
            "within 0.01") in said
    assert "paging bug" not in said and "disagree" not in said
    # A wrong block is still told beside the overflow.
    first, second = e.block_table("A")[:2]
    e.cache.k[0][second] = e.cache.k[0][first]
    kind, said = verdict(e.verify_recomputation(), 1e-2, "float16")
    assert kind == "disagree" and said.count("They disagree: the K/V differ by ") == 1
    assert f"a bug in the paging. {v.logits_left_out} of the 256 logits are NaN" in said


def test_an_overflow_in_one_layer_hides_no_wrong_block_in_another() -> None:
    """The last layer's values overflow float16 (and with them the logits): the first
    layer's are still compared value by value, and a block read in place of another
    there is a paging bug, not an overflow."""
    e = make("torch", dtype="float16", temperature=0, num_blocks=16, block_size=4)
    e.model.layers[-1]["wv"].mul_(1e6)
    run(e, [Add("A", prompt="The cat sat", max_new_tokens=8), Step(2)])
    v = e.verify_recomputation()
    # The last layer's 13 tokens x 2 heads x 16 values, and every logit.
    assert (v.kv_left_out, v.logits_left_out) == (13 * 2 * 16, 256)
    kind, said = verdict(v, 5e-2, "float16")
    assert kind == "overflow" and said.endswith(
        "all 256 logits are NaN or infinite in the recomputation itself, in float16, and in "
        "the blocks too: the model overflows there, paged or not (float32 has the range to "
        "hold them), so they are left out. The rest agree, within 0.05 of their largest "
        "value (of 1 where values are smaller): float rounding of float16.")
    assert "max |logits − recomputed|: none compared" in said
    first, second = e.block_table("A")[:2]
    e.cache.v[0][second] = e.cache.v[0][first]
    kind, said = verdict(e.verify_recomputation(), 5e-2, "float16")
    assert kind == "disagree" and "They disagree: the K/V differ by " in said
    # A block of the overflowing layer itself, zeroed: finite where the model overflows
    # is no overflow "paged or not" but a difference.
    e = make("torch", dtype="float16", temperature=0, num_blocks=16, block_size=4)
    e.model.layers[-1]["wv"].mul_(1e6)
    run(e, [Add("A", prompt="The cat sat", max_new_tokens=8), Step(2)])
    e.cache.v[-1][e.block_table("A")[1]] = 0.0
    kind, said = verdict(e.verify_recomputation(), 5e-2, "float16")
    assert kind == "disagree" and ("They disagree: the K/V differ from the recomputation by "
                                   "NaN or infinity") in said


def test_a_recomputation_overflowing_everywhere_judges_nothing() -> None:
    v = Verification(1, 4, 0.0, 0.0, kv_values=512, kv_left_out=512, logit_values=256,
                     logits_left_out=256)
    kind, said = verdict(v, 1e-3, "bfloat16")
    assert kind == "overflow" and "agree" not in said
    assert said.endswith(": none compared, max |logits − recomputed|: none compared. All 512 "
                         "keys and values and all 256 logits are NaN or infinite in the "
                         "recomputation itself, in bfloat16, and in the blocks too: the model "
                         "overflows there, paged or not, so they are left out. Nothing else "
                         "was compared.")


def test_one_value_left_out_is_said_in_the_singular_and_no_logits_is_no_agreement() -> None:
    v = Verification(1, 4, 0.0, 0.0, kv_values=512, kv_left_out=1)
    kind, said = verdict(v, 1e-3, "float32")
    assert kind == "overflow"
    assert ("1 of the 512 keys and values is NaN or infinite in the recomputation itself, in "
            "float32, and in the blocks too: the model overflows there, paged or not, so it is "
            "left out.") in said
    # Still prefilling: no logits were compared, and the verdict does not claim them.
    kind, said = verdict(Verification(1, 4, 0.0, 0.0, kv_values=512), 1e-3, "float32")
    assert kind == "agree" and "max |logits − recomputed|: none compared" in said
    assert "and the logits" not in said and "no request has logits yet" in said


def test_a_grow_refusal_counts_blocks_as_the_metrics_do() -> None:
    e = make("torch", num_blocks=8, block_size=4)
    e.apply(Add("A", prompt="abcdefgh"))          # two full blocks, cached once A finishes
    e.apply(Finish("A"))
    e.apply(Add("B", prompt="zyxwvuts"))          # two blocks each
    e.apply(Add("C", prompt="qponmlkj"))
    metrics = export_snapshot(e)["metrics"]
    assert (metrics["free_blocks"], metrics["cached_blocks"]) == (2, 2)
    with pytest.raises(PagedLabError) as refused:
        e.apply(Grow("B", 17))
    assert str(refused.value) == (
        "request 'B' needs 5 free blocks to grow by 17 tokens but only 4 can be taken "
        "(2 free, 2 cached); finish a request, or use step, which preempts")


def test_a_grow_refusal_says_when_max_new_tokens_leave_fewer_than_asked() -> None:
    """A grow decodes at most what the request's max new tokens leave: a refusal that
    counted those said "to grow by 7 tokens" for a grow of 50, without saying why."""
    e = make("torch", num_blocks=6, block_size=4)
    e.apply(Add("A", prompt="abcdefgh", max_new_tokens=9))     # two blocks each
    e.apply(Add("B", prompt="zyxwvuts"))
    assert export_snapshot(e)["metrics"]["free_blocks"] == 2
    with pytest.raises(PagedLabError) as refused:
        e.apply(Grow("A", 50))
    assert str(refused.value) == (
        "request 'A' needs 3 free blocks to grow by 9 tokens (its max new tokens leave 9 "
        "of the 50 asked) but only 2 are free; finish a request, or use step, which preempts")
    # The pool itself too small for them: the same words.
    e = make("torch", num_blocks=4, block_size=4)
    e.apply(Add("A", prompt="abcdefgh", max_new_tokens=9))
    with pytest.raises(PagedLabError) as refused:
        e.apply(Grow("A", 50))
    assert str(refused.value) == (
        "request 'A' would need 5 blocks for 17 tokens (its max new tokens leave 9 of the "
        "50 asked) but the pool has only 4")
