"""Restore's check that a snapshot's event log is every event of a run that reached
its state.

PagedLab's log holds every allocator event so far. Each event that changes a block's
reference count carries the count it left (`alloc`, `share`, `prefix_hit`, `free`,
and a `cow`'s new block), except a copy-on-write's source, which loses one holder
without an event of its own. A shuffle's `move` events are one permutation: each
moved block's count goes with it, and an id a block left without another arriving
holds a free block (free blocks are relabelled too, without an event). Replayed
from an empty pool, each event must find its block at a count it could have met (an
`alloc` a free block, a `free` a held one) and give the count its kind makes of it,
and the log must leave every block at the count the snapshot gives it. A log that
gives every count (PagedLab's) is also held to who holds each block: each event names
a request that holds the block it acts on, the log leaves each block with the requests
whose tables list it, and a swapped request's host table where its swap-out put it. Every
preemption logs a `preempt` naming its request; a swapped-out request's
last device event is its `swap_out`, and a running request's is no `swap_out`.

An edited event (a `free` of a block still held, an `alloc` left out, a `preempt`
removed) would otherwise show a history no run could have had beside a state it
could, and the totals the log gives (swap-outs) would contradict the state.

A file another tool wrote may leave `ref_count` out of its events (the contract has
none), be cut short at its start, or write one `free` for a shared block, when it is
free at last: a log that leaves any count out is held only to the counts it gives and
to the final counts, and a block an event without a count names is not checked until
a later event gives its count again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from backend.core.checks import shown
from backend.engine.engine import Engine
from backend.io.restore_host import BACK_ON_DEVICE_WORDS, swap_counts
from backend.paging.events import Event

# Events that name a block without changing its count: an eviction drops a ref-count-0
# block's cached key (the alloc after it sets the count); a swap copies K/V while the
# frees and allocs beside it change the counts.
_COUNT_KEPT = frozenset({"evict", "swap_out", "swap_in"})


def log_problem(engine: Engine) -> str | None:
    """Why the restored `engine`'s log cannot be every event of a run that reached its
    state (the first thing found, in words), or None. O(events + blocks + requests)."""
    events = engine.manager.events
    preempts = Counter(e.request for e in events if e.kind == "preempt")
    for rid, req in engine.requests.items():
        if req.num_preemptions != preempts[rid]:
            return (f"request {shown(rid)} has num_preemptions {req.num_preemptions:,} but "
                    f"the events hold {preempts[rid]:,} preempt event"
                    f"{'s' * (preempts[rid] != 1)} for it")
    if engine.host is not None:
        _, _, away = swap_counts(events)
        for rid in engine.swapped:
            if rid not in away:
                # The host-pool line and the timeline tell a swap-out from the log.
                return (f"request {shown(rid)} is swapped out, but the events hold no "
                        "swap_out for it since it last took device blocks")
        for rid in engine.running:
            if rid in away:
                return (f"request {shown(rid)} is running, but the events hold no return to "
                        f"the device after its last swap_out ({BACK_ON_DEVICE_WORDS})")
    problem = _count_problem(events, [b.ref_count for b in engine.manager.pool.blocks])
    if problem is None and _strict(events):
        problem = _holder_problem(
            events, engine.manager.pool.num_blocks,
            {rid: seq.block_table for rid, seq in engine.manager.seqs.items()},
            {} if engine.host is None else engine.host.tables)
    return problem


def _strict(events: Sequence[Event]) -> bool:
    """Whether the log gives every count it could (PagedLab's own logs do): only such a
    log is held to what each event finds, and to who holds each block."""
    return all(e.ref_count is not None for e in events if e.kind in _GIVES_COUNT)


def _count_problem(events: Sequence[Event], ref_counts: Sequence[int]) -> str | None:
    """The first event the log, replayed from an empty pool, could not have recorded
    (one that finds its block at a count no run gives it), or the first block the log
    does not leave at `ref_counts[block]`, in words; or None.

    Each event is checked against the count the events before it leave: a check of
    the final counts alone would pass a bad event whose block a later event sets again
    (an alloc of a held block, a free of one still in a table, then a share).
    """
    # A log another tool wrote may leave counts out (the contract has no ref_count) and
    # give up a shared block with one `free` when it is free at last, or be cut short at
    # its start: only a log that gives every count it could is held to what each event
    # finds (a free block, a held one). Any log is held to each count it gives, where
    # the events before it leave a known one, and to the final counts.
    strict = _strict(events)
    n = len(ref_counts)
    counts: list[int | None] = [0] * n
    last: list[int | None] = [None] * n     # the event that last set each block's count
    i = 0
    while i < len(events):
        e = events[i]
        if e.kind == "move":
            i = _shuffle(events, i, counts, last)
            continue
        if e.kind == "cow" and e.src is not None:
            was = counts[e.src]
            if strict and was is not None and was < 2:
                return (f"{_named(i, e)} copies from block {e.src}, which the events "
                        f"before it leave at ref_count {was}: a copy-on-write copies a "
                        "block two or more requests hold")
            counts[e.src] = None if was is None else was - 1
            last[e.src] = i
        if e.block is not None:
            problem = _event_problem(i, e, counts, strict)
            if problem is not None:
                return problem
            if e.kind not in _COUNT_KEPT:
                counts[e.block] = e.ref_count
                last[e.block] = i
        i += 1
    for b, (want, got) in enumerate(zip(counts, ref_counts, strict=True)):
        if want is not None and want != got:
            where = ("no event names it, so no request was ever given it" if last[b] is None
                     else f"events[{last[b]}] last changed it")
            return f"block {b} has ref_count {got}, but the events leave it at {want} ({where})"
    return None


# What the kinds that name a block need of its count before them: a free block (0), or
# one a request holds (1 or more). A fork names no block; a move is a permutation.
_FROM_FREE = {"alloc": "an alloc takes a free block (0)",
              "cow": "a copy-on-write copies into a free block (0)",
              "evict": "an evict drops the cached key of a free block (0)"}
_FROM_HELD = frozenset({"free", "share", "swap_out", "swap_in"})
# The count each kind leaves, which its event gives: 1 for a block taken, else the count
# before it plus this (a prefix hit may take a cached block at 0 or share a held one).
_TAKEN = frozenset({"alloc", "cow"})
_CHANGE = {"share": 1, "prefix_hit": 1, "free": -1}
_GIVES_COUNT = _TAKEN | frozenset(_CHANGE)


def _event_problem(i: int, e: Event, counts: Sequence[int | None],
                   strict: bool) -> str | None:
    """Why `e` (events[i]) could not have happened to its block at the count the events
    before it leave (`counts`), in words; or None. Without `strict`, only the count it
    gives is checked."""
    assert e.block is not None
    before = counts[e.block]
    if before is None:
        return None
    if strict and e.kind in _FROM_FREE and before != 0:
        return (f"{_named(i, e)} finds block {e.block} at ref_count {before}, where "
                f"{_FROM_FREE[e.kind]}")
    if strict and e.kind in _FROM_HELD and before == 0:
        return (f"{_named(i, e)} finds block {e.block} at ref_count 0, where a {e.kind} "
                "needs a block a request holds")
    if e.ref_count is not None and (e.kind in _TAKEN or e.kind in _CHANGE):
        want = 1 if e.kind in _TAKEN else before + _CHANGE[e.kind]
        if e.ref_count != want:
            return (f"{_named(i, e)} gives ref_count {e.ref_count}, but the events before "
                    f"it leave block {e.block} at {before}, so it leaves {want}")
    return None


def _named(i: int, e: Event) -> str:
    return f"events[{i}] ({e.kind}, step {e.step:,})"


def _step_moves(events: Sequence[Event], i: int) -> tuple[list[tuple[int, int, int]], int]:
    """The shuffle whose moves start at events[i] (the moves of one step, side by side),
    as (index, src, dst) each; and the index after them."""
    step = events[i].step
    moves: list[tuple[int, int, int]] = []
    while i < len(events) and events[i].kind == "move" and events[i].step == step:
        e = events[i]
        if e.src is not None and e.dst is not None:   # restore's reader requires both
            moves.append((i, e.src, e.dst))
        i += 1
    return moves, i


def _shuffle(events: Sequence[Event], i: int, counts: list[int | None],
             last: list[int | None]) -> int:
    """Mutates `counts` and `last`: apply the shuffle whose moves start at events[i];
    returns the index after them."""
    moves, i = _step_moves(events, i)
    before = {src: counts[src] for _, src, _ in moves}
    for at, src, _ in moves:
        counts[src], last[src] = 0, at
    for at, src, dst in moves:
        counts[dst], last[dst] = before[src], at
    return i


def _holder_problem(events: Sequence[Event], num_blocks: int,
                    tables: Mapping[str, Sequence[int]],
                    host_tables: Mapping[str, Sequence[int]]) -> str | None:
    """The first event of a strict log that names a request not holding the block it
    acts on, or the first block (or swapped request's host table) the log does not leave
    with the holders the snapshot gives it, in words; or None.

    Counts alone pass a log whose events name the wrong requests (an `alloc` of A's
    block written as B's) and tables that traded blocks behind the log's back: the
    counts stay right, while the event table shows histories no table agrees with.
    Replayed: an `alloc` gives its block to its request, a `share` or `prefix_hit` adds
    its request, a `free` removes it, a `cow` moves it from `src` to its new block, a
    shuffle's moves carry each block's holders along; a `swap_out`, `swap_in` or `free`
    names a request holding its block. A swap-out's `dst`s, in order, are its request's
    host table while it stays swapped out.
    """
    holders: list[set[str]] = [set() for _ in range(num_blocks)]
    swapped: dict[str, list[int]] = {}
    out_step: dict[str, int] = {}
    i = 0
    while i < len(events):
        e = events[i]
        rid = e.request
        if e.kind == "move":
            moves, i = _step_moves(events, i)
            before = {src: holders[src] for _, src, _ in moves}
            for _, src, _ in moves:
                holders[src] = set()
            for _, src, dst in moves:
                holders[dst] = before[src]
            continue
        if rid is not None and e.block is not None:
            b = e.block
            if e.kind == "cow" and e.src is not None:
                if rid not in holders[e.src]:
                    return _not_holding(i, e, e.src, holders[e.src])
                holders[e.src].discard(rid)
                holders[b] = {rid}
            elif e.kind == "alloc":
                holders[b] = {rid}
            elif e.kind in ("share", "prefix_hit"):
                holders[b].add(rid)
            elif e.kind in ("free", "swap_out", "swap_in"):
                if rid not in holders[b]:
                    return _not_holding(i, e, b, holders[b])
                if e.kind == "free":
                    holders[b].discard(rid)
            if e.kind == "swap_out" and e.dst is not None:
                if out_step.get(rid) != e.step:      # a new swap-out of this request
                    swapped[rid], out_step[rid] = [], e.step
                swapped[rid].append(e.dst)
            elif e.kind == "swap_in":
                swapped.pop(rid, None)
                out_step.pop(rid, None)
        i += 1
    held: list[set[str]] = [set() for _ in holders]
    for rid, table in tables.items():
        for b in table:
            held[b].add(rid)
    for b, (want, got) in enumerate(zip(holders, held, strict=True)):
        if want != got:
            return (f"block {b} is in the block table{'s' * (len(got) != 1)} of "
                    f"{_requests(got)}, but the events leave it held by {_requests(want)}")
    for rid, host in host_tables.items():
        logged = swapped.get(rid)
        if logged is not None and list(host) != logged:
            return (f"the host blocks of request {shown(rid)} are {list(host)}, but its last "
                    f"swap_out events copied its blocks to host blocks {logged}, in that order")
    return None


def _not_holding(i: int, e: Event, block: int, holders: set[str]) -> str:
    return (f"{_named(i, e)} names request {shown(e.request or '')} for block {block}, which "
            f"the events before it leave held by {_requests(holders)}")


def _requests(rids: set[str]) -> str:
    if not rids:
        return "no request"
    return ", ".join(shown(r) for r in sorted(rids))
