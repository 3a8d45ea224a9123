"""Swap preemption in the Playground through AppTest: the sidebar, the host pool's grid,
the request table and the focus caption."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from tests.test_app import add, click, engine, html, start
from tests.test_app_timeline import requests_table


def host_caption(at: AppTest) -> str | None:
    found = [c.value for c in at.caption if c.value.startswith("Host pool:")]
    assert len(found) <= 1
    return found[0] if found else None


def swap_engine() -> AppTest:
    at = start(num_blocks=12)
    at.sidebar.radio(key="cfg_preemption").set_value("swap").run()
    assert not at.exception
    # Picking swap with no host pool gives one as large as the device pool.
    assert at.sidebar.number_input(key="cfg_num_cpu_blocks").value == 12
    e = engine(at)
    assert e.config.preemption == "swap" and e.config.num_cpu_blocks == 12
    return at


def test_a_swapped_request_shows_in_the_host_pool_and_its_table() -> None:
    at = swap_engine()
    for rid in "ABC":
        add(at, f"request {rid} asks something", rid=rid, max_new=30)
    # The device grid, the host pool's grid and the translator's vector.
    assert len(at.get("vega_lite_chart")) == 3
    assert host_caption(at) == ("Host pool: 0 of 12 blocks hold swapped-out K/V (no "
                                "request); 0 swap-outs, 0 swap-ins so far.")
    for _ in range(20):
        if engine(at).swapped:
            break
        click(at, "btn_step")
    e = engine(at)
    assert e.swapped, "the 12-block pool should swap a request out"
    rid = e.swapped[0]
    row = requests_table(at).loc[rid]
    assert row["status"] == "swapped to host"
    assert str(row["block table (logical→physical)"]).startswith("host 0→")   # host blocks
    caption = host_caption(at)
    assert caption is not None and f"K/V ({rid})" in caption
    # The device grid no longer counts it as a holder; the focus says where it is.
    at.selectbox(key="focus_req").set_value(rid).run()
    assert any("swapped out" in m.value for m in at.markdown)
    for _ in range(40):
        if e.idle:
            break
        click(at, "btn_step")
    assert e.host is not None and e.host.swap_ins > 0


def test_without_swap_there_is_no_host_pool() -> None:
    at = add(start())
    assert host_caption(at) is None and len(at.get("vega_lite_chart")) == 2
    assert at.sidebar.number_input(key="cfg_num_cpu_blocks").disabled


def test_the_add_form_adds_parallel_samples_that_share_the_prompt() -> None:
    at = start()
    at.number_input(key="add_n").set_value(3)
    add(at, "Tell me a story about a cat")
    e = engine(at)
    assert list(e.running) == ["A.0", "A.1", "A.2"]
    table = requests_table(at)
    assert list(table.loc[["A.1", "A.2"], "parent"]) == ["A.0", "A.0"]
    assert at.selectbox(key="req_pick").value == "A.0"
    # The next free id skips A, whose samples exist; n is a one-off, cleared by the add.
    assert at.number_input(key="add_n").value is None
    add(at, "another prompt")
    assert "B" in e.requests and not {"B.0", "B.1", "B.2"} & set(e.requests)
    at.number_input(key="add_n").set_value(1)
    add(at, "one more")
    assert "C" in e.requests


def test_a_large_host_pool_is_drawn_a_page_at_a_time() -> None:
    """A host pool past one page of cells has its own page picker and title: before, its
    grid drew the first 1,024 blocks alone, untitled, while a swapped request's table
    pointed past them."""
    at = swap_engine()
    # An engine without requests takes a setting at once.
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(2048).run()
    assert not at.exception and engine(at).config.num_cpu_blocks == 2048
    pick = at.selectbox(key="host_grid_page")
    assert pick.label == "Host blocks shown"
    assert pick.options == ["0–1,023", "1,024–2,047"]
    titles = [m.value for m in at.markdown if m.value.startswith("**Host pool blocks")]
    assert titles == ["**Host pool blocks 0–1,023 of 2,048 (4 slots each)**"]
    pick.select(1).run()
    assert not at.exception
    titles = [m.value for m in at.markdown if m.value.startswith("**Host pool blocks")]
    assert titles == ["**Host pool blocks 1,024–2,047 of 2,048 (4 slots each)**"]
    # The device pool, one page, keeps no picker of its own.
    assert "grid_page" not in [s.key for s in at.selectbox]
    # A reset goes back to the first page, as the device pool's picker does.
    at.button(key="btn_reset").click().run()
    assert at.selectbox(key="host_grid_page").value == 0
    # So does a pool that shrank to one page and grew again.
    at.selectbox(key="host_grid_page").select(1).run()
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(12).run()
    assert "host_grid_page" not in [s.key for s in at.selectbox]
    at.sidebar.number_input(key="cfg_num_cpu_blocks").set_value(2048).run()
    assert at.selectbox(key="host_grid_page").value == 0


def test_a_beam_groups_shared_blocks_show_shared_in_the_host_pool() -> None:
    """A beam group swapped out: the host grid counts the blocks its beams share, and the
    event log says which beam's swap_out shared another beam's copy."""
    at = start(num_blocks=10)
    at.sidebar.toggle(key="cfg_prefix_caching").set_value(False).run()
    at.sidebar.radio(key="cfg_preemption").set_value("swap").run()
    add(at, None, length=11, rid="A", max_new=14)
    at.number_input(key="add_beam").set_value(3)
    add(at, None, length=6, rid="B", max_new=12)
    e = engine(at)
    assert e.config.block_size == 4 and not e.config.prefix_caching
    for _ in range(12):
        if e.swapped:
            break
        click(at, "btn_step")
        e = engine(at)
    assert e.host is not None and len(e.swapped) >= 2
    shared = sum(b.ref_count >= 2 for b in e.host.blocks)
    assert shared >= 1
    grids = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    host = [g["description"] for g in grids
            if g.get("description", "").startswith("Host pool blocks")]
    assert len(host) == 1 and f"{e.host.num_used} used, {shared} of them shared" in host[0]
    log = html(at, "pl-events")
    assert "is already in host block" in log and "and it shares that copy" in log
