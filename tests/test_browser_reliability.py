"""The app in a real Chromium where AppTest cannot tell: what the browser holds and loads.

The request picker after the counts change, user text that must not load anything,
the Playground's own address, and several sessions at once on one server.
Screenshots go to build/screenshots/ (test artifacts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests.browser_support import CHROMIUM_ARGS

pytestmark = pytest.mark.browser

T = 30_000          # a model step on a small, busy CPU may take a while


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True,
                               args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def idle(page: Page) -> None:
    """Wait until the page's script run has finished (Streamlit marks it on the app)."""
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        timeout=T)


def shows(locator: Locator, text: str | re.Pattern[str] | None = None) -> None:
    if text is None:
        expect(locator).to_be_visible(timeout=T)
    else:
        expect(locator).to_contain_text(text, timeout=T)


def shoot(page: Page, path: Path) -> None:
    page.mouse.move(0, 0)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(400)
    page.screenshot(path=path, full_page=True)


def open_playground(browser: Browser, url: str) -> Page:
    """A new session (its own browser context) on the Playground, on the torch kernel."""
    page = browser.new_context(viewport={"width": 1500, "height": 2400}).new_page()
    page.set_default_timeout(T)
    page.goto(url)
    shows(page.get_by_role("button", name="Add request"))
    idle(page)
    page.get_by_test_id("stSidebar").get_by_text("torch", exact=True).click()
    shows(page.get_by_test_id("stSidebar"), "Next step runs on torch")
    idle(page)
    return page


def status_line(page: Page, text: str) -> None:
    """Wait for the status line to say `text` (and not a refusal)."""
    shows(page.get_by_test_id("stAlert").first, text)


def picker(page: Page) -> Locator:
    return page.locator(".st-key-req_pick").get_by_role("combobox")


def picked(page: Page, label: str) -> None:
    """Wait until the request picker shows `label`."""
    expect(picker(page)).to_have_value(label, timeout=T)


def click(page: Page, button: str) -> None:
    page.get_by_role("button", name=button, exact=True).click()


# ---- the request picker -------------------------------------------------------------

def test_grow_fork_and_finish_act_on_the_picked_request_after_a_step(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = open_playground(browser, app_url)
    try:
        click(page, "Add request")
        status_line(page, "Step 1: add A")
        click(page, "Add request")
        status_line(page, "Step 2: add B")
        click(page, "Step")
        status_line(page, "Step 3: step")
        # The picker shows the count after the step, not the one it had when B was added.
        picked(page, "B · running · 24 tokens")
        picker(page).click()
        page.get_by_role("option", name="A · running · 24 tokens").click()
        idle(page)
        click(page, "Step")
        status_line(page, "Step 4: step")
        picked(page, "A · running · 25 tokens")

        click(page, "Grow")
        status_line(page, "Step 5: grow A +1")
        picked(page, "A · running · 26 tokens")
        click(page, "Fork")
        status_line(page, "Step 6: fork A → A.1")
        picked(page, "A.1 · running · 26 tokens")
        click(page, "Step")
        status_line(page, "Step 7: step")
        click(page, "Finish")
        status_line(page, "Step 8: finish A.1")
        table = page.get_by_test_id("stDataFrame").first
        shows(table, "finished")
        expect(page.get_by_text("Refused")).to_have_count(0)
        shoot(page, screenshots / "20-picker-after-steps.png")
    finally:
        page.context.close()
