"""The metrics panel's numbers and the kernel panel's last step, formatted, no Streamlit.

Both read a snapshot dict (CONTRACT.md's format), like backend/views/model.py:
every figure here is one the snapshot holds or a ratio of two it holds, with
the sentence that says what it means.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.words import counted, percent
from backend.kernels.checks import REFERENCE_EVERY_ENV, reference_every
from backend.views.glossary import METRICS
from backend.views.model import format_bytes
from backend.views.tokens import Snapshot

# The metrics panel's name for each snapshot metric it shows: a scenario's checks name a
# metric as its card does, so a student finds it on screen. Where one card shows two
# metrics (hits in blocks and tokens), the unit tells them apart.
CARD_NAMES: dict[str, str] = {
    "preemptions": "Preemptions",
    "used_blocks": "Used blocks",
    "cached_blocks": "Cached blocks",
    "free_blocks": "Free blocks",
    "filled_slots": "Filled slots",
    "internal_waste_slots": "Internal waste",
    "shared_blocks": "Shared blocks",
    "blocks_saved_by_sharing": "Blocks saved by sharing",
    "cow_copies": "Copy-on-write copies",
    "prefix_queries": "Prefix-cache queries",
    "prefix_query_tokens": "Prefix-cache queries (tokens)",
    "prefix_hit_blocks": "Prefix-cache hits (blocks)",
    "prefix_hit_tokens": "Prefix-cache hits (tokens)",
    "prefix_floor_tokens": "Uncacheable prompt tail",
}


@dataclass(frozen=True, slots=True)
class MetricItem:
    group: str
    label: str
    value: str
    help: str


def metric_items(snap: Snapshot) -> list[MetricItem]:
    """Every number the metrics panel shows, formatted, grouped, with what it means."""
    c = snap["config"]
    m = snap["metrics"]
    status = [r["status"] for r in snap["requests"]]
    n = c["num_blocks"]
    bs = c["block_size"]
    bpb = c["bytes_per_block"]
    used = m["used_blocks"]
    slots_in_used = used * bs
    occupancy = m["filled_slots"] / slots_in_used if slots_in_used else 0.0
    saved = m.get("blocks_saved_by_sharing", 0)
    queries = m.get("prefix_queries", 0)
    q_tokens = m.get("prefix_query_tokens", 0)
    hit_tokens = m.get("prefix_hit_tokens", m["prefix_hit_blocks"] * bs)
    floor = m.get("prefix_floor_tokens", 0)
    # A beam search finishes every beam it forked: one request of width 4 may end as 17
    # finished requests, most of them dropped.
    dropped = sum(r.get("finish_reason") == "dropped" for r in snap["requests"])
    finished_help = "Requests that finished and released their blocks." + (
        f" Of them, {counted(dropped, 'is a beam', 'are beams')} a beam search dropped."
        if dropped else "")

    return [
        MetricItem("Requests", "Running requests", str(status.count("running")),
                   "Requests holding blocks and decoding in every step."),
        MetricItem("Requests", "Waiting requests", str(status.count("waiting")),
                   "Requests queued to start (new or preempted), first come, first served: "
                   "each waits for room in the pool and within the scheduler's budgets. "
                   "Grow or Fork on one says what holds it back."),
        *([MetricItem("Requests", "Swapped requests", str(status.count("swapped")),
                      METRICS["swapped"])]
          if c.get("preemption") == "swap" or "swapped" in status else []),
        MetricItem("Requests", "Finished requests", str(status.count("finished")),
                   finished_help),
        MetricItem("Requests", CARD_NAMES["preemptions"], str(m["preemptions"]),
                   METRICS["preemptions"]),
        MetricItem("Blocks", CARD_NAMES["used_blocks"], f"{used} / {n}",
                   METRICS["used_blocks"]),
        MetricItem("Blocks", CARD_NAMES["cached_blocks"], str(m["cached_blocks"]),
                   METRICS["cached_blocks"]),
        MetricItem("Blocks", CARD_NAMES["free_blocks"], str(m["free_blocks"]),
                   f"{METRICS['free_blocks']} Blocks the free queue can hand out: "
                   f"{m['free_blocks'] + m['cached_blocks']} (free and cached)."),
        MetricItem("Blocks", "Block usage", percent(used / n if n else 0.0),
                   "Used blocks over all blocks."),
        MetricItem("Slots", "Slot occupancy", percent(occupancy),
                   "Filled token slots over the slots of used blocks: the rest is tail waste."),
        MetricItem("Slots", CARD_NAMES["filled_slots"], f"{m['filled_slots']} / {slots_in_used}",
                   METRICS["filled_slots"]),
        MetricItem("Slots", CARD_NAMES["internal_waste_slots"],
                   counted(m['internal_waste_slots'], 'slot'),
                   f"Empty slots inside used blocks: at most {bs - 1} per unshared request."),
        MetricItem("Sharing", CARD_NAMES["shared_blocks"], str(m["shared_blocks"]),
                   METRICS["shared_blocks"]),
        MetricItem("Sharing", CARD_NAMES["blocks_saved_by_sharing"], str(saved),
                   METRICS["blocks_saved_by_sharing"]),
        MetricItem("Sharing", "Bytes saved by sharing", format_bytes(saved * bpb),
                   "Blocks saved by sharing × bytes per block."),
        MetricItem("Sharing", CARD_NAMES["cow_copies"], str(m["cow_copies"]),
                   METRICS["cow_copies"]),
        MetricItem("Prefix cache", "Prefix-cache queries",
                   f"{queries} ({counted(q_tokens, 'token')})",
                   METRICS["prefix_queries"] + " In brackets, the tokens looked up."),
        MetricItem("Prefix cache", "Prefix-cache hits",
                   f"{counted(m['prefix_hit_blocks'], 'block')} "
                   f"({counted(hit_tokens, 'token')})", METRICS["prefix_hit_blocks"]),
        MetricItem("Prefix cache", CARD_NAMES["prefix_floor_tokens"], counted(floor, "token"),
                   METRICS["prefix_floor_tokens"]),
        MetricItem("Memory", "Bytes per block", format_bytes(bpb),
                   "2 (K and V) × layers × KV heads × head dim × block size × bytes per "
                   "element."),
        MetricItem("Memory", "Total KV bytes", format_bytes(n * bpb),
                   "The whole pool, allocated once when the engine starts."),
    ]


@dataclass(frozen=True, slots=True)
class KernelInfo:
    backend: str
    device: str
    time_ms: str
    max_abs_err: str
    batch: str
    ran: bool


def kernel_info(snap: Snapshot) -> KernelInfo:
    """The last model step's kernel, formatted; `ran` is False before any step.

    A step that ran without a reference check (a GPU compares one forward in
    `reference_every()`, kernels/checks.py) says so rather than showing a blank."""
    k = snap["kernel"]
    err = k.get("max_abs_err")
    ms = k.get("time_ms")
    seqs = k.get("num_seqs", 0)
    toks = k.get("num_query_tokens", 0)
    if err is not None:
        shown_err = f"{err:.1e}"
    elif ms is None:
        shown_err = "—"
    else:
        shown_err = "not checked at this step"
        if str(k["device"]).startswith("cuda"):
            shown_err += (f" (a GPU compares one forward in {reference_every()}, counted "
                          f"across this server's sessions, with the reference: "
                          f"{REFERENCE_EVERY_ENV})")
    return KernelInfo(
        backend=k["backend"], device=k["device"],
        time_ms="—" if ms is None else f"{ms:.1f} ms",
        max_abs_err=shown_err,
        batch=f"{counted(seqs, 'sequence')}, {counted(toks, 'query token')}" if seqs else "—",
        ran=ms is not None,
    )
