"""Expectation paths that can never be met, found when a scenario is read.

A step's `expect` is checked against the snapshot taken after it runs
(backend/io/expect.py, `resolve`). A misspelt path ("metric.used_blocks",
"events.evicted", "blocks.40.ref_count" in a 32-block pool) would only say
"not found" when its step ran, perhaps many steps and a long run later. What
no run of the scenario could ever find is named as soon as the file is read.

Only certainties are named: a path that some run might resolve (a request id,
a position in a block table, a config field) is left to the check at its step.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from backend.core.checks import shown
from backend.core.config import EngineConfig
from backend.paging.events import EVENT_KINDS

# The fields export_snapshot (backend/io/snapshot.py) writes at a snapshot's top
# level, in its `metrics` and in each of its blocks; those of a host pool only with
# swap preemption. tests/test_scenarios.py keeps these in step with a real export.
SNAPSHOT_FIELDS = frozenset({
    "schema_version", "step", "config", "blocks", "requests", "events", "metrics",
    "kernel", "scheduler", "free_queue", "prefix_cache", "allocator"})
SWAP_SNAPSHOT_FIELDS = frozenset({"cpu_blocks"})
METRIC_FIELDS = frozenset({
    "used_blocks", "free_blocks", "cached_blocks", "filled_slots", "internal_waste_slots",
    "shared_blocks", "cow_copies", "prefix_hit_blocks", "preemptions", "prefix_queries",
    "prefix_query_tokens", "prefix_hit_tokens", "prefix_floor_tokens", "logical_tokens",
    "blocks_saved_by_sharing"})
SWAP_METRIC_FIELDS = frozenset({"swapped_requests", "cpu_used_blocks", "swap_outs",
                                "swap_ins"})
BLOCK_FIELDS = frozenset({"id", "state", "ref_count", "num_filled", "hash"})
# Heads resolve() reads from the engine, its arena or the step's result, not the snapshot.
SPECIAL_HEADS = frozenset({"contiguous", "address", "events", "step_events", "text",
                           "requests"})
# How many unmeetable paths a note names before it counts the rest.
NAMED_PATHS = 3
# A path a message quotes whole; a longer one is cut, with its length. The longest a
# snapshot has (a request's 64-character id and a field) is well under it.
SHOWN_PATH_CHARS = 120


def shown_path(path: str) -> str:
    """`path` as a message quotes it: whole, or cut short past SHOWN_PATH_CHARS with its
    length, so that a file's runaway key cannot fill a terminal or a page."""
    if len(path) <= SHOWN_PATH_CHARS:
        return path
    return f"{path[:SHOWN_PATH_CHARS]}… ({len(path):,} characters)"


def path_problem(path: str, config: EngineConfig, has_arena: bool) -> str | None:
    """Why no run of a scenario with `config` could find `path`, or None if one might."""
    parts = path.split(".")
    head = parts[0]
    swap = config.preemption == "swap"
    if head == "contiguous":
        return None if has_arena else "the scenario names no contiguous arena"
    if head in ("events", "step_events") and len(parts) == 2:
        return None if parts[1] in EVENT_KINDS else _unknown(
            parts[1], EVENT_KINDS, "event kind")
    if head == "address" and len(parts) >= 3:
        pos = parts[-1]
        return None if pos.isascii() and pos.isdigit() else f"{shown(pos)} is no token position"
    if head in SPECIAL_HEADS:
        return None
    if head not in SNAPSHOT_FIELDS | (SWAP_SNAPSHOT_FIELDS if swap else frozenset()):
        if head in SWAP_SNAPSHOT_FIELDS:
            return f"a snapshot holds {head!r} only with swap preemption"
        return _unknown(head, SNAPSHOT_FIELDS, "field")
    if head == "metrics" and len(parts) >= 2:
        if parts[1] in METRIC_FIELDS or (swap and parts[1] in SWAP_METRIC_FIELDS):
            return None
        if parts[1] in SWAP_METRIC_FIELDS:
            return f"the metric {parts[1]!r} is kept only with swap preemption"
        return _unknown(parts[1], METRIC_FIELDS, "metric")
    if head in ("blocks", "cpu_blocks") and len(parts) >= 2:
        count = config.num_blocks if head == "blocks" else config.num_cpu_blocks
        index = parts[1]
        if not (index.isascii() and index.isdigit()):
            return f"{shown(index)} is no block id (0, 1, ...)"
        if int(index) >= count:
            return f"block {int(index):,} is past the pool's {count:,} blocks"
        if len(parts) >= 3 and parts[2] not in BLOCK_FIELDS:
            return _unknown(parts[2], BLOCK_FIELDS, "block field")
    return None


def _unknown(name: str, known: Iterable[str], what: str) -> str:
    """"no field 'metric'; did you mean 'metrics'?", from the names there are."""
    near = difflib.get_close_matches(name, sorted(known), 1)
    return f"no {what} {shown(name)}" + (f"; did you mean {near[0]!r}?" if near else "")


def unmeetable(expects: Iterable[tuple[int, Mapping[str, Any] | None]], config: EngineConfig,
               has_arena: bool) -> list[tuple[int, str, str]]:
    """(step, path, reason) for every expectation no run could meet, in step order."""
    return [(step, path, reason)
            for step, expect in expects if expect
            for path in expect
            if (reason := path_problem(path, config, has_arena)) is not None]


def unmeetable_note(found: list[tuple[int, str, str]]) -> list[str]:
    """At most one sentence, without its full stop, naming the first NAMED_PATHS
    unmeetable expectations with their reasons and counting the rest."""
    if not found:
        return []
    named = "; ".join(f"step {step}'s {shown_path(path)} ({reason})"
                      for step, path, reason in found[:NAMED_PATHS])
    more = len(found) - NAMED_PATHS
    rest = f"; and {more:,} more" if more > 0 else ""
    if len(found) == 1:
        return [f"this expectation can never be met, and fails when its step runs: {named}"]
    return [f"these expectations can never be met, and fail when their steps run: "
            f"{named}{rest}"]
