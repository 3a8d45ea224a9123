"""Restore: a snapshot's JSON back into an engine with that exact state.

`restore_engine` takes data parsed by `parse_snapshot_text` (JSON only, no
pickle, no eval), refuses anything malformed or inconsistent with a message
naming it, builds a fresh engine with that exact allocator state, proves it
with `check_integrity`, and recomputes the K/V of every used and cached block
from the tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from backend.core.checks import MAX_JSON_INT, check_int
from backend.core.config import EngineConfig
from backend.core.errors import IntegrityError, PagedLabError
from backend.core.words import agrees, counted
from backend.engine.engine import Engine
from backend.engine.request import Request
from backend.engine.results import KernelReport
from backend.io.json_input import FieldReader, listed_by_id, non_negative
from backend.io.recompute import Progress, recompute_kv
from backend.io.restore_host import restore_host
from backend.io.restore_requests import read_requests, read_scheduler
from backend.io.snapshot import CONFIG_EXTRA, SCHEMA_VERSION
from backend.paging.block_manager import SeqBlocks
from backend.paging.events import Event
from backend.paging.hashing import BlockHash, block_digest


def restore_engine(data: dict[str, Any], *, device: str = "auto", kernel: str = "auto",
                   check_reference: bool = True, progress: Progress | None = None) -> Engine:
    """A new engine in exactly the state `data` describes. Raises PagedLabError.

    `progress(done, total)` hears of each forward of the K/V recomputation (the
    part that takes time: one forward per request and per cached chain)."""
    top = FieldReader(data, "snapshot")
    version = top.get("schema_version", int)
    if version != SCHEMA_VERSION:
        raise PagedLabError(f"snapshot schema_version is {version}; this PagedLab reads "
                            f"version {SCHEMA_VERSION}")
    cfg_data = dict(top.get("config", dict))
    config = EngineConfig.from_json(cfg_data, where="snapshot.config", ignore=CONFIG_EXTRA)
    if "bytes_per_block" in cfg_data and cfg_data["bytes_per_block"] != config.bytes_per_block:
        raise PagedLabError(f"snapshot.config.bytes_per_block is {cfg_data['bytes_per_block']} "
                            f"but these settings give {config.bytes_per_block}")
    engine = Engine(config, device=device, kernel=kernel, check_reference=check_reference)
    try:
        _restore_into(engine, top)
        engine.manager.check_integrity()
        recompute_kv(engine, progress)
        engine.check_requests()
    except (IntegrityError, AssertionError) as exc:
        raise PagedLabError(f"inconsistent snapshot: {exc}") from None
    return engine


def _restore_into(engine: Engine, top: FieldReader) -> None:
    c = engine.config
    bs = c.block_size
    m = engine.manager
    pool = m.pool
    top_id = c.vocab_size - 1
    host = engine.host
    step = check_int(top.get("step", int), "snapshot.step", 0, MAX_JSON_INT)

    requests, tables = read_requests(top, engine)
    queues = read_scheduler(top, requests)
    waiting, running, swapped = queues.waiting, queues.running, queues.swapped

    # Hash nodes, parents first; each digest is re-derived from its tokens.
    nodes: dict[str, BlockHash] = {}
    for i, raw in enumerate(top.get("prefix_cache", list)):
        if not isinstance(raw, dict):
            raise PagedLabError(f"snapshot.prefix_cache[{i}] must be an object")
        r = FieldReader(raw, f"snapshot.prefix_cache[{i}]")
        digest = r.get("hash", str)
        parent_digest = r.get("parent", str, optional=True)
        tokens = r.int_list("tokens", 0, top_id)
        if len(tokens) != bs:
            raise PagedLabError(f"{r.where}: a full block holds {bs} tokens, not {len(tokens)}")
        if parent_digest is not None and parent_digest not in nodes:
            raise PagedLabError(f"{r.where}: parent {parent_digest} is not listed before it")
        entry = BlockHash(digest, None if parent_digest is None else nodes[parent_digest],
                          tuple(tokens))
        # A key at depth d described logical block d of some request, and no
        # request holds more blocks than the pool. Evicted ancestors stay listed,
        # but they sit above the key, so every listed depth is below num_blocks.
        # A deeper chain is no engine's, and recomputing it would cost one
        # quadratic forward pass over all its tokens.
        if entry.depth() >= c.num_blocks:
            raise PagedLabError(
                f"{r.where}: hash {digest} is logical block {entry.depth()} of its chain, but "
                f"a pool of {c.num_blocks} blocks never holds a request of more than "
                f"{c.num_blocks} blocks")
        if block_digest(parent_digest, tokens, c.cache_salt()) != digest:
            raise PagedLabError(f"{r.where}: hash {digest} does not match its tokens")
        if digest in nodes:
            raise PagedLabError(f"{r.where}: hash {digest} is listed twice")
        nodes[digest] = entry

    # Blocks.
    holders = Counter(b for rid in running for b in tables[rid])
    for i, r in enumerate(listed_by_id(top, "blocks", c.num_blocks, "pool")):
        ref = r.get("ref_count", int)
        filled = r.get("num_filled", int)
        digest = r.get("hash", str, optional=True)
        state = r.get("state", str)
        if ref != holders[i]:
            raise PagedLabError(f"inconsistent snapshot: block {i} has ref_count {ref} but "
                                f"{counted(holders[i], 'block table')} "
                                f"{agrees(holders[i], 'holds', 'hold')} it")
        want = "used" if ref > 0 else ("cached" if digest is not None else "free")
        if state != want:
            raise PagedLabError(f"inconsistent snapshot: block {i} is listed as {state!r} but "
                                f"its ref_count and hash make it {want!r}")
        check_int(filled, f"{r.where}.num_filled", 0, bs)
        if digest is not None and digest not in nodes:
            raise PagedLabError(f"{r.where}.hash {digest} is missing from "
                                "snapshot.prefix_cache")
        block = pool.blocks[i]
        block.ref_count = ref
        block.num_filled = filled
        block.hash = None if digest is None else nodes[digest]

    # Every listed hash node is some block's key or an ancestor of one.
    reachable: set[str] = set()
    for block in pool.blocks:
        node = block.hash
        while node is not None and node.digest not in reachable:
            reachable.add(node.digest)
            node = node.parent
    stray = sorted(set(nodes) - reachable)
    if stray:
        raise PagedLabError(f"snapshot.prefix_cache lists hash {stray[0]}, which no block's key "
                            "chains through")

    # The free queue, then the prefix cache's index.
    free_ids = top.int_list("free_queue", 0, c.num_blocks - 1)
    zero_ref = sorted(b.id for b in pool.blocks if b.ref_count == 0)
    if sorted(free_ids) != zero_ref:
        raise PagedLabError("inconsistent snapshot: free_queue must list every block with "
                            "ref_count 0 exactly once")
    for block in list(pool.free_queue):
        pool.free_queue.remove(block)
    for b in free_ids:
        pool.free_queue.append(pool.blocks[b])
    pool.reindex()
    alloc = FieldReader(top.get("allocator", dict), "snapshot.allocator")
    pool.random_picks = non_negative(alloc, "random_picks")

    # Sequences: tail tokens and chain parents follow from the requests' tokens.
    for rid in running:
        req = requests[rid]
        table = tables[rid]
        held = req.num_computed
        full = held // bs
        last_hash = pool.blocks[table[full - 1]].hash if full else None
        tail = req.tokens[full * bs:held] if c.prefix_caching else []
        m.seqs[rid] = SeqBlocks(rid, list(table), held, tail, last_hash)
    mt = FieldReader(top.get("metrics", dict), "snapshot.metrics")
    m.cow_copies = non_negative(mt, "cow_copies")
    m.prefix_hit_blocks = non_negative(mt, "prefix_hit_blocks")
    m.preemptions = non_negative(mt, "preemptions")
    m.prefix_queries = non_negative(mt, "prefix_queries", optional=True)
    m.prefix_query_tokens = non_negative(mt, "prefix_query_tokens", optional=True)
    m.prefix_floor_tokens = non_negative(mt, "prefix_floor_tokens", optional=True)
    if m.preemptions != sum(r.num_preemptions for r in requests.values()):
        raise PagedLabError("inconsistent snapshot: metrics.preemptions differs from the "
                            "requests' num_preemptions")
    m.recount()
    m.events = _events(top, step, c.num_blocks, c.num_cpu_blocks, requests)
    m.step = step
    if host is not None:
        restore_host(top, mt, host, {rid: tables[rid] for rid in swapped}, requests, bs)

    # The scheduler shares this dict with the engine: fill it, never replace it.
    engine.requests.clear()
    engine.requests.update(requests)
    engine.waiting.extend(waiting)
    engine.swapped.extend(swapped)
    for n, rid in enumerate(running, start=1):
        requests[rid].admitted = n
        engine.running.append(rid)
    engine.scheduler.admissions = queues.admissions
    engine.step = step
    k = FieldReader(top.get("kernel", dict), "snapshot.kernel")
    err = k.get("max_abs_err", (int, float), optional=True)
    ms = k.get("time_ms", (int, float), optional=True)
    if any(v is not None and not (math.isfinite(v) and v >= 0) for v in (err, ms)):
        raise PagedLabError("snapshot.kernel: max_abs_err and time_ms must be finite and >= 0")
    seqs, toks = (check_int(k.get(key, int, optional=True) or 0, f"snapshot.kernel.{key}", 0,
                            MAX_JSON_INT) for key in ("num_seqs", "num_query_tokens"))
    engine.kernel_report = KernelReport(
        k.get("backend", str), k.get("device", str), None if err is None else float(err),
        None if ms is None else float(ms), seqs, toks)
    # Counts the blocks determine must be the ones the file claims.
    metrics = m.metrics()
    got = {**metrics.contract_dict(), "prefix_hit_tokens": metrics.prefix_hit_tokens,
           "logical_tokens": metrics.logical_tokens,
           "blocks_saved_by_sharing": metrics.blocks_saved_by_sharing}
    derived = ("used_blocks", "free_blocks", "cached_blocks", "filled_slots",
               "internal_waste_slots", "shared_blocks")
    for key in (*derived, "prefix_hit_tokens", "logical_tokens", "blocks_saved_by_sharing"):
        claimed = mt.get(key, int, optional=key not in derived)
        if claimed is not None and claimed != got[key]:
            raise PagedLabError(f"inconsistent snapshot: metrics.{key} is {claimed} but the "
                                f"blocks give {got[key]}")


def _events(top: FieldReader, step: int, num_blocks: int, num_cpu_blocks: int,
            requests: dict[str, Request]) -> list[Event]:
    """Events that could have happened: known kinds, blocks, requests, and past steps."""
    out = []
    for i, raw in enumerate(top.get("events", list)):
        if not isinstance(raw, dict):
            raise PagedLabError(f"snapshot.events[{i}] must be an object")
        try:
            e = Event.from_json(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise PagedLabError(f"snapshot.events[{i}]: malformed event ({exc})") from None
        # A swap's host side names a block of the host pool.
        host = e.dst if e.kind == "swap_out" else e.src if e.kind == "swap_in" else None
        blocks = [b for b in (e.block, e.src, e.dst) if b is not None]
        if host is not None:
            blocks.remove(host)
        problem = None
        if not 1 <= e.step <= step:
            problem = f"its step {e.step} is not in 1..{step}"
        elif any(not 0 <= b < num_blocks for b in blocks):
            problem = "it names a block outside the pool"
        elif host is not None and not 0 <= host < num_cpu_blocks:
            problem = "it names a block outside the host pool"
        elif e.request is not None and e.request not in requests:
            problem = f"it names request {e.request!r}, which the snapshot does not list"
        elif (e.kind in ("cow", "move", "swap_out", "swap_in")
              and (e.src is None or e.dst is None)):
            problem = f"a {e.kind} event needs src and dst"
        elif e.kind == "fork" and (e.request is None or any(
                v is not None for v in (e.block, e.src, e.dst, e.ref_count))):
            problem = ("a fork event names the new request and nothing else (no block, src, "
                       "dst or ref_count)")
        elif e.ref_count is not None and e.ref_count < 0:
            problem = "its ref_count is negative"
        if problem:
            raise PagedLabError(f"inconsistent snapshot: events[{i}]: {problem}")
        out.append(e)
    return out
