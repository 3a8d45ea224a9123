"""Restore recomputes every beam's cum_logprob from the model and refuses one it does
not give: a running, swapped, waiting (preempted for recomputation) or finished beam,
and a beam before its first round, whose score is 0. The scores come from the
forwards that rebuild the K/V where those cover a beam's tokens, else from one forward
per longest sequence the others leave; a snapshot in bfloat16 restores, its rounding
inside the bound."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.engine.results import logit_tolerance
from backend.io import restore_scores
from backend.io.recompute import recompute_kv
from backend.io.restore import restore_engine
from backend.io.restore_scores import BeamScores, check_beam_scores, longest
from backend.io.snapshot import export_snapshot
from backend.models.tiny_byte import TinyByteLM
from backend.sessions.budget import KVBudget
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Settings
from backend.sessions.rows import MIB, StoreLimits
from backend.sessions.saved import Live, Tab, new_id, resume, save
from backend.sessions.store import SessionStore, browser_key

# A runs beside a beam group in a 10-block pool: at its 9th step the group is
# preempted (to the waiting queue, or with "swap" to the host pool), with earlier
# rounds' beams finished ("dropped").
OPS = [{"op": "add", "request": "A", "prompt_len": 11, "max_new_tokens": 14},
       {"op": "add", "request": "B", "prompt_len": 6, "beam_width": 3, "max_new_tokens": 12}]


def run(steps: int, preemption: str = "recompute", **config: Any) -> Engine:
    e = Engine(EngineConfig.from_json({"num_blocks": 10, "block_size": 4,
                                       "preemption": preemption, "num_cpu_blocks": 32,
                                       **config}), kernel="torch")
    for op in OPS:
        e.apply(parse_op(op))
    for _ in range(steps):
        e.apply(parse_op({"op": "step"}))
    return e


def beams(e: Engine) -> dict[str, str]:
    """Each beam's status (finished ones by their reason)."""
    return {r.id: r.finish_reason or r.status for r in e.requests.values()
            if r.beam_width is not None}


STATES = {"running": lambda: run(4), "waiting": lambda: run(7),
          "swapped": lambda: run(7, "swap"), "done": lambda: run(20)}


@pytest.mark.parametrize("name", STATES)
def test_every_beam_is_scored_as_the_model_gives_it(name: str) -> None:
    e = STATES[name]()
    kinds = set(beams(e).values())
    assert "dropped" in kinds and (name == "done" or name in kinds)
    twin = restore_engine(export_snapshot(e), kernel="torch")
    found = recompute_kv(twin)
    assert set(found) == set(beams(e))
    for rid, score in found.items():
        assert e.requests[rid].cum_logprob == pytest.approx(score, abs=1e-4)


def test_a_beam_is_scored_a_chunk_of_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    e = STATES["done"]()
    monkeypatch.setattr(restore_scores, "_ROWS", 2)
    found = recompute_kv(restore_engine(export_snapshot(e), kernel="torch"))
    assert max(r.num_tokens - r.prompt_len for r in e.requests.values()) > 2
    for rid, score in found.items():
        assert e.requests[rid].cum_logprob == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("name", STATES)
def test_an_edited_score_is_refused_naming_the_beam(name: str) -> None:
    e = STATES[name]()
    snap = export_snapshot(e)
    seen = set()
    for i, row in enumerate(snap["requests"]):
        kind = beams(e).get(row["id"])
        if kind is None or kind in seen:
            continue
        seen.add(kind)
        bad = copy.deepcopy(snap)
        bad["requests"][i]["cum_logprob"] -= 0.05
        with pytest.raises(PagedLabError, match=rf"beam '{row['id']}' has cum_logprob "
                                                r".* the most float32 rounding explains"):
            restore_engine(bad, kernel="torch")
    assert seen == set(beams(e).values())


def test_edited_tokens_under_the_old_score_are_refused() -> None:
    """The check is of the pair: tokens a beam never chose make its score wrong too."""
    snap = export_snapshot(STATES["running"]())
    row = next(r for r in snap["requests"] if r.get("status") == "running" and "cum_logprob" in r)
    row["tokens"][-2] = 32 + (row["tokens"][-2] - 31) % 95    # another printable byte
    with pytest.raises(PagedLabError, match=f"beam '{row['id']}' has cum_logprob"):
        restore_engine(snap, kernel="torch")


def test_a_beam_before_its_first_round_scores_zero() -> None:
    snap = export_snapshot(run(0))
    [row] = [r for r in snap["requests"] if "cum_logprob" in r]
    assert row["cum_logprob"] == 0.0
    row["cum_logprob"] = -0.5
    with pytest.raises(PagedLabError, match="its 0 generated tokens a log-probability of 0 "):
        restore_engine(snap, kernel="torch")


def counting_forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the sequences tiny-byte's contiguous forward computes from now on."""
    forwards: list[int] = []
    plain = TinyByteLM.forward_contiguous

    def counted(self: TinyByteLM, tokens: list[int], past: Any = None,
                branches: Any = None) -> Any:
        forwards.append(len(tokens))
        return plain(self, tokens, past, branches)

    monkeypatch.setattr(TinyByteLM, "forward_contiguous", counted)
    return forwards


def test_finished_beams_are_scored_from_forwards_the_restore_makes_anyway(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped beam's tokens but its last are its parent's at that round: a running
    beam's forward, or one other dropped beam's, covers them. Every forward is reported
    to `progress`, and there are fewer than one per beam."""
    e = STATES["waiting"]()
    forwards = counting_forwards(monkeypatch)
    calls: list[tuple[int, int]] = []
    restore_engine(export_snapshot(e), kernel="torch",
                   progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(forwards), len(forwards))
    waiting_or_done = [r for r in e.requests.values()
                       if r.beam_width is not None and r.status != "running"]
    # A runs; the beams need forwards of their own, but fewer than there are beams.
    assert 1 < len(forwards) < 1 + len(waiting_or_done)


def test_longest_keeps_one_sequence_per_longest_of_its_kind() -> None:
    seqs = [[1, 2, 3], [1, 2], [1, 2, 4], [5], [1, 2, 4], [1, 2, 4, 6]]
    # [1, 2] begins [1, 2, 3] and [1, 2, 4, 6]; [1, 2, 4] begins [1, 2, 4, 6].
    assert longest(seqs) == [[5], [1, 2, 4, 6], [1, 2, 3]]
    assert longest([]) == []


def test_the_extra_forwards_share_the_prompt_and_skip_what_others_cover() -> None:
    """The beams of a finished search take their prompt (but its last token) once, then
    one suffix per longest sequence; a sequence a planned forward covers takes none."""
    e = STATES["done"]()
    scores = BeamScores(e)
    members = [r for r in e.requests.values() if r.beam_width is not None]
    [(prefix, passes)] = scores.extra_forwards([])
    assert len(passes) == 1                  # a few tokens each: one pass holds them
    suffixes = passes[0]
    assert prefix == members[0].tokens[:members[0].prompt_len - 1]
    assert len(suffixes) < len(members)
    assert longest([prefix + s for s in suffixes]) == [prefix + s for s in suffixes]
    for r in members:         # each beam's tokens but its last begin one of them
        assert any((prefix + s)[:r.num_tokens - 1] == r.tokens[:-1] for s in suffixes)
    best = max(members, key=lambda r: r.num_tokens)
    [(_, [fewer])] = scores.extra_forwards([best.tokens])
    assert len(fewer) < len(suffixes)


def test_a_pass_holds_at_most_its_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    e = STATES["done"]()
    monkeypatch.setattr(restore_scores, "PASS_TOKENS", 10)
    [(_, passes)] = BeamScores(e).extra_forwards([])
    assert len(passes) > 1
    for suffixes in passes:
        assert sum(map(len, suffixes)) <= 10 or len(suffixes) == 1
    twin = restore_engine(export_snapshot(e), kernel="torch")
    found = recompute_kv(twin)
    for rid, score in found.items():
        assert e.requests[rid].cum_logprob == pytest.approx(score, abs=1e-4)


def test_the_bound_is_twice_the_logit_tolerance_a_generated_token_plus_one() -> None:
    e = STATES["running"]()
    rid = next(r for r, kind in beams(e).items() if kind == "running")
    req = e.requests[rid]
    assert req.cum_logprob is not None
    bound = logit_tolerance("float32") * (2 * (req.num_tokens - req.prompt_len) + 1)
    check_beam_scores(e, {rid: req.cum_logprob + 0.9 * bound})
    with pytest.raises(PagedLabError, match=f"beam '{rid}'.*more than {bound:.3g} apart"):
        check_beam_scores(e, {rid: req.cum_logprob - 1.1 * bound})


def test_a_bfloat16_snapshot_of_smollm2_restores_with_its_scores() -> None:
    """bfloat16 rounding moved a score by up to 0.07 a token in runs like this one: the
    bound (0.4 a token) allows it, and still refuses an edit of several units."""
    e = Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 4,
                                       "model": "smollm2-135m", "dtype": "bfloat16"}),
               kernel="torch")
    e.apply(parse_op({"op": "add", "request": "B", "prompt": "The cat sat on the mat because",
                      "beam_width": 3, "max_new_tokens": 6}))
    e.apply(parse_op({"op": "step", "count": 5}))
    snap = export_snapshot(e)
    assert "dropped" in beams(e).values()
    twin = restore_engine(copy.deepcopy(snap), kernel="torch")
    assert beams(twin) == beams(e)
    row = next(r for r in snap["requests"] if r.get("status") == "running")
    row["cum_logprob"] -= 5.0
    with pytest.raises(PagedLabError, match="the most bfloat16 rounding explains"):
        restore_engine(snap, kernel="torch")


def test_an_engines_own_export_restores_without_scoring(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """`check_scores=False` (a saved session reopened, a failed operation undone, a move
    to another device) spends no forward on the beams: one per request holding K/V and
    per cached chain, as without beams. A saved session resumes that way."""
    e = STATES["done"]()
    snap = export_snapshot(e)
    forwards = counting_forwards(monkeypatch)
    restore_engine(copy.deepcopy(snap), kernel="torch")
    checked = len(forwards)
    forwards.clear()
    own = restore_engine(copy.deepcopy(snap), kernel="torch", check_scores=False)
    unchecked = len(forwards)
    assert export_snapshot(own) == export_snapshot(restore_engine(snap, kernel="torch"))
    assert unchecked < checked - 1          # a finished group: every beam needed a forward
    live = Live(e, Settings(e.config, "cpu", "torch"), History(), OpLog())
    live.history.record(snap)
    tab = Tab(SessionStore(tmp_path / "s.sqlite3", StoreLimits()), browser_key(new_id()))
    assert save(tab, live, snap) is None and tab.id is not None
    stored = tab.store.load(tab.id)
    assert stored is not None
    forwards.clear()
    again, _ = resume(stored, "o", budget=KVBudget(512 * MIB, 4096 * MIB))
    assert len(forwards) == unchecked
    assert again.engine.requests["B.0"].cum_logprob == e.requests["B.0"].cum_logprob
