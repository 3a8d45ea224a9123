"""Fixtures for the browser tests: a live `streamlit run` and Debian's Chromium via Playwright.

Playwright's own browser download cannot work offline, so the tests launch the
system's `chromium` through `executable_path`. A missing browser is a failure,
not a skip: CI must not pass without having looked at the page.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "build" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STARTUP_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"streamlit did not become healthy in {STARTUP_TIMEOUT_S} s:\n"
                f"{log.read_text()}")


@contextlib.contextmanager
def serve(script: str, log_name: str, *, launcher: bool = False) -> Iterator[str]:
    """`streamlit run SCRIPT` on a free port for the duration of the block; yields its URL.
    With `launcher`, `python -m ui.serve` (make run's) serves app.py instead.

    Its output goes to build/<log_name>.streamlit.log (kept for a failure's post-mortem).
    The server saves sessions in this run's PAGEDLAB_DATA_DIR (tests/conftest.py's
    temporary directory), never in the repository's data/.
    """
    env = dict(os.environ)
    data = env.get("PAGEDLAB_DATA_DIR", "").strip()
    if not data or Path(data).resolve().is_relative_to(ROOT):
        pytest.fail(f"PAGEDLAB_DATA_DIR is {data!r}: a test server must save its sessions "
                    "outside the repository (tests/conftest.py sets a temporary directory)")
    port = _free_port()
    log = ROOT / "build" / f"{log_name}.streamlit.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    streamlit = Path(sys.executable).with_name("streamlit")
    if launcher:
        assert script == "app.py", "ui.serve serves app.py"
    command = ([sys.executable, "-m", "ui.serve"] if launcher else
               [str(streamlit), "run", script])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false",
             # The code under test is fixed for the run: a module re-imported when a
             # file changes beside a live engine makes its classes strangers
             # ("unknown operation Step(...)"), which is no bug of the app's.
             "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def app_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh `streamlit run app.py`, stopped after the module's tests."""
    with serve("app.py", request.module.__name__.rsplit(".", 1)[-1]) as url:
        yield url


@pytest.fixture(scope="module")
def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Debian's chromium is not on PATH; install it (scripts/ensure-chromium, "
                    "or apt-get install chromium): the browser tests need a real browser")
    return path


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Browser]:
    """Debian's Chromium, headless, for the module's tests (each opens its own pages)."""
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True,
                               args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


def in_app(page: Page) -> Locator:
    """The app's own elements: without the screen reader's live region (ui/a11y.py),
    which repeats the newest result's words outside them."""
    return page.locator("[data-testid='stApp']")


def scroll_to(locator: Locator, timeout_s: float = 120.0) -> None:
    """Scroll `locator` into view, again if Streamlit redraws it under the scroll.

    A rerun replaces elements: one resolved a moment ago can be detached before
    Playwright's stability wait ends, which is an error there rather than a retry.
    Re-resolving the locator is what a user's eye does; anything else still fails.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            locator.scroll_into_view_if_needed(timeout=10_000)
            return
        except PlaywrightError as exc:
            if "not attached" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def room_for_a_long_step(page: Page, timeout_ms: int = 120_000) -> None:
    """Set the Playground for a request that decodes far longer than a test takes: a pool
    of 8,192 blocks (the default's 128 slots would end a fast machine's Step N by
    capacity within a second) and 20,000 new tokens for the next Add."""
    pool = page.get_by_role("spinbutton", name="Pool size (blocks)")
    pool.fill("8192")
    pool.press("Tab")
    expect(page.locator(".pl-metric[data-label='Used blocks']")).to_have_text(
        "0 / 8192", timeout=timeout_ms)
    page.get_by_role("spinbutton", name="Max new tokens").fill("20000")


def status_lines(page: Page) -> Locator:
    """The Playground status line's messages, oldest first: those of operations a click
    waited behind stand above its own."""
    return page.locator("[class*='st-key-status_line'] [data-testid='stAlert']")
