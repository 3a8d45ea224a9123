"""The "Contiguous vs paged" page in a real Chromium: every tab, its numbers, a screenshot each.

Runs `streamlit run app.py` and opens the page at /fragmentation, as a reader does (the
app's wide layout is what the tables are sized for). Drives Debian's chromium through
Playwright's `executable_path`, since Playwright's own browser download cannot work
offline. A missing browser fails the test: it must not pass without having looked at the
page. Screenshots: build/screenshots/compare-*.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from backend.engine.sharing import recorded_results
from backend.lab.compare.block_sizes import trace_block_sweep
from backend.lab.sim.simulator import SimConfig, simulate_workload
from backend.views.compare import frames as views
from backend.views.compare import tables
from tests.browser_support import CHROMIUM_ARGS, SCREENSHOTS, in_app, scroll_to, serve

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def page_url() -> Iterator[str]:
    """The page's address on a fresh `streamlit run app.py`, stopped after the module."""
    with serve("app.py", "test_compare_browser") as url:
        yield f"{url}/fragmentation"


def open_tab(page: Page, name: str, *, charts: bool = True) -> None:
    page.get_by_role("tab", name=name).click()
    panel = page.get_by_role("tabpanel", name=name)
    expect(panel).to_be_visible()
    if charts:
        expect(panel.locator(".vega-embed").first).to_be_visible()


def shot(page: Page, name: str) -> None:
    # Vega draws asynchronously after the embed appears. (The page scrolls inside
    # Streamlit's own container, so the tall viewport is what captures it whole.)
    page.wait_for_timeout(800)
    page.screenshot(path=SHOTS / f"compare-{name}.png", full_page=True)


def shot_of(locator: Locator, name: str) -> None:
    """One element, scrolled into view (the page is taller than the viewport)."""
    scroll_to(locator)
    locator.page.wait_for_timeout(800)
    locator.screenshot(path=SHOTS / f"compare-{name}.png")


# Each table of the open tab: its grid's scrolled and visible width and height.
TABLES = """() => [...document.querySelectorAll(
        '[role=tabpanel]:not([hidden]) [data-testid=stDataFrame] .dvn-scroller')]
    .map(s => ({wide: [s.scrollWidth, s.clientWidth], tall: [s.scrollHeight, s.clientHeight]}))"""


def tables_fit(page: Page, count: int) -> None:
    """The open tab's `count` tables show every column and row without scrolling."""
    # Only the open tab is drawn: its tables come with its run, after the click.
    page.wait_for_function(f"({TABLES})().length >= {count}", timeout=60_000)
    page.wait_for_timeout(500)     # a grid sizes itself once drawn
    sizes = page.evaluate(TABLES)
    assert len(sizes) == count, sizes
    assert all(s["wide"][0] <= s["wide"][1] and s["tall"][0] <= s["tall"][1]
               for s in sizes), sizes


def test_every_tab_in_chromium(page_url: str, chromium_path: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # What the page must show, computed here from the backend directly.
    sims = [simulate_workload("sharegpt", SimConfig(p), requests=1000, rate=4.0, seed=0)
            for p in ("max", "pow2", "oracle", "paged")]
    gain = views.batch_gain_sentence(sims)
    paged = sims[-1]
    tradeoff = tables.block_tradeoff_sentence(trace_block_sweep("sharegpt", 1000, 0))
    sharing = tables.sharing_sentence(recorded_results()[1])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 3000})
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page.goto(page_url)
            expect(page.get_by_role("heading", name="Contiguous vs paged")).to_be_visible(
                timeout=60_000)

            open_tab(page, "The seed's example")
            expect(in_app(page).get_by_text("5 slots are free in total but the largest hole is 3")
                   ).to_be_visible()
            expect(in_app(page).get_by_text("block table [11, 12, 13, 14]")).to_be_visible()
            shot(page, "1-seed")

            open_tab(page, "One workload, two memories")
            expect(in_app(page).get_by_text("The last request finished in iteration")
                   ).to_be_visible()
            panel = page.get_by_role("tabpanel", name="One workload, two memories")
            # Two maps, two area charts and the breakdown bars; the legend is text.
            expect(panel.locator(".vega-embed")).to_have_count(5)
            expect(panel.locator(".pl-kind-legend")).to_contain_text("internal fragmentation")
            shot(page, "2-maps")

            # Nothing is drawn here until a run.
            open_tab(page, "Trace simulator", charts=False)
            page.get_by_role("button", name="Run simulation").click()
            expect(in_app(page).get_by_text(gain)).to_be_visible()
            expect(in_app(page).get_by_text("Last run: sharegpt, 1,000 requests")).to_be_visible()
            panel = page.get_by_role("tabpanel", name="Trace simulator")
            expect(in_app(page).get_by_text(f"Why {paged.preemptions:,} preemptions for 1,000 "
                                    "requests.")).to_be_visible()
            # Policy bars (3), breakdown, the preemption histogram and the timeline.
            expect(panel.locator(".vega-embed")).to_have_count(6)
            expect(panel.get_by_text("Timeline (CSV)")).to_be_visible()
            shot(page, "3-simulator")
            shot_of(panel.locator(".vega-embed").last, "3b-simulator-timeline")

            # Issue 13: with the run above cached, this button crashed every session.
            open_tab(page, "Block size")
            expect(in_app(page).get_by_text(tradeoff)).to_be_visible()
            tables_fit(page, 1)     # every column of the sweep in view
            page.get_by_role("button", name="Simulate every block size").click()
            expect(in_app(page).get_by_text("In the simulator, block size 1:")).to_be_visible()
            expect(page.locator(".stException")).to_have_count(0)
            shot(page, "4-block-size")

            open_tab(page, "Real deployment", charts=False)
            panel = page.get_by_role("tabpanel", name="Real deployment")
            panel.get_by_role("combobox").first.click()
            page.get_by_role("option", name="azure-code").click()
            expect(panel.get_by_text("Llama-3-8B on one H200.")).to_be_visible()
            # The preset's time scale as it is, not with two decimals ("400.00").
            expect(panel.get_by_role("spinbutton", name="Time scale")).to_have_value("400")
            panel.get_by_role("button", name="Replay the whole trace").click()
            # Another tab opened while it replays stops the page's run, not the replay:
            # back on this tab, its bar goes on and its result comes.
            expect(panel.get_by_test_id("stProgress")).to_be_visible(timeout=60_000)
            open_tab(page, "Memory calculator", charts=False)
            expect(in_app(page).get_by_text("819,200 bytes per token (800 KiB)")).to_be_visible()
            open_tab(page, "Real deployment", charts=False)
            panel = page.get_by_role("tabpanel", name="Real deployment")
            expect(panel.get_by_text("the direction of the paper's Figure 13")).to_be_visible(
                timeout=120_000)
            expect(panel.get_by_text("NOT the direction")).to_have_count(0)
            shot(page, "4b-deployment")
            shot_of(panel.locator(".vega-embed").last, "4c-deployment-timeline")

            # Real engines at four block sizes; all twelve runs' columns in view.
            open_tab(page, "Swap or recompute", charts=False)
            panel = page.get_by_role("tabpanel", name="Swap or recompute")
            panel.get_by_role("button", name="Run on the engine").click()
            expect(panel.get_by_text("every request generated exactly the tokens")
                   ).to_be_visible(timeout=120_000)
            expect(panel.locator(".vega-embed")).to_have_count(1)
            tables_fit(page, 1)
            shot(page, "4d-swap")

            open_tab(page, "Sharing")
            expect(in_app(page).get_by_text(sharing)).to_be_visible()
            tables_fit(page, 1)
            shot(page, "5-sharing")
            # A refusal in "Run it here" leaves the estimate below it open.
            estimate = page.locator("details", has_text="Estimate for a whole Alpaca-like")
            estimate.locator("summary").click()
            expect(estimate).to_have_attribute("open", "")
            expect(estimate.get_by_test_id("stDataFrame")).to_be_visible()
            tables_fit(page, 2)     # the recorded run's table and the estimate's
            prompts = page.get_by_role("tabpanel", name="Sharing").get_by_label("Prompts")
            prompts.fill("0")
            prompts.press("Enter")
            expect(in_app(page).get_by_text("Prompts must be 1 to 16; got 0")).to_be_visible()
            expect(estimate).to_have_attribute("open", "")
            prompts.fill("4")
            prompts.press("Enter")
            expect(in_app(page).get_by_text("Prompts must be 1 to 16; got 0")).to_have_count(0)

            open_tab(page, "Memory calculator", charts=False)   # tables and metrics only
            expect(in_app(page).get_by_text("819,200 bytes per token (800 KiB)")).to_be_visible()
            expect(in_app(page).get_by_text("15,447", exact=True)).to_be_visible()
            # Every model's shape, the source column included, without scrolling.
            tables_fit(page, 2)
            shot(page, "6-calculator")
            # A panel left open is open again when its tab is: Streamlit drops the state
            # of a widget a run does not draw, and it came back closed.
            open_tab(page, "Sharing")
            estimate = page.locator("details", has_text="Estimate for a whole Alpaca-like")
            expect(estimate).to_have_attribute("open", "")
            expect(estimate.get_by_test_id("stDataFrame")).to_be_visible()
            # Only the open tab is drawn; one drawn again shows its last run as it was,
            # and the address names it, so a reload opens it.
            open_tab(page, "Trace simulator")
            expect(in_app(page).get_by_text("Last run: sharegpt, 1,000 requests")).to_be_visible()
            expect(page).to_have_url(re.compile(r"[?&]tab=Trace(\+|%20)simulator"))
            page.reload()
            expect(page.get_by_role("tab", name="Trace simulator")).to_have_attribute(
                "aria-selected", "true", timeout=60_000)
            expect(page.get_by_role("tabpanel", name="Trace simulator").get_by_role(
                "button", name="Run simulation")).to_be_visible()
            # No section fell over.
            expect(page.locator(".stException")).to_have_count(0)
        finally:
            browser.close()
