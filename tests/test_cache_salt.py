"""A request's cache salt: prefix reuse needs the same keys, not only the same tokens.

A salted request's blocks are keyed under its salt (backend/paging/hashing.py,
`SaltRoot`): it shares cached blocks with requests of the same salt only. The
salt changes keys, never K/V: a salted request computes exactly what an
unsalted one does. Snapshots carry it and restore it exactly.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
import torch

from backend.core.config import EngineConfig
from backend.core.errors import IntegrityError, PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Step, describe_op, parse_op
from backend.io.restore import restore_engine
from backend.io.restore_derive import contract_only
from backend.io.scenario_export import op_to_json
from backend.io.snapshot import export_snapshot, snapshot_json
from backend.paging.block_manager import BlockManager
from backend.paging.hashing import (
    MAX_CACHE_SALT_CHARS,
    SaltRoot,
    block_digest,
    hash_prompt_blocks,
    salt_root,
    salt_root_digest,
)
from backend.sessions.forms import add_op
from backend.views.model import (
    BLOCK_TABLE_COLUMN,
    MIN_TABLE_PX,
    OPTIONAL_COLUMNS,
    REQUEST_COLUMN_WIDTHS,
    column_label,
    requests_frame,
    requests_layout,
)
from tests.test_engine import kv_through_table

PROMPT = list(b"You are a helpful assistant. Hi!")   # 32 tokens: 8 full blocks of 4


def manager() -> BlockManager:
    return BlockManager(64, 4, cache_salt="model-settings")


def test_the_same_tokens_share_only_under_the_same_salt() -> None:
    m = manager()
    m.allocate("A", PROMPT)
    b = m.allocate("B", PROMPT, cache_salt="tenant-b")
    c = m.allocate("C", PROMPT, cache_salt="tenant-b")
    d = m.allocate("D", PROMPT)
    f = m.allocate("F", PROMPT, cache_salt="tenant-f")
    # The last block holds the prompt's last token, computed by every request.
    assert b.hit_blocks == () and f.hit_blocks == ()
    assert c.hit_blocks == tuple(b.block_table[:7])
    assert d.hit_blocks == tuple(m.block_table("A")[:7])
    assert not set(b.block_table) & set(m.block_table("A"))
    m.check_integrity()


def test_a_plan_finds_the_hits_its_allocation_takes() -> None:
    m = manager()
    m.allocate("B", PROMPT, cache_salt="s")
    assert m.plan_prompt(PROMPT).hit_blocks == ()
    assert m.plan_prompt(PROMPT, cache_salt="s").hit_blocks == tuple(m.block_table("B")[:7])
    assert m.plan_prompt(PROMPT, cache_salt="t").num_new_blocks == 8


def test_blocks_filled_by_decoding_are_keyed_under_the_salt() -> None:
    m = manager()
    # Two tokens: no full block yet, so the first key is made by decoding.
    m.allocate("A", PROMPT[:2], cache_salt="s")
    for t in PROMPT[2:12]:
        m.append_one("A", t)
    m.fork("A", "A2")           # the child inherits the chain and its root
    m.append_one("A2", 7)
    m.check_integrity()
    m.free("A")
    m.free("A2")
    plain = m.allocate("P", PROMPT[:13])
    salted = m.allocate("S", PROMPT[:13], cache_salt="s")
    assert plain.hit_blocks == ()
    assert len(salted.hit_blocks) == 3
    m.check_integrity()


def test_a_salted_key_chains_from_the_salts_root() -> None:
    root = salt_root("model-settings", "tenant-b")
    assert root.tokens == () and root.parent is None and root.depth() == -1
    assert root.digest == salt_root_digest("model-settings", "tenant-b")
    # As docs/CONTRACT.md says, for a tool that computes keys itself.
    assert root.digest == hashlib.sha256(
        b"model-settings|cache_salt=tenant-b\x00\x00").hexdigest()[:16]
    assert root.digest == block_digest(None, (), "model-settings|cache_salt=tenant-b")
    keys = hash_prompt_blocks(PROMPT, 4, "model-settings", root)
    assert keys[0].parent_digest == root.digest and keys[0].depth() == 0
    assert keys[0].digest == block_digest(root.digest, PROMPT[:4], "model-settings")
    plain = hash_prompt_blocks(PROMPT, 4, "model-settings")
    assert {k.digest for k in keys}.isdisjoint(k.digest for k in plain)
    # The root names the salt and the model settings; it is no block's digest.
    others = {salt_root_digest("model-settings", "tenant-c"),
              salt_root_digest("other-model", "tenant-b"), *(k.digest for k in plain)}
    assert root.digest not in others


def test_without_prefix_caching_a_salt_changes_nothing() -> None:
    m = BlockManager(16, 4, prefix_caching=False)
    m.allocate("A", PROMPT[:9], cache_salt="s")
    assert m.seqs["A"].root is None and m.seqs["A"].last_hash is None
    m.check_integrity()


def test_the_integrity_check_names_a_root_of_another_salt() -> None:
    m = manager()
    m.allocate("A", PROMPT, cache_salt="s")
    m.seqs["A"].root = salt_root("model-settings", "t")
    with pytest.raises(IntegrityError, match="keyed under cache salt 's', and the request "
                                             "has cache salt 't'"):
        m.check_integrity()
    m.seqs["A"].root = SaltRoot("0" * 16, "s")
    with pytest.raises(IntegrityError, match="its cache salt's root key does not match"):
        m.check_integrity()


# ---- the engine ---------------------------------------------------------------

def engine(**config: Any) -> Engine:
    return Engine(EngineConfig(num_blocks=48, block_size=4, max_new_tokens=6, **config),
                  kernel="torch")


def run(e: Engine) -> None:
    e.apply(Add("A", prompt_tokens=tuple(PROMPT)))
    e.apply(Add("B", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))
    e.apply(Add("C", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b", n=2))
    e.apply(Fork("B", "B2"))
    e.apply(Grow("B2", 2))
    e.apply(Step(2))
    e.apply(Finish("B"))
    e.apply(Add("D", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))


def test_forks_and_samples_inherit_the_salt_and_hits_stay_within_it() -> None:
    e = engine()
    run(e)
    reqs = e.requests
    assert [reqs[r].cache_salt for r in ("A", "B", "B2", "C.0", "C.1")] == [
        None, "tenant-b", "tenant-b", "tenant-b", "tenant-b"]
    hits = {ev.request for ev in e.events if ev.kind == "prefix_hit"}
    assert hits == {"C.0", "D"}
    a_blocks = set(e.manager.block_table("A"))
    assert not a_blocks & set(e.manager.block_table("C.0"))
    e.check_integrity()


def test_a_salt_changes_keys_not_what_the_model_computes() -> None:
    """B under a salt generates, token for token, what B without one does; C, sharing
    B's salted blocks, holds in them the K/V a contiguous recomputation gives."""
    salted, plain = engine(), engine()
    salted.apply(Add("A", prompt_tokens=tuple(PROMPT)))
    salted.apply(Add("B", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))
    salted.apply(Add("C", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))
    plain.apply(Add("B", prompt_tokens=tuple(PROMPT)))
    for e in (salted, plain):
        e.apply(Grow("B", 5))
    assert salted.requests["B"].tokens == plain.requests["B"].tokens
    assert salted.manager.block_table("C")[:7] == salted.manager.block_table("B")[:7]
    for rid in ("A", "B", "C"):
        ref = salted.model.forward_contiguous(salted.requests[rid].tokens)
        for got, want in zip(kv_through_table(salted, rid), [*ref.keys, *ref.values],
                             strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_snapshots_carry_the_salt_and_restore_exactly() -> None:
    e = engine()
    run(e)
    text = snapshot_json(e)
    snap = json.loads(text)
    by_id = {r["id"]: r for r in snap["requests"]}
    assert "cache_salt" not in by_id["A"] and by_id["B2"]["cache_salt"] == "tenant-b"
    roots = [n for n in snap["prefix_cache"] if n["tokens"] == []]
    assert roots == [{"hash": salt_root_digest(e.config.cache_salt(), "tenant-b"),
                      "parent": None, "tokens": [], "cache_salt": "tenant-b"}]
    again = restore_engine(snap, kernel="torch")
    assert snapshot_json(again) == text
    # The restored engine goes on as the first: a new tenant-b request hits B's blocks.
    for x in (e, again):
        x.apply(Add("E", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))
    went_on = [{k: v for k, v in export_snapshot(x).items() if k != "kernel"} for x in (e, again)]
    assert went_on[0] == went_on[1]
    assert len([ev for ev in again.events if ev.kind == "prefix_hit" and ev.request == "E"]) == 7
    # From the contract's fields alone, the salted chains are derived from the requests.
    bare = restore_engine(copy.deepcopy(contract_only(json.loads(snapshot_json(e)))),
                          kernel="torch")
    # Less each event's ref_count, which the contract does not list.
    assert unlogged(export_snapshot(bare)) == unlogged(export_snapshot(e))


def unlogged(snap: dict[str, Any]) -> dict[str, Any]:
    return {**snap, "events": [{k: v for k, v in ev.items() if k != "ref_count"}
                               for ev in snap["events"]]}


def test_cached_salted_blocks_get_their_own_kv_back_from_a_restore() -> None:
    """Cached salted blocks no request holds are recomputed from their chain's tokens:
    a request that takes them back after a restore attends over the right K/V."""
    e = engine()
    e.apply(Add("A", prompt_tokens=tuple(PROMPT), cache_salt="s"))
    e.apply(Finish("A"))
    restored = restore_engine(json.loads(snapshot_json(e)), kernel="torch")
    for x in (e, restored):
        x.apply(Add("B", prompt_tokens=tuple(PROMPT), cache_salt="s"))
        assert len([ev for ev in x.events if ev.kind == "prefix_hit"]) == 7
        x.apply(Grow("B", 4))
    assert restored.requests["B"].tokens == e.requests["B"].tokens
    ref = restored.model.forward_contiguous(restored.requests["B"].tokens)
    for got, want in zip(kv_through_table(restored, "B"), [*ref.keys, *ref.values],
                         strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: _request(s, "D").__setitem__("cache_salt", "tenant-x"),
     "block 8's hash does not chain from the start: the block is keyed under cache salt "
     "'tenant-b', and the request has cache salt 'tenant-x'"),
    (lambda s: _request(s, "D").pop("cache_salt"),
     "keyed under cache salt 'tenant-b', and the request has no cache salt"),
    (lambda s: _request(s, "B2").__setitem__("cache_salt", "tenant-x"),
     "its cache salt is 'tenant-x', but that of 'B', which it came from, is 'tenant-b': a "
     "fork, sample or beam keeps the salt of the request it came from"),
    (lambda s: _request(s, "C.1").pop("cache_salt"),
     "its cache salt is none, but that of 'C.0', which it came from, is 'tenant-b'"),
    (lambda s: _request(s, "B2").__setitem__("cache_salt", "a\x00b"),
     "contains U\\+0000, which is not a printable character"),
    (lambda s: _request(s, "B2").__setitem__("cache_salt", 7), "cache_salt"),

    (lambda s: _root(s).__setitem__("cache_salt", "tenant-x"), "is not the root key"),
    (lambda s: _root(s).__setitem__("tokens", [1, 2, 3, 4]),
     "a key with no tokens is a cache salt's root"),
    (lambda s: _root(s).pop("cache_salt"), "a key with no tokens is a cache salt's root"),
])
def test_a_snapshot_with_a_wrong_salt_is_refused_by_name(edit: Any, message: str) -> None:
    e = engine()
    run(e)
    snap = json.loads(snapshot_json(e))
    edit(snap)
    with pytest.raises(PagedLabError, match=message):
        restore_engine(snap, kernel="torch")


def _request(snap: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(r for r in snap["requests"] if r["id"] == rid)


def _root(snap: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in snap["prefix_cache"] if n["tokens"] == [])


# ---- the formats and the form -----------------------------------------------------

def test_the_add_operation_reads_and_writes_its_salt() -> None:
    op = parse_op({"op": "add", "request": "B", "prompt": "hi", "cache_salt": "tenant-b"})
    assert isinstance(op, Add) and op.cache_salt == "tenant-b"
    assert op_to_json(op)["cache_salt"] == "tenant-b"
    assert parse_op(op_to_json(op)) == op
    assert "cache_salt" not in op_to_json(Add("A", prompt="hi"))
    assert describe_op(op) == "add B ('hi') salt 'tenant-b'"


@pytest.mark.parametrize(("salt", "message"), [
    ("", "cache_salt must be a non-empty string"),
    (3, "cache_salt must be a non-empty string"),
    ("x" * (MAX_CACHE_SALT_CHARS + 1), f"at most {MAX_CACHE_SALT_CHARS} characters"),
    ("tab\there", "contains U\\+0009, which is not a printable character"),
    ("no\xa0break", "contains U\\+00A0"),
    ("   ", "cache_salt must be a non-empty string"),
    (" a", "cache_salt ' a' begins or ends with a space"),
    ("a ", "begins or ends with a space"),
])
def test_a_bad_salt_is_refused_by_name(salt: Any, message: str) -> None:
    with pytest.raises(PagedLabError, match=message):
        parse_op({"op": "add", "request": "B", "prompt": "hi", "cache_salt": salt})


def test_the_add_form_salts_a_request_and_names_a_bad_salt_by_its_label() -> None:
    def form(salt: str | None) -> Add:
        return add_op(request="B", prompt="hi", prompt_len=None, max_new_tokens=None,
                      blocks=None, existing={}, vocab_size=256, cache_salt=salt)
    assert form("  tenant-b ").cache_salt == "tenant-b"
    assert form("   ").cache_salt is None and form(None).cache_salt is None
    with pytest.raises(PagedLabError, match=r"^Cache salt .* U\+0007, which is not a printable"):
        form("a\x07b")


def test_the_block_tables_show_a_salt_column_only_while_a_request_has_one() -> None:
    e = engine()
    e.apply(Add("A", prompt_tokens=tuple(PROMPT)))
    plain = requests_frame(export_snapshot(e))
    assert "cache salt" not in plain.columns
    e.apply(Add("B", prompt_tokens=tuple(PROMPT), cache_salt="tenant-b"))
    df = requests_frame(export_snapshot(e))
    assert list(df["cache salt"]) == ["", "tenant-b"]
    widths, _ = requests_layout(df)
    plain_widths, _ = requests_layout(plain)
    # The column takes its width from the block table's: the row is as wide as before.
    shown = sum(widths[c] for c in df.columns)
    assert shown == sum(plain_widths[c] for c in plain.columns)
    assert widths[BLOCK_TABLE_COLUMN] == plain_widths[BLOCK_TABLE_COLUMN] - widths["cache salt"]
    # Its header, too long for that width, is shown in short; the usual width keeps it.
    assert column_label(BLOCK_TABLE_COLUMN, widths[BLOCK_TABLE_COLUMN]) == "block table (L→P)"
    assert column_label(BLOCK_TABLE_COLUMN, plain_widths[BLOCK_TABLE_COLUMN]) is None
    assert column_label("cache salt", widths["cache salt"]) is None


def test_beside_beams_a_salt_column_widens_the_table_rather_than_squeeze_the_block_table(
        ) -> None:
    e = engine()
    e.apply(Add("A", prompt_tokens=tuple(PROMPT), beam_width=2, cache_salt="tenant-b"))
    df = requests_frame(export_snapshot(e))
    assert {"log p", "cache salt"} <= set(df.columns)
    widths, _ = requests_layout(df)
    assert widths[BLOCK_TABLE_COLUMN] == MIN_TABLE_PX
    # Wider than the usual row (which fits beside the sidebar of a 1366 px window).
    assert sum(widths[c] for c in df.columns) > sum(
        w for c, w in REQUEST_COLUMN_WIDTHS.items() if c not in OPTIONAL_COLUMNS)
