"""The "Contiguous vs paged" page at 1024 px with the sidebar open, in a real Chromium.

That window leaves the page some 560 px. Every tab's name must show (no scroll arrow
hiding the last ones), no field's text or metric's label be cut short, nothing scroll
sideways, and each table show either every column or, where they cannot all fit, the
columns that carry its point before it scrolls, with no cell's text cut short in them.
Screenshots of each tab go to build/screenshots/compare-1024-*.png. At 1280 px, four
fields that do not fit one line go two and two.
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
    "Sharing": [["kind", "n", "saved", "paper", "held", "unshared"]],
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
# The text cells a grid cuts short, among the columns wholly in view. The grid draws on a
# canvas and clips a long text at its cell's edge, with no ellipsis to find in the page:
# the columns' edges are its vertical lines, read off the canvas in the first row's top
# padding (where no text is drawn), and each cell's text is measured in the grid's own
# font, with its 8 px padding either side. A number column's cell holds its raw value
# (say 0.5272704264563209), not what its format draws: numbers are left out.
CUT_CELLS = """d => {
    const canvas = d.querySelector('canvas[data-testid=data-grid-canvas]');
    const ctx = canvas.getContext('2d');
    const scale = canvas.width / canvas.clientWidth;
    const px = ctx.getImageData(0, Math.round(38 * scale), canvas.width, 1).data;
    const edges = [0];
    for (let x = 1; x < canvas.width; x++) {
        if (px[4 * x] < 240 && px[4 * x + 3] > 0 && x / scale - edges.at(-1) > 4) {
            edges.push(x / scale);
        }
    }
    // The last column ends at the grid's edge only when the grid does not scroll.
    const scroller = d.querySelector('.dvn-scroller');
    if (scroller.scrollWidth <= scroller.clientWidth) edges.push(canvas.clientWidth);
    const style = getComputedStyle(d.querySelector('.stDataFrameGlideDataEditor'));
    ctx.save();
    ctx.font = style.getPropertyValue('--gdg-base-font-style') + ' '
        + style.getPropertyValue('--gdg-font-family');
    const cut = [...d.querySelectorAll('table tbody td')].flatMap(td => {
        const col = Number(td.getAttribute('aria-colindex')) - 1;
        const text = td.innerText;
        if (col + 1 >= edges.length || /^-?[0-9.e+-]+$/.test(text)) return [];
        const room = edges[col + 1] - edges[col] - 16;
        const width = ctx.measureText(text).width;
        return width > room + 0.5 ? [`"${text}" (${Math.ceil(width)} px in ${Math.floor(room)})`]
                                  : [];
    });
    ctx.restore();
    return cut;
}"""


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
        grid = panel.get_by_test_id("stDataFrame").nth(i)
        scroll_to(grid)
        grid.locator("table th").first.wait_for(state="attached")
        # A cell's text whole, in every column in view ("26.8% (Orca (Pow2))" lost its end).
        problems += [f"{name}, table {i + 1}: cut {c}" for c in grid.evaluate(CUT_CELLS)]
        if show is ALL:
            if wide > seen:
                problems.append(f"{name}, table {i + 1}: {wide} px of columns in {seen}")
            continue
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


# The state legends' labels in the seed tab's two charts: [text, left, right] in px.
LEGENDS = """() => [...document.querySelectorAll("[role=tabpanel]:not([hidden]) "
    + "[data-testid=stVegaLiteChart]")].map(c => [...c.querySelectorAll(
    "g.role-legend-label text")].map(t => {
        const r = t.getBoundingClientRect();
        return [t.textContent, Math.round(r.left), Math.round(r.right)];
    })).filter(labels => labels.length)"""


def test_a_window_narrowed_to_a_phones_width_redraws_the_legends_in_one_column(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # Streamlit resizes a drawn chart in place: a test of the container's width made
    # only when the chart was first drawn kept the wide layout, and the legend's second
    # column (reservation, external fragmentation) ran off a 390 px screen.
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.set_default_timeout(T)
        page.goto(f"{app_url}/fragmentation")
        page.wait_for_function(f"({LEGENDS})().length >= 2", timeout=60_000)
        wide = page.evaluate(LEGENDS)
        assert all(len({left for _, left, _ in labels}) == 2 for labels in wide), wide
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function(f"({LEGENDS})().every(labels => "
                               "new Set(labels.map(l => l[1])).size === 1)", timeout=T)
        narrow = page.evaluate(LEGENDS)
        assert all(right <= 390 for labels in narrow for _, _, right in labels), narrow
        page.screenshot(path=screenshots / "compare-narrowed-390.png")
        # ...and widened again, two columns again.
        page.set_viewport_size({"width": 1440, "height": 900})
        page.wait_for_function(f"({LEGENDS})().every(labels => "
                               "new Set(labels.map(l => l[1])).size === 2)", timeout=T)
    finally:
        page.close()


def test_four_fields_that_do_not_fit_a_line_go_two_and_two(browser: Browser,
                                                            app_url: str) -> None:
    # At 1280 px beside the sidebar the trace simulator's four fields (200 px each at
    # least) do not fit one line: they went three and one, Seed alone the page's width.
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.set_default_timeout(T)
        page.goto(f"{app_url}/fragmentation?tab=Trace%20simulator")
        panel = page.get_by_role("tabpanel", name="Trace simulator")
        boxes = {}
        for name in ("Workload", "Requests", "Rate (requests/s)", "Seed"):
            field = panel.get_by_text(name, exact=True).first
            field.wait_for(timeout=60_000)
            box = field.locator("xpath=ancestor::*[@data-testid='stColumn'][1]").bounding_box()
            assert box is not None
            boxes[name] = box
        rows = sorted({round(b["y"]) for b in boxes.values()})
        assert len(rows) == 2, boxes
        widths = [b["width"] for b in boxes.values()]
        assert max(widths) - min(widths) < 2, boxes
    finally:
        page.close()
