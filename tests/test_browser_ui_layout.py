"""The pages at 1024 x 768 (and 800 px for button labels), and on a 390 px phone, in a
real Chromium: nothing scrolls sideways, every download label fits.

A laptop window of 1024 px with the sidebar open leaves the main column about
560 px. Streamlit scrolls its main section (`stMain`), not the document, so both
are checked. Screenshots go to build/screenshots/ui-1024-*.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from backend.sessions.tour import shipped_paths, shipped_scenario
from tests.browser_support import in_app, scroll_to
from tests.test_browser import T, metric_is, shoot, shows
from ui.numbers import UNREADABLE
from ui.session import DEFAULT_STEP_N

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1024, "height": 768}

SIDEWAYS = """() => {
    const doc = document.scrollingElement;
    const main = document.querySelector('[data-testid=stMain]');
    return {doc: [doc.scrollWidth, doc.clientWidth], main: [main.scrollWidth, main.clientWidth]};
}"""

# The page's downloads of what it shows (ui/exports.downloads), by key.
DOWNLOADS = ["dl_snapshot", "dl_png", "dl_svg", "dl_zip",
             *(f"dl_{t}_{f}" for t in ("blocks", "requests", "events") for f in ("csv", "parquet"))]

# Each download button's label: its text, and whether it is cut short (an ellipsis).
# (Streamlit draws a second, hidden copy of each button: the visible one is taken.)
LABELS = """keys => keys.map(k => [...document.querySelectorAll(`.st-key-${k} button`)]
                             .find(b => b.offsetParent !== null))
    .map(b => {
        const box = b.querySelector('[data-testid=stMarkdownContainer]');
        return {text: box.innerText.trim(), cut: box.scrollWidth > box.clientWidth + 1};
    })"""


# The fields whose placeholder is wider than the room the field gives its text.
PLACEHOLDERS_CUT = """() => [...document.querySelectorAll(
        '[data-testid=stMain] input[placeholder], [data-testid=stMain] textarea[placeholder]')]
    .filter(i => i.offsetParent !== null && i.placeholder).flatMap(i => {
        const s = getComputedStyle(i);
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
        const room = i.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
        const width = ctx.measureText(i.placeholder).width;
        return width > room + 0.5 ? [`${i.ariaLabel}: ${i.placeholder}`] : [];
    })"""

# How wide each keyed field's input is drawn.
WIDTHS = """keys => keys.map(k => document.querySelector(`.st-key-${k} input`).clientWidth)"""
# Where each event row's text lines start, from the row's left edge: the nearest of them.
EVENT_TEXT_LEFT = """() => [...document.querySelectorAll('.pl-events > div')].map(row => {
    const range = document.createRange();
    range.selectNodeContents(row.lastElementChild);
    const left = row.getBoundingClientRect().left;
    return Math.min(...[...range.getClientRects()].map(r => r.left - left));
})"""


def fields_fit(page: Page, keys: list[str], min_px: int = 100) -> None:
    widths = dict(zip(keys, page.evaluate(WIDTHS, keys), strict=True))
    assert [k for k, w in widths.items() if w < min_px] == [], widths


def no_sideways_scroll(page: Page) -> None:
    # Charts size themselves after they are drawn: give them a moment.
    page.wait_for_timeout(1500)
    widths = page.evaluate(SIDEWAYS)
    assert widths["doc"][0] <= widths["doc"][1], widths
    assert widths["main"][0] <= widths["main"][1], widths


def labels_fit(page: Page, prefix: str) -> None:
    keys = [prefix + k for k in DOWNLOADS]
    for key in keys:
        expect(page.locator(f".st-key-{key} button").first).to_be_visible(timeout=T)
    labels = page.evaluate(LABELS, keys)
    assert [lab for lab in labels if lab["cut"]] == [], labels
    texts = [lab["text"] for lab in labels]
    assert len(set(texts)) == len(texts) == len(DOWNLOADS), texts


def open_playground(page: Page, app_url: str, *, torch: bool = True) -> Locator:
    """The Playground opened in `page`, its kernel switched to torch (Triton's interpreter
    is slow) unless `torch` is False; its Add request button."""
    page.set_default_timeout(T)
    page.goto(f"{app_url}/lab")
    add = page.get_by_role("button", name="Add request")
    expect(add).to_be_visible(timeout=60_000)
    if torch:
        sidebar = page.get_by_test_id("stSidebar")
        expect(sidebar).to_be_visible(timeout=T)
        sidebar.get_by_text("torch", exact=True).click()
        shows(sidebar, "Next step runs on torch")
    return add


def test_at_1024_px_nothing_scrolls_sideways_and_download_labels_fit(
        app_url: str, browser: Browser, screenshots: Path) -> None:
    page = browser.new_page(viewport=VIEWPORT)
    try:
        add = open_playground(page, app_url)      # the sidebar open: the narrow case
        # No request yet: no line about scrolling a table that holds none.
        narrow = page.get_by_text("The table is wider than the page")
        shows(in_app(page).get_by_text("No requests yet: each one added gets a row here."))
        expect(narrow).to_be_hidden()
        # Two requests: the grid, tables, layouts, translator and its K chart all drawn.
        add.click()
        shows(in_app(page).get_by_text("Step 1: add A"))
        add.click()
        shows(in_app(page).get_by_text("Step 2: add B"))
        metric_is(page, "Shared blocks", "5")
        expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(2, timeout=T)
        no_sideways_scroll(page)
        labels_fit(page, "")
        # The session's scenario file, below them ("Session as …" in a quarter row).
        scenario = page.evaluate(LABELS, ["dl_scenario"])
        assert not scenario[0]["cut"], scenario
        # No field's hint cut short ("click or type an" in Inspect a block).
        assert page.evaluate(PLACEHOLDERS_CUT) == []
        # The block tables' columns are wider than this page, so their grid scrolls
        # sideways: a line says so, and only while it does (a 1366 px window, the
        # commonest laptop's, fits it).
        expect(narrow).to_be_visible()
        page.set_viewport_size({"width": 1366, "height": 768})
        expect(narrow).to_be_hidden()
        page.set_viewport_size(VIEWPORT)
        expect(narrow).to_be_visible()
        # The three control panels wrap and the event log stacks over the kernel and
        # translator, so no field is squeezed ("Laye/r", "e.g. 9, 2, :") and an event
        # keeps its block number on its line.
        fields_fit(page, ["add_id", "add_pins", "add_len", "req_child", "batch_n",
                          "tr_pos"])
        fields_fit(page, ["tr_layer"], 50)      # a layer has one or two digits
        starts = page.evaluate(EVENT_TEXT_LEFT)
        assert starts and min(starts) >= 120, starts      # right of step and badge
        shoot(page, screenshots / "ui-1024-playground.png")
        # Text the browser cannot read as a number never reaches the page: a line
        # under the field says so, drawn by the browser alone, until it holds one.
        steps = page.locator(".st-key-batch_n input")
        box = page.locator(".st-key-batch_n [data-testid=stNumberInput]")
        after = "e => getComputedStyle(e, '::after').content"
        steps.click()
        steps.press("Control+a")
        steps.press("Backspace")
        steps.type("1e309")
        assert box.evaluate(after) == f'"{UNREADABLE}"'
        steps.press("Control+a")
        steps.type("4")
        assert box.evaluate(after) == "none"
        # Enter on such text puts back the value the page drew the field with.
        steps.press("Control+a")
        steps.type("-")
        assert box.evaluate(after) == f'"{UNREADABLE}"'
        steps.press("Enter")
        expect(steps).to_have_value(str(DEFAULT_STEP_N))
        assert box.evaluate(after) == "none"

        # The Scenarios page, with the contiguous arena under the grid.
        page.get_by_test_id("stSidebar").get_by_role("link", name="Scenarios").click()
        shows(page.get_by_role("heading", name="The contiguous allocation problem"))
        nxt = page.get_by_role("button", name="Next", exact=True)
        for n in range(1, 6):
            nxt.click()
            shows(page.locator(".st-key-tour_narration"), f"Step {n} of 5:")
        shows(in_app(page).get_by_text(
            "D waits with 4 tokens: a request that will reach 5 tokens"))
        no_sideways_scroll(page)
        labels_fit(page, "tour_")
        shoot(page, screenshots / "ui-1024-scenarios.png")
    finally:
        page.close()


# Every visible button of the main section whose label is cut short (an ellipsis).
CUT_BUTTONS = """() => [...document.querySelectorAll('[data-testid=stMain] button')]
    .filter(b => b.offsetParent !== null).flatMap(b => {
        const box = b.querySelector('[data-testid=stMarkdownContainer]');
        return box && box.scrollWidth > box.clientWidth + 1 ? [box.innerText.trim()] : [];
    })"""

# The visible Open and Delete buttons of the saved-session rows: label, cut short, top.
SESSION_BUTTONS = """() => [...document.querySelectorAll(
        '[class*="st-key-btn_open_"] button, [class*="st-key-btn_delete_"] button')]
    .filter(b => b.offsetParent !== null).map(b => {
        const box = b.querySelector('[data-testid=stMarkdownContainer]');
        return {text: box.innerText.trim(), cut: box.scrollWidth > box.clientWidth + 1,
                top: Math.round(b.getBoundingClientRect().top)};
    })"""


# The width a label needs in the scenario picker's font, and the width its box gives.
PICKER_FIT = """(label) => {
  const input = document.querySelector('.st-key-tour_pick input');
  const style = getComputedStyle(input);
  const context = document.createElement('canvas').getContext('2d');
  context.font = style.font;
  return {need: Math.ceil(context.measureText(label).width),
          have: input.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight)};
}"""


@pytest.mark.parametrize("width", [800, 1024])
def test_narrower_than_planned_no_button_label_is_cut(
        width: int, app_url: str, browser: Browser, screenshots: Path) -> None:
    """Buttons in columns of fixed shares were cut to "Snaps…", "Grid (P…" (two alike) and
    "O…"/"D…" for Open and Delete at 800 px with the sidebar open, "Del…" at 1024, and the
    Scenarios page's to "B…", "R…" and "Upload your own …": each row's buttons are now as
    wide as their labels and wrap where the page is narrow."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        add = open_playground(page, app_url, torch=False)
        add.click()
        shows(in_app(page).get_by_text("Step 1: add A"))
        # A second session, so that the first is listed with its Open and Delete.
        page.get_by_role("button", name="New session").click()
        listed = page.locator("[class*='st-key-btn_open_'] button").filter(visible=True)
        expect(listed).to_have_count(1, timeout=T)
        add.click()
        shows(in_app(page).get_by_text("Step 1: add A"))
        labels_fit(page, "")
        scenario = page.evaluate(LABELS, ["dl_scenario"])
        assert not scenario[0]["cut"], scenario
        row = page.evaluate(SESSION_BUTTONS)
        assert [b["text"] for b in row] == ["Open", "Delete"], row
        assert not any(b["cut"] for b in row), row
        # Side by side on the session's line, not one under the other.
        assert row[0]["top"] == row[1]["top"], row
        # The line does not clip the focus ring of Delete, at its right edge (Streamlit
        # lets a row kept on one line scroll sideways, which clipped it).
        assert page.evaluate("""() => getComputedStyle(document.querySelector(
            "[class*='st-key-pagedlab_row_session_']")).overflowX""") == "visible"
        no_sideways_scroll(page)
        scroll_to(listed)
        shoot(page, screenshots / f"ui-{width}-sessions.png")
        assert page.evaluate(CUT_BUTTONS) == []
        # The Scenarios page's controls ("B…", "R…", "Upload your own …" at 800 px).
        page.get_by_test_id("stSidebar").get_by_role("link", name="Scenarios").click()
        nxt = page.get_by_role("button", name="Next", exact=True)
        expect(nxt).to_be_enabled(timeout=T)
        nxt.click()
        shows(page.locator(".st-key-tour_narration"), "Step 1 of 5:")
        assert page.evaluate(CUT_BUTTONS) == []
        no_sideways_scroll(page)
        # The picker holds the longest shipped scenario's name in full ("01 · The
        # contiguous allocation pr" at 800 px); the upload's button goes below it.
        longest = max((f"{key[:2]} · {shipped_scenario(key).name}" for key in shipped_paths()),
                      key=len)
        fit = page.evaluate(PICKER_FIT, longest)
        assert fit["need"] <= fit["have"], (longest, fit)
        shoot(page, screenshots / f"ui-{width}-scenarios-controls.png")
    finally:
        page.close()


# Every chart's right edge, and the window's width.
CHART_EDGES = """() => ({width: window.innerWidth, right: [...document.querySelectorAll(
    '[data-testid=stMain] .vega-embed')].map(e => Math.round(e.getBoundingClientRect().right))})"""


def test_on_a_phone_nothing_scrolls_sideways_and_the_sharing_charts_are_whole(
        app_url: str, browser: Browser, screenshots: Path) -> None:
    # 390 px: the grid's legend kept its longest entry on one line and scrolled the page
    # sideways; the Sharing tab drew its two panels as one 560 px picture, the second cut.
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        add = open_playground(page, app_url, torch=False)
        add.click()
        shows(in_app(page).get_by_text("Step 1: add A"))
        shows(page.locator(".pl-legend"), "cached")
        no_sideways_scroll(page)
        shoot(page, screenshots / "ui-390-playground.png")
        page.goto(f"{app_url}/fragmentation?tab=Sharing")
        panel = page.get_by_role("tabpanel", name="Sharing")
        expect(panel.locator(".vega-embed")).to_have_count(2, timeout=T)
        no_sideways_scroll(page)
        edges = page.evaluate(CHART_EDGES)
        assert edges["right"] and max(edges["right"]) <= edges["width"], edges
        shoot(page, screenshots / "ui-390-sharing.png")
        # The maps' legend wraps (a three-column chart cut a label and ran another
        # into the next swatch).
        page.goto(f"{app_url}/fragmentation?tab=One+workload%2C+two+memories")
        legend = page.locator(".pl-kind-legend")
        shows(legend, "external fragmentation")
        no_sideways_scroll(page)
        box = legend.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 390, box
        shoot(page, screenshots / "ui-390-maps.png")
    finally:
        context.close()


# The event log's scrolling box (itself or the nearest ancestor that scrolls, short of the
# page's own main section): its height, whether it scrolls, and how tall the log's rows
# are together.
EVENT_BOX = """() => {
    const log = document.querySelector('.pl-events');
    const main = document.querySelector('[data-testid=stMain]');
    let box = log;
    while (box && box !== main
           && !['auto', 'scroll'].includes(getComputedStyle(box).overflowY)) {
        box = box.parentElement;
    }
    if (box === main) box = null;
    return {box: box ? box.getBoundingClientRect().height : null, rows: log.scrollHeight,
            scrolls: box ? box.scrollHeight > box.clientHeight + 1 : false};
}"""


def test_the_event_log_is_as_tall_as_its_rows_up_to_a_cap(
        app_url: str, browser: Browser, screenshots: Path) -> None:
    """A fixed 340 px box left "No events yet." in a tall empty frame and showed a long log
    in a strip: the box follows its rows, and scrolls only past its cap (70% of the
    window's height, at most 560 px)."""
    page = browser.new_page(viewport=VIEWPORT)
    try:
        add = open_playground(page, app_url)
        shows(in_app(page).get_by_text("No events yet."))
        empty = page.evaluate(EVENT_BOX)
        assert empty["box"] is None or empty["box"] <= empty["rows"] + 4, empty
        # 120 tokens in blocks of 4: 30 of the 32 blocks taken, a line each.
        page.get_by_role("spinbutton", name="…or N random tokens").fill("120")
        add.click()
        shows(in_app(page).get_by_text("Step 1: add A (120 random tokens)"))
        log = page.get_by_role("log", name="Event log, newest first")
        expect(log).to_be_visible()
        full = page.evaluate(EVENT_BOX)
        cap = min(560, 0.7 * VIEWPORT["height"])
        assert full["scrolls"] and 340 < full["box"] <= cap + 1, full
        scroll_to(log)
        shoot(page, screenshots / "ui-1024-event-log.png")
    finally:
        page.close()
