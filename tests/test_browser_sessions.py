"""Saved sessions and progress in a real Chromium, against a real `streamlit run`.

A reload reopens the session its address names; a link opened in another
browser (a context without the cookie) opens a copy under a new id; the
server is killed with SIGKILL and restarted on the same port and data
directory, and a reload brings the same state back. The Sessions list
reopens an earlier session. Step N shows a progress bar whose Stop button
ends it between two iterations, and what ran is what a reload, and the
exported scenario replayed with --check, shows.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from backend.io.cli import main
from backend.sessions.store import FILE_NAME
from tests.browser_support import (
    CHROMIUM_ARGS,
    ROOT,
    _free_port,
    _wait_healthy,
    in_app,
    room_for_a_long_step,
    scroll_to,
)
from ui import resume

pytestmark = pytest.mark.browser

T = 120_000
ID = r"[A-Za-z0-9_-]{32}"


class Server:
    """`streamlit run app.py` on a fixed port and data directory, killable and restartable."""

    def __init__(self, data: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = data
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        streamlit = Path(sys.executable).with_name("streamlit")
        env = {**os.environ, "PAGEDLAB_DATA_DIR": str(self.data)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(streamlit), "run", "app.py", "--server.port", str(self.port),
                 "--server.address", "127.0.0.1", "--server.headless", "true",
                 "--browser.gatherUsageStats", "false"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        _wait_healthy(self.url, self.proc, self.log)

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, nothing is flushed but what was committed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    log = ROOT / "build" / "test_browser_sessions.streamlit.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    s = Server(tmp_path / "data", log)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def browser(chromium_path: str) -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def new_page(browser: Browser) -> Page:
    """A page in a context of its own: another browser, with its own cookies."""
    page = browser.new_context(viewport={"width": 1440, "height": 1400},
                               accept_downloads=True).new_page()
    page.set_default_timeout(T)
    return page


def status(page: Page, text: str | re.Pattern[str]) -> None:
    expect(in_app(page).get_by_text(text).first).to_be_visible(timeout=T)


def settled(page: Page) -> None:
    """No run in progress (Streamlit's status widget gone) and no error on the page."""
    expect(page.get_by_test_id("stStatusWidget")).to_have_count(0, timeout=T)
    expect(page.get_by_test_id("stException")).to_have_count(0)
    expect(page.get_by_text("This app has encountered an error")).to_have_count(0)


def session_id(page: Page) -> str:
    expect(page).to_have_url(re.compile(rf"/lab\?session={ID}$"), timeout=T)
    found = re.search(rf"session=({ID})", page.url)
    assert found is not None
    return found.group(1)


def filled(page: Page) -> str:
    return page.locator(".pl-metric[data-label='Filled slots']").inner_text()


def shoot(page: Page, screenshots: Path, name: str) -> None:
    page.screenshot(path=screenshots / f"sessions-{name}.png", full_page=True)


def test_reload_link_copy_and_a_killed_server_keep_the_session(
        server: Server, browser: Browser, screenshots: Path) -> None:
    page = new_page(browser)
    try:
        page.goto(server.url)
        page.get_by_role("button", name="Add request").click()
        status(page, "Step 1: add A")
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("3")
        steps.press("Tab")
        page.get_by_role("button", name="Step N").click()
        status(page, "Step 2: step ×3")
        settled(page)
        sid = session_id(page)
        before = filled(page)
        assert before == "26 / 28"

        # A reload: the same session, under the same address.
        page.reload()
        status(page, "Reopened this session: step 2")
        settled(page)
        assert session_id(page) == sid and filled(page) == before
        shoot(page, screenshots, "01-reloaded")

        # The link in another browser: a copy, the same state, saved under a new id from
        # its first operation (until then the address names the link's session).
        other = new_page(browser)
        other.goto(page.url)
        status(other, "This link is another browser's session")
        settled(other)
        assert session_id(other) == sid and filled(other) == before
        other.get_by_role("button", name="Step", exact=True).click()
        status(other, "Step 3: step")
        settled(other)
        expect(other).not_to_have_url(re.compile(rf"session={sid}$"), timeout=T)
        copy_id = session_id(other)
        assert copy_id != sid
        shoot(other, screenshots, "02-copy-in-another-browser")

        # Killed and restarted, with the page left open: it reconnects as a new server
        # session, which knows no button's callback yet. The first click reopens the
        # session and says that it did nothing, rather than being lost without a word.
        server.kill()
        server.start()
        page.wait_for_timeout(1_000)
        settled(page)
        page.get_by_role("button", name="Step", exact=True).click()
        status(page, re.compile(r"^Your click on “Step” did nothing: this page had lost its "
                                r"server session \(the server restarted"))
        status(page, "Reopened this session: step 2")
        settled(page)
        assert session_id(page) == sid and filled(page) == before
        shoot(page, screenshots, "03-click-after-a-restart")
        page.get_by_role("button", name="Step", exact=True).click()
        status(page, "Step 3: step")
        settled(page)
        after = filled(page)
        server.kill()
        server.start()
        page.reload()
        status(page, "Reopened this session: step 3")
        assert filled(page) == after
        shoot(page, screenshots, "03-after-a-killed-server")

        # A new session, then the list brings the first one back.
        page.get_by_role("button", name="New session").click()
        status(page, "New session:")
        settled(page)
        expect(page).to_have_url(re.compile(r"/lab$"), timeout=T)
        page.get_by_role("button", name="Add request").click()
        status(page, "Step 1: add A")
        settled(page)
        assert session_id(page) != sid
        listed = page.get_by_text(re.compile(rf"^{re.escape(sid[:8])}… · step 3 ·"))
        expect(listed).to_be_visible(timeout=T)
        scroll_to(listed)
        shoot(page, screenshots, "04-sessions-list")
        page.locator(f".st-key-btn_open_{sid} button").click()
        status(page, f"Opened session {sid[:8]}…: step 3")
        settled(page)
        assert session_id(page) == sid and filled(page) == after
    except BaseException:
        shoot(page, screenshots, "failed")
        raise


def test_two_tabs_opened_together_on_a_first_visit_share_the_browsers_secret(
        server: Server, browser: Browser, screenshots: Path) -> None:
    # Each tab minted a secret and set the cookie, the last one winning: the other tab's
    # session then belonged to a secret the browser no longer presented, and its link
    # opened in a third tab of the same browser was "another browser's session".
    context = browser.new_context(viewport={"width": 1440, "height": 1400})
    context.set_default_timeout(T)
    first, second = context.new_page(), context.new_page()
    try:
        first.goto(f"{server.url}/lab", wait_until="commit")
        second.goto(f"{server.url}/lab", wait_until="commit")
        # Both tabs' first runs (each mints a secret) before either acts: a tab whose first
        # run comes after the other's first save reopens that session, as a bare address
        # does for a browser with a saved session, and the two tabs then shared one
        # engine (seen once on a loaded machine: "Step 2: add Two").
        for page in (first, second):
            expect(page.get_by_role("button", name="Add request")).to_be_visible(timeout=T)
        ids = []
        for page, rid in ((first, "One"), (second, "Two")):
            settled(page)
            page.get_by_role("textbox", name="Request id").fill(rid)
            page.get_by_role("button", name="Add request").click()
            status(page, f"Step 1: add {rid}")
            settled(page)
            ids.append(session_id(page))
        for sid in ids:
            third = context.new_page()
            third.goto(f"{server.url}/lab?session={sid}")
            status(third, "Reopened this session: step 1")
            settled(third)
            expect(in_app(third).get_by_text("another browser's session")).to_have_count(0)
            third.close()
    except BaseException:
        shoot(second, screenshots, "two-tabs-failed")
        raise
    finally:
        context.close()


def test_step_n_shows_progress_and_stops_between_iterations(
        server: Server, browser: Browser, screenshots: Path, tmp_path: Path) -> None:
    page = new_page(browser)
    try:
        page.goto(server.url)
        page.get_by_role("button", name="Add request").click()
        status(page, "Step 1: add A")
        settled(page)
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("2000")
        steps.press("Tab")
        page.get_by_role("button", name="Step N").click()
        bar = page.get_by_text(re.compile(r"Stepping the batch \(2,000 iterations\): iteration "
                                          r"[\d,]+ of 2,000"))
        expect(bar).to_be_visible(timeout=T)
        shoot(page, screenshots, "05-step-n-progress")
        page.get_by_role("button", name="Stop stepping").first.click()
        done = in_app(page).get_by_text(re.compile(
            r"Stopped after [\d,]+ of 2,000 iterations\. Step 2: step ×[\d,]+"))
        expect(done).to_be_visible(timeout=T)
        settled(page)
        found = re.search(r"Stopped after ([\d,]+) of", done.inner_text())
        assert found is not None
        ran = int(found.group(1).replace(",", ""))
        assert 1 <= ran < 2000
        # The engine holds exactly the iterations that ran: one token each.
        tokens = 23 + ran
        slots = -(-tokens // 4) * 4
        assert filled(page) == f"{tokens:,} / {slots:,}"
        expect(page.get_by_role("button", name="Stop stepping")).to_have_count(0)
        shoot(page, screenshots, "06-stopped")

        # What ran is what was saved, and what the scenario replays.
        page.reload()
        status(page, "Reopened this session: step 2")
        settled(page)
        assert filled(page) == f"{tokens:,} / {slots:,}"
        with page.expect_download() as info:
            page.get_by_role("button", name="Session as a scenario").click()
        path = tmp_path / info.value.suggested_filename
        info.value.save_as(path)
        assert main(["run", str(path), "--check"]) == 0
    except BaseException:
        shoot(page, screenshots, "progress-failed")
        raise


def test_a_reload_or_a_second_tab_during_step_n_stops_it_and_opens_what_it_reached(
        server: Server, browser: Browser, screenshots: Path) -> None:
    """Streamlit lets a reloaded page's run go on: the new page opened the state before
    the Step N, and the step, saving when done, became an unlisted copy."""
    page = new_page(browser)
    try:
        page.goto(server.url)
        room_for_a_long_step(page)
        page.get_by_role("button", name="Add request").click()
        status(page, "Step 1: add A")
        settled(page)
        sid = session_id(page)

        def step_n(p: Page) -> None:
            steps = p.get_by_role("spinbutton", name="Steps")
            steps.fill("2000")
            steps.press("Tab")
            p.get_by_role("button", name="Step N").click()
            expect(p.get_by_text(re.compile(r"iteration [\d,]+ of 2,000")).first).to_be_visible(
                timeout=T)

        step_n(page)
        page.reload()
        reopened = in_app(page).get_by_text(re.compile(
            r"Reopened this session: step 2, .* This session's other page \(this one before a "
            r"reload, or another tab\) was in the middle of “Stepping the batch \(2,000 "
            r"iterations\)” \(iteration [\d,]+ of 2,000 when this page opened\): it was "
            r"stopped after its current iteration and saved first"))
        expect(reopened).to_be_visible(timeout=T)
        settled(page)
        shoot(page, screenshots, "07-reloaded-during-step-n")
        assert session_id(page) == sid
        ran = int(filled(page).split(" / ")[0].replace(",", "")) - 23
        assert 1 <= ran < 2000
        # One session, holding the step that ran: no copy was made of it.
        rows = sqlite3.connect(server.data / FILE_NAME).execute(
            "SELECT id FROM sessions").fetchall()
        assert rows == [(sid,)]

        # A second tab on the link: the first tab's step stops and says why.
        step_n(page)
        second = page.context.new_page()
        second.set_default_timeout(T)
        second.goto(f"{server.url}/lab?session={sid}")
        expect(in_app(second).get_by_text(re.compile(
            r"Reopened this session: step 3, .* was in the middle of “Stepping the batch"))
               ).to_be_visible(timeout=T)
        expect(in_app(page).get_by_text(re.compile(
            r"Stopped after [\d,]+ of 2,000 iterations: this session was opened in another tab, "
            r"which goes on from here\. Step 3: step ×[\d,]+"))).to_be_visible(timeout=T)
        settled(second)
        assert filled(second) == filled(page)
    except BaseException:
        shoot(page, screenshots, "reload-during-step-failed")
        raise


def test_back_and_forward_open_the_sessions_their_addresses_name(
        server: Server, browser: Browser, screenshots: Path) -> None:
    """Back wrote this tab's session back into the address it had gone back to: the
    page stayed, every entry passed over was rewritten to it, and Back never left it.
    Back during a Step N stops the step, which saves what it ran, as a reload does."""
    page = new_page(browser)
    try:
        page.goto(f"{server.url}/lab")
        add = page.get_by_role("button", name="Add request")
        expect(add).to_be_visible(timeout=T)
        settled(page)
        sidebar = page.get_by_test_id("stSidebar")
        sidebar.get_by_text("torch", exact=True).click()
        expect(sidebar.get_by_text("Next step runs on torch")).to_be_visible(timeout=T)
        room_for_a_long_step(page)
        settled(page)
        add.click()
        status(page, "Step 1: add A")
        settled(page)
        first = session_id(page)
        page.get_by_role("button", name="New session").click()
        expect(page).to_have_url(re.compile(r"/lab$"), timeout=T)
        settled(page)
        add.click()
        status(page, "Step 1: add A")
        settled(page)
        second = session_id(page)
        assert second != first
        page.locator(f".st-key-btn_open_{first} button").filter(visible=True).click()
        status(page, f"Opened session {first[:8]}…")
        settled(page)
        assert session_id(page) == first
        # A long step on it, under way when Back is pressed.
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("10000")
        steps.press("Tab")
        page.get_by_role("button", name="Step N").click()
        expect(page.get_by_text(re.compile(r"Stepping the batch \(10,000 iterations\): "
                                           r"iteration \d+"))).to_be_visible(timeout=T)
        # Back: the step stops and saves, and the session the entry before names opens,
        # as a link would open it.
        page.go_back()
        status(page, re.compile(r"Stopped after [\d,]+ of 10,000 iterations: Back or Forward "
                                r"opened another session"))
        status(page, f"Opened session {second[:8]}… (the browser's Back or Forward)")
        settled(page)
        assert session_id(page) == second
        assert filled(page) == "23 / 24"
        shoot(page, screenshots, "08-back")
        # Forward: the one Back left, as far as its step ran.
        page.go_forward()
        status(page, f"Opened session {first[:8]}… (the browser's Back or Forward)")
        settled(page)
        assert session_id(page) == first
        tokens = int(filled(page).split("/")[0].replace(",", "").strip())
        assert 23 < tokens < 23 + 10_000, tokens
        # Back twice: to the second session, then onto the entry New session left,
        # from before its first operation. It names no session: the page stays, and
        # says so instead of keeping the line of the Back before.
        page.go_back()
        status(page, f"Opened session {second[:8]}… (the browser's Back or Forward)")
        settled(page)
        page.go_back()
        status(page, resume.NAMES_NONE.format(f"session {second[:8]}…"))
        settled(page)
        assert session_id(page) == second
        expect(in_app(page).get_by_text("(the browser's Back or Forward)")).to_have_count(0)
    except BaseException:
        shoot(page, screenshots, "history-failed")
        raise
    finally:
        page.context.close()
