"""Restore: a snapshot's JSON back into an engine with that exact state.

`restore_engine` takes data parsed by `parse_snapshot_text` (JSON only, no
pickle, no eval), refuses anything malformed or inconsistent with a message
naming it, builds a fresh engine with that exact allocator state, proves it
with `check_integrity`, and recomputes the K/V of every used and cached block
from the tokens. The totals a snapshot claims (`metrics`) are checked last, so
that an edited block or request is refused by its own name, not through a total.

Fields the snapshot holds that restore does not read are not refused (the
contract lets fields be added), but `restore_notes(engine)` (restore_notes.py)
names them, so that a misspelt field is not ignored without a word.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from backend.core.checks import MAX_JSON_INT, check_int, shown, unicode_text
from backend.core.config import EngineConfig
from backend.core.errors import IntegrityError, PagedLabError
from backend.core.words import agrees, counted
from backend.engine.engine import Engine
from backend.engine.request import Request
from backend.engine.results import KernelReport
from backend.io.json_input import FieldReader, listed_by_id, non_negative
from backend.io.recompute import Progress, recompute_kv
from backend.io.restore_derive import derive_missing, order_problem
from backend.io.restore_host import restore_host
from backend.io.restore_log import log_problem
from backend.io.restore_notes import keep_notes
from backend.io.restore_requests import read_requests, read_scheduler
from backend.io.restore_scores import check_beam_scores
from backend.io.snapshot import CONFIG_EXTRA, CONTRACT_CONFIG, SCHEMA_VERSION
from backend.paging.block_manager import SeqBlocks
from backend.paging.events import Event
from backend.paging.hashing import (
    BlockHash,
    SaltRoot,
    block_digest,
    check_cache_salt,
    salt_root_digest,
)
from backend.paging.integrity import prefix_count_problem


def restore_engine(data: dict[str, Any], *, device: str = "auto", kernel: str = "auto",
                   check_reference: bool = True, progress: Progress | None = None,
                   check_scores: bool = True) -> Engine:
    """A new engine in exactly the state `data` describes. Raises PagedLabError.

    `progress(done, total)` hears of each forward of the K/V recomputation (the
    part that takes time: one forward per request and per cached chain, and the few
    that only beams' scores need). `check_scores=False` is for an engine's own
    export (a saved session reopened, a failed operation undone, a move to another
    device, a scenario's step continued): its beams' `cum_logprob` are what that
    engine computed, so no forward is spent recomputing them."""
    return _restore(data, device=device, kernel=kernel, check_reference=check_reference,
                    progress=progress, recompute=True, check_scores=check_scores)


def check_snapshot(data: dict[str, Any]) -> None:
    """Raises PagedLabError where `restore_engine` would refuse `data`, without computing
    any K/V: every check of the bookkeeping (a state to be shown, not run: a saved
    session's past step), on an engine with no weights and no K/V memory (`weights=False`).
    Tens of milliseconds for a pool of a few thousand blocks, where a restore of SmolLM2's
    takes seconds; a second or more for tens of thousands of blocks, read field by field."""
    _restore(data, device="cpu", kernel="torch", check_reference=False, progress=None,
             recompute=False, check_scores=False)


def _restore(data: dict[str, Any], *, device: str, kernel: str, check_reference: bool,
             progress: Progress | None, recompute: bool, check_scores: bool) -> Engine:
    top = FieldReader(data, "snapshot")
    version = top.get("schema_version", int)
    if version != SCHEMA_VERSION:
        raise PagedLabError(f"snapshot schema_version is {version}; this PagedLab reads "
                            f"version {SCHEMA_VERSION}")
    # Its keys are EngineConfig.from_json's to check: it refuses unknown ones. A scenario's
    # config may leave any field to its default; a snapshot's holds the contract's whole,
    # since a default put in for a field left out (seed 0) would run the next steps
    # differently from the engine that wrote the file, without a word.
    cfg_data = dict(top.get("config", dict))
    missing = [key for key in CONTRACT_CONFIG if key not in cfg_data]
    if missing:
        raise PagedLabError(f"snapshot.config: missing field{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(repr, missing))} (a snapshot's config gives "
                            "every field the contract lists; only a scenario's may leave "
                            "them to their defaults)")
    config = EngineConfig.from_json(cfg_data, where="snapshot.config", ignore=CONFIG_EXTRA)
    # Where the state was taken; the restore runs on the device it is given, so any
    # PagedLab can read it, but it is one PagedLab writes.
    if "device" in cfg_data and cfg_data["device"] not in ("cpu", "cuda"):
        raise PagedLabError(f"snapshot.config.device must be 'cpu' or 'cuda' (where the "
                            f"state was taken), got {shown(cfg_data['device'])}")
    if "bytes_per_block" in cfg_data:
        claimed = check_int(cfg_data["bytes_per_block"], "snapshot.config.bytes_per_block", 1,
                            MAX_JSON_INT)
        if claimed != config.bytes_per_block:
            raise PagedLabError(_bytes_per_block_differs(config, claimed))
    derived = derive_missing(data, config)
    if derived.fields:
        # A file with the contract's fields alone: the completed file is read instead,
        # and checked the same way (the derived fields count as read).
        top = FieldReader({**data, **derived.fields}, "snapshot")
        top.accept("schema_version", "config")
    # Without a recomputation nothing reads the weights or the K/V: none are loaded or
    # held for it.
    engine = Engine(config, device=device, kernel=kernel, check_reference=check_reference,
                    kv_fill=0.0 if recompute else None, weights=recompute)
    try:
        metrics = _restore_into(engine, top, cache_derived="prefix_cache" in derived.fields)
        engine.manager.check_integrity()
        scores: dict[str, float] = {}
        if recompute:
            scores = recompute_kv(engine, progress, scores=check_scores)
        engine.check_requests(logits=recompute)
    except (IntegrityError, AssertionError) as exc:
        raise PagedLabError(f"inconsistent snapshot: {exc}") from None
    # After the blocks' and tables' own checks, which name an edited block or request by
    # what is wrong with it, rather than by the log that no longer leads to it. A file
    # with the contract's fields alone may come from a tool whose log is cut short at
    # its start or leaves events out (a preempt): such a log is kept, as partial, and
    # the engine's exports say so (events_partial), so restoring them keeps it too.
    problem = log_problem(engine)
    said_partial = top.get("events_partial", bool, optional=True) is True
    if not (derived.fields or said_partial):
        # A whole log: held to it, and the queues to what it leaves.
        refused = problem if problem is not None else order_problem(data, config)
        if refused is not None:
            raise PagedLabError(f"inconsistent snapshot: {refused}")
    engine.log_partial = problem is not None or said_partial
    if scores:
        # After the bookkeeping's checks: a score is compared once every beam's tokens
        # and the model's view of them are known good.
        check_beam_scores(engine, scores)
    # After every per-block and per-request check: a total that disagrees with the
    # blocks then has no edited block or request behind it to name instead.
    _check_totals(engine, metrics)
    keep_notes(engine, tuple(top.unread()), derived.brief(), problem)
    return engine


def _bytes_per_block_differs(c: EngineConfig, claimed: int) -> str:
    """Why a snapshot's `bytes_per_block` is refused: it names the block_size (the
    setting a user edits) and the other factors with the size they give, since a
    setting changed alone leaves the file's bytes_per_block behind it."""
    return (f"snapshot.config: block_size {c.block_size} gives bytes_per_block "
            f"{c.bytes_per_block:,} (2 for K and V x {counted(c.num_layers, 'layer')} x "
            f"{counted(c.num_kv_heads, 'KV head')} x head_dim {c.head_dim} x block_size "
            f"{c.block_size} x {counted(c.dtype_bytes, 'byte')} of {c.dtype}), but the "
            f"snapshot says {claimed:,}: a setting was changed without the bytes_per_block "
            "it implies")


def _restore_into(engine: Engine, top: FieldReader, *, cache_derived: bool) -> FieldReader:
    """Everything but the K/V and the totals' check into `engine`; returns the reader of
    `snapshot.metrics`, whose derived totals `_check_totals` compares at the end.
    `cache_derived`: the prefix cache was derived from the requests' tokens, not read."""
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
    for r in top.objects("prefix_cache"):
        digest = r.get("hash", str)
        parent_digest = r.get("parent", str, optional=True)
        tokens = r.int_list("tokens", 0, top_id)
        salt = r.get("cache_salt", str, optional=True)
        if salt is not None or not tokens:
            # A cache salt's root: no parent, no tokens, a digest naming the salt.
            if salt is None or tokens or parent_digest is not None:
                raise PagedLabError(f"{r.where}: a key with no tokens is a cache salt's root, "
                                    "with a cache_salt, no parent and no tokens")
            check_cache_salt(salt, f"{r.where}.cache_salt")
            if salt_root_digest(c.cache_salt(), salt) != digest:
                raise PagedLabError(f"{r.where}: hash {digest} is not the root key of cache "
                                    f"salt {shown(salt)}")
            if digest in nodes:
                raise PagedLabError(f"{r.where}: hash {digest} is listed twice")
            nodes[digest] = SaltRoot(digest, salt)
            continue
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
            # Said whole: an edited seed or dtype changes every key, and the bare
            # "does not match its tokens" sent readers to the tokens.
            raise PagedLabError(
                f"{r.where}: hash {digest} does not match its tokens under this config (a "
                "key hashes its tokens, its parent's key and the config fields its K/V "
                f"depend on: {', '.join(c.cache_salt_fields())}; a file whose config was "
                "edited after it was written holds the old keys)")
        if digest in nodes:
            raise PagedLabError(f"{r.where}: hash {digest} is listed twice")
        nodes[digest] = entry

    # Blocks.
    holders = Counter(b for rid in running for b in tables[rid])
    for i, r in enumerate(listed_by_id(top, "blocks", c.num_blocks, "pool")):
        ref = r.get("ref_count", int)
        filled = r.get("num_filled", int)
        digest = r.get("hash", str, nullable=True)
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
            if cache_derived and ref == 0:
                raise PagedLabError(
                    f"{r.where}.hash {digest} is not the key PagedLab gives any request's "
                    "tokens: this cached block (no request holds it) needs its tokens to "
                    "recompute its K/V, and without the prefix_cache PagedLab's snapshots "
                    "add they are nowhere in the file. Copy the hash from a PagedLab "
                    "snapshot of the same config, or list the block as free (hash null); "
                    "README, Snapshots, says how a key is computed")
            if cache_derived:
                raise PagedLabError(
                    f"{r.where}.hash {digest} is not the key PagedLab gives the tokens of "
                    "the request holding it: a hash must be PagedLab's (README, Snapshots, "
                    "says how a key is computed; a PagedLab snapshot of the same config has "
                    "them)")
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
    alloc = top.object("allocator")
    pool.random_picks = non_negative(alloc, "random_picks")

    # Sequences: tail tokens and chain parents follow from the requests' tokens.
    for rid in running:
        req = requests[rid]
        table = tables[rid]
        held = req.num_computed
        full = held // bs
        root = m.salt_root(req.cache_salt)
        last_hash = pool.blocks[table[full - 1]].hash if full else root
        tail = req.tokens[full * bs:held] if c.prefix_caching else []
        m.seqs[rid] = SeqBlocks(rid, list(table), held, tail, last_hash, root=root)
    mt = top.object("metrics")
    m.cow_copies = non_negative(mt, "cow_copies")
    m.prefix_hit_blocks = non_negative(mt, "prefix_hit_blocks")
    m.preemptions = non_negative(mt, "preemptions")
    m.prefix_queries = non_negative(mt, "prefix_queries", optional=True)
    m.prefix_query_tokens = non_negative(mt, "prefix_query_tokens", optional=True)
    m.prefix_floor_tokens = non_negative(mt, "prefix_floor_tokens", optional=True)
    if all(mt.data.get(key) is not None for key in PREFIX_COUNTERS):
        # The metrics panel shows them beside the hits: edited, it showed more tokens
        # served from the cache than were ever looked up.
        problem = prefix_count_problem(m.metrics(), prefix_caching=c.prefix_caching)
        if problem is not None:
            raise PagedLabError(f"inconsistent snapshot: {problem}")
    if m.preemptions != sum(r.num_preemptions for r in requests.values()):
        raise PagedLabError("inconsistent snapshot: metrics.preemptions differs from the "
                            "requests' num_preemptions")
    m.recount()
    m.events = _events(top, step, c.num_blocks, c.num_cpu_blocks, requests)
    # Every copy-on-write and every block a prefix hit shared is an event of its own,
    # and the log holds every event so far: the totals are its counts.
    logged_by_kind: Counter[str] = Counter(e.kind for e in m.events)
    for total, kind in ((m.cow_copies, "cow"), (m.prefix_hit_blocks, "prefix_hit")):
        logged = logged_by_kind[kind]
        if total != logged:
            raise PagedLabError(f"inconsistent snapshot: metrics.{_TOTAL_OF[kind]} is "
                                f"{total:,} but the events hold {logged:,} {kind} events")
    m.step = step
    if host is not None:
        restore_host(top, mt, host, {rid: tables[rid] for rid in swapped}, requests, bs,
                     m.events)

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
    k = top.object("kernel")
    err = k.get("max_abs_err", (int, float), nullable=True)
    ms = k.get("time_ms", (int, float), optional=True)
    if any(v is not None and not (math.isfinite(v) and v >= 0) for v in (err, ms)):
        raise PagedLabError("snapshot.kernel: max_abs_err and time_ms must be finite and >= 0")
    # Counts, never null in a snapshot (0 before any step): a null would come back as 0,
    # and the round trip would change the file.
    seqs, toks = (check_int(k.get(key, object) if key in k.data else 0,
                            f"snapshot.kernel.{key}", 0, MAX_JSON_INT)
                  for key in ("num_seqs", "num_query_tokens"))
    # Kept as the file has it (the round trip is exact), but marked: no step of this
    # engine measured it, and the Kernel panel says so until a step replaces it.
    engine.kernel_report = KernelReport(
        _label("backend", k.get("backend", str)), _label("device", k.get("device", str)),
        None if err is None else float(err),
        None if ms is None else float(ms), seqs, toks,
        name=_label("name", k.get("name", str)), restored=True)
    return mt


# The prefix-cache counters beyond the contract's metrics (a file may leave them out).
PREFIX_COUNTERS = ("prefix_queries", "prefix_query_tokens", "prefix_floor_tokens")


# A kernel's backend, device and name: labels, shown as the file writes them.
MAX_LABEL_CHARS = 64


def _label(key: str, value: str) -> str:
    """snapshot.kernel.<key>, `value`: printable text of at most MAX_LABEL_CHARS characters
    (the Kernel panel shows it as written, and a restored state writes it back)."""
    where = f"snapshot.kernel.{key}"
    unicode_text(value, where)
    if len(value) > MAX_LABEL_CHARS or not value.isprintable():
        raise PagedLabError(f"{where} must be printable text of at most {MAX_LABEL_CHARS} "
                            f"characters, got {len(value):,} characters: "
                            f"{value[:MAX_LABEL_CHARS]!r}")
    return value


def _check_totals(engine: Engine, mt: FieldReader) -> None:
    """The totals the blocks and queues determine must be the ones `snapshot.metrics`
    claims: the contract's six are required, the others checked where present."""
    metrics = engine.manager.metrics()
    got = {**metrics.contract_dict(), "prefix_hit_tokens": metrics.prefix_hit_tokens,
           "logical_tokens": metrics.logical_tokens,
           "blocks_saved_by_sharing": metrics.blocks_saved_by_sharing,
           "swapped_requests": len(engine.swapped)}
    derived = ("used_blocks", "free_blocks", "cached_blocks", "filled_slots",
               "internal_waste_slots", "shared_blocks")
    optional = ["prefix_hit_tokens", "logical_tokens", "blocks_saved_by_sharing"]
    if engine.host is not None:
        # Written only with a host pool; without one they are fields restore ignores.
        got["cpu_used_blocks"] = engine.host.num_used
        optional += ["swapped_requests", "cpu_used_blocks"]
    for key in (*derived, *optional):
        claimed = mt.get(key, int, optional=key not in derived)
        if claimed is not None and claimed != got[key]:
            raise PagedLabError(f"inconsistent snapshot: metrics.{key} is {claimed} but the "
                                f"blocks give {got[key]}")


_TOTAL_OF = {"cow": "cow_copies", "prefix_hit": "prefix_hit_blocks"}


def _events(top: FieldReader, step: int, num_blocks: int, num_cpu_blocks: int,
            requests: dict[str, Request]) -> list[Event]:
    """Events that could have happened: known kinds, blocks, requests, and past steps, in
    the order of their steps (the log is every event in the order it happened)."""
    out: list[Event] = []
    for i, r in enumerate(top.objects("events")):
        # Event.from_json reads exactly the event's own fields. The contract's four are
        # always there (`request` and `block` may be null, not left out), so a file
        # missing one is refused rather than read as if it said null.
        r.accept(*Event._fields)
        for key in ("step", "kind", "request", "block"):
            if key not in r.data:
                raise PagedLabError(f"snapshot.events[{i}]: missing field {key!r}")
        try:
            e = Event.from_json(r.data)
        except (TypeError, ValueError) as exc:
            raise PagedLabError(f"snapshot.events[{i}]: malformed event ({exc})") from None
        # A swap's host side names a block of the host pool.
        host = e.dst if e.kind == "swap_out" else e.src if e.kind == "swap_in" else None
        blocks = [b for b in (e.block, e.src, e.dst) if b is not None]
        if host is not None:
            blocks.remove(host)
        problem = None
        if not 1 <= e.step <= step:
            problem = f"its step {e.step} is not in 1..{step}"
        elif out and e.step < out[-1].step:
            problem = (f"its step {e.step} comes after an event of step {out[-1].step}: the "
                       "events are listed in the order they happened")
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
        elif e.ref_count is not None and e.ref_count > MAX_JSON_INT:
            # Counts are bounded as every other count of the file (README: up to 2^53 - 1),
            # beyond which a JavaScript reader of the file would round them.
            problem = f"its ref_count {e.ref_count:,} is past {MAX_JSON_INT:,}"
        if problem:
            raise PagedLabError(f"inconsistent snapshot: events[{i}]: {problem}")
        out.append(e)
    return out
