"""View models for the block-size, sharing and memory-calculator sections of the
"Contiguous vs paged" page: pandas DataFrames and sentences (no Streamlit)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from backend.core.words import counted, tenths
from backend.lab.compare.block_sizes import BlockSizePoint
from backend.lab.memory_calc import MODELS, KVCapacity, ModelShape, binary_size
from backend.lab.sharing import SharingResult
from backend.lab.sim.simulator import SimResult
from backend.views.compare.frames import SHARING_KINDS, pct

# ---- block size ------------------------------------------------------------------


def block_sweep_frame(points: Sequence[BlockSizePoint]) -> pd.DataFrame:
    """One row per block size; means rounded for display, the waste share left exact."""
    return pd.DataFrame([{
        "block size": p.block_size, "tail waste": p.tail_waste_share,
        "empty last-block slots at finish": round(p.mean_tail_slots, 2),
        "table entries at finish": round(p.mean_table_entries, 2),
        "largest table at finish": p.max_table_entries,
        "table entries, time-averaged": round(p.mean_live_entries, 2),
    } for p in points])


def block_tradeoff_sentence(points: Sequence[BlockSizePoint], picks: Sequence[int] = (1, 16, 256)
                            ) -> str:
    """'block size 16: x% tail waste, y table entries per request at its end; ...' for the
    picks present (the waste averaged over each request's life, the entries at its end:
    the table's "entries (end)")."""
    by = {p.block_size: p for p in points}
    parts = [f"block size {b}: {pct(by[b].tail_waste_share)} tail waste, "
             f"{by[b].mean_table_entries:.1f} table entries per request at its end"
             for b in picks if b in by]
    return "; ".join(parts) + "." if parts else ""


def block_batch_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """Paged simulator results by block size: mean batch, internal fragmentation (a share
    of the KV capacity, time-averaged), preemptions."""
    return pd.DataFrame([{"block size": r.block_size, "mean batch size": r.mean_batch_size,
                          "internal fragmentation of capacity":
                              r.memory["internal_fragmentation"],
                          "preemptions": r.preemptions} for r in results])


def block_batch_sentence(results: Sequence[SimResult]) -> str:
    """The smallest and largest block sizes' mean batch and internal fragmentation.

    The fragmentation is the simulator's, a time-averaged share of the whole KV capacity
    (free slots included), beside a table whose tail waste is a share of the slots
    allocated: the sentence names its base, or the two read as one figure twice.
    """
    if not results:
        return ""
    ends = sorted(results, key=lambda r: r.block_size or 0)
    parts = [f"block size {r.block_size}: mean batch {tenths(r.mean_batch_size)}, "
             f"{pct(r.memory['internal_fragmentation'])} of the KV capacity lost to internal "
             "fragmentation" for r in (ends[0], ends[-1])]
    return ("In the simulator, " + "; ".join(parts) + " (time-averaged over the run; the "
            "table's tail waste is a share of the slots allocated, averaged over each "
            "request's life, so the two differ).")


# The inputs a block-size simulation ran with: workload, requests, seed.
BlockRunInputs = tuple[str, int, int]


def block_run_caption(ran: BlockRunInputs, fields: BlockRunInputs, *, rate: float,
                      capacity: int) -> str:
    """Which inputs the shown block-size simulation ran with and, when the fields no longer
    match them, which differ: a result kept in the session must never read as the answer
    to fields it did not run (switching the workload does not rerun it)."""
    workload, requests, seed = ran
    text = (f"Last run: {workload}, {counted(requests, 'request')}, seed {seed}, at "
            f"{rate:g} requests/s in {capacity:,} token slots.")
    changed = [f"{name} {now:,}" if isinstance(now, int) else f"{name} {now}"
               for name, was, now in zip(("workload", "requests", "seed"), ran, fields,
                                         strict=True) if was != now]
    if changed:
        text += (f" The fields have changed since ({', '.join(changed)}): the numbers below "
                 "are from before; press Simulate every block size to run the fields.")
    return text


# ---- sharing -----------------------------------------------------------------------


def sharing_frame(results: Sequence[SharingResult]) -> pd.DataFrame:
    """One row per (kind, n): saved share of block memory beside the paper's range."""
    return pd.DataFrame([{
        "kind": SHARING_KINDS[r.kind], "n": r.n, "saved": r.saved_fraction,
        "paper low": r.paper_low, "paper high": r.paper_high,
        "paper range": f"{pct(r.paper_low)} - {pct(r.paper_high)}",
        # What `saved` is computed from (1 - held / unshared), so that it can be checked
        # against the columns beside it; the peaks are another measure.
        "block-steps held": r.trace.used_block_steps,
        "block-steps unshared": r.trace.unshared_block_steps,
        "copy-on-write copies": r.trace.cow_copies,
        "peak blocks shared": r.trace.peak_used_blocks,
        "peak blocks unshared": r.trace.peak_unshared_blocks,
        "requests": r.requests,
    } for r in results])


def sharing_sentence(results: Sequence[SharingResult]) -> str:
    """Our saved range per kind beside the paper's, e.g. 'Parallel sampling (2, 4, 6) saved
    3.3% to 6.2% of block memory (paper: 6.1% to 9.8%); beam search ...'."""
    names = {"parallel": "Parallel sampling", "beam": "beam search"}
    parts: list[str] = []
    for kind, name in names.items():
        rs = sorted((r for r in results if r.kind == kind), key=lambda r: r.n)
        if not rs:
            continue
        ns = ", ".join(str(r.n) for r in rs)
        lo = min(r.saved_fraction for r in rs)
        hi = max(r.saved_fraction for r in rs)
        parts.append(f"{name} ({ns}) saved {pct(lo)} to {pct(hi)} of block memory "
                     f"(paper: {pct(rs[0].paper_low)} to {pct(rs[0].paper_high)})")
    return "; ".join(parts) + "." if parts else ""


# ---- memory calculator ---------------------------------------------------------------


def human_bytes(n: int) -> str:
    """Bytes in binary units at `memory_calc.binary_size`'s precision: 819200 -> '800 KiB',
    Gemma-2-9B's 16-token block '5.25 MiB' (one decimal would show '5.2 MiB')."""
    return binary_size(n)


def window_note(model: ModelShape, request_len: int) -> str:
    """What the formula overstates for a model whose layers partly attend within a sliding
    window ('' for one without): the figures count every layer's K/V for every token."""
    if not model.window:
        return ""
    said = (f"{model.name}: {model.window_layers} of its {model.num_layers} layers attend "
            f"only within the last {model.window:,} tokens, and an engine that keeps just "
            "those needs less for longer requests; the figures here count every layer for "
            "every token, as an engine that ignores the window does.")
    share = model.windowed_share(request_len)
    if share == 1.0:
        return said + (f" At {counted(request_len, 'token')}, within the window, that is "
                       "exact.")
    return said + (f" At {counted(request_len, 'token')} a request's K/V with the window is "
                   f"{share:.3g} of what is shown (({model.num_layers - model.window_layers} "
                   f"x {request_len:,} + {model.window_layers} x {model.window:,}) / "
                   f"({model.num_layers} x {request_len:,})).")


def fit_note(cap: KVCapacity, block_size: int = 16) -> str:
    """Why the requests metric and the table's row for `block_size` may differ: the metric
    divides the KV tokens by the request length, slot-exact; in blocks each request takes
    whole blocks, and the pool only whole blocks."""
    row = next((b for b in cap.per_block if b.block_size == block_size), None)
    said = (f"Slot-exact: {cap.kv_tokens:,} KV tokens ÷ {cap.request_len:,} = "
            f"{counted(cap.requests, 'request')}, with no block rounding.")
    if row is None:
        return said
    tail = (f"{counted(row.tail_waste_slots, 'slot')} of its last one empty"
            if row.tail_waste_slots else "its last one full")
    return said + (f" In blocks of {block_size} (the table's row) each request takes "
                   f"{counted(row.blocks_per_request, 'whole block')} ({tail}) of "
                   f"{row.num_blocks:,}, so {counted(row.requests, 'request')} fit.")


def windowed_models_note() -> str:
    """The model shapes table's word on models whose bytes the formula overstates."""
    return " ".join(f"{m.name}: {m.note} (the table counts every layer)." for m in
                    MODELS.values() if m.window)


def capacity_blocks_frame(cap: KVCapacity) -> pd.DataFrame:
    """One row per block size: bytes per block, blocks, tokens and requests that fit."""
    return pd.DataFrame([{
        "block size": b.block_size, "bytes per block": b.bytes_per_block,
        "per block": human_bytes(b.bytes_per_block), "blocks": b.num_blocks,
        "KV tokens": b.kv_tokens, "blocks per request": b.blocks_per_request,
        "requests that fit": b.requests, "tail waste per request (slots)": b.tail_waste_slots,
    } for b in cap.per_block])


def models_frame(kv_dtype_bytes: int = 2) -> pd.DataFrame:
    """Every known model's KV bytes per token and per 16-token block."""
    return pd.DataFrame([{
        "model": m.name, "layers": m.num_layers, "query heads": m.num_heads,
        "KV heads": m.num_kv_heads, "head dim": m.head_dim,
        "parameters (B)": round(m.num_params / 1e9, 2),
        "bytes per token": m.kv_bytes_per_token(kv_dtype_bytes),
        "per token": human_bytes(m.kv_bytes_per_token(kv_dtype_bytes)),
        "per 16-token block": human_bytes(m.kv_bytes_per_block(16, kv_dtype_bytes)),
        "source": m.source,
    } for m in MODELS.values()])
