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
import pyarrow as pa
import pyarrow.parquet as pq

from backend.core.config import TINY_BYTE
from backend.core.errors import PagedLabError
from backend.engine.sampling import render_tokens
from backend.models.registry import codec_for

TableName = Literal["blocks", "requests", "events"]
TABLES: tuple[TableName, ...] = ("blocks", "requests", "events")
# Columns of int lists (a block table, a request's tokens): Python lists in the frame,
# list<int64> in Parquet, space-separated numbers in CSV. (Not pandas' ArrowDtype: a
# frame that has one writes pandas metadata that pd.read_parquet cannot read back.)
INT_LIST_COLUMNS = frozenset({"block_table", "tokens"})


def blocks_table(snapshot: dict[str, Any]) -> pd.DataFrame:
    """One row per physical block: id, state, ref_count, num_filled, hash, holders (the
    requests whose tables hold it: a swapped-out request's table names host blocks, and
    holds none of these)."""
    holders: dict[int, list[str]] = {}
    for req in snapshot["requests"]:
        if req["status"] == "swapped":
            continue
        for b in req["block_table"]:
            holders.setdefault(b, []).append(req["id"])
    rows = [{**b, "holders": " ".join(holders.get(b["id"], []))} for b in snapshot["blocks"]]
    df = pd.DataFrame(rows, columns=["id", "state", "ref_count", "num_filled", "hash", "holders"])
    return df.astype({"id": "int64", "ref_count": "int64", "num_filled": "int64",
                      "state": "string", "hash": "string", "holders": "string"})


def request_text(snapshot: dict[str, Any], request: dict[str, Any]) -> str | None:
    """A request's tokens as text: the snapshot's decoded `text` where it has one (a real
    model's requests do), else, for the tiny byte model, its bytes as the pages show them
    (`render_tokens`: printable ASCII as is, a line break as \\n, other bytes as \\xNN),
    and for a real model its tokens decoded by its tokenizer. None if that tokenizer is
    not installed here."""
    text = request.get("text")
    if isinstance(text, str):
        return text
    model = snapshot["config"].get("model", TINY_BYTE)
    if model == TINY_BYTE:
        return render_tokens(request["tokens"])
    try:
        return codec_for(str(model)).decode(request["tokens"])
    except PagedLabError:
        return None


def requests_table(snapshot: dict[str, Any]) -> pd.DataFrame:
    """One row per request; its block table and tokens as lists of ints, and its text.
    `pool` says whose blocks the table names: the device pool's, or for a swapped-out
    request the host pool's.

    `to_parquet` writes the lists as list<int64>, `to_csv` as space-separated numbers.
    """
    rows = []
    for r in snapshot["requests"]:
        rows.append({
            "id": r["id"], "status": r["status"], "parent": r["parent"],
            "prompt_len": r["prompt_len"], "num_tokens": r["num_tokens"],
            "num_preemptions": r["num_preemptions"],
            "max_new_tokens": r.get("max_new_tokens"),
            "finish_reason": r.get("finish_reason"),
            "block_table": list(r["block_table"]),
            "pool": "host" if r["status"] == "swapped" else "device",
            "tokens": list(r["tokens"]),
            "text": request_text(snapshot, r),
        })
    cols = ["id", "status", "parent", "prompt_len", "num_tokens", "num_preemptions",
            "max_new_tokens", "finish_reason", "block_table", "pool", "tokens", "text"]
    df = pd.DataFrame(rows, columns=cols)
    return df.astype({"id": "string", "status": "string", "parent": "string",
                      "prompt_len": "int64", "num_tokens": "int64", "num_preemptions": "int64",
                      "max_new_tokens": "Int64", "finish_reason": "string",
                      "pool": "string", "text": "string"})


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
    """CSV has no lists: a list column is written as its numbers, space-separated."""
    out = df.copy()
    for col in INT_LIST_COLUMNS.intersection(out.columns):
        out[col] = pd.Series([" ".join(map(str, v)) for v in out[col]], index=out.index,
                             dtype="string")
    return out.to_csv(index=False).encode()


def to_parquet(df: pd.DataFrame) -> bytes:
    """Parquet, with the int-list columns typed list<int64> (also when there are no rows)."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    for col in INT_LIST_COLUMNS.intersection(df.columns):
        i = table.schema.get_field_index(col)
        table = table.set_column(i, col, pa.array([list(v) for v in df[col]],
                                                  type=pa.list_(pa.int64())))
    buf = io.BytesIO()
    pq.write_table(table, buf)
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
