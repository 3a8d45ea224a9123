"""Exports: a snapshot's tables as CSV and Parquet, a run as a zip, charts as PNG and SVG.

Everything here is a pure function of a snapshot dict (CONTRACT.md's JSON),
so what a person downloads is exactly what the snapshot says, and the same
exports can be produced from a file on the command line. Charts render
without a browser through vl-convert (Vega-Lite compiled in-process).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from typing import Any, Literal

import altair as alt
import pandas as pd

TableName = Literal["blocks", "requests", "events"]
TABLES: tuple[TableName, ...] = ("blocks", "requests", "events")


def blocks_table(snapshot: dict[str, Any]) -> pd.DataFrame:
    """One row per physical block: id, state, ref_count, num_filled, hash, holders."""
    holders: dict[int, list[str]] = {}
    for req in snapshot["requests"]:
        for b in req["block_table"]:
            holders.setdefault(b, []).append(req["id"])
    rows = [{**b, "holders": " ".join(holders.get(b["id"], []))} for b in snapshot["blocks"]]
    df = pd.DataFrame(rows, columns=["id", "state", "ref_count", "num_filled", "hash", "holders"])
    return df.astype({"id": "int64", "ref_count": "int64", "num_filled": "int64",
                      "state": "string", "hash": "string", "holders": "string"})


def requests_table(snapshot: dict[str, Any]) -> pd.DataFrame:
    """One row per request; the table and tokens as space-separated numbers."""
    rows = []
    for r in snapshot["requests"]:
        rows.append({
            "id": r["id"], "status": r["status"], "parent": r["parent"],
            "prompt_len": r["prompt_len"], "num_tokens": r["num_tokens"],
            "num_preemptions": r["num_preemptions"],
            "max_new_tokens": r.get("max_new_tokens"),
            "finish_reason": r.get("finish_reason"),
            "block_table": " ".join(map(str, r["block_table"])),
            "tokens": " ".join(map(str, r["tokens"])),
        })
    cols = ["id", "status", "parent", "prompt_len", "num_tokens", "num_preemptions",
            "max_new_tokens", "finish_reason", "block_table", "tokens"]
    df = pd.DataFrame(rows, columns=cols)
    return df.astype({"id": "string", "status": "string", "parent": "string",
                      "prompt_len": "int64", "num_tokens": "int64", "num_preemptions": "int64",
                      "max_new_tokens": "Int64", "finish_reason": "string",
                      "block_table": "string", "tokens": "string"})


def events_table(snapshot: dict[str, Any]) -> pd.DataFrame:
    """Every event in order; src, dst and ref_count empty where they do not apply."""
    cols = ["step", "kind", "request", "block", "src", "dst", "ref_count"]
    df = pd.DataFrame([{c: e.get(c) for c in cols} for e in snapshot["events"]], columns=cols)
    return df.astype({"step": "int64", "kind": "string", "request": "string", "block": "Int64",
                      "src": "Int64", "dst": "Int64", "ref_count": "Int64"})


def table(snapshot: dict[str, Any], name: TableName) -> pd.DataFrame:
    match name:
        case "blocks":
            return blocks_table(snapshot)
        case "requests":
            return requests_table(snapshot)
        case "events":
            return events_table(snapshot)
    raise ValueError(f"unknown table {name!r}")


def to_csv(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False).encode()


def to_parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


def snapshot_bytes(snapshot: dict[str, Any]) -> bytes:
    """The snapshot as its file text (the same bytes `python -m backend run --out` writes)."""
    return (json.dumps(snapshot, indent=1) + "\n").encode()


def run_zip(snapshots: Sequence[dict[str, Any]]) -> bytes:
    """A whole run: one snapshot per step, named step-NNNN.json by its `step` field."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for snap in snapshots:
            zf.writestr(f"step-{snap['step']:04d}.json", snapshot_bytes(snap))
    return buf.getvalue()


def chart_svg(chart: alt.TopLevelMixin) -> str:
    """Render an Altair chart to SVG without a browser."""
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_dict())


def chart_png(chart: alt.TopLevelMixin, scale: float = 2.0) -> bytes:
    """Render an Altair chart to PNG without a browser (scale 2: sharp on slides)."""
    import vl_convert as vlc

    return vlc.vegalite_to_png(chart.to_dict(), scale=scale)
