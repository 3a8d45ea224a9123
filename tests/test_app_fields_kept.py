"""Fields keep what was typed through a visit to another page (persist_state="session").

Streamlit forgets a widget's value when a run does not draw it; before the fields
persisted, a pool typed and not yet applied, a picked request or a Compare tab's
numbers were back at their defaults after a look at another page.
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.compare_support import CALCULATOR, MAPS, open_tab
from tests.test_app import add, engine, pick, start

PAGES = ("pages/scenarios.py", "pages/compare.py")


def away_and_back(at: AppTest, home: str = "pages/playground.py") -> None:
    for page in (*PAGES, home):
        at.switch_page(page).run()
        assert not at.exception


def test_a_pool_typed_and_not_applied_is_still_waiting_after_other_pages() -> None:
    at = start()
    add(at)
    kept = engine(at)
    at.sidebar.number_input(key="cfg_num_blocks").set_value(48).run()
    at.sidebar.number_input(key="cfg_max_num_seqs").set_value(3).run()
    assert "btn_apply_config" in [b.key for b in at.sidebar.button]
    away_and_back(at)
    assert at.sidebar.number_input(key="cfg_num_blocks").value == 48
    assert at.sidebar.number_input(key="cfg_max_num_seqs").value == 3
    # Still waiting for the confirmation: the engine and its request are untouched.
    assert "btn_apply_config" in [b.key for b in at.sidebar.button]
    assert engine(at) is kept and kept.config.num_blocks == 32 and "A" in kept.requests
    at.sidebar.button(key="btn_apply_config").click().run()
    assert not at.exception
    assert engine(at).config.num_blocks == 48 and engine(at).config.max_num_seqs == 3


def test_the_picked_request_and_the_highlight_stay_picked() -> None:
    at = start()
    add(at, rid="A")
    add(at, rid="B")
    pick(at, "A")
    at.selectbox(key="focus_req").select("A").run()
    assert at.selectbox(key="req_pick").value == "A"
    away_and_back(at)
    # Without persistence the picker came back empty and the page picked the last, B.
    assert at.selectbox(key="req_pick").value == "A"
    assert at.selectbox(key="focus_req").value == "A"


def test_a_compare_tabs_numbers_are_kept_through_the_playground() -> None:
    at = start()
    at.switch_page("pages/compare.py").run()
    open_tab(at, CALCULATOR)
    at.number_input(key="cmp_calc_gpu").set_value(80.0).run()
    at.selectbox(key="cmp_calc_bits").select(8).run()
    open_tab(at, MAPS).number_input(key="cmp_map_requests").set_value(12).run()
    assert not at.exception
    away_and_back(at, "pages/compare.py")
    assert open_tab(at, CALCULATOR).number_input(key="cmp_calc_gpu").value == 80.0
    assert at.selectbox(key="cmp_calc_bits").value == 8
    assert open_tab(at, MAPS).number_input(key="cmp_map_requests").value == 12
