"""Offline: each page in a real Chromium fetches nothing but the app's server and logs no error.

Each page is opened by its address in a fresh browser context that refuses
every request off 127.0.0.1 (as a machine without a network would), then used
a little: the icons, fonts, charts, tooltips and popovers a person meets. All
requests are recorded, and every console error, Vega warning and uncaught page error.

Streamlit's own start-up probe is the one exception: opened at /lab, its
frontend first asks /lab/_stcore/health and /lab/_stcore/host-config (404, the
server answers at /_stcore/), then the right address (streamlit/streamlit#7074).
Those two same-origin requests and their "Failed to load resource" lines are
expected, by exact address; anything else fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.sync_api import ConsoleMessage, Page, Request, Route, expect, sync_playwright

from tests.browser_support import CHROMIUM_ARGS, in_app
from tests.test_browser import T, shows

pytestmark = pytest.mark.browser

PROBES = ("_stcore/health", "_stcore/host-config")


@dataclass
class Log:
    requests: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def on_console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(f"{msg.text} [{msg.location.get('url', '')}]")
        elif msg.type == "warning" and msg.text.startswith("WARN "):
            # Vega's own warnings ("WARN Infinite extent for field ..."): a chart drawn
            # from a spec it had to correct, or from no data.
            self.errors.append(f"Vega: {msg.text}")


def _offline(log: Log, host: str) -> Callable[[Route], None]:
    def route(r: Route) -> None:
        if urlparse(r.request.url).netloc == host:
            r.continue_()
        else:
            log.refused.append(r.request.url)
            r.abort("internetdisconnected")
    return route


def _use_lab(page: Page) -> None:
    add = page.get_by_role("button", name="Add request")
    expect(add).to_be_visible(timeout=60_000)
    page.get_by_test_id("stSidebar").get_by_text("torch", exact=True).click()
    # The switch's rerun rebuilds the form; Add is clicked once it is done.
    shows(page.get_by_test_id("stSidebar").get_by_text("Next step runs on torch"))
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for()
    add.click()
    shows(in_app(page).get_by_text("Step 1: add A"))
    page.locator("path[aria-label^='Block 0:']").hover()           # a cell's tooltip
    page.get_by_role("button", name="Grow", exact=True).hover()                # a button's help
    page.wait_for_timeout(1000)


def _use_tour(page: Page) -> None:
    nxt = page.get_by_role("button", name="Next", exact=True)
    expect(nxt).to_be_visible(timeout=60_000)
    nxt.click()
    shows(page.locator(".st-key-tour_narration"), "Step 1 of")
    # Until the step's run ends, Streamlit may keep the popover it replaces beside the
    # new one (a bar drawn above it on a busy machine moves it down a place).
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']",
                           timeout=T)
    page.get_by_role("button", name=re.compile("Upload your own scenario")).click()
    expect(page.get_by_text("Scenario file (JSON)")).to_be_visible(timeout=T)
    page.keyboard.press("Escape")
    page.wait_for_timeout(1000)


def _use_fragmentation(page: Page) -> None:
    expect(page.get_by_role("heading", name="Contiguous vs paged")).to_be_visible(
        timeout=60_000)
    for tab in page.get_by_role("tab").all():
        tab.click()
        page.wait_for_timeout(1500)


PAGES: dict[str, Callable[[Page], None]] = {
    "lab": _use_lab, "tour": _use_tour, "fragmentation": _use_fragmentation}


@pytest.mark.parametrize("path", list(PAGES))
def test_a_page_fetches_nothing_off_the_server_and_logs_no_error(
        path: str, app_url: str, chromium_path: str, screenshots: Path) -> None:
    host = urlparse(app_url).netloc
    log = Log()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.route("**/*", _offline(log, host))
            page = context.new_page()
            page.set_default_timeout(T)
            page.on("request", lambda r: log.requests.append(r.url))
            page.on("console", log.on_console)
            page.on("pageerror", lambda e: log.errors.append(f"uncaught: {e}"))
            failed: list[Request] = []
            page.on("requestfailed", lambda r: failed.append(r))
            page.goto(f"{app_url}/{path}")
            PAGES[path](page)
            page.screenshot(path=screenshots / f"ui-offline-{path}.png")
        finally:
            browser.close()
    probes = {f"{app_url}/{path}/{p}" for p in PROBES}
    off_server = [u for u in log.requests if urlparse(u).netloc != host]
    assert off_server == [] and log.refused == [], off_server or log.refused
    assert [r.url for r in failed] == []
    # Only Streamlit's start-up probe may fail, once per address, each with its one line.
    probed = [u for u in log.requests if u in probes]
    assert sorted(probed) == sorted(probes), probed
    unexpected = [e for e in log.errors
                  if not (e.startswith("Failed to load resource: the server responded with a "
                                       "status of 404") and any(p in e for p in probes))]
    assert unexpected == [], unexpected
