"""The block tables at 1400 px: every column readable, the block table wrapped when long.

st.dataframe draws on a canvas, so the test reads what the page asks of it: the
column order, each column's width, and the row height (over 64 px, Streamlit
wraps a cell's text). Together the widths fit the ~940 px a 1400 px window gives
the table beside the sidebar, so no column is cut off or pushed out of view.
"""

from __future__ import annotations

import json

from tests.test_app import add, start

BLOCK_TABLE_COLUMN = "block table (logical→physical)"

TABLE_AT_1400 = 940     # px: the main column of a 1400 px window with the sidebar open


def test_every_column_has_a_width_that_fits_and_a_long_table_wraps() -> None:
    at = add(start(num_blocks=64), None, length=70)      # 18 blocks: a long block table
    frame = at.dataframe[0]
    # The block table next to the status: in view at 1024 px, where the counts scroll.
    assert list(frame.value.columns)[:3] == ["request", "status", BLOCK_TABLE_COLUMN]
    config = json.loads(frame.proto.columns)
    widths = {c: config[c].get("width") for c in frame.value.columns}
    assert all(isinstance(w, int) for w in widths.values()), widths
    assert sum(widths.values()) <= TABLE_AT_1400, widths
    # Narrower windows scroll the table sideways, with the request in view.
    assert config["request"].get("pinned") is True
    assert not any(config[c].get("pinned") for c in widths if c != "request")
    # The widest column is the block table's; its 18 entries wrap onto 3 lines.
    assert max(widths, key=lambda c: widths[c]) == BLOCK_TABLE_COLUMN
    assert frame.proto.row_height > 64
    # A short table keeps one line per request.
    short = add(start())
    assert short.dataframe[0].proto.row_height == 0


def test_with_beams_the_block_table_gives_log_p_its_room_and_long_tables_show_both_ends(
        ) -> None:
    at = start(num_blocks=256)
    at.number_input(key="add_beam").set_value(2)
    add(at, None, length=150, max_new=4)     # 38 blocks of 4: too long for four lines
    frame = at.dataframe[0]
    config = json.loads(frame.proto.columns)
    widths = {c: config[c].get("width") for c in frame.value.columns}
    assert "log p" in widths and sum(widths.values()) <= TABLE_AT_1400, widths
    shown = frame.value.set_index("request").loc["A.0", BLOCK_TABLE_COLUMN]
    # The first entries and the last, with its fill; the middle counted, not cut.
    assert shown.startswith("0→0 · 1→1 · ") and shown.endswith(" · 37→37 (2/4)"), shown
    kept = [e for e in shown.split(" · ") if "more" not in e]
    assert f"… {38 - len(kept)} more …" in shown


def test_past_a_dozen_requests_the_table_scrolls_and_says_so() -> None:
    at = start()
    for _ in range(13):
        add(at, "ab")
    assert any(c.value == "13 requests, 12 in view: scroll the table for the rest."
               for c in at.caption)
