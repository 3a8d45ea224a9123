"""Restoring a snapshot that holds only CONTRACT.md's fields.

PagedLab's snapshots add `free_queue`, `prefix_cache`, `scheduler` and
`allocator`; a file another tool wrote lacks them, and restore derives them
(backend/io/restore_derive.py). The derivation is checked the strongest way
there is: every step of every shipped scenario, stripped of those fields (and
of each event's `ref_count`, which the contract does not list either),
restores to the engine that wrote it, so exporting it again gives the
original file. Random sequences (bench/soak.py, run by test_fuzz_engine.py)
end with the same check; here also with swap preemption, token budgets, beams
and samples, which the shipped scenarios use little.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Shuffle, Step
from backend.io import restore_derive, restore_queue
from backend.io.cli import main
from backend.io.restore import restore_engine
from backend.io.restore_derive import contract_only
from backend.io.restore_notes import derived_fields, restore_notes
from backend.io.scenario import load_scenario, run_steps
from backend.io.snapshot import export_snapshot
from backend.paging.hashing import block_digest
from bench.soak import contract_round_trip, soak_sequence
from tests.test_app import engine as app_engine
from tests.test_app import start
from tests.test_exports_app import upload

ROOT = Path(__file__).resolve().parents[1]
REBUILT = ("the file lacks free_queue (the order free blocks are handed out in), "
           "prefix_cache (the tokens behind each cached block), scheduler (the order of the "
           "request queues) and allocator (the random allocator's pick count), fields "
           "PagedLab's own snapshots add beyond the contract; they were rebuilt from its "
           "events, blocks and requests")
ALL_DERIVED = (f"{REBUILT}, so the next steps run as they would have in the run that wrote "
               "it (README, Snapshots)")

SCENARIOS = sorted((ROOT / "assets" / "scenarios").glob("*.json"))


def bare(snap: dict[str, Any]) -> dict[str, Any]:
    """`snap` with the contract's fields only, a copy to edit."""
    return copy.deepcopy(contract_only(snap))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_step_of_every_scenario_restores_from_the_contracts_fields(path: Path) -> None:
    sc = load_scenario(path)
    engine = Engine(sc.config, kernel="torch")
    seeded_shuffle = False
    for i, step, _ in run_steps(engine, sc.steps):
        seeded_shuffle |= isinstance(step.op, Shuffle) and step.op.seed is not None
        snap = export_snapshot(engine)
        problem = contract_round_trip(snap, exact_queue=not seeded_shuffle)
        assert problem is None, f"step {i}: {problem}"
    # The exception the README names: 11's shuffle gives a seed of its own.
    assert seeded_shuffle == (path.stem == "11-moving-blocks")


@pytest.mark.parametrize("config", [
    {"num_blocks": 10, "block_size": 4, "preemption": "swap", "num_cpu_blocks": 12},
    {"num_blocks": 12, "block_size": 2, "max_num_batched_tokens": 5, "max_num_seqs": 3},
    {"num_blocks": 9, "block_size": 4, "preemption": "swap", "num_cpu_blocks": 6,
     "max_num_batched_tokens": 7, "watermark_blocks": 1},
], ids=["swap", "budgets", "swap-and-budgets"])
def test_random_runs_with_swap_and_budgets_restore_from_the_contracts_fields(
        config: dict[str, Any]) -> None:
    # soak_sequence runs contract_round_trip after every operation (until a shuffle the
    # log cannot follow) and at the end, and raises if anything differs.
    for seed in range(3):
        soak_sequence({**config, "seed": seed}, seed=seed, num_ops=45, contract_every=1)


def test_a_shuffle_without_a_seed_is_planned_again_and_the_free_queue_is_exact() -> None:
    # The Playground's Shuffle gives no seed: its plan, and so where each never-filled
    # block went, follows from the config's seed and the step.
    e = Engine(EngineConfig.from_json({"num_blocks": 24, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=9), Add("B", prompt_len=6), Step(), Finish("B"),
               Shuffle(), Step(), Add("C", prompt_len=7), Shuffle(), Step()):
        e.apply(op)
    snap = export_snapshot(e)
    assert sum(ev["kind"] == "move" for ev in snap["events"]) > 0
    assert contract_round_trip(snap) is None


def test_random_allocation_continues_with_the_same_picks() -> None:
    cfg = EngineConfig.from_json({"num_blocks": 64, "block_size": 4, "allocation": "random"})
    e = Engine(cfg, kernel="torch")
    for op in (Add("A", prompt_len=9), Add("B", prompt_len=13), Step(), Finish("A"), Step()):
        e.apply(op)
    snap = export_snapshot(e)
    assert snap["allocator"]["random_picks"] > 0
    assert contract_round_trip(snap) is None
    # And the next blocks it hands out are the original's.
    restored = restore_engine(bare(snap), kernel="torch")
    for engine in (e, restored):
        engine.apply(Add("C", prompt_len=12))
    assert export_snapshot(restored)["requests"] == export_snapshot(e)["requests"]


def test_a_hand_written_snapshot_runs_on_like_the_run_it_describes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Written from CONTRACT.md alone: no PagedLab field, events without ref_count, no
    # prefix caching (so no hash to compute), the state after adding A.
    tokens = [72, 101, 108, 108, 111, 33]
    hand = {
        "schema_version": 1, "step": 1,
        "config": {"num_blocks": 8, "block_size": 4, "num_layers": 2, "num_heads": 4,
                   "num_kv_heads": 2, "head_dim": 16, "dtype": "float32", "device": "cpu",
                   "bytes_per_block": 2048, "prefix_caching": False, "allocation": "fifo",
                   "seed": 0},
        "blocks": [{"id": i, "state": "used" if i < 2 else "free", "ref_count": int(i < 2),
                    "num_filled": (4, 2)[i] if i < 2 else 0, "hash": None} for i in range(8)],
        "requests": [{"id": "A", "status": "running", "parent": None, "prompt_len": 6,
                      "num_tokens": 6, "block_table": [0, 1], "tokens": tokens,
                      "num_preemptions": 0}],
        "events": [{"step": 1, "kind": "alloc", "request": "A", "block": b} for b in (0, 1)],
        "metrics": {"used_blocks": 2, "free_blocks": 6, "cached_blocks": 0,
                    "filled_slots": 6, "internal_waste_slots": 2, "shared_blocks": 0,
                    "cow_copies": 0, "prefix_hit_blocks": 0, "preemptions": 0},
        "kernel": {"name": "paged_attention", "backend": "torch", "device": "cpu",
                   "max_abs_err": None},
    }
    snap = tmp_path / "hand.json"
    snap.write_text(json.dumps(hand))
    more = tmp_path / "more.json"
    more.write_text(json.dumps({"steps": [{"op": "step", "count": 3},
                                          {"op": "add", "request": "B", "prompt_len": 5}]}))
    out = tmp_path / "out.json"
    code = main(["run", str(more), "--from", str(snap), "--out", str(out), "--kernel", "torch"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err == f"note: {ALL_DERIVED}\n"
    # The same steps from the start give the same tokens and tables.
    fresh = Engine(EngineConfig.from_json({k: v for k, v in hand["config"].items()
                                           if k not in ("device", "bytes_per_block")}),
                   kernel="torch")
    fresh.apply(Add("A", prompt_tokens=tokens))
    fresh.apply(Step(3))
    fresh.apply(Add("B", prompt_len=5))
    got = json.loads(out.read_text())
    want = export_snapshot(fresh)
    for key in ("requests", "blocks", "metrics", "free_queue", "scheduler"):
        assert got[key] == want[key], key


def test_only_the_missing_fields_are_derived_and_named() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"), Finish("A"), Step()):
        e.apply(op)
    snap = export_snapshot(e)
    partial = {k: v for k, v in snap.items() if k != "free_queue"}
    restored = restore_engine(partial, kernel="torch")
    assert derived_fields(restored).names == ("free_queue",)
    assert restore_notes(restored) == [
        "the file lacks free_queue (the order free blocks are handed out in), a field "
        "PagedLab's own snapshots add beyond the contract; it was rebuilt from its events, "
        "blocks and requests, so the next steps run as they would have in the run that "
        "wrote it (README, Snapshots)"]
    assert export_snapshot(restored) == snap
    # A complete file derives nothing and says nothing.
    whole = restore_engine(copy.deepcopy(snap), kernel="torch")
    assert derived_fields(whole).names == () and restore_notes(whole) == []


def test_a_cached_block_whose_tokens_no_request_holds_is_refused_by_name() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt="abcdefghij"), Finish("A")):
        e.apply(op)
    snap = bare(export_snapshot(e))
    cached = next(b for b in snap["blocks"] if b["state"] == "cached")
    cached["hash"] = "0123456789abcdef"
    with pytest.raises(PagedLabError) as err:
        restore_engine(snap, kernel="torch")
    assert str(err.value) == (
        f"snapshot.blocks[{cached['id']}].hash 0123456789abcdef is not the key PagedLab gives "
        "any request's tokens: this cached block (no request holds it) needs its tokens to "
        "recompute its K/V, and without the prefix_cache PagedLab's snapshots add they are "
        "nowhere in the file. Copy the hash from a PagedLab snapshot of the same config, or "
        "list the block as free (hash null); README, Snapshots, says how a key is computed")
    # Listed as free instead, as the message says, the file restores.
    freed = bare(export_snapshot(e))
    block = freed["blocks"][cached["id"]]
    block.update(state="free", hash=None, num_filled=0)
    freed["metrics"]["cached_blocks"] -= 1
    freed["metrics"]["free_blocks"] += 1
    restore_engine(freed, kernel="torch")
    # A held block's hash that is no key of its own tokens is named as such.
    held = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    held.apply(Add("B", prompt="abcdefghij"))
    foreign = bare(export_snapshot(held))
    foreign["blocks"][0]["hash"] = "fedcba9876543210"
    with pytest.raises(PagedLabError) as err:
        restore_engine(foreign, kernel="torch")
    assert str(err.value).startswith("snapshot.blocks[0].hash fedcba9876543210 is not the key "
                                     "PagedLab gives the tokens of the request holding it")
    # With PagedLab's prefix_cache the same edit is named as it always was.
    full = export_snapshot(e)
    full["blocks"][cached["id"]]["hash"] = "0123456789abcdef"
    with pytest.raises(PagedLabError, match=r"is missing from snapshot\.prefix_cache"):
        restore_engine(full, kernel="torch")


def test_a_contract_only_file_is_still_checked_like_any_other() -> None:
    # Deriving fills in what is missing; it never makes an inconsistent file pass.
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"), Step()):
        e.apply(op)
    snap = bare(export_snapshot(e))
    snap["blocks"][0]["ref_count"] = 1          # A and B both hold it
    with pytest.raises(PagedLabError, match=r"block 0 has ref_count 1 but 2 block tables"):
        restore_engine(snap, kernel="torch")
    garbled = bare(export_snapshot(e))
    garbled["events"] = "none"
    with pytest.raises(PagedLabError) as err:
        restore_engine(garbled, kernel="torch")
    assert str(err.value).startswith("snapshot.events must be ")


def test_the_playground_restores_a_contract_only_upload_and_says_what_it_derived() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt="abcdefgh"), Add("B", prompt="abcdxyz"), Finish("A"), Step()):
        e.apply(op)
    snap = export_snapshot(e)
    at = upload(start(), json.dumps(bare(snap)).encode(), "other-tool.json")
    [message] = [s.value for s in at.success]
    assert message.startswith("Restored the snapshot in 'other-tool.json': step 4, ")
    assert message.endswith(f" Note: {ALL_DERIVED}.")
    restored = export_snapshot(app_engine(at))
    assert {k: v for k, v in restored.items() if k != "events"} == {
        k: v for k, v in snap.items() if k != "events"}


def test_beams_forked_beside_a_later_request_stay_beside_their_group() -> None:
    # B is admitted after A's beams; the beams A forks later still run beside A's group
    # (Scheduler.insert_fork), which the derived order repeats, from the `fork` events
    # or, in a log without them (CONTRACT lists `fork` as an addition), from the
    # `share` events that admit the new beams.
    e = Engine(EngineConfig.from_json({"num_blocks": 40, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=6, beam_width=3, max_new_tokens=6), Add("B", prompt_len=5),
               Step(3)):
        e.apply(op)
    snap = export_snapshot(e)
    running = snap["scheduler"]["running"]
    assert running[-1] == "B" and len(running) == 4, running
    assert contract_round_trip(snap) is None
    no_forks = bare(snap)
    no_forks["events"] = [ev for ev in no_forks["events"] if ev["kind"] != "fork"]
    assert export_snapshot(restore_engine(no_forks, kernel="torch"))["scheduler"] == \
        snap["scheduler"]


def test_a_preempted_request_the_log_does_not_show_is_still_requeued_first() -> None:
    # C was preempted (num_preemptions 1) and waits at the front of the queue, ahead of D,
    # which never ran; without its `preempt` event the count alone puts it there.
    e = Engine(EngineConfig.from_json({"num_blocks": 6, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=9), Add("C", prompt_len=9), Step(4), Add("D", prompt_len=4)):
        e.apply(op)
    snap = export_snapshot(e)
    waiting = snap["scheduler"]["waiting"]
    assert waiting == ["C", "D"], snap["scheduler"]
    assert contract_round_trip(snap) is None
    unlogged = bare(snap)
    unlogged["events"] = [ev for ev in unlogged["events"] if ev["kind"] != "preempt"]
    assert export_snapshot(restore_engine(unlogged, kernel="torch"))["scheduler"]["waiting"] \
        == waiting


def test_a_random_pool_that_evicted_continues_with_the_same_picks() -> None:
    # Evictions happen once every free block is cached; those blocks come from the
    # queue's front, not from a pick, so the count leaves them out.
    cfg = EngineConfig.from_json({"num_blocks": 8, "block_size": 4, "allocation": "random"})
    e = Engine(cfg, kernel="torch")
    for op in (Add("A", prompt_len=16), Add("B", prompt_len=12), Finish("A"), Finish("B"),
               Add("C", prompt_len=20)):
        e.apply(op)
    snap = export_snapshot(e)
    assert any(ev["kind"] == "evict" for ev in snap["events"])
    restored = restore_engine(bare(snap), kernel="torch")
    assert restored.manager.pool.random_picks == e.manager.pool.random_picks > 0
    assert contract_round_trip(snap) is None


@pytest.mark.parametrize("src", [99, -1])
def test_a_move_event_outside_the_pool_is_refused_by_the_strict_check(src: int) -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=6), Shuffle()):
        e.apply(op)
    snap = bare(export_snapshot(e))
    snap["events"].append({"step": 2, "kind": "move", "request": None, "block": 3,
                           "src": src, "dst": 3})
    with pytest.raises(PagedLabError) as err:
        restore_engine(snap, kernel="torch")
    assert str(err.value) == (f"inconsistent snapshot: events[{len(snap['events']) - 1}]: "
                              "it names a block outside the pool")


def test_derivation_past_its_bounds_is_refused_naming_the_field_to_give(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The bounds keep a hostile file from costing minutes; a real engine's file is far
    # below them, so they are lowered here to reach them with a small one.
    docs = (ROOT / "README.md").read_text() + (ROOT / "docs" / "CONTRACT.md").read_text()
    for bound in (restore_derive.MAX_HASHED_BLOCKS, restore_queue.MAX_SHUFFLE_WORK):
        assert docs.count(f"{bound:,}") >= 2, bound
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt="abcdefghijkl"), Finish("A"), Add("B", prompt_len=5), Shuffle(),
               Shuffle()):
        e.apply(op)
    snap = export_snapshot(e)
    monkeypatch.setattr(restore_derive, "MAX_HASHED_BLOCKS", 2)
    with pytest.raises(PagedLabError, match=r"^snapshot: without prefix_cache, .* more than 2 "
                                            r"blocks; give its prefix_cache \(PagedLab's"):
        restore_engine(bare(snap), kernel="torch")
    monkeypatch.setattr(restore_derive, "MAX_HASHED_BLOCKS", 100)
    monkeypatch.setattr(restore_queue, "MAX_SHUFFLE_WORK", 20)
    with pytest.raises(PagedLabError, match=r"^snapshot: without free_queue, .* pool of 16 "
                                            r"blocks are too many to replay \(more than 20 "):
        restore_engine(bare(snap), kernel="torch")
    # Given those fields, nothing needs deriving past a bound.
    restore_engine({**bare(snap), "free_queue": snap["free_queue"],
                    "prefix_cache": snap["prefix_cache"]}, kernel="torch")


def test_fields_ignored_and_fields_derived_are_both_said() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(Add("A", prompt="abcdefgh"))
    snap = bare(export_snapshot(e))
    snap["requests"][0]["colour"] = "blue"
    restored = restore_engine(snap, kernel="torch")
    assert restore_notes(restored) == [
        "snapshot.requests[0].colour is not a field PagedLab reads; it was ignored",
        ALL_DERIVED]


def test_a_log_that_frees_a_shared_block_once_still_queues_it_where_it_was_freed() -> None:
    # A tool may write a `free` only when a block is free at last, not one per reference
    # given up as PagedLab does; a block the counts never bring to 0 is queued at its
    # last `free` all the same.
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4,
                                       "prefix_caching": False}), kernel="torch")
    for op in (Add("A", prompt_len=10), Fork("A", "A2"), Finish("A"), Finish("A2")):
        e.apply(op)
    snap = export_snapshot(e)
    assert snap["free_queue"] == [3, 4, 5, 6, 7, 2, 1, 0]
    once = bare(snap)
    once["events"] = [ev for ev, full in zip(once["events"], snap["events"], strict=True)
                      if not (ev["kind"] == "free" and full["ref_count"] > 0)]
    assert export_snapshot(restore_engine(once, kernel="torch"))["free_queue"] == \
        snap["free_queue"]
    # Such a log does not contradict itself when the block is handed out again.
    e = Engine(EngineConfig.from_json({"num_blocks": 3, "block_size": 4,
                                       "prefix_caching": False}), kernel="torch")
    for op in (Add("A", prompt_len=3), Fork("A", "A2"), Finish("A"), Finish("A2"),
               Add("C", prompt_len=11)):
        e.apply(op)
    snap = export_snapshot(e)
    assert [b for r in snap["requests"] if r["id"] == "C" for b in r["block_table"]] == [1, 2, 0]
    once = bare(snap)
    once["events"] = [ev for ev, full in zip(once["events"], snap["events"], strict=True)
                      if not (ev["kind"] == "free" and full["ref_count"] > 0)]
    restored = restore_engine(once, kernel="torch")
    assert restore_notes(restored) == [ALL_DERIVED]
    assert export_snapshot(restored)["free_queue"] == snap["free_queue"]


def test_what_the_log_cannot_fix_is_said_in_the_note() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=6), Shuffle(seed=3), Step(), Shuffle(seed=4)):
        e.apply(op)
    notes = restore_notes(restore_engine(bare(export_snapshot(e)), kernel="torch"))
    # With a caveat, the first note no longer says the next steps run as they would have.
    assert notes == [f"{REBUILT} (README, Snapshots)",
                     "the log does not say where the shuffles of steps 2 and 4 "
                     "put the free blocks that hold no cached data, so their order in the "
                     "derived free_queue is a guess"]
    # The Playground's shuffle gives no seed: planned again, nothing to warn of.
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=6), Shuffle()):
        e.apply(op)
    assert restore_notes(restore_engine(bare(export_snapshot(e)), kernel="torch")) == \
        [ALL_DERIVED]
    # Under random allocation the pick count comes with its caveat.
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4,
                                       "allocation": "random"}), kernel="torch")
    e.apply(Add("A", prompt_len=6))
    notes = restore_notes(restore_engine(bare(export_snapshot(e)), kernel="torch"))
    assert notes[0] == f"{REBUILT} (README, Snapshots)"
    assert notes[1].startswith("under random allocation the log does not tell a pinned add's "
                               "blocks from picked ones")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda ev: ev.update(kind=["alloc"]),
     "snapshot.events[0]: malformed event (unknown event kind ['alloc'])"),
    (lambda ev: ev.pop("kind"), "snapshot.events[0]: missing field 'kind'"),
    (lambda ev: ev.pop("step"), "snapshot.events[0]: missing field 'step'"),
])
def test_a_malformed_event_is_named_as_with_every_field_present(edit: Any,
                                                                 message: str) -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4}), kernel="torch")
    e.apply(Add("A", prompt_len=6))
    for snap in (bare(export_snapshot(e)), export_snapshot(e)):
        edit(snap["events"][0])
        with pytest.raises(PagedLabError) as err:
            restore_engine(snap, kernel="torch")
        assert str(err.value) == message


def test_the_readme_recipe_for_a_blocks_hash_gives_pagedlabs_hash() -> None:
    # README, Snapshots: what a tool writing hashes of its own must compute.
    c = EngineConfig.from_json({"num_blocks": 8, "block_size": 4, "seed": 3})
    salt = f"pagedlab-1|seed=3|L={c.num_layers}|H={c.num_heads}|KVH={c.num_kv_heads}|" \
           f"D={c.head_dim}|{c.dtype}"
    assert salt in (ROOT / "README.md").read_text().replace(
        "seed=S|L=layers|H=heads|KVH=kv_heads|D=head_dim|dtype",
        f"seed=3|L={c.num_layers}|H={c.num_heads}|KVH={c.num_kv_heads}|D={c.head_dim}|"
        f"{c.dtype}")
    first = hashlib.sha256(salt.encode() + b"\0" + b"\0" + bytes([72, 105, 33, 10])) \
        .hexdigest()[:16]
    second = hashlib.sha256(salt.encode() + b"\0" + first.encode() + b"\0"
                            + bytes([5, 6, 7, 8])).hexdigest()[:16]
    e = Engine(c, kernel="torch")
    e.apply(Add("A", prompt_tokens=(72, 105, 33, 10, 5, 6, 7, 8, 1)))
    assert [b["hash"] for b in export_snapshot(e)["blocks"][:2]] == [first, second]
    # A real model's ids past 255: four bytes each (SmolLM2's salt, without loading it).
    real = EngineConfig.from_json({"num_blocks": 8, "block_size": 4, "model": "smollm2-135m"})
    assert real.cache_salt() == f"pagedlab-1|model=smollm2-135m|{real.dtype}"
    assert "`pagedlab-1|model=smollm2-135m|dtype`" in (ROOT / "README.md").read_text()
    wide = hashlib.sha256(real.cache_salt().encode() + b"\0" + first.encode() + b"\0"
                          + struct.pack("<4I", 5, 6, 7, 300)).hexdigest()[:16]
    assert block_digest(first, [5, 6, 7, 300], real.cache_salt()) == wide


def test_a_partial_log_is_kept_as_partial_through_its_exports() -> None:
    """PagedLab's own log holds every event, and restore holds a PagedLab file's log to
    that; a file with the contract's fields alone may not. Its engine's exports say so
    (events_partial), or a session saved from it (its snapshot an export) could never
    be reopened."""
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=10), Add("B", prompt_len=5), Finish("A")):
        e.apply(op)
    whole = export_snapshot(e)
    assert "events_partial" not in whole
    # A's free of block 1 left out: the log never gives it back.
    cut_whole = copy.deepcopy(whole)
    cut_whole["events"] = [ev for ev in cut_whole["events"]
                           if not (ev["kind"] == "free" and ev["block"] == 1)]
    with pytest.raises(PagedLabError, match=(
            r"^inconsistent snapshot: block 1 has ref_count 0, but the events leave it at 1 "
            r"\(events\[\d+\] last changed it\)$")):
        restore_engine(copy.deepcopy(cut_whole), kernel="torch")
    # The same log in a file with the contract's fields alone (its events keeping the
    # ref_count the contract leaves out, without which no count is checked): restored,
    # and kept partial.
    contract = bare(cut_whole)
    contract["events"] = copy.deepcopy(cut_whole["events"])
    restored = restore_engine(contract, kernel="torch")
    assert restored.log_partial
    # The user is told why, by the event that breaks the run, and what it means.
    partial = [n for n in restore_notes(restored) if "partial log" in n]
    assert partial == [
        "the event log does not lead to this state on its own: block 1 has ref_count 0, "
        "but the events leave it at 1 (events[1] last changed it); it is kept as a partial "
        "log, so the timeline and the counts read from it (swap-outs and returns) cover "
        "only the events it holds, and this engine's snapshots say events_partial"]
    again = export_snapshot(restored)
    assert again["events_partial"] is True
    assert export_snapshot(restore_engine(copy.deepcopy(again), kernel="torch")) == again
    # It runs on, and its later exports still say so.
    restored.apply(Step())
    assert export_snapshot(restored)["events_partial"] is True
    # A sound contract-only file keeps no such mark, nor a note; a whole file may claim it.
    sound = restore_engine(bare(copy.deepcopy(whole)), kernel="torch")
    assert "events_partial" not in export_snapshot(sound)
    assert not any("partial log" in n for n in restore_notes(sound))
    assert restore_engine({**copy.deepcopy(whole), "events_partial": True},
                          kernel="torch").log_partial
    with pytest.raises(PagedLabError,
                       match=r"snapshot\.events_partial must be true or false, got 'yes'"):
        restore_engine({**copy.deepcopy(whole), "events_partial": "yes"}, kernel="torch")


def test_a_log_that_contradicts_itself_is_said_to_leave_the_order_a_guess() -> None:
    """A log cut short at its start, or written by hand, restored with a guessed queue
    order and no word; the strict checks still hold the blocks and tables."""
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=10), Add("B", prompt_len=5), Finish("A")):
        e.apply(op)
    snap = bare(export_snapshot(e))
    assert restore_notes(restore_engine(copy.deepcopy(snap), kernel="torch")) == [ALL_DERIVED]
    # Cut short: the log starts after A's blocks were allocated, so it frees blocks it
    # shows no reference to (A held 0, 1, 2; B 3, 4).
    cut = copy.deepcopy(snap)
    cut["events"] = [ev for ev in cut["events"] if ev["kind"] != "alloc" or ev["block"] > 2]
    notes = restore_notes(restore_engine(cut, kernel="torch"))
    assert notes == [f"{REBUILT} (README, Snapshots)",
                     "the event log contradicts itself (events[2] frees block 2, which the log "
                     "shows no reference to; 3 such contradictions in all): it may be cut "
                     "short at its start or written by hand, so the derived free_queue's "
                     "order is a guess around those blocks"]
    # A block the file lists free that the log took and never gave back.
    kept = copy.deepcopy(snap)
    kept["events"] = [ev for ev in kept["events"]
                      if not (ev["kind"] == "free" and ev["block"] == 1)]
    assert restore_notes(restore_engine(kept, kernel="torch"))[1].startswith(
        "the event log contradicts itself (block 1 is free in the file, but the log never "
        "gives it back)")
    # Allocating a block the log shows held.
    twice = copy.deepcopy(snap)
    twice["events"].insert(1, {**twice["events"][0]})
    assert "(events[1] allocates block 0, which the log shows held" in \
        restore_notes(restore_engine(twice, kernel="torch"))[1]
    # Two blocks moved to one in a shuffle.
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=10), Shuffle(seed=3)):
        e.apply(op)
    moved = bare(export_snapshot(e))
    moves = [ev for ev in moved["events"] if ev["kind"] == "move"]
    moves[1]["dst"] = moves[0]["dst"]
    assert restore_notes(restore_engine(moved, kernel="torch"))[2].startswith(
        f"the event log contradicts itself (the shuffle of step 2 moves two blocks to block "
        f"{moves[0]['dst']})")


def test_a_logged_count_that_leaves_a_block_held_makes_its_next_alloc_a_contradiction() -> None:
    """Only a log without counts may free a block once, at last: where the log gives
    `ref_count` 1 after a free, an alloc of that block contradicts it."""
    e = Engine(EngineConfig.from_json({"num_blocks": 3, "block_size": 4,
                                       "prefix_caching": False}), kernel="torch")
    for op in (Add("A", prompt_len=3), Fork("A", "A2"), Finish("A"), Finish("A2"),
               Add("C", prompt_len=11)):
        e.apply(op)
    snap = copy.deepcopy(export_snapshot(e))
    for key in ("free_queue", "prefix_cache", "scheduler", "allocator"):
        snap.pop(key)
    # Keep the counts, but drop A2's free of block 0: the log leaves it held (count 1).
    last_free = max(i for i, ev in enumerate(snap["events"])
                    if ev["kind"] == "free" and ev["block"] == 0)
    del snap["events"][last_free]
    notes = restore_notes(restore_engine(snap, kernel="torch"))
    assert any("allocates block 0, which the log shows held" in n for n in notes), notes


def test_a_copy_on_write_gives_up_its_sources_reference_before_a_shuffle() -> None:
    """A forks B, both grow into their shared last block (A copies it on write, which
    gives up one of the source's references with no event of its own), B finishes and
    frees the source, and a Playground shuffle (no seed) moves the free blocks. Counting
    the source as still held by A, the rebuilt queue lost where the shuffle put it: the
    restored free_queue differed from the run's and the user was told it was a guess."""
    e = Engine(EngineConfig.from_json({"num_blocks": 12, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=5, max_new_tokens=30), Fork("A", "B"), Step(),
               Finish("B"), Shuffle(), Step()):
        e.apply(op)
    snap = export_snapshot(e)
    assert [ev["kind"] for ev in snap["events"]].count("cow") == 1
    assert sum(ev["kind"] == "move" for ev in snap["events"]) > 0
    restored = restore_engine(bare(snap), kernel="torch")
    assert export_snapshot(restored)["free_queue"] == snap["free_queue"]
    assert not any("does not say where" in n for n in restore_notes(restored))


def test_a_preemption_the_log_leaves_out_is_queued_after_the_logged_ones() -> None:
    """B, C and E were preempted (E first, so it waits third) and D added after: the queue
    is B, C, E, D. Without E's preempt event, E is known preempted only by its count, and
    was queued first: the next steps admitted E before B."""
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    for op in (Add("A", prompt_len=7), Add("B", prompt_len=7), Add("C", prompt_len=7),
               Add("E", prompt_len=7), Step(10), Add("D", prompt_len=4)):
        e.apply(op)
    snap = export_snapshot(e)
    assert snap["scheduler"]["waiting"] == ["B", "C", "E", "D"]
    edited = bare(snap)
    edited["events"] = [ev for ev in edited["events"]
                        if not (ev["kind"] == "preempt" and ev["request"] == "E")]
    restored = export_snapshot(restore_engine(edited, kernel="torch"))
    assert restored["scheduler"]["waiting"] == ["B", "C", "E", "D"]


def test_a_readmission_after_a_preemption_the_log_leaves_out_is_counted() -> None:
    """A request preempted (its preempt event left out: its blocks' frees remain) and
    admitted again counts two admissions: counting only logged preemptions as ends, the
    derived admissions were one short."""
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    for name in "ABC":
        e.apply(Add(name, prompt_len=7, max_new_tokens=6))
    back: list[str] = []
    for _ in range(14):
        e.apply(Step())
        back = [r.id for r in e.requests.values()
                if r.status == "running" and r.num_preemptions > 0]
        if back:
            break
    assert back
    snap = export_snapshot(e)
    edited = bare(snap)
    edited["events"] = [ev for ev in edited["events"]
                        if not (ev["kind"] == "preempt" and ev["request"] in back)]
    restored = export_snapshot(restore_engine(edited, kernel="torch"))
    assert restored["scheduler"] == snap["scheduler"]
    assert snap["scheduler"]["admissions"] == 3 + len(back)


def test_random_picks_count_copy_on_write_blocks() -> None:
    """Under random allocation a copy-on-write's new block is drawn like an alloc's: the
    derived pick count left the copies out, and the restored engine's next random block
    differed from the run's."""
    e = Engine(EngineConfig.from_json({"num_blocks": 16, "block_size": 4,
                                       "allocation": "random"}), kernel="torch")
    e.apply(Add("A", prompt_len=6, n=2, max_new_tokens=4))
    e.apply(Step(2))
    snap = export_snapshot(e)
    kinds = [ev["kind"] for ev in snap["events"]]
    assert "cow" in kinds and "evict" not in kinds
    assert e.manager.pool.random_picks == kinds.count("alloc") + kinds.count("cow")
    restored = restore_engine(bare(snap), kernel="torch")
    assert restored.manager.pool.random_picks == e.manager.pool.random_picks


def test_a_cached_block_holding_the_top_token_id_is_derived() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 8, "block_size": 4}), kernel="torch")
    top = e.config.vocab_size - 1
    e.apply(Add("A", prompt_tokens=(top, 1, 2, 3, 4, 5, 6, 7), max_new_tokens=1))
    e.apply(Finish("A"))
    snap = export_snapshot(e)
    assert snap["prefix_cache"]
    restored = export_snapshot(restore_engine(bare(snap), kernel="torch"))
    assert restored["prefix_cache"] == snap["prefix_cache"]
