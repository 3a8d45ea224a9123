"""The host block pool of swap preemption, drawn with the device pool's grid.

A snapshot with `preemption: "swap"` lists the host pool's blocks in
`cpu_blocks`, and a swapped request's `block_table` names host blocks.
`host_view` turns that into a snapshot-shaped view of the host pool alone
(its blocks, the swapped requests holding them, no prefix cache), so the
grid, its legend and its tooltips draw it exactly as they draw the device
pool. Views of the device pool skip swapped requests (`on_device`).
"""

from __future__ import annotations

from typing import Any

from backend.core.words import counted

Snapshot = dict[str, Any]
HOST_POOL = "host"


def has_host_pool(snap: Snapshot) -> bool:
    return "cpu_blocks" in snap


def is_host(snap: Snapshot) -> bool:
    """Whether `snap` is `host_view`'s view of the host pool."""
    return snap.get("pool") == HOST_POOL


def on_device(snap: Snapshot, req: dict[str, Any]) -> bool:
    """Whether `req`'s block table names blocks of the pool `snap` shows."""
    swapped = req["status"] == "swapped"
    return swapped if is_host(snap) else not swapped


def host_view(snap: Snapshot) -> Snapshot:
    """The host pool as a snapshot the block views can draw (`pool`: "host").

    Requests keep their ids and arrival order (so colours match the device
    grid's); only swapped ones hold blocks here.
    """
    blocks = snap["cpu_blocks"]
    return {
        **snap,
        "pool": HOST_POOL,
        "config": {**snap["config"], "num_blocks": len(blocks)},
        "blocks": blocks,
        "prefix_cache": [],
        "free_queue": [b["id"] for b in blocks if b["state"] == "free"],
    }


def host_summary(snap: Snapshot) -> str:
    """One line: how full the host pool is and who is swapped out."""
    m = snap["metrics"]
    swapped = snap["scheduler"].get("swapped", [])
    used, total = m.get("cpu_used_blocks", 0), len(snap["cpu_blocks"])
    who = ", ".join(swapped) if swapped else "no request"
    return (f"Host pool: {used:,} of {total:,} blocks hold swapped-out K/V ({who}); "
            f"{counted(m.get('swap_outs', 0), 'swap-out')}, "
            f"{counted(m.get('swap_ins', 0), 'swap-in')} so far.")
