"""The address translator on a past state: translated from its snapshot alone.

`snapshot_address` must give, for every position, the address the live
engine's `read_kv` gave in the state the snapshot records (and refuse what it
refused); the Scenarios page must show the translation on a step it went back
to, where the live tensors already hold a newer state.
"""

from __future__ import annotations

import random

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Step
from backend.io.snapshot import export_snapshot
from backend.views.tokens import token_pieces
from backend.views.translate import (
    arithmetic_md,
    running_ids,
    snapshot_address,
    snapshot_request,
    token_md,
)
from tests.test_app import click, markdown
from tests.test_scenarios_app import open_tour, viewed_step


def _engine(seed: int, **cfg: object) -> Engine:
    """A small engine whose free blocks are handed out at random, so that block tables
    are scattered over the pool rather than 0, 1, 2, ..."""
    return Engine(EngineConfig.from_json({"num_blocks": 48, "block_size": 4, "seed": seed,
                                          "allocation": "random", "max_new_tokens": 40, **cfg}),
                  kernel="torch")


def _prompt(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefgh ,.!KV") for _ in range(rng.randint(1, 23)))


def _check_state(engine: Engine) -> int:
    """Every running request's every position, and a few past its end, translated from
    a snapshot taken now against the engine's own `read_kv`; the positions compared."""
    snap = export_snapshot(engine)
    assert running_ids(snap) == list(engine.running)
    bs = engine.config.block_size
    compared = 0
    for rid in engine.running:
        req = snapshot_request(snap, rid)
        for pos in range(engine.request(rid).num_tokens + 2):
            try:
                live, _key, _value = engine.read_kv(rid, pos, engine.config.num_layers - 1)
            except PagedLabError as exc:
                with pytest.raises(PagedLabError) as past:
                    snapshot_address(snap, rid, pos)
                assert str(past.value) == str(exc)
                continue
            assert snapshot_address(snap, rid, pos) == live
            # The lines a past step shows are the live panel's, word for word.
            assert (arithmetic_md(snapshot_address(snap, rid, pos), bs, req["block_table"])
                    == arithmetic_md(live, bs, engine.block_table(rid)))
            assert (token_md(req["tokens"], live, bs, lambda t: token_pieces(snap, t))
                    == token_md(engine.request(rid).tokens, live, bs, engine.token_pieces))
            compared += 1
    # A request that holds no device blocks is refused as the engine refuses it.
    for rid, req in engine.requests.items():
        if req.status != "running":
            with pytest.raises(PagedLabError) as past:
                snapshot_address(snap, rid, 0)
            with pytest.raises(PagedLabError) as live_exc:
                engine.read_kv(rid, 0)
            assert str(past.value) == str(live_exc.value)
    return compared


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_snapshot_address_is_read_kv_address(seed: int) -> None:
    rng = random.Random(seed)
    engine = _engine(seed)
    ops: list[Op] = [Add("A", prompt=_prompt(rng)), Add("B", prompt=_prompt(rng)), Step(2),
                     Fork("A", "A2"), Grow("B", rng.randint(1, 9)), Step(3),
                     Add("C", prompt=_prompt(rng), max_new_tokens=2), Finish("B"), Step(4)]
    compared = 0
    for op in ops:
        engine.apply(op)
        compared += _check_state(engine)
    assert compared > 100
    # Scattered: some table is not 0, 1, 2, ... (else an identity map would pass).
    tables = [engine.block_table(rid) for rid in engine.running]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in tables if t)


def test_snapshot_address_of_a_prompt_spread_over_steps() -> None:
    """A token budget computes a long prompt over steps: its table covers the computed
    tokens only, and positions past them are refused, live and past alike."""
    engine = _engine(5, max_num_batched_tokens=8)
    engine.apply(Add("A", prompt="a prompt of some thirty tokens, or so"))
    engine.apply(Step(1))
    snap = export_snapshot(engine)
    assert "num_computed_tokens" in snapshot_request(snap, "A")
    assert _check_state(engine) == snapshot_request(snap, "A")["num_computed_tokens"]


def test_scenarios_back_translates_the_past_step() -> None:
    """Scenario 02 narrates position 6's translation at step 2: after step 3, Back to
    step 2 shows it from step 2's snapshot, over the requests running then."""
    at = open_tour("02-block-table")
    for _ in range(3):
        click(at, "tour_next")
    assert viewed_step(at) == 3
    assert at.selectbox(key="tour_tr_req").options == ["A", "B"]
    click(at, "tour_back")
    assert viewed_step(at) == 2
    # Step 2 ran only A; B arrived at step 3.
    assert at.selectbox(key="tour_tr_req").options == ["A"]
    at.number_input(key="tour_tr_pos").set_value(6).run()
    assert not at.exception and not at.error
    text = markdown(at)
    assert ("position **6** ÷ block size **4** → logical block **1**, offset **2**" in text)
    assert "block table [9, 2, 14] → entry 1 is physical block **2**" in text
    assert "slot = 2 × 4 + 2 = **10**" in text
    captions = "\n".join(c.value for c in at.caption)
    # "Paged KV!": position 6 is "K", in logical block 1 with positions 4 to 7.
    assert "Token 75 ('K') · block 2 holds 'd' ' ' 'K' 'V'" in captions
    assert "read from the live K/V tensors, which hold the newest state: view step 3" in captions
    assert "tour_tr_chart" not in [c.key for c in at.get("vega_lite_chart")]
    # Out of range is refused by name, as on the live state.
    at.number_input(key="tour_tr_pos").set_value(10).run()
    assert any("Token position" in e.value for e in at.error)
