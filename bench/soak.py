"""Random-operation soak of the engine: every invariant after every operation.

Runs seeded random sequences of add / grow / fork / finish / step / shuffle
on small pools (several block sizes, fifo and random allocation, prefix
caching on and off), about a fifth of them invalid: unknown and duplicate
ids, pins that are not free, counts far past the pool or the format's
limits, malformed fields. Each operation goes in as the JSON a scenario
holds, through `parse_op`, so both the parser's and the engine's refusals
are exercised. After every operation `check_integrity` must pass; after
every refused one (PagedLabError) the snapshot must be byte-identical to the
one before it (CONTRACT.md: "the state is left exactly as it was"); any
other exception is a bug. Each sequence ends with an export, restore,
export round trip, which must give the same file, and with a restore from the
contract's fields alone (`contract_round_trip`), which must derive the rest.

    python bench/soak.py [--ops 200] [--seeds 4] [--first-seed 0] [--blocks 16]
                         [--full-every 1]

tests/test_fuzz_engine.py runs a small fixed set of these sequences on every
`make test`; this script runs as many and as long as asked. The snapshot
carries every event so far, so comparing whole snapshots costs more as a run
grows: `--full-every N` compares whole snapshots every N operations and, in
between, everything but the events list, which must keep its length and its
newest event.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import MAX_GROW_TOKENS, MAX_STEP_COUNT, parse_op
from backend.io.restore import restore_engine
from backend.io.restore_derive import contract_only
from backend.io.restore_notes import restore_notes
from backend.io.snapshot import export_snapshot

# Prompts share these openings, so prefix hits, cached blocks and evictions happen.
OPENINGS = ["The cat sat on the mat", "The cat sat", "Once upon a time", "abcdefgh"]


@dataclass
class SoakStats:
    """What a run did: operations applied and refused (by op), and allocator events."""

    applied: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)

    def add(self, other: SoakStats) -> None:
        self.applied.update(other.applied)
        self.refused.update(other.refused)
        self.events.update(other.events)


class SoakError(AssertionError):
    """An invariant broke: names the sequence, the operation and what went wrong."""


def soak_configs(num_blocks: int) -> list[dict[str, Any]]:
    """Pools of about `num_blocks` blocks (at least 48 token slots), in every mode."""
    configs = []
    for i, (block_size, allocation, caching) in enumerate([
            (1, "fifo", True), (2, "random", True), (4, "fifo", True), (4, "random", False),
            (8, "fifo", False), (16, "random", True), (3, "fifo", True), (4, "random", True)]):
        blocks = max(num_blocks + i % 3 - 1, -(-48 // block_size), 2)
        configs.append({"num_blocks": blocks, "block_size": block_size,
                        "allocation": allocation, "prefix_caching": caching, "seed": i,
                        "max_new_tokens": None if i % 2 else 6 + i})
    return configs


def _prompt(rng: random.Random, max_tokens: int) -> dict[str, Any]:
    """One of the three prompt forms, of 1..max_tokens tokens."""
    n = rng.randint(1, max(1, max_tokens))
    kind = rng.random()
    if kind < 0.5:
        text = rng.choice(OPENINGS) + "".join(rng.choice(" xyz!") for _ in range(n))
        return {"prompt": text[:n]}
    if kind < 0.8:
        return {"prompt_tokens": [rng.randrange(256) for _ in range(n)]}
    return {"prompt_len": n}


def _prompt_len(op: dict[str, Any]) -> int:
    if "prompt" in op:
        return len(op["prompt"].encode("utf-8"))
    if "prompt_tokens" in op:
        return len(op["prompt_tokens"])
    return int(op["prompt_len"])


def _bad_add(rng: random.Random, op: dict[str, Any], ids: list[str],
             num_blocks: int, capacity: int) -> dict[str, Any]:
    """`op` made invalid in one of the ways a scenario file can be."""
    prompt_len = {k: v for k, v in op.items() if k not in ("prompt", "prompt_tokens")}
    return rng.choice([
        {**op, "request": rng.choice(ids) if ids else ""},      # duplicate (or empty) id
        {**prompt_len, "prompt_len": capacity + rng.randint(0, 3)},  # can never fit
        {**prompt_len, "prompt_len": 10**9},                     # past the format's limit
        {**op, "blocks": [rng.randrange(num_blocks)] * 2},       # a pin twice / wrong count
        {**op, "blocks": list(range(-(-_prompt_len(op) // max(1, capacity // num_blocks))))},
        {**op, "blocks": [num_blocks + 5]},                      # outside the pool
        {**op, "max_new_tokens": 0},
        {**op, "prompt_tokens": [1, 256], "prompt": "both"},     # two prompt forms
        {"op": "add", "request": "x", "prompt": ""},
    ])


def random_op(rng: random.Random, engine: Engine, snapshot: dict[str, Any],
              next_id: list[int]) -> dict[str, Any]:
    """A random operation as scenario JSON; about a fifth of them are invalid."""
    c = engine.config
    capacity = c.num_blocks * c.block_size
    ids = [r["id"] for r in snapshot["requests"]]
    running = list(snapshot["scheduler"]["running"])
    bad = rng.random() < 0.2

    def new_id() -> str:
        next_id[0] += 1
        return f"r{next_id[0]}"

    def some_id() -> str:
        # Mostly running requests, where the interesting state is.
        if running and rng.random() < 0.8:
            return rng.choice(running)
        return rng.choice(ids) if ids else "nobody"

    kind = rng.choices(["add", "grow", "fork", "finish", "step", "shuffle"],
                       weights=[5, 4, 2, 2, 3, 1])[0]
    if kind == "add":
        op: dict[str, Any] = {"op": "add", "request": new_id(), **_prompt(rng, capacity // 3)}
        # Two requests in five carry one of two cache salts, picked by the id's number
        # and not drawn from `rng`, so every other choice of a seed's sequence is as it
        # was before salts existed.
        salt = next_id[0] % 5
        if salt < 2:
            op["cache_salt"] = f"tenant-{salt}"
        if rng.random() < 0.3:
            op["max_new_tokens"] = rng.randint(1, 8)
        if rng.random() < 0.2:
            # Pins: free blocks when there are enough (valid), else too few (refused).
            free = [b["id"] for b in snapshot["blocks"] if b["state"] == "free"]
            need = -(-_prompt_len(op) // c.block_size)
            op["blocks"] = rng.sample(free, need) if need <= len(free) else free
        elif rng.random() < 0.2:
            # Parallel samples or a beam search (which needs a token limit).
            if rng.random() < 0.5:
                op["n"] = rng.randint(2, 3)
            else:
                op["beam_width"] = rng.randint(2, 3)
                op["max_new_tokens"] = rng.randint(2, 8)
        return _bad_add(rng, op, ids, c.num_blocks, capacity) if bad else op
    if kind == "grow":
        if not bad:
            return {"op": "grow", "request": some_id(), "tokens": rng.randint(1, 3)}
        return rng.choice([
            {"op": "grow", "request": "ghost"},
            {"op": "grow", "request": some_id(),
             "tokens": rng.choice([0, -2, capacity + 1, MAX_GROW_TOKENS, MAX_GROW_TOKENS + 1,
                                   10**30, 2.5, True])}])
    if kind == "fork":
        if not bad:
            return {"op": "fork", "request": some_id(), "child": new_id()}
        return rng.choice([{"op": "fork", "request": "ghost", "child": new_id()},
                           {"op": "fork", "request": some_id(),
                            "child": rng.choice(ids) if ids else "ghost"},
                           {"op": "fork", "request": some_id()}])
    if kind == "finish":
        return {"op": "finish", "request": "ghost" if bad else some_id()}
    if kind == "step":
        if not bad:
            return {"op": "step", "count": rng.randint(1, 3)}
        return {"op": "step", "count": rng.choice([0, -1, MAX_STEP_COUNT + 1, "3", None])}
    if bad:
        return {"op": "shuffle", "seed": rng.choice([-1, 2**64, "7"])}
    return {"op": "shuffle", "seed": rng.randrange(1000) if rng.random() < 0.7 else None}


def _state(snapshot: dict[str, Any], full: bool) -> str:
    """The snapshot as text; without `full`, the events list only by its length and tail."""
    if not full:
        events = snapshot["events"]
        snapshot = {**snapshot, "events": [len(events), events[-1] if events else None]}
    return json.dumps(snapshot)


def soak_sequence(config: dict[str, Any], seed: int, num_ops: int, *,
                  full_every: int = 1, contract_every: int = 0) -> SoakStats:
    """Mutates nothing outside: one seeded random sequence on a fresh engine. Raises SoakError.

    The state at the end is restored from the contract's fields alone
    (`contract_round_trip`); with `contract_every` N, also after every N-th operation
    applied (the free queue's order compared only until a shuffle the log cannot
    follow)."""
    engine = Engine(EngineConfig.from_json(config), kernel="torch")
    rng = random.Random(seed)
    next_id = [0]
    stats = SoakStats()
    where = f"config {config}, seed {seed}"
    # What a restore from the contract's fields alone cannot repeat exactly.
    blind_shuffle = False
    for i in range(num_ops):
        full = i % full_every == 0
        snapshot = export_snapshot(engine)
        before = _state(snapshot, full)
        raw = random_op(rng, engine, snapshot, next_id)
        try:
            result = engine.apply(parse_op(raw))
        except PagedLabError as exc:
            stats.refused[raw["op"]] += 1
            if _state(export_snapshot(engine), full) != before:
                raise SoakError(f"{where}, op {i} {raw}: refused ({exc}) but the snapshot "
                                  "changed") from None
        else:
            stats.applied[raw["op"]] += 1
            # A shuffle with a seed of its own, or one that moved no data and so logged
            # no move: where its never-filled blocks went is in no event.
            blind_shuffle |= raw["op"] == "shuffle" and (
                raw.get("seed") is not None or not any(e.kind == "move" for e in result.events))
            if contract_every and i % contract_every == 0:
                _contract_check(engine, f"{where}, after op {i} {raw}",
                                exact_queue=not blind_shuffle)
        try:
            engine.check_integrity()
        except Exception as exc:  # an IntegrityError, or a check that itself broke
            raise SoakError(f"{where}, after op {i} {raw}: {exc}") from exc
    stats.events.update(e.kind for e in engine.events)
    text = json.dumps(export_snapshot(engine))
    restored = restore_engine(json.loads(text), kernel="torch")
    again = json.dumps(export_snapshot(restored))
    if again != text:
        raise SoakError(f"{where}: export, restore, export gave a different snapshot")
    if problem := kv_differs(engine, restored):
        raise SoakError(f"{where}: restored, {problem}")
    _contract_check(engine, where, exact_queue=not blind_shuffle)
    return stats


def kv_differs(live: Engine, restored: Engine, atol: float = 1e-4) -> str | None:
    """Where a restored engine's K/V differ from the live one's (None: nowhere): every
    filled slot of every used or cached block of the device pool, in every layer. A
    restore recomputes K/V from tokens, so they agree to float rounding."""
    bs = live.config.block_size
    slots = [b.id * bs + s for b in live.manager.pool.blocks
             if b.state != "free" for s in range(b.num_filled)]
    if not slots:
        return None
    for layer in range(live.config.num_layers):
        for what, want, got in zip(("K", "V"), live.cache.read_slots(layer, slots),
                                   restored.cache.read_slots(layer, slots), strict=True):
            worst = float((want - got).abs().amax())
            if not worst <= atol:
                at = int((want - got).abs().flatten(1).amax(1).argmax())
                return (f"layer {layer}'s {what} differ by {worst:.3g} (block "
                        f"{slots[at] // bs}, slot {slots[at] % bs})")
    return None


def _contract_check(engine: Engine, where: str, *, exact_queue: bool = True) -> None:
    # A random pool's pick count is left out: the log does not tell a pinned add's
    # blocks, or a pick whose probes met no empty block, from other picks.
    problem = contract_round_trip(export_snapshot(engine), exact_queue=exact_queue,
                                  exact_picks=engine.config.allocation != "random")
    if problem:
        raise SoakError(f"{where}: restored from the contract's fields alone, {problem}")


def contract_round_trip(snapshot: dict[str, Any], *, exact_queue: bool = True,
                        exact_picks: bool = True) -> str | None:
    """What differs (None: nothing) when `snapshot` is restored from the contract's fields
    alone (no free_queue, prefix_cache, scheduler or allocator, no event's ref_count) and
    exported again, or a contradiction the restore reported in the log PagedLab wrote.
    What the log cannot fix (README, Snapshots) is compared only where the caller says
    the run made it fixable: the free queue's order after a shuffle that gave its own
    seed or moved no data (`exact_queue`), and a random pool's pick count, which a
    pinned add or a pick whose probes found no never-filled block leaves unknown
    (`exact_picks`)."""
    bare = contract_only(snapshot)
    restored = restore_engine(bare, kernel="torch")
    # A log PagedLab wrote adds up: no contradiction may be reported in it.
    if said := [n for n in restore_notes(restored) if "contradicts itself" in n]:
        return f"a log PagedLab wrote was called contradictory: {said[0]}"
    got = export_snapshot(restored)
    for key, want in snapshot.items():
        have = got.get(key)
        if key == "events":
            want = bare["events"]
        elif key == "free_queue" and not exact_queue:
            want, have = sorted(want), sorted(have)
        elif key == "allocator" and not exact_picks:
            continue
        if have != want:
            return f"{key} differs: {json.dumps(have)[:300]} instead of {json.dumps(want)[:300]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=200, help="operations per sequence")
    parser.add_argument("--seeds", type=int, default=4, help="sequences per pool config")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seed of the first sequence (tests/test_fuzz_engine.py uses 0..7)")
    parser.add_argument("--blocks", type=int, default=16, help="about how many blocks a pool has")
    parser.add_argument("--full-every", type=int, default=1, metavar="N",
                        help="compare whole snapshots (with every event) every N operations")
    args = parser.parse_args(argv)
    total = SoakStats()
    started = time.monotonic()
    for config in soak_configs(args.blocks):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            total.add(soak_sequence(config, seed, args.ops, full_every=args.full_every))
        print(f"ok: {config} x {args.seeds} seeds ({time.monotonic() - started:.1f} s)",
              flush=True)
    print(f"applied {sum(total.applied.values())} {dict(total.applied)}")
    print(f"refused {sum(total.refused.values())} {dict(total.refused)}")
    print(f"events {dict(total.events)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
