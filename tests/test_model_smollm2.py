"""SmolLM2-135M-Instruct through the paged engine, against transformers as the oracle.

transformers' LlamaForCausalLM, loaded in float32 from the same GGUF file, is
an independent implementation of the same network: our logits must agree
with its at every position, through the contiguous pass and through the paged
kernels, and greedy generation must match it token for token while the
engine shares prefixes, moves blocks, forks and preempts.

Both models are loaded once per module (ours once per process: the registry
shares it with every engine).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from backend.core.config import SMOLLM2, EngineConfig
from backend.engine.engine import Engine
from backend.engine.kv_cache import KVCache
from backend.engine.ops import Add, Finish, Fork, Grow, Shuffle, Step
from backend.engine.results import logit_tolerance
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot
from backend.kernels import select_kernels
from backend.models import registry
from backend.models.batch import ForwardBatch
from backend.models.smollm2 import SmolLM2
from backend.views.model import finished_frame

pytestmark = pytest.mark.slow

# fp32 against fp32, 30 layers apart in summation order: observed <= 8e-5 on
# logits of magnitude ~40.
LOGIT_TOL = 5e-4


def real(**settings: Any) -> EngineConfig:
    return EngineConfig.for_model(SMOLLM2, **settings)


@pytest.fixture(scope="module")
def ours() -> SmolLM2:
    model = registry.build_model(real(), torch.device("cpu"))
    assert isinstance(model, SmolLM2)
    return model


def hf_logits(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def hf_greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return [int(t) for t in out[0, len(ids):]]


def prompts(model: SmolLM2) -> list[list[int]]:
    c = model.codec
    return [c.encode(s) for s in (
        "The capital of France is",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        c.render_chat([{"role": "user", "content": "Explain paged attention briefly."}]),
        "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9 \U0001f600 " * 6,
    )]


def test_greedy_continuation_of_the_capital_of_france_begins_paris(hf: Any) -> None:
    engine = Engine(real(temperature=0, num_blocks=16), kernel="torch")
    engine.apply(Add("A", prompt="The capital of France is", max_new_tokens=3))
    engine.apply(Step(3))
    req = engine.request("A")
    assert engine.model.codec.decode(req.tokens[req.prompt_len:]).startswith(" Paris.")
    assert engine.text("A").startswith("The capital of France is Paris.")
    assert hf_greedy(hf, req.tokens[:req.prompt_len], 3) == req.tokens[req.prompt_len:]


def test_logits_at_every_position_agree_with_transformers(ours: SmolLM2, hf: Any) -> None:
    for ids in prompts(ours):
        want = hf_logits(hf, ids)
        got = ours.forward_contiguous(ids)
        assert (got.logits - want).abs().max() <= LOGIT_TOL, len(ids)


def test_a_pass_after_a_past_equals_the_whole_pass(ours: SmolLM2) -> None:
    tokens = prompts(ours)[1]
    assert len(tokens) > 10
    whole = ours.forward_contiguous(tokens)
    after = ours.forward_contiguous(tokens[5:], past=ours.forward_contiguous(tokens[:5]))
    torch.testing.assert_close(after.logits, whole.logits[5:], atol=LOGIT_TOL, rtol=0)
    torch.testing.assert_close(after.keys[-1], whole.keys[-1][5:], atol=1e-4, rtol=1e-4)
    other = prompts(ours)[2]
    past = ours.forward_contiguous(tokens[:5])
    both = ours.forward_contiguous(tokens[5:] + other, past=past,
                                   branches=[len(tokens) - 5, len(other)])
    torch.testing.assert_close(both.logits[:len(tokens) - 5], whole.logits[5:],
                               atol=LOGIT_TOL, rtol=0)
    alone = ours.forward_contiguous(tokens[:5] + other)
    torch.testing.assert_close(both.logits[len(tokens) - 5:], alone.logits[5:],
                               atol=LOGIT_TOL, rtol=0)


def test_paged_logits_agree_in_one_packed_batch_with_scattered_blocks(ours: SmolLM2,
                                                                      hf: Any) -> None:
    """All prompts prefilled together through the paged kernels; then, in one batch, the
    longest one's second half as a chunk that reads the first half back from the cache
    and a decode token for the first prompt."""
    bs = 4
    seqs = prompts(ours)
    config = real(block_size=bs, num_blocks=128)
    cache = KVCache(config, torch.device("cpu"), fill=float("nan"))
    kernels = select_kernels("cpu", "torch")
    free = torch.randperm(128, generator=torch.Generator().manual_seed(5)).tolist()
    tables = [[free.pop() for _ in range(-(-len(ids) // bs))] for ids in seqs]

    def slots(table: list[int], start: int, stop: int) -> list[int]:
        return [table[p // bs] * bs + p % bs for p in range(start, stop)]

    long = max(range(len(seqs)), key=lambda i: len(seqs[i]))
    half = len(seqs[long]) // 2
    lengths = [half if i == long else len(ids) for i, ids in enumerate(seqs)]
    first = [(ids[:n], 0, slots(t, 0, n), t)
             for ids, t, n in zip(seqs, tables, lengths, strict=True)]
    out = ours.forward(ForwardBatch.build(first, cache.device), cache, kernels,
                       all_positions=True)
    assert out.max_abs_err is not None and out.max_abs_err < 1e-4
    row = 0
    for i, (ids, n) in enumerate(zip(seqs, lengths, strict=True)):
        want = hf_logits(hf, ids)[:n]
        assert (out.logits[row:row + n] - want).abs().max() <= LOGIT_TOL, i
        row += n
    ids, table = seqs[long], tables[long]
    assert long != 0
    # Prompt 0 has room for one more token in its last block or takes a new one.
    grown = seqs[0] + [int(hf_logits(hf, seqs[0])[-1].argmax())]
    if len(grown) > len(tables[0]) * bs:
        tables[0].append(free.pop())
    rest = ForwardBatch.build([
        (ids[half:], half, slots(table, half, len(ids)), table),
        (grown[-1:], len(grown) - 1, slots(tables[0], len(grown) - 1, len(grown)), tables[0]),
    ], cache.device)
    later = ours.forward(rest, cache, kernels, all_positions=True)
    chunk = len(ids) - half
    assert (later.logits[:chunk] - hf_logits(hf, ids)[half:]).abs().max() <= LOGIT_TOL
    assert (later.logits[chunk] - hf_logits(hf, grown)[-1]).abs().max() <= LOGIT_TOL


def test_greedy_generation_matches_transformers_through_sharing_moves_forks_and_preemption(
        hf: Any) -> None:
    n = 36
    config = real(temperature=0, block_size=4, num_blocks=28, max_new_tokens=n)
    # The kernel-against-reference check is other tests' job; this one is about tokens.
    engine = Engine(config, kernel="torch", check_reference=False)
    engine.apply(Add("A", prompt="Once upon a time, in a quiet village,"))
    engine.apply(Grow("A", 3))
    # B starts with A's first two full blocks: prefix hits.
    engine.apply(Add("B", prompt="Once upon a time, in a quiet village, there lived"))
    assert engine.manager.prefix_hit_blocks == 2
    # A2 shares all of A's blocks; its first token copies A's partial last block.
    engine.apply(Fork("A", "A2"))
    engine.apply(Add("C", prompt="The history of the printing press begins"))
    engine.apply(Step(6))
    engine.apply(Shuffle(11))
    # 28 blocks cannot hold four requests of ~48 tokens: the latest admitted are
    # preempted and recomputed later.
    engine.apply(Step(100))
    assert engine.manager.cow_copies >= 1
    assert any(e.kind == "move" for e in engine.events)
    assert engine.manager.preemptions >= 1
    for rid in ("A", "A2", "B", "C"):
        req = engine.request(rid)
        assert (req.status, req.finish_reason) == ("finished", "max_new_tokens"), rid
        generated = req.tokens[req.prompt_len:]
        assert len(generated) == n
        want = hf_greedy(hf, req.tokens[:req.prompt_len], n)
        assert generated == want, (rid, engine.model.codec.decode(generated),
                                   engine.model.codec.decode(want))


def test_the_triton_interpreter_agrees_with_the_torch_path() -> None:
    runs = {}
    for kernel in ("torch", "triton"):
        engine = Engine(real(temperature=0, block_size=8, num_blocks=8), kernel=kernel)
        engine.apply(Add("A", prompt="Paged attention stores"))
        engine.apply(Step(2))
        assert engine.kernel_report.max_abs_err is not None
        assert engine.kernel_report.max_abs_err < 1e-4
        req = engine.request("A")
        assert req.logits is not None
        runs[engine.kernels.name] = (req.tokens, req.logits)
    (t_tok, t_log), (i_tok, i_log) = runs["torch"], runs["triton-interpreter"]
    assert t_tok == i_tok
    assert (t_log - i_log).abs().max() <= LOGIT_TOL


def test_a_request_that_samples_end_of_sequence_finishes() -> None:
    engine = Engine(real(temperature=0, block_size=8, num_blocks=32), kernel="torch")
    question = (("user", "What is the capital of France?"),)
    engine.apply(Add("A", messages=question, max_new_tokens=20))
    engine.apply(Step(20))
    req = engine.request("A")
    assert (req.status, req.finish_reason) == ("finished", "eos")
    assert req.tokens[-1] == engine.model.eos_token_id == 2
    assert engine.text("A").endswith(
        "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>")
    # The Finished list shows the answer without the end-of-sequence token it ended on.
    finished = finished_frame(export_snapshot(engine)).set_index("request")
    assert finished.loc["A", "generated text"] == "The capital of France is Paris."
    # Its prompt by its last user turn: every chat's rendered template starts with the
    # same system turn, which filled the column.
    assert finished.loc["A", "prompt"] == "…user: What is the capital of France?"
    # grow stops at end-of-sequence too, before its count.
    engine.apply(Add("B", messages=question))
    engine.apply(Grow("B", 20))
    assert engine.request("B").tokens == req.tokens
    assert engine.request("B").finish_reason == "eos"
    # An answer that is the end of sequence alone says so, rather than an empty cell.
    snap = export_snapshot(engine)
    row = next(r for r in snap["requests"] if r["id"] == "A")
    row["tokens"] = [*row["tokens"][:row["prompt_len"]], 2]
    assert finished_frame(snap).set_index("request").loc["A", "generated text"] == (
        "(none: its first token was the end of sequence)")
    # Restore holds a finish reason to the tokens: these end on end-of-sequence.
    again = restore_engine(export_snapshot(engine), kernel="torch")
    assert [again.request(r).finish_reason for r in "AB"] == ["eos", "eos"]


def test_loaded_weights_are_handed_out_while_another_dtype_loads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A session switching to bfloat16 (seconds of loading) held up every other session
    # that needed the float32 weights already loaded.
    loaded = registry.preload(SMOLLM2, "float32", "cpu")
    reading, release = threading.Event(), threading.Event()
    original = registry.read_gguf

    def slow(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        release.wait(120)
        return original(*args, **kwargs)

    monkeypatch.setattr(registry, "read_gguf", slow)
    key = (SMOLLM2, "bfloat16", "cpu")
    registry._weights.pop(key, None)
    loader = threading.Thread(target=registry.preload, args=(SMOLLM2, "bfloat16", "cpu"))
    loader.start()
    try:
        assert reading.wait(60)
        got: list[Any] = []
        hit = threading.Thread(target=lambda: got.append(
            registry.preload(SMOLLM2, "float32", "cpu")))
        hit.start()
        hit.join(10)
        assert got == [loaded], "waited for another dtype's load"
    finally:
        release.set()
        loader.join(300)
        registry._weights.pop(key, None)    # give the memory back


def test_weights_are_loaded_once_under_concurrency_and_shared(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = registry.read_gguf

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(registry, "read_gguf", counted)
    key = (SMOLLM2, "bfloat16", "cpu")
    registry._weights.pop(key, None)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(
        registry.preload(SMOLLM2, "bfloat16", "cpu"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(calls) == 1 and len(got) == 3
        assert all(w is got[0] for w in got)
        assert got[0].embed.dtype == torch.bfloat16
        assert registry.is_loaded(SMOLLM2, "bfloat16", "cpu")
    finally:
        registry._weights.pop(key, None)    # give the memory back
    a = Engine(real(), kernel="torch")
    b = Engine(real(num_blocks=8), kernel="torch")
    assert isinstance(a.model, SmolLM2) and isinstance(b.model, SmolLM2)
    assert a.model.weights is b.model.weights
    card = registry.model_card(SMOLLM2)
    assert card.num_parameters == 134_515_008 and card.shared_weights
    assert card.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4


def test_random_prompts_on_the_real_model_are_its_tokens() -> None:
    engine = Engine(real(num_blocks=32), kernel="torch")
    engine.apply(Add("R", prompt_len=17))
    engine.apply(Finish("R"))
    again = Engine(real(num_blocks=32), kernel="torch")
    again.apply(Add("R", prompt_len=17))
    tokens = engine.request("R").tokens
    assert len(tokens) == 17 and tokens == again.request("R").tokens
    assert not set(tokens) & set(range(17))     # letters and spaces, no special tokens


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_two_byte_cache_agrees_with_its_recomputation_and_a_wrong_block_does_not(
        dtype: str) -> None:
    """Rounding in 2-byte types grows with SmolLM2's values (keys near 20, logits near
    30): the check allows the dtype's tolerance of the largest value, layer by layer,
    and still tells a block read in place of another, even in a layer whose values
    stay under 1."""
    def run() -> Engine:
        engine = Engine(real(dtype=dtype, temperature=0, block_size=4, num_blocks=16),
                        kernel="torch")
        engine.apply(Add("A", prompt="Paged attention stores keys", max_new_tokens=8))
        engine.apply(Step(2))
        return engine

    tol = logit_tolerance(dtype)
    engine = run()
    v = engine.verify_recomputation()
    assert v.max_kv_err > tol or v.max_logit_err > tol   # past the bare tolerance
    assert v.agrees(tol), (v, v.bounds(tol))
    first, second = engine.block_table("A")[:2]
    for layer in range(len(engine.cache.k)):
        keys = engine.cache.k[layer]
        keys[second] = keys[first]
    assert not engine.verify_recomputation().agrees(tol)
    # The first layer's values alone, judged against their own scale, not the keys'.
    engine = run()
    first, second = engine.block_table("A")[:2]
    values = engine.cache.v[0]
    values[second] = values[first]
    wrong = engine.verify_recomputation()
    assert wrong.kv_worst[1] < 2 and not wrong.agrees(tol), (wrong, wrong.bounds(tol))
    # Garbage is never agreement.
    engine.cache.k[3][second] = float("nan")
    assert engine.verify_recomputation().kv_worst[0] == float("inf")
