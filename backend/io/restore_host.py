"""Restoring the host pool of swap preemption from a snapshot, cross-checked.

A snapshot with `preemption: "swap"` lists the host pool in `cpu_blocks`, and
each swapped request's `block_table` names host blocks. `restore_host`
checks every listed block against the tables (held by exactly one swapped
request, filled as its tokens say, never hashed) and rebuilds the pool.
"""

from __future__ import annotations

from backend.core.errors import PagedLabError
from backend.engine.request import Request
from backend.engine.swap import HostPool
from backend.io.json_input import FieldReader, listed_by_id, non_negative


def restore_host(top: FieldReader, mt: FieldReader, host: HostPool,
                  tables: dict[str, list[int]], requests: dict[str, Request], bs: int) -> None:
    """The host pool from `cpu_blocks` and the swapped requests' tables, cross-checked."""
    readers = listed_by_id(top, "cpu_blocks", host.num_blocks,
                           "host pool (config.num_cpu_blocks)")
    holder: dict[int, tuple[str, int]] = {}
    for rid, table in tables.items():
        for i, b in enumerate(table):
            if b in holder:
                raise PagedLabError(f"inconsistent snapshot: host block {b} is in the tables "
                                    f"of {holder[b][0]} and {rid}")
            holder[b] = (rid, i)
    filled: dict[int, int] = {}
    for i, r in enumerate(readers):
        ref = r.get("ref_count", int)
        state = r.get("state", str)
        n = r.get("num_filled", int)
        if r.get("hash", str, nullable=True) is not None:
            raise PagedLabError(f"{r.where}: host blocks are not in the prefix cache (no hash)")
        want_ref, want_filled = 0, 0
        if i in holder:
            rid, logical = holder[i]
            want_ref = 1
            want_filled = min(bs, requests[rid].num_computed - logical * bs)
        if ref != want_ref or state != ("used" if want_ref else "free") or n != want_filled:
            raise PagedLabError(
                f"inconsistent snapshot: host block {i} is listed as {state} with ref_count "
                f"{ref} and {n} slots filled, but the swapped requests' tables make it "
                f"{'used' if want_ref else 'free'} with ref_count {want_ref} and "
                f"{want_filled} filled")
        filled[i] = n
    host.restore(tables, filled)
    host.swap_outs = non_negative(mt, "swap_outs", optional=True)
    host.swap_ins = non_negative(mt, "swap_ins", optional=True)
