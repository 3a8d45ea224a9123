"""The physical-order what-if: a request's blocks read sorted by physical id, on a copy.

Table order must give the engine's pending logits back; physical order must
change what attention reads when the sorted table puts the partly filled
block elsewhere; and the engine itself must be left exactly as it was.
"""

from __future__ import annotations

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import parse_op
from backend.engine.whatif import physical_order
from backend.io.snapshot import export_snapshot
from backend.views.whatif import draw_note, outcome


def shuffled(**config: object) -> Engine:
    e = Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 4, **config}),
               kernel="torch")
    for op in ({"op": "add", "request": "A", "prompt": "Paging moves nothing:"},
               {"op": "add", "request": "B", "prompt": "Another one here"},
               {"op": "step", "count": 3}, {"op": "shuffle", "seed": 3}):
        e.apply(parse_op(op))
    return e


def test_table_order_gives_the_logits_back_and_physical_order_changes_them() -> None:
    e = shuffled()
    before = export_snapshot(e)
    keys = [t.clone() for t in e.cache.k]
    w = physical_order(e, "A")
    table = e.block_table("A")
    assert w.table_order.table == table and w.physical_order.table == sorted(table)
    assert not w.sorted_already
    # A has 24 tokens: 6 blocks, the last full; sorted, its first logical block
    # is elsewhere, and the last token's K/V lands in another block.
    assert w.table_order.logits_diff < 1e-4
    assert w.physical_order.logits_diff > 1e-2
    assert min(w.attention_diff) > 1e-3
    assert len(w.attention_diff) == e.config.num_layers
    # What the sorted table reads, block by block: the same blocks, another order.
    as_read = w.blocks_as_read(w.physical_order.table)
    assert sorted(map(tuple, as_read)) == sorted(map(tuple, w.blocks_as_read(table)))
    assert as_read != w.blocks_as_read(table)
    assert [t for block in as_read for t in block] != e.requests["A"].tokens
    # The engine is untouched: its state and its pool's tensors.
    assert export_snapshot(e) == before
    assert all(torch_equal(a, b) for a, b in zip(keys, e.cache.k, strict=True))


def torch_equal(a: object, b: object) -> bool:
    import torch

    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    return bool(torch.equal(a, b))


def test_a_sorted_table_reads_the_same_and_a_waiting_request_is_refused() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "Paging moves nothing:"}))
    w = physical_order(e, "A")
    assert w.sorted_already
    assert w.physical_order.logits_diff < 1e-4
    assert w.physical_order.next_token == w.table_order.next_token
    small = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    small.apply(parse_op({"op": "add", "request": "A", "prompt_len": 28}))
    small.apply(parse_op({"op": "add", "request": "W", "prompt_len": 12}))
    with pytest.raises(PagedLabError, match="must be running"):
        physical_order(small, "W")


def test_a_beam_has_no_drawn_next_token() -> None:
    # The beam search picks by cumulative log-probability; a sampled request draws.
    e = Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "hello there", "beam_width": 3,
                      "max_new_tokens": 20}))
    e.apply(parse_op({"op": "add", "request": "S", "prompt": "hello there"}))
    e.apply(parse_op({"op": "step"}))
    beam = physical_order(e, "A.0")
    assert beam.table_order.next_token is None and beam.physical_order.next_token is None
    assert draw_note(beam.table_order, 1.0, None) == ""
    assert isinstance(physical_order(e, "S").table_order.next_token, int)


def pinned(table: list[int]) -> Engine:
    """A of 9 tokens in blocks of 4, pinned to `table` (the seed's [9, 2, 14] and others)."""
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "Paged KV!", "blocks": table}))
    return e


def test_the_seeds_table_sorted_reads_the_same_slots_and_moves_nothing() -> None:
    e = pinned([9, 2, 14])
    w = physical_order(e, "A")
    t = e.requests["A"].tokens
    assert not w.sorted_already and w.physical_order.table == [2, 9, 14]
    # The partly filled block 14 stays last: the same slots, only float rounding moves.
    assert w.slots_read([9, 2, 14]) == [t[0:4], t[4:8], [t[8]]]
    assert w.slots_read([2, 9, 14]) == [t[4:8], t[0:4], [t[8]]]
    assert w.overwritten([9, 2, 14]) is None and w.overwritten([2, 9, 14]) is None
    assert not w.physical_changed
    assert w.physical_order.logits_diff <= w.tolerance
    assert w.physical_order.next_token == w.table_order.next_token
    assert w.last_block_stays
    assert "within float rounding" in outcome(w) and "stays last" in outcome(w)


def test_a_partly_filled_block_sorted_into_the_middle_is_read_with_its_empty_slots() -> None:
    e = pinned([14, 2, 9])
    w = physical_order(e, "A")
    t = e.requests["A"].tokens
    assert w.physical_order.table == [2, 9, 14]
    # Block 9 (A's last, 1 of 4 filled) is read whole; block 14 (A's first) is cut to
    # one slot, where this forward writes A's last token over its first.
    assert w.slots_read([2, 9, 14]) == [t[4:8], [t[8], None, None, None], [t[8]]]
    assert w.overwritten([2, 9, 14]) == 0 and w.overwritten([14, 2, 9]) is None
    assert w.physical_changed
    assert w.physical_order.logits_diff > 100 * w.tolerance
    assert not w.last_block_stays
    assert "another block is read last" in outcome(w)
    assert "what attention read changed, and with it the next-token distribution" in outcome(w)


def test_the_table_orders_next_token_is_the_one_the_engine_then_draws() -> None:
    """The what-if's "next token" through the table is the engine's own seeded draw for
    the position after the last token: drawn for the last token's position instead, it
    named a token the next step did not append (5 of these 6 steps)."""
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "The cat sat on",
                      "max_new_tokens": 20}))
    for _ in range(6):
        said = physical_order(e, "A").table_order.next_token
        e.apply(parse_op({"op": "step"}))
        assert said == e.requests["A"].tokens[-1]


def test_the_top_probabilities_are_over_the_tokens_the_model_may_emit() -> None:
    """tiny-byte emits printable bytes only (32..126) and its sampling renormalises over
    them; the what-if's table of the most likely next tokens is that distribution. Over
    all 256 bytes it listed tokens no step can emit, with probabilities too small."""
    import torch

    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "The cat sat on",
                      "max_new_tokens": 20}))
    e.apply(parse_op({"op": "step", "count": 2}))
    logits = e.requests["A"].logits
    assert logits is not None and logits.numel() == 256
    # Softmax over bytes 32..126 alone, in float64.
    printable = torch.softmax(logits.detach().cpu().double()[32:127], dim=0)
    values, indices = torch.topk(printable, 5)
    want = [(int(i) + 32, float(v)) for v, i in zip(values, indices, strict=True)]
    top = physical_order(e, "A").table_order.top
    assert [t for t, _ in top] == [t for t, _ in want]
    assert [p for _, p in top] == pytest.approx([p for _, p in want], abs=1e-5)


def test_logits_diff_is_the_largest_change_not_the_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if reports max |logits - pending|: one token's logit moved by 1.0 is a
    change of 1.0. Averaged over the 256 logits it read as 1/256 (0.0039), a change 256
    times smaller than the one made (under float16's tolerance of 0.05, the verdict would
    have called it float rounding)."""
    import torch

    from backend.models.batch import ForwardOutput

    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(parse_op({"op": "add", "request": "A", "prompt": "The cat sat on",
                      "max_new_tokens": 20}))
    e.apply(parse_op({"op": "step"}))
    req_logits = e.requests["A"].logits
    assert req_logits is not None
    pending = req_logits.detach().float().cpu().clone()
    spiked = pending.clone()
    spiked[70] = pending[70] + 1.0
    real = e.model.forward

    def forward(batch: object, cache: object, kernels: object, **kw: object) -> ForwardOutput:
        out = real(batch, cache, kernels, **kw)  # type: ignore[arg-type]
        return ForwardOutput(spiked.unsqueeze(0).to(out.logits.device), out.max_abs_err)

    monkeypatch.setattr(e.model, "forward", forward)
    w = physical_order(e, "A")
    assert float((spiked - pending).abs().max()) == pytest.approx(1.0, abs=1e-5)
    assert w.table_order.logits_diff == pytest.approx(1.0, abs=1e-5)
    assert w.physical_order.logits_diff == pytest.approx(1.0, abs=1e-5)
    # The engine's own pending logits are untouched by the what-if.
    after = e.requests["A"].logits
    assert after is not None and torch.equal(after.cpu(), req_logits.cpu())
