"""The Playground in a real Chromium: share a prompt, fork, copy on write, select a block.

Screenshots of each stage go to build/screenshots/ (test artifacts).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from tests.browser_support import CHROMIUM_ARGS, in_app

pytestmark = pytest.mark.browser

# Model steps on the Triton interpreter take a moment on a small, busy CPU. Passed to
# each wait rather than set globally: other browser tests share Playwright's defaults.
T = 30_000


def shows(locator: Locator, text: str | re.Pattern[str] | None = None) -> None:
    """Wait until `locator` is visible (and holds `text`, if given)."""
    if text is None:
        expect(locator).to_be_visible(timeout=T)
    else:
        expect(locator).to_contain_text(text, timeout=T)


def metric_is(page: Page, label: str, value: str) -> None:
    """Wait until the metrics panel shows exactly `value` for `label`."""
    expect(page.locator(f".pl-metric[data-label='{label}']")).to_have_text(value, timeout=T)


def shoot(page: Page, path: Path) -> None:
    # No hover or focus tooltip over the picture: move away, blur, let it fade.
    page.mouse.move(0, 0)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(400)
    page.screenshot(path=path, full_page=True)


def test_share_fork_and_copy_on_write_in_the_browser(app_url: str, chromium_path: str,
                                                     screenshots: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2600})
            page.set_default_timeout(T)
            page.goto(app_url)
            add = page.get_by_role("button", name="Add request")
            expect(add).to_be_visible(timeout=60_000)
            shows(in_app(page).get_by_text("No events yet."))

            # Two requests with the same prompt: B's full prompt blocks are A's.
            add.click()
            shows(in_app(page).get_by_text("Step 1: add A"))
            add.click()
            shows(in_app(page).get_by_text("Step 2: add B"))
            metric_is(page, "Shared blocks", "5")
            layouts = page.locator(".pl-layouts")
            shows(layouts, "L0 → P0 ×2")
            shoot(page, screenshots / "01-shared-prompt.png")

            # Fork B (the request the controls picked) into B2, then grow the child.
            page.get_by_role("textbox", name="Child id").fill("B2")
            page.get_by_role("textbox", name="Child id").press("Tab")
            page.get_by_role("button", name="Fork").click()
            # (Markdown typesets the "->" of the status line as an arrow.)
            shows(in_app(page).get_by_text("Step 3: fork B → B2"))
            shows(layouts, "L0 → P0 ×3")
            shows(layouts, "L5 → P6 ×2")                 # the shared, partly filled tail
            shoot(page, screenshots / "02-forked.png")

            page.get_by_role("button", name="Grow", exact=True).click()
            shows(in_app(page).get_by_text("Step 4: grow B2 +1"))
            shows(page.locator(".pl-events"), "request B2 wrote into shared block 6: copied it "
                                              "to block 7 first (copy-on-write)")
            metric_is(page, "Copy-on-write copies", "1")
            metric_is(page, "Shared blocks", "5")
            shows(layouts, "L5 → P7")
            shows(in_app(page).get_by_text("Last model step ran on triton-interpreter"))
            shoot(page, screenshots / "03-copy-on-write.png")

            # Clicking a cell of the grid selects that block and names its holders.
            page.locator("path[aria-label^='Block 0:']").click()
            shows(in_app(page).get_by_text(re.compile(
                r"Block 0: used, ref count 3, 4/4 slots filled, .*held by A, B, B2")))
            shoot(page, screenshots / "04-block-selected.png")
        finally:
            browser.close()


def test_a_cache_salt_keeps_the_same_prompt_apart_in_the_browser(
        app_url: str, chromium_path: str, screenshots: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 2200})
            page.set_default_timeout(T)
            page.goto(app_url)
            add = page.get_by_role("button", name="Add request")
            expect(add).to_be_visible(timeout=60_000)
            salt = page.get_by_role("textbox", name="Cache salt")

            add.click()
            shows(in_app(page).get_by_text("Step 1: add A"))
            # The same prompt under a salt: none of A's blocks match B's keys.
            salt.fill("tenant-b")
            salt.press("Tab")
            add.click()
            shows(in_app(page).get_by_text("Step 2: add B ('The cat sat on the mat.') salt "
                                           "'tenant-b'"))
            metric_is(page, "Shared blocks", "0")
            expect(salt).to_have_value("", timeout=T)      # a one-off, like the pins
            layouts = page.locator(".pl-layouts")
            shows(layouts, "prompt 23, cache salt 'tenant-b'")
            # Under the same salt again: C shares B's five full blocks.
            salt.fill("tenant-b")
            salt.press("Tab")
            add.click()
            shows(in_app(page).get_by_text(re.compile(r"Step 3: add C .* salt 'tenant-b' · "
                                                      r"admitted C · events: 5 prefix_hit")))
            metric_is(page, "Shared blocks", "5")
            shows(layouts, "L0 → P6 ×2")
            shoot(page, screenshots / "05-cache-salt.png")
        finally:
            browser.close()


def test_a_4096_block_pool_is_paged_and_clickable(app_url: str, chromium_path: str,
                                                  screenshots: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.set_default_timeout(T)
            page.goto(app_url)
            expect(page.get_by_role("button", name="Add request")).to_be_visible(timeout=60_000)
            # An empty engine takes new settings at once; the torch kernel is one click.
            pool = page.get_by_role("spinbutton", name="Pool size (blocks)")
            pool.fill("4096")
            pool.press("Enter")
            metric_is(page, "Used blocks", "0 / 4096")
            page.get_by_test_id("stSidebar").get_by_text("torch", exact=True).click()
            shows(page.get_by_test_id("stSidebar"), "Next step runs on torch")
            # The prompt box still holds its text: a length given wins over it.
            page.get_by_role("spinbutton", name="…or N random tokens").fill("1000")
            page.get_by_role("button", name="Add request").click()
            shows(in_app(page).get_by_text("Step 1: add A (1,000 random tokens)"))
            metric_is(page, "Used blocks", "250 / 4096")
            # Four pages of 1,024 cells; the first is shown.
            expect(page.get_by_role("combobox", name="Blocks shown")).to_have_value(
                "0–1,023", timeout=T)
            shows(in_app(page).get_by_text("Physical blocks 0–1,023 of 4,096"))
            # A dense page is drawn on a canvas: click where block 249's cell is (column
            # 25, row 7 of the 32 x 32 cells of 23 x 20 px; the cells start at the top left).
            canvas = page.get_by_test_id("stVegaLiteChart").nth(1).locator("canvas")
            # Vega draws its canvas after the element appears (a box of None if asked
            # before, which a loaded machine showed once).
            expect(canvas).to_be_visible(timeout=T)
            box = canvas.bounding_box()
            assert box is not None
            page.mouse.click(box["x"] + 25.5 * 23, box["y"] + 7.5 * 20)
            shows(in_app(page).get_by_text(re.compile(r"Block 249: used, ref count 1, 4/4 slots "
                                              r"filled, .*held by A")))
            shoot(page, screenshots / "05-4096-blocks.png")
        finally:
            browser.close()
