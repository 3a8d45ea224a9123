"""Snapshots: the engine's state as CONTRACT.md's JSON, and back.

`export_snapshot` writes every field CONTRACT.md lists, plus what an exact
restore needs and the contract leaves open (fields may be added):

    scheduler      waiting queue order, running requests in admission order
    free_queue     ids of ref-count-0 blocks in eviction order
    prefix_cache   every hash node a block's key chains through: digest,
                   parent digest, the block's own tokens (evicted ancestors
                   included, so a cached block's full prefix is recoverable)
    allocator      totals and the random-allocation pick counter
    cpu_blocks     with preemption "swap": the host pool's blocks (a swapped
                   request's block_table names these), and the scheduler's
                   `swapped` queue

`parse_snapshot_text` reads such a file as JSON data only (no pickle, no
eval); backend/io/restore.py turns it back into an engine. Export, restore,
export gives the same JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.core.checks import file_kind, json_kind
from backend.core.config import TINY_BYTE
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.request import Request
from backend.io.json_input import decode_json
from backend.paging.hashing import BlockHash, SaltRoot

SCHEMA_VERSION = 1
MAX_SNAPSHOT_BYTES = 32 << 20
# Config fields a snapshot carries that are derived, not settings.
CONFIG_EXTRA = frozenset({"device", "bytes_per_block"})
# The config fields every snapshot carries (CONTRACT.md's snapshot example), in its order.
CONTRACT_CONFIG = ("num_blocks", "block_size", "num_layers", "num_heads", "num_kv_heads",
                   "head_dim", "dtype", "device", "bytes_per_block", "prefix_caching",
                   "allocation", "seed")


def export_snapshot(engine: Engine) -> dict[str, Any]:
    """The engine's state as a JSON-ready dict. Reads only."""
    c = engine.config
    m = engine.manager
    pool = m.pool
    nodes: dict[str, BlockHash] = {}
    for block in pool.blocks:
        node = block.hash
        while node is not None and node.digest not in nodes:
            nodes[node.digest] = node
            node = node.parent
    metrics = m.metrics()
    report = engine.kernel_report
    # The model, sampling and scheduler settings are written only where they differ
    # from the defaults, so a tiny-byte snapshot is the same file it always was.
    model_fields: dict[str, Any] = {}
    if c.model != TINY_BYTE:
        model_fields["model"] = c.model
    for key in ("temperature", "top_p", "max_num_seqs", "max_num_batched_tokens",
                "watermark_blocks"):
        if getattr(c, key) is not None:
            model_fields[key] = getattr(c, key)
    if c.preemption != "recompute":
        model_fields["preemption"] = c.preemption
    if c.num_cpu_blocks:
        model_fields["num_cpu_blocks"] = c.num_cpu_blocks
    real = c.model != TINY_BYTE
    host = engine.host

    def table(r: Request) -> list[int]:
        """Device blocks while running; host blocks while swapped out."""
        if r.status == "swapped":
            assert host is not None
            return list(host.tables[r.id])
        return engine.block_table(r.id)

    snap: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "step": engine.step,
        "config": {
            "num_blocks": c.num_blocks, "block_size": c.block_size,
            "num_layers": c.num_layers, "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "dtype": c.dtype,
            "device": engine.device.type, "bytes_per_block": c.bytes_per_block,
            "prefix_caching": c.prefix_caching, "allocation": c.allocation, "seed": c.seed,
            "max_new_tokens": c.max_new_tokens, **model_fields,
        },
        "blocks": [
            {"id": b.id, "state": b.state, "ref_count": b.ref_count, "num_filled": b.num_filled,
             "hash": None if b.hash is None else b.hash.digest}
            for b in pool.blocks
        ],
        "requests": [
            {"id": r.id, "status": r.status, "parent": r.parent, "prompt_len": r.prompt_len,
             "num_tokens": r.num_tokens, "block_table": table(r),
             "tokens": list(r.tokens), "num_preemptions": r.num_preemptions,
             "max_new_tokens": r.max_new_tokens, "finish_reason": r.finish_reason,
             # Derived from the tokens; a real model's requests carry it (CONTRACT.md).
             **({"text": engine.text(r.id)} if real else {}),
             # Only while a token budget spreads its prompt over steps: the block
             # table then covers these leading tokens, not all of them.
             **({"num_computed_tokens": r.num_computed} if r.prefilling else {}),
             # Parallel sampling (`add` with n): the add's id, and on its first sample
             # until its prompt is computed, the samples still to be forked from it.
             **({"group": r.group} if r.group is not None else {}),
             **({"pending_samples": r.pending_samples} if r.pending_samples else {}),
             # Beam search: the group's width, and the beam's cumulative log-probability.
             **({"beam_width": r.beam_width, "cum_logprob": r.cum_logprob}
                if r.beam_width is not None else {}),
             # `add`'s cache_salt: its chain starts from the salt's root key.
             **({"cache_salt": r.cache_salt} if r.cache_salt is not None else {})}
            for r in engine.requests.values()
        ],
        "events": [e.to_json() for e in m.events],
        "metrics": {
            **metrics.contract_dict(),
            "prefix_queries": metrics.prefix_queries,
            "prefix_query_tokens": metrics.prefix_query_tokens,
            "prefix_hit_tokens": metrics.prefix_hit_tokens,
            "prefix_floor_tokens": metrics.prefix_floor_tokens,
            "logical_tokens": metrics.logical_tokens,
            "blocks_saved_by_sharing": metrics.blocks_saved_by_sharing,
        },
        "kernel": {"name": report.name, "backend": report.backend, "device": report.device,
                   "max_abs_err": report.max_abs_err, "time_ms": report.time_ms,
                   "num_seqs": report.num_seqs, "num_query_tokens": report.num_query_tokens},
        "scheduler": {"waiting": list(engine.waiting), "running": list(engine.running),
                      "admissions": engine.scheduler.admissions},
        "free_queue": [b.id for b in pool.free_queue],
        "prefix_cache": [hash_node_json(n)
                         for n in sorted(nodes.values(), key=lambda n: (n.depth(), n.digest))],
        "allocator": {"random_picks": pool.random_picks},
    }
    if engine.log_partial:
        # Only then, so that every other snapshot is the file it always was.
        snap["events_partial"] = True
    if host is not None:
        # Only with a host pool, so that every other snapshot is the file it always was.
        snap["cpu_blocks"] = [{"id": b.id, "state": b.state, "ref_count": b.ref_count,
                               "num_filled": b.num_filled, "hash": None} for b in host.blocks]
        snap["scheduler"]["swapped"] = list(engine.swapped)
        snap["metrics"]["swapped_requests"] = len(engine.swapped)
        snap["metrics"]["cpu_used_blocks"] = host.num_used
        snap["metrics"]["swap_outs"] = host.swap_outs
        snap["metrics"]["swap_ins"] = host.swap_ins
    return snap


def hash_node_json(key: BlockHash) -> dict[str, Any]:
    """One entry of a snapshot's `prefix_cache`: a key's digest, its parent's, its tokens;
    a cache salt's root (no parent, no tokens) also names its salt."""
    node = {"hash": key.digest, "parent": key.parent_digest, "tokens": list(key.tokens)}
    if isinstance(key, SaltRoot):
        node["cache_salt"] = key.cache_salt
    return node


def snapshot_json(engine: Engine) -> str:
    """The snapshot as the text written to files (stable key order, one trailing newline)."""
    return json.dumps(export_snapshot(engine), indent=1) + "\n"


def parse_snapshot_text(text: str | bytes) -> dict[str, Any]:
    """Parse uploaded snapshot text as JSON data only, bounded in size."""
    if len(text) > MAX_SNAPSHOT_BYTES:
        raise PagedLabError(f"snapshot is {len(text):,} bytes; the limit is "
                            f"{MAX_SNAPSHOT_BYTES >> 20} MiB")
    data = decode_json(text, "snapshot")
    if not isinstance(data, dict):
        raise PagedLabError(f"snapshot must be a JSON object, got {json_kind(data)}")
    if file_kind(data) == "scenario":
        # The other JSON file PagedLab reads: say which one this is and where it goes.
        raise PagedLabError("snapshot: missing field 'schema_version'; this is a scenario "
                            "file (it has 'steps'): open it on the Scenarios page, or run "
                            "it with python -m backend run")
    return data


def write_snapshot(engine: Engine, path: Path) -> None:
    path.write_text(snapshot_json(engine))
