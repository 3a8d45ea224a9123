"""Restoring the host pool of swap preemption from a snapshot, cross-checked.

A snapshot with `preemption: "swap"` lists the host pool in `cpu_blocks`, and
each swapped request's `block_table` names host blocks. `restore_host`
checks every listed block against the tables (held by one swapped request, or
shared by beams of one group at one position over the same tokens, as a beam
group's swap-out shares them; filled as the tokens say; never hashed) and
rebuilds the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.core.checks import shown
from backend.core.errors import PagedLabError
from backend.engine.request import Request
from backend.engine.swap import HostPool, sharing_problem
from backend.io.json_input import FieldReader, listed_by_id, optional_non_negative
from backend.paging.events import Event

# A swapped-out request is back on the device at its first event of these kinds: a
# swap-in allocates (hits and new blocks), may evict, copies its K/V back, and a beam
# shares the blocks an earlier beam of its group brought back. PagedLab's swap-in copies
# a request's last block (a prefix hit stops short of it) unless it shares it, so it
# logs a swap_in or a share; the other kinds count a file's swap-in whose blocks were
# all still cached.
_BACK_ON_DEVICE = frozenset({"alloc", "prefix_hit", "evict", "swap_in", "share"})
BACK_ON_DEVICE_WORDS = "an alloc, prefix_hit, evict, swap_in or share"

# How the log tells each total, for a refusal's message.
_COUNTED = {
    "swap_outs": "a request's run of swap_out events is one",
    "swap_ins": f"a swapped-out request's next {BACK_ON_DEVICE_WORDS.removeprefix('an ')} "
                "is one",
}


def restore_host(top: FieldReader, mt: FieldReader, host: HostPool,
                  tables: dict[str, list[int]], requests: dict[str, Request], bs: int,
                  events: Sequence[Event]) -> None:
    """The host pool from `cpu_blocks` and the swapped requests' tables, cross-checked;
    its swap counts from `metrics`, checked against the event log `events`, or from the
    log where the file leaves them out (restore_log checks who the log leaves out)."""
    readers = listed_by_id(top, "cpu_blocks", host.num_blocks,
                           "host pool (config.num_cpu_blocks)")
    holders: dict[int, list[tuple[str, int]]] = {}
    for rid, table in tables.items():
        if requests[rid].num_preemptions < 1:
            # A swap-out is a preemption, which the Preemptions card counts.
            raise PagedLabError(f"inconsistent snapshot: request {shown(rid)} is swapped out "
                                "but its num_preemptions is 0 (a swap-out preempts)")
        for i, b in enumerate(table):
            held = holders.setdefault(b, [])
            why = sharing_problem(held[0], (rid, i), requests, tables, bs) if held else None
            if why is not None:
                raise PagedLabError(f"inconsistent snapshot: host block {b} is in the tables "
                                    f"of {shown(held[0][0])} and {shown(rid)}, but {why}")
            held.append((rid, i))
    filled: dict[int, int] = {}
    for i, r in enumerate(readers):
        ref = r.get("ref_count", int)
        state = r.get("state", str)
        n = r.get("num_filled", int)
        if r.get("hash", str, nullable=True) is not None:
            raise PagedLabError(f"{r.where}: host blocks are not in the prefix cache (no hash)")
        want_ref, want_filled = 0, 0
        if i in holders:
            rid, logical = holders[i][0]
            want_ref = len(holders[i])
            want_filled = min(bs, requests[rid].num_computed - logical * bs)
        if ref != want_ref or state != ("used" if want_ref else "free") or n != want_filled:
            raise PagedLabError(
                f"inconsistent snapshot: host block {i} is listed as {state} with ref_count "
                f"{ref} and {n} slots filled, but the swapped requests' tables make it "
                f"{'used' if want_ref else 'free'} with ref_count {want_ref} and "
                f"{want_filled} filled")
        filled[i] = n
    host.restore(tables, filled)
    outs, ins, _ = swap_counts(events)
    # The totals are optional in the contract: a file without them (or with null) gets
    # the log's counts; one with them must agree, or the host pool's line would show
    # counts no run could reach.
    for key, logged, what in (("swap_outs", outs, "swap-out"), ("swap_ins", ins, "swap-in")):
        total = optional_non_negative(mt, key)
        if total is not None and total != logged:
            raise PagedLabError(
                f"inconsistent snapshot: metrics.{key} is {total:,} but the events hold "
                f"{logged:,} {what}{'s' * (logged != 1)} ({_COUNTED[key]})")
    host.swap_outs, host.swap_ins = outs, ins


def swap_counts(events: Sequence[Event]) -> tuple[int, int, set[str]]:
    """(swap-outs, swap-ins, the requests still swapped out at the log's end) as the
    event log tells them. A swap-out logs one `swap_out` per block of its request, in
    one run (a block an earlier beam of its group copied is shared, not copied again,
    and still logged); a swap-in is the request's return to the device, whose first
    event follows its swap-out."""
    outs = ins = 0
    away: set[str] = set()
    last: Event | None = None
    for e in events:
        rid = e.request
        if e.kind == "swap_out" and rid is not None:
            if last is None or last.kind != "swap_out" or last.request != rid:
                outs += 1
            away.add(rid)
        elif rid in away and e.kind in _BACK_ON_DEVICE:
            ins += 1
            away.discard(rid)
        last = e
    return outs, ins, away
