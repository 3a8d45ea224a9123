"""A real model's context bounds a request, as vLLM's max_model_len does.

SmolLM2 was trained on 8,192 positions: a prompt that leaves none for a generated token is
refused, a request that fills the context finishes ("context"), a grow stops there, and a
beam search that would pass it is refused. The engine's rules are checked on tiny-byte with
a context of 40 patched in (an 8,192-token run is minutes on a CPU); SmolLM2's own limit,
read from its weight file, is checked by a refusal that costs no prefill.
"""

from __future__ import annotations

import json

import pytest

from backend.core.config import REAL_MODELS, SMOLLM2, EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.control import _upper_tokens
from backend.engine.engine import Engine
from backend.engine.ops import Add, Grow, Step
from backend.io.restore import restore_engine
from backend.io.snapshot import export_snapshot
from backend.sessions.summary import summarize
from backend.views.model import status_text

CONTEXT = 40


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setattr(EngineConfig, "context_length", property(lambda self: CONTEXT))
    return Engine(EngineConfig(num_blocks=64, block_size=4), kernel="torch")


def test_a_prompt_that_fills_the_context_is_refused_and_nothing_changes(engine: Engine) -> None:
    before = json.dumps(export_snapshot(engine))
    with pytest.raises(PagedLabError, match=(
            "a prompt of 40 tokens leaves no room in tiny-byte's context of 40 tokens for a "
            "generated token; it may hold 39 at most")):
        engine.apply(Add("A", prompt_len=CONTEXT))
    assert json.dumps(export_snapshot(engine)) == before
    # One short of it runs, and finishes with the token that fills it.
    engine.apply(Add("A", prompt_len=CONTEXT - 1))
    result = engine.apply(Step())
    req = engine.request("A")
    assert (req.status, req.finish_reason, req.num_tokens) == ("finished", "context", CONTEXT)
    assert status_text(export_snapshot(engine)["requests"][0]) == "finished (context full)"
    assert "finished A (context full: tiny-byte has no position left for a token)" in \
        summarize(result, export_snapshot(engine))


def test_a_step_finishes_a_request_at_the_context_however_many_it_was_asked_for(
        engine: Engine) -> None:
    engine.apply(Add("A", prompt_len=30))                  # no max_new_tokens limit
    engine.apply(Add("B", prompt_len=30, max_new_tokens=5))
    engine.apply(Step(20))
    a, b = engine.request("A"), engine.request("B")
    assert (a.finish_reason, a.num_tokens) == ("context", CONTEXT)
    assert (b.finish_reason, b.num_tokens) == ("max_new_tokens", 35)
    assert engine.idle


def test_a_grow_stops_at_the_context_and_says_how_far_it_got(engine: Engine) -> None:
    engine.apply(Add("A", prompt_len=30))
    result = engine.apply(Grow("A", 20))
    req = engine.request("A")
    assert (req.finish_reason, req.num_tokens) == ("context", CONTEXT)
    assert ("finished A (the model's context reached after 10 of the 20 asked)"
            in summarize(result, export_snapshot(engine)))


def test_a_beam_search_that_would_pass_the_context_is_refused(engine: Engine) -> None:
    with pytest.raises(PagedLabError, match=(
            "a beam search of max_new_tokens 20 from a prompt of 30 tokens would pass "
            "tiny-byte's context of 40 tokens; ask for at most 10")):
        engine.apply(Add("A", prompt_len=30, beam_width=2, max_new_tokens=20))
    assert not engine.requests
    engine.apply(Add("A", prompt_len=30, beam_width=2, max_new_tokens=10))
    engine.apply(Step(12))
    assert all(r.num_tokens <= CONTEXT for r in engine.requests.values())


def test_a_snapshot_past_the_context_is_refused_and_one_finished_there_restores(
        engine: Engine) -> None:
    engine.apply(Add("A", prompt_len=30))
    engine.apply(Step(10))
    snap = export_snapshot(engine)
    assert snap["requests"][0]["finish_reason"] == "context"
    assert export_snapshot(restore_engine(snap, kernel="torch")) == snap
    # The same tokens on a request still running: it would have finished.
    running = Engine(EngineConfig(num_blocks=64, block_size=4), kernel="torch")
    running.apply(Add("A", prompt_len=30))
    running.apply(Step(9))
    assert running.request("A").num_tokens == CONTEXT - 1
    row = export_snapshot(running)
    row["requests"][0]["tokens"].append(7)
    row["requests"][0]["num_tokens"] += 1
    with pytest.raises(PagedLabError, match="40 tokens fill tiny-byte's context of 40, so it "
                                            "would have finished, but it is running"):
        restore_engine(row, kernel="torch")
    # Finished, but holding more than the context: no run could have written it.
    past = json.loads(json.dumps(snap))
    past["requests"][0]["tokens"].append(7)
    past["requests"][0]["num_tokens"] += 1
    with pytest.raises(PagedLabError, match="41 tokens pass tiny-byte's context of 40, so it "
                                            "could not hold them"):
        restore_engine(past, kernel="torch")


def test_smollm2s_context_is_its_weight_files_and_bounds_a_prompt() -> None:
    # The dims are checked against the GGUF's llama.* metadata when the weights load, its
    # llama.context_length included.
    assert REAL_MODELS[SMOLLM2].context_length == 8192
    e = Engine(EngineConfig.for_model(SMOLLM2, num_blocks=600, block_size=16),
               kernel="torch")
    with pytest.raises(PagedLabError, match="a prompt of 8,192 tokens leaves no room in "
                                            "smollm2-135m's context of 8,192 tokens"):
        e.apply(Add("A", prompt_tokens=tuple([42] * 8192)))
    assert not e.requests


def test_the_control_runs_pool_counts_no_token_past_the_context(engine: Engine) -> None:
    # Sized for what each request may reach: past its context, none does.
    assert _upper_tokens(engine.config, Add("A", prompt_len=30), iterations=100) == CONTEXT
    assert _upper_tokens(engine.config, Add("A", prompt_len=30, max_new_tokens=5),
                         iterations=100) == 35
