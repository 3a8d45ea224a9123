"""Exports are exactly what the snapshot says, in every format."""

from __future__ import annotations

import io
import json
import zipfile

import altair as alt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Fork, Grow, Op
from backend.engine.sampling import render_tokens
from backend.io.export import (
    blocks_table,
    chart_png,
    chart_svg,
    events_table,
    requests_table,
    run_zip,
    snapshot_bytes,
    to_csv,
    to_parquet,
)
from backend.io.snapshot import export_snapshot


@pytest.fixture(scope="module")
def run() -> list[dict]:
    engine = Engine(EngineConfig(num_blocks=12, block_size=4), kernel="torch")
    ops: list[Op] = [Add("A", prompt="The cat sat"), Fork("A", "B"), Grow("B", 2)]
    snaps = []
    for op in ops:
        engine.apply(op)
        snaps.append(export_snapshot(engine))
    return snaps


def test_tables_hold_the_snapshot(run: list[dict]) -> None:
    snap = run[-1]
    blocks = blocks_table(snap)
    assert list(blocks["id"]) == list(range(12))
    assert blocks.loc[0, "holders"] == "A B" and blocks.loc[0, "ref_count"] == 2
    assert blocks.loc[3, "holders"] == "B" and blocks.loc[3, "state"] == "used"
    reqs = requests_table(snap)
    assert list(reqs["id"]) == ["A", "B"]
    assert list(reqs.loc[1, "block_table"]) == [0, 1, 3, 4] and reqs.loc[1, "parent"] == "A"
    assert list(reqs.loc[0, "tokens"])[:3] == [84, 104, 101]
    # The tiny byte model's tokens are bytes: the text is theirs, as the page shows it.
    assert reqs.loc[0, "text"].startswith("The cat sat")
    assert reqs.loc[1, "text"] == render_tokens(snap["requests"][1]["tokens"])
    events = events_table(snap)
    cow = events[events["kind"] == "cow"].iloc[0]
    assert (cow["request"], cow["src"], cow["dst"], cow["step"]) == ("B", 2, 3, 3)
    assert len(events) == len(snap["events"])


def test_csv_and_parquet_round_trip(run: list[dict]) -> None:
    snap = run[-1]
    for df in (blocks_table(snap), requests_table(snap), events_table(snap)):
        back = pd.read_csv(io.BytesIO(to_csv(df)), keep_default_na=False)
        assert list(back.columns) == list(df.columns) and len(back) == len(df)
        back = pd.read_parquet(io.BytesIO(to_parquet(df)))
        # pandas reads a Parquet list as an array: compare the lists.
        for col in {"block_table", "tokens"}.intersection(df.columns):
            back[col] = back[col].map(list)
        pd.testing.assert_frame_equal(back, df)


def test_parquet_holds_lists_of_ints_and_csv_the_numbers_and_the_text(run: list[dict]) -> None:
    snap = run[-1]
    table = pq.read_table(io.BytesIO(to_parquet(requests_table(snap))))
    assert table.schema.field("block_table").type == pa.list_(pa.int64())
    assert table.schema.field("tokens").type == pa.list_(pa.int64())
    text_type = table.schema.field("text").type
    assert pa.types.is_string(text_type) or pa.types.is_large_string(text_type)
    rows = table.to_pylist()
    assert rows[1]["block_table"] == [0, 1, 3, 4]
    assert rows[1]["tokens"] == snap["requests"][1]["tokens"]
    assert rows[0]["text"] == render_tokens(snap["requests"][0]["tokens"])
    # CSV has no lists: the numbers space-separated, the text beside them.
    back = pd.read_csv(io.BytesIO(to_csv(requests_table(snap))), keep_default_na=False)
    assert back.loc[1, "block_table"] == "0 1 3 4"
    assert back.loc[0, "tokens"].split()[:3] == ["84", "104", "101"]
    assert back.loc[0, "text"] == render_tokens(snap["requests"][0]["tokens"])
    # A real model's snapshot carries each request's decoded text: that is the column.
    real = {**snap, "config": {**snap["config"], "model": "smollm2-135m"},
            "requests": [{**r, "text": f"text of {r['id']}, with, commas\nand a line"}
                         for r in snap["requests"]]}
    reqs = requests_table(real)
    assert list(reqs["text"]) == ["text of A, with, commas\nand a line",
                                  "text of B, with, commas\nand a line"]
    back = pd.read_csv(io.BytesIO(to_csv(reqs)), keep_default_na=False)
    assert list(back["text"]) == list(reqs["text"])
    # No requests: still list columns.
    empty = pq.read_table(io.BytesIO(to_parquet(requests_table({**snap, "requests": []}))))
    assert empty.num_rows == 0 and empty.schema.field("tokens").type == pa.list_(pa.int64())


def test_run_zip_holds_one_snapshot_per_step(run: list[dict]) -> None:
    with zipfile.ZipFile(io.BytesIO(run_zip(run))) as zf:
        assert zf.namelist() == ["step-0001.json", "step-0002.json", "step-0003.json"]
        assert json.loads(zf.read("step-0002.json")) == run[1]
        assert zf.read("step-0003.json") == snapshot_bytes(run[2])


def test_charts_render_without_a_browser() -> None:
    chart = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_rect().encode(x="x:O", y="y:O")
    png = chart_png(chart)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 200
    svg = chart_svg(chart)
    assert svg.lstrip().startswith("<svg") and "</svg>" in svg
