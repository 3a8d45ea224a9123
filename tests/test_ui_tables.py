"""The block tables at 1440 px: every column readable, the block table wrapped when long.

st.dataframe draws on a canvas, so the test reads what the page asks of it: the
column order, each column's width, and the row height (over 64 px, Streamlit
wraps a cell's text). Together the widths fit the ~980 px a 1440 px window gives
the table beside the sidebar, so no column is cut off or pushed out of view.
"""

from __future__ import annotations

import json

from tests.test_app import add, start

BLOCK_TABLE_COLUMN = "block table (logical→physical)"

TABLE_AT_1440 = 980     # px: the main column of a 1440 px window with the sidebar open


def test_every_column_has_a_width_that_fits_and_a_long_table_wraps() -> None:
    at = add(start(num_blocks=64), None, length=70)      # 18 blocks: a long block table
    frame = at.dataframe[0]
    assert list(frame.value.columns)[-2:] == ["preempted", BLOCK_TABLE_COLUMN]
    config = json.loads(frame.proto.columns)
    widths = {c: config[c].get("width") for c in frame.value.columns}
    assert all(isinstance(w, int) for w in widths.values()), widths
    assert sum(widths.values()) <= TABLE_AT_1440, widths
    # The widest column is the block table's; its 18 entries wrap onto 3 lines.
    assert max(widths, key=lambda c: widths[c]) == BLOCK_TABLE_COLUMN
    assert frame.proto.row_height > 64
    # A short table keeps one line per request.
    short = add(start())
    assert short.dataframe[0].proto.row_height == 0
