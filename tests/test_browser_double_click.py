"""Two clicks on one session's engine in quick succession, in a real Chromium.

Streamlit's fast reruns can run a second click's callback while the first one
is still stepping the engine; the engine must see one operation at a time.
Streamlit itself may fold two clicks of one button that arrive during one
run into one trigger, so the page may show two or three operations after the
add: but each whole, and the state exactly what those operations make.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser_support import in_app, room_for_a_long_step, status_lines

pytestmark = pytest.mark.browser

T = 60_000
TRY_MS = 3_000


def step_until_stopped(page: Page, app_url: str) -> Locator:
    """The Playground with request A and a Step N of 10,000 iterations running, one that
    runs until it is stopped; the Add request button."""
    page.set_default_timeout(T)
    page.goto(app_url)
    add = page.get_by_role("button", name="Add request")
    expect(add).to_be_visible(timeout=T)
    # A request that keeps decoding far longer than the test takes: on a slow machine a
    # step of a few seconds could end before the clicks that are to wait behind it.
    room_for_a_long_step(page, T)
    add.click()
    expect(in_app(page).get_by_text("Step 1: add A")).to_be_visible(timeout=T)
    steps = page.get_by_role("spinbutton", name="Steps")
    steps.fill("10000")
    steps.press("Tab")
    page.get_by_role("button", name="Step N").click()
    expect(in_app(page).get_by_text(re.compile("Stepping the batch"))).to_be_visible(timeout=T)
    return add


def stop_stepping(page: Page) -> None:
    """Click the visible Stop stepping button. The page may also hold copies a waiting
    run drew, and one visible when found may be hidden before the click lands (its run
    moved on); Playwright would wait on that one, so each try is short and the button
    is found again."""
    deadline = time.monotonic() + T / 1000
    while True:
        try:
            page.get_by_role("button", name="Stop stepping").filter(visible=True).first.click(
                timeout=TRY_MS)
            return
        except PlaywrightTimeoutError:
            if time.monotonic() > deadline:
                raise


def test_step_n_twice_then_step_applies_three_whole_operations(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1800})
    try:
        page.set_default_timeout(T)
        page.goto(app_url)
        add = page.get_by_role("button", name="Add request")
        expect(add).to_be_visible(timeout=T)
        add.click()
        expect(in_app(page).get_by_text("Step 1: add A")).to_be_visible(timeout=T)
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("8")
        steps.press("Tab")
        step_n = page.get_by_role("button", name="Step N")
        step_n.click()
        page.wait_for_timeout(300)
        step_n.click()
        page.wait_for_timeout(300)
        page.get_by_role("button", name="Step", exact=True).click()
        # The last click's operation, once everything before it has run.
        last = in_app(page).get_by_text(re.compile(r"^Step [34]: step · generated 1 token"))
        expect(last).to_be_visible(timeout=T)
        # Step 3: one Step N counted (23 prompt tokens + 8 + 1); Step 4: both (+ 8 + 8 + 1).
        tokens = {"3": 32, "4": 40}[last.inner_text().split(":")[0].split()[1]]
        expect(page.locator(".pl-metric[data-label='Filled slots']")).to_have_text(
            f"{tokens} / {tokens}", timeout=T)
        expect(page.locator("[data-testid='stException']")).to_have_count(0)
        expect(in_app(page).get_by_text("This app has encountered an error")).to_have_count(0)
        page.screenshot(path=screenshots / "double-click.png", full_page=True)
    except BaseException:
        page.screenshot(path=screenshots / "double-click-failed.png", full_page=True)
        raise
    finally:
        page.close()


def test_a_click_waiting_behind_a_step_still_acts_when_a_later_click_supersedes_it(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # Add request waits for the engine while Step N runs; Finish, clicked next, makes
    # Streamlit stop the Add's run. The Add used to be dropped (its run read session
    # state after the wait); now it acts first, then the Finish, and the page shows both.
    page = browser.new_page(viewport={"width": 1440, "height": 1800})
    try:
        # A Step N that runs until it is stopped: a step of a few seconds could end, and
        # the Add's pick of B reach the browser, before Finish was clicked.
        add = step_until_stopped(page, app_url)
        add.click()
        page.wait_for_timeout(500)
        page.get_by_role("button", name="Finish").click()
        # Both clicks wait for the step; a Stop (a third click, superseding the Finish's
        # run in turn) ends it, and the two waiting clicks act in the order they came.
        page.wait_for_timeout(500)
        stop_stepping(page)
        # Finish acts on A, the request picked when it was clicked.
        expect(in_app(page).get_by_text(re.compile(r"^Step 4: finish A"))).to_be_visible(timeout=T)
        # What ran before it while it waited stays above it, in order: the stopped step's
        # line was lost behind the waiting clicks' own.
        lines = status_lines(page)
        expect(lines).to_have_count(3, timeout=T)
        said = lines.all_inner_texts()
        assert re.match(r"Stopped after [\d,]+ of 10,000 iterations\. Step 2: step ×[\d,]+",
                        said[0])
        assert said[1].startswith("Step 3: add B") and said[2].startswith("Step 4: finish A")
        # Step 3 was the add: B is the request left to pick.
        picker = page.locator(".st-key-req_pick").get_by_role("combobox")
        expect(picker).to_have_value(re.compile(r"^B · running"), timeout=T)
        expect(page.locator("[data-testid='stException']")).to_have_count(0)
        page.screenshot(path=screenshots / "superseded-click.png", full_page=True)
    except BaseException:
        page.screenshot(path=screenshots / "superseded-click-failed.png", full_page=True)
        raise
    finally:
        page.close()


def test_an_upload_refused_after_waiting_behind_step_n_keeps_its_line_above(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    """"Refused the snapshot ... The playground is unchanged" was all the page said,
    though the Step N it waited behind had just changed the engine."""
    page = browser.new_page(viewport={"width": 1440, "height": 1800})
    try:
        step_until_stopped(page, app_url)
        # A snapshot whose blocks the restore refuses: it waits for the step's lock first.
        bad = {"name": "bad.json", "mimeType": "application/json",
               "buffer": b'{"schema_version": 1, "config": {"num_blocks": 4}}'}
        page.locator(".st-key-import_snapshot").get_by_test_id(
            "stFileUploaderDropzoneInput").set_input_files(files=[bad])
        page.wait_for_timeout(500)
        stop_stepping(page)
        lines = status_lines(page)
        expect(lines).to_have_count(2, timeout=T)
        said = lines.all_inner_texts()
        assert re.match(r"Stopped after [\d,]+ of 10,000 iterations\. Step 2: step ×[\d,]+",
                        said[0])
        assert said[1].startswith("Refused the snapshot in 'bad.json': ")
        assert said[1].endswith("The playground is unchanged.")
        page.screenshot(path=screenshots / "refused-after-step-n.png", full_page=True)
    except BaseException:
        page.screenshot(path=screenshots / "refused-after-step-n-failed.png", full_page=True)
        raise
    finally:
        page.close()


def test_a_long_steps_bar_floats_over_the_page_and_streamlits_own_stop_never_shows(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    """Drawn in the page's flow, the bar pushed every control 107 px down as Step N began
    (a click aimed meanwhile landed on the control above) and out of view on a page
    scrolled down; Streamlit's own Stop, hidden only beside a bar, left the page blank
    when pressed during an operation with a spinner."""
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    try:
        page.set_default_timeout(T)
        page.goto(app_url)
        add = page.get_by_role("button", name="Add request")
        expect(add).to_be_visible(timeout=T)
        # Hidden on any page, with no operation running: a running indicator's button.
        page.evaluate("""() => document.body.insertAdjacentHTML('beforeend',
            "<div data-testid='stStatusWidget'><button id='probe'>Stop</button></div>")""")
        expect(page.locator("#probe")).to_be_hidden()
        page.evaluate("() => document.getElementById('probe').parentElement.remove()")
        room_for_a_long_step(page, T)
        add.click()
        expect(in_app(page).get_by_text("Step 1: add A")).to_be_visible(timeout=T)
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("10000")
        steps.press("Tab")
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        step_n = page.get_by_role("button", name="Step N")
        # The run the new Steps value starts may redraw the button: its box is read once
        # it is drawn (read mid-redraw, it was None).
        expect(step_n).to_be_visible(timeout=T)
        before = step_n.bounding_box()
        assert before is not None
        step_n.click()
        bar = page.get_by_test_id("stProgress")
        expect(bar).to_be_visible(timeout=T)
        assert step_n.bounding_box() == before
        header_stop = page.locator("[data-testid='stStatusWidget'] button")
        expect(header_stop).to_have_count(1)
        expect(header_stop).to_be_hidden()
        # Scrolled to the pool: the bar and its Stop stay in view.
        page.mouse.wheel(0, 1500)
        page.wait_for_timeout(300)
        box = bar.bounding_box()
        assert box is not None and 0 <= box["y"] <= 900 - box["height"]
        page.screenshot(path=screenshots / "floating-bar.png")
        stop_stepping(page)
        expect(in_app(page).get_by_text(re.compile(r"^Stopped after"))).to_be_visible(timeout=T)
    except BaseException:
        page.screenshot(path=screenshots / "floating-bar-failed.png", full_page=True)
        raise
    finally:
        page.close()
