"""The "Contiguous vs paged" page at 1024 px with the sidebar open, in a real Chromium.

That window leaves the page some 560 px. Every tab's name must show (no scroll arrow
hiding the last ones), no field's text or metric's label be cut short, nothing scroll
sideways, and each table show either every column or, where they cannot all fit, the
columns that carry its point before it scrolls. Screenshots of each tab go to
build/screenshots/compare-1024-*.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser_support import scroll_to

pytestmark = pytest.mark.browser

T = 30_000
# 1024 px wide; tall, so that a screenshot holds most of a tab (Streamlit scrolls its
# main section, not the document). The height leaves the width as it is.
VIEWPORT = {"width": 1024, "height": 1600}
ALL = None   # a table whose every column is in view

# Per tab, in order: what its tables must show. ALL, or the columns (their headers) that
# must be whole in view before the grid scrolls sideways.
TABLES_SHOW: dict[str, list[list[str] | None]] = {
    "The seed's example": [ALL, ALL],
    "One workload, two memories": [ALL],
    "Trace simulator": [],                       # nothing until a run
    "Real deployment": [],
    "Block size": [ALL],
    "Swap or recompute": [["block", "mode", "wall ms", "recomputed", "recompute ms",
                           "swapped", "swap ms"]],
    # The estimate's table is in a closed expander, not drawn.
    "Sharing": [["kind", "n", "saved", "paper", "peak blocks", "peak unshared"]],
    "Memory calculator": [ALL, ["model", "layers", "Q heads", "KV heads", "head dim",
                                "per token", "16-token block"]],
}

# What the open tab cuts short: a field's chosen value (a select's text, a multiselect's
# chips) or a metric's label wider than its box, and the page's own sideways scroll.
CUT = """() => {
    const panel = document.querySelector('[role=tabpanel]:not([hidden])');
    const cut = sel => [...panel.querySelectorAll(sel)]
        .filter(e => e.scrollWidth > e.clientWidth + 1);
    const main = document.querySelector('[data-testid=stMain]');
    return [
        ...cut('input[role=combobox]').map(e => `field ${e.ariaLabel}: ${e.value}`),
        ...cut('[data-testid=stMultiSelectTagsContainer]')
            .map(e => `chips of ${e.querySelector('input').ariaLabel}`),
        ...cut('[data-testid=stMetricLabel] [data-testid=stMarkdownContainer]')
            .map(e => `metric label ${e.innerText}`),
        ...(main.scrollWidth > main.clientWidth ? [`page ${main.scrollWidth} px wide`] : []),
    ];
}"""
# Each table of the open tab: its grid's scrolled and visible width.
WIDTHS = """() => [...document.querySelectorAll(
        '[role=tabpanel]:not([hidden]) [data-testid=stDataFrame] .dvn-scroller')]
    .map(s => [s.scrollWidth, s.clientWidth])"""
# The headers of the columns a grid draws: those at least partly in view (its table for
# screen readers holds no others).
DRAWN = "d => [...d.querySelectorAll('table th')].map(th => th.innerText)"


def tabs_fit(page: Page) -> None:
    """Every tab's name lies inside the tab bar, which does not scroll."""
    bar = page.get_by_role("tablist")
    box = bar.bounding_box()
    assert box is not None
    right = box["x"] + box["width"]
    tabs = page.get_by_role("tab")
    expect(tabs).to_have_count(len(TABLES_SHOW))
    outside = [t.inner_text() for t in tabs.all()
               if (b := t.bounding_box()) is None or b["x"] + b["width"] > right + 1]
    assert outside == [], outside
    assert bar.evaluate("b => b.scrollWidth <= b.clientWidth"), "the tab bar scrolls"


def table_problems(page: Page, name: str) -> list[str]:
    panel = page.get_by_role("tabpanel", name=name)
    wanted = TABLES_SHOW[name]
    widths = page.evaluate(WIDTHS)
    if len(widths) != len(wanted):
        return [f"{name}: {len(widths)} tables, expected {len(wanted)}"]
    problems = []
    for i, (show, (wide, seen)) in enumerate(zip(wanted, widths, strict=True)):
        if show is ALL:
            if wide > seen:
                problems.append(f"{name}, table {i + 1}: {wide} px of columns in {seen}")
            continue
        grid = panel.get_by_test_id("stDataFrame").nth(i)
        scroll_to(grid)
        grid.locator("table th").first.wait_for(state="attached")
        drawn = grid.evaluate(DRAWN)
        # A column is whole in view when the one after it is drawn too.
        if drawn[:len(show)] != show or len(drawn) <= len(show):
            problems.append(f"{name}, table {i + 1}: drew {drawn}, needs {show} whole")
    return problems


def test_at_1024_px_every_tab_reads_without_scrolling_sideways(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = browser.new_page(viewport=VIEWPORT)
    try:
        page.set_default_timeout(T)
        page.goto(f"{app_url}/fragmentation")
        expect(page.get_by_role("heading", name="Contiguous vs paged")).to_be_visible(
            timeout=60_000)
        expect(page.get_by_test_id("stSidebar")).to_be_visible(timeout=T)   # open
        tabs_fit(page)
        problems: list[str] = []
        for n, name in enumerate(TABLES_SHOW, start=1):
            page.get_by_role("tab", name=name).click()
            panel = page.get_by_role("tabpanel", name=name)
            expect(panel).to_be_visible(timeout=T)
            if name == "Swap or recompute":     # its table comes with a run
                panel.get_by_role("button", name="Run on the engine").click()
                expect(panel.get_by_test_id("stDataFrame")).to_be_visible(timeout=120_000)
            # The tab's grids may still be coming (the first tab's, while the page's first
            # run ends); then charts and grids size themselves after they are drawn.
            page.wait_for_function(f"({WIDTHS})().length >= {len(TABLES_SHOW[name])}",
                                   timeout=60_000)
            page.wait_for_timeout(1000)
            problems += [f"{name}: {p}" for p in page.evaluate(CUT)]
            problems += table_problems(page, name)
            page.screenshot(path=screenshots / f"compare-1024-{n}.png", full_page=True)
        assert problems == [], "\n".join(problems)
        expect(page.locator(".stException")).to_have_count(0)
    finally:
        page.close()
