"""Swap preemption and the timeline on the Playground in a real Chromium at 1440 x 900.

A 12-block pool with swap preemption and three requests of up to 30 new tokens
runs out of room within a few steps: the engine copies a request's K/V to the
host pool. The page draws the host pool as a second grid under the device grid,
with its caption; the request table says `swapped to host`, the event log shows
`swap_out`. Then the timeline's chart, strip and latency table are opened, an
earlier iteration is picked (the page shows that past state, a different grid)
and Back to live returns. No console error, page error or Streamlit exception
box along the way. Screenshots go to build/screenshots/swap-timeline-*.png.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Locator, Page, expect, sync_playwright

from tests.browser_support import CHROMIUM_ARGS, in_app, scroll_to
from tests.test_browser import T, metric_is, shoot, shows

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 1440, "height": 900}
POOL = 12
PROBES = ("_stcore/health", "_stcore/host-config")
MAX_STEPS = 15                      # the 12-block pool swaps within some 5 steps

# A grid's cells by their tooltips (`Block N: used, ...`), in the order drawn.
CELLS = """sel => [...document.querySelectorAll(`${sel} path[aria-label^='Block ']`)]
                  .map(p => p.getAttribute('aria-label'))"""

SIDEWAYS = """() => {
    const doc = document.scrollingElement;
    const main = document.querySelector('[data-testid=stMain]');
    return {doc: [doc.scrollWidth, doc.clientWidth], main: [main.scrollWidth, main.clientWidth]};
}"""


def idle(page: Page) -> None:
    """The script run is over (Streamlit marks it on the app) and no error box is shown."""
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        timeout=T)
    expect(page.get_by_test_id("stStatusWidget")).to_have_count(0, timeout=T)
    expect(page.get_by_test_id("stException")).to_have_count(0)


def status_line(page: Page, text: str | re.Pattern[str]) -> None:
    shows(page.get_by_test_id("stAlert").first, text)


def to_top(locator: Locator) -> None:
    """Scroll Streamlit's main section so that `locator` is near the top of the window
    (clear of the app's header bar)."""
    locator.evaluate("""e => { e.scrollIntoView({block: 'start'});
                               e.closest('[data-testid=stMain]').scrollBy(0, -70); }""")


def cells(page: Page, key: str) -> list[str]:
    labels: list[str] = page.evaluate(CELLS, f".st-key-{key}")
    return labels


def test_swap_preemption_draws_the_host_pool_and_the_timeline_shows_a_past_state(
        app_url: str, chromium_path: str, screenshots: Path) -> None:
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"{msg.text} [{msg.location.get('url', '')}]")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        try:
            page.set_default_timeout(T)
            page.on("console", on_console)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.goto(f"{app_url}/lab")
            add = page.get_by_role("button", name="Add request")
            expect(add).to_be_visible(timeout=60_000)
            idle(page)
            sidebar = page.get_by_test_id("stSidebar")
            sidebar.get_by_text("torch", exact=True).click()
            shows(sidebar, "Next step runs on torch")
            idle(page)

            # A small pool first, then swap: the host pool takes the pool's size.
            pool = sidebar.get_by_role("spinbutton", name="Pool size (blocks)")
            pool.fill(str(POOL))
            pool.press("Enter")
            metric_is(page, "Used blocks", f"0 / {POOL}")
            idle(page)
            sidebar.get_by_text("Scheduler", exact=True).click()
            host_field = sidebar.get_by_role("spinbutton", name="Host pool (blocks)")
            expect(host_field).to_be_disabled(timeout=T)
            swap = sidebar.get_by_role("radiogroup", name="Preemption").get_by_text(
                "swap", exact=True)
            expect(swap).to_be_visible(timeout=T)
            page.wait_for_timeout(500)                  # the expander's opening animation
            swap.click()
            expect(sidebar.get_by_role("radio", name="swap")).to_be_checked(timeout=T)
            expect(host_field).to_have_value(str(POOL), timeout=T)
            expect(host_field).to_be_enabled(timeout=T)
            idle(page)

            # Three requests of distinct prompts, up to 30 new tokens each.
            page.get_by_role("spinbutton", name="Max new tokens", exact=True).fill("30")
            for n, rid in enumerate("ABC", start=1):
                page.get_by_label("Prompt text").fill(f"request {rid} asks something")
                add.click()
                status_line(page, f"Step {n}: add {rid}")
                idle(page)
            caption = page.get_by_text(re.compile(r"^Host pool: \d+ of \d+ blocks hold"))
            shows(caption, f"Host pool: 0 of {POOL} blocks hold swapped-out K/V (no request)")

            # Step until the engine swaps a request out.
            step = page.get_by_role("button", name="Step", exact=True)
            n = 3
            while "(no request)" in caption.inner_text():
                assert n < 3 + MAX_STEPS, f"no swap after {MAX_STEPS} steps"
                step.click()
                n += 1
                status_line(page, f"Step {n}: step")
                idle(page)
            swapped_at = n
            text = caption.inner_text()
            found = re.match(rf"Host pool: (\d+) of {POOL} blocks hold swapped-out K/V "
                             r"\(([A-C])\); (\d+) swap-outs?, 0 swap-ins so far\.", text)
            assert found is not None, text
            used, victim, outs = int(found.group(1)), found.group(2), int(found.group(3))
            assert used >= 1 and outs == 1, text          # one request, its blocks

            heading = page.get_by_text("Host pool (swap space)", exact=True)
            expect(heading).to_be_visible()
            expect(caption).to_be_visible()
            # Two grids: the device pool's, and under it the host pool's.
            device = page.locator(".st-key-grid_box [data-testid=stVegaLiteChart]")
            host = page.locator(".st-key-host_grid_box [data-testid=stVegaLiteChart]")
            expect(device).to_be_visible()
            expect(host).to_be_visible()
            expect(host.locator("svg, canvas").first).to_be_visible()
            dbox, hbox = device.bounding_box(), host.bounding_box()
            assert dbox is not None and hbox is not None
            assert hbox["y"] >= dbox["y"] + dbox["height"] - 1, (dbox, hbox)
            host_cells = cells(page, "host_grid_box")
            assert len(host_cells) == POOL, host_cells
            assert sum(": used" in c for c in host_cells) == used, host_cells
            # The host grid fits the main column.
            main = page.get_by_test_id("stMain").bounding_box()
            assert main is not None
            assert hbox["x"] >= main["x"] and hbox["x"] + hbox["width"] <= (
                main["x"] + main["width"] + 1), (hbox, main)
            assert hbox["height"] > 40, hbox          # drawn, not squashed

            # The request table (a data grid on a canvas, with an accessible table).
            table = page.get_by_test_id("stDataFrame").first
            scroll_to(table)
            shows(table, "swapped to host")
            shows(page.locator(".pl-events"), "swap_out")
            page.wait_for_timeout(1000)           # charts size themselves once drawn
            widths = page.evaluate(SIDEWAYS)
            assert widths["doc"][0] <= widths["doc"][1], widths
            assert widths["main"][0] <= widths["main"][1], widths
            # The device grid with the host pool's under it; then the tables and log.
            to_top(page.get_by_role("heading", name="Physical block pool"))
            shoot(page, screenshots / "swap-timeline-01-host-pool.png")
            to_top(page.get_by_role("heading", name="Block tables"))
            shoot(page, screenshots / "swap-timeline-02-tables.png")

            # The timeline: its chart, the strip of bars and the latency table.
            page.get_by_text("Chart, latencies and downloads", exact=True).click()
            details = page.get_by_test_id("stExpander").filter(
                has_text="Chart, latencies and downloads")
            charts = details.get_by_test_id("stVegaLiteChart")
            expect(charts).to_have_count(2, timeout=T)      # the four panels, the strip
            for i in range(2):
                expect(charts.nth(i).locator("canvas, svg").first).to_be_visible(timeout=T)
            shows(page.get_by_text("Latency per request", exact=True))
            latency = page.get_by_test_id("stDataFrame").filter(has_text="ttft_iterations")
            shows(latency)
            for rid in "ABC":
                shows(latency, rid)
            expect(page.get_by_role("button", name="Timeline (CSV)")).to_be_visible()
            idle(page)
            page.wait_for_timeout(500)
            to_top(details)
            shoot(page, screenshots / "swap-timeline-03-timeline.png")
            to_top(page.get_by_text("Pick a moment", exact=True))
            shoot(page, screenshots / "swap-timeline-03b-strip-latency.png")

            # Iteration 0 is the first add's: A alone, in fewer blocks than now.
            live_cells = cells(page, "grid_box")
            assert len(live_cells) == POOL, live_cells
            live_used = sum(": used" in c for c in live_cells)
            pick = page.get_by_role("spinbutton", name="Show the state after iteration")
            pick.fill("0")
            pick.press("Enter")
            banner = in_app(page).get_by_text(
                re.compile(r"^Showing the past: the state after step 1\."))
            shows(banner)
            shows(banner, "Iteration 0 belongs to step 1")
            idle(page)
            past = page.locator(".st-key-past_grid_box [data-testid=stVegaLiteChart]")
            shows(past)
            past_cells = cells(page, "past_grid_box")
            assert len(past_cells) == POOL, past_cells
            assert past_cells != live_cells
            past_used = sum(": used" in c for c in past_cells)
            assert 0 < past_used < live_used, (past_used, live_used)
            metric_is(page, "Used blocks", f"{past_used} / {POOL}")
            # Step 1 had no swap: no host pool in use, no swapped request.
            expect(page.get_by_text(f"Host pool: 0 of {POOL} blocks hold swapped-out K/V "
                                    "(no request)")).to_be_visible(timeout=T)
            expect(page.get_by_test_id("stDataFrame").first).not_to_contain_text(
                "swapped to host")
            to_top(banner)
            shoot(page, screenshots / "swap-timeline-04-past.png")
            to_top(page.get_by_role("heading", name="Physical block pool"))
            shoot(page, screenshots / "swap-timeline-05-past-grid.png")

            page.get_by_role("button", name="Back to live").first.click()
            expect(banner).to_have_count(0, timeout=T)
            idle(page)
            expect(pick).to_have_value("", timeout=T)
            expect(page.locator(".st-key-past_grid_box")).to_have_count(0, timeout=T)
            metric_is(page, "Used blocks", f"{live_used} / {POOL}")
            shows(caption, f"K/V ({victim})")
            assert cells(page, "grid_box") == live_cells
            status_line(page, f"Step {swapped_at}: step")
            shoot(page, screenshots / "swap-timeline-06-live-again.png")
        except BaseException:
            shoot(page, screenshots / "swap-timeline-failed.png")
            raise
        finally:
            browser.close()
    # Streamlit's start-up probe at /lab asks two addresses under /lab/_stcore/ first
    # (404; streamlit/streamlit#7074, as tests/test_browser_ui_offline.py expects): only
    # their "Failed to load resource" lines are allowed.
    probes = [f"{app_url}/lab/{p}" for p in PROBES]
    unexpected = [e for e in errors
                  if not (e.startswith("Failed to load resource: the server responded with a "
                                       "status of 404") and any(p in e for p in probes))]
    assert unexpected == [], unexpected
