"""The app in a real Chromium where AppTest cannot tell: what the browser holds and loads.

The request picker after the counts change, numbers typed past a field's range, user
text that must not load anything, the Playground's own address, and several sessions at
once on one server.
Screenshots go to build/screenshots/ (test artifacts).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    FilePayload,
    Locator,
    Page,
    Request,
    expect,
)

from tests.browser_support import in_app, room_for_a_long_step, serve, status_lines

pytestmark = pytest.mark.browser

T = 30_000          # a model step on a small, busy CPU may take a while


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


def as_written(text: str) -> re.Pattern[str]:
    """`text` as the page shows it: word joiners (U+2060, invisible) may sit anywhere.

    backend.views.text puts them into bare addresses so that they are not made links.
    """
    return re.compile("\u2060?".join(map(re.escape, text)))


def status_line(page: Page, text: str | re.Pattern[str]) -> None:
    """Wait for the status line's newest message to say `text` (and not a refusal): the
    messages of operations it waited behind stand above it."""
    shows(status_lines(page).last, text)


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


# ---- panels that stay as they were left --------------------------------------------------

def test_a_panel_stays_as_left_when_a_warning_comes_and_goes_above_it(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # Unkeyed, an expander below an element that comes or goes (here the warning that
    # the sidebar's settings differ) was drawn anew, closed. Keyed, it stays as the
    # person left it, and the control run's still opens by itself at a perturbation.
    page = open_playground(browser, app_url)
    try:
        control = page.get_by_test_id("stExpander").filter(has_text="Control run")
        details = control.locator("details")
        click(page, "Add request")
        status_line(page, "Step 1: add A")
        # Nothing perturbed yet: closed, until opened by hand.
        expect(details).not_to_have_attribute("open", re.compile(".*"), timeout=T)
        control.locator("summary").click()
        expect(details).to_have_attribute("open", "", timeout=T)
        pool = page.get_by_role("spinbutton", name="Pool size (blocks)")
        pool.fill("48")
        pool.press("Tab")
        shows(page.get_by_text("The sidebar's settings differ from the running engine's"))
        idle(page)
        expect(details).to_have_attribute("open", "", timeout=T)
        page.get_by_role("button", name="Keep current").click()
        expect(page.get_by_text("The sidebar's settings differ")).to_have_count(0, timeout=T)
        idle(page)
        expect(details).to_have_attribute("open", "", timeout=T)
        # Closed by hand, it stays closed through the next operation.
        control.locator("summary").click()
        expect(details).not_to_have_attribute("open", re.compile(".*"), timeout=T)
        click(page, "Step")
        status_line(page, "Step 2: step")
        idle(page)
        expect(details).not_to_have_attribute("open", re.compile(".*"), timeout=T)
        # The same prompt again: a prefix hit, so the panel opens by itself.
        click(page, "Add request")
        status_line(page, "Step 3: add B")
        expect(details).to_have_attribute("open", "", timeout=T)
        shoot(page, screenshots / "21-panel-kept-as-left.png")
    finally:
        page.context.close()


# ---- numbers past a field's range -------------------------------------------------------

def test_a_number_past_a_fields_range_or_a_fraction_is_refused_as_typed(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = open_playground(browser, app_url)
    try:
        click(page, "Add request")
        status_line(page, "Step 1: add A")
        # The browser sends the number as typed (a bounded field would keep it to itself
        # and send its last one in range), so the click is refused by the field's name.
        steps = page.get_by_role("spinbutton", name="Steps")
        steps.fill("20000")
        steps.press("Tab")
        idle(page)
        click(page, "Step N")
        shows(page.get_by_test_id("stAlert").first,
              "Refused: Steps must be 1 to 10,000; got 20,000")
        expect(page.locator(".pl-metric[data-label='Filled slots']")).to_have_text("23 / 24")
        max_new = page.get_by_role("spinbutton", name="Max new tokens")
        max_new.fill("2000000")
        max_new.press("Tab")
        click(page, "Add request")
        shows(page.get_by_test_id("stAlert").first,
              "Refused: Max new tokens must be 1 to 1,000,000; got 2,000,000")
        # Emptied, the field is blank again (the sidebar's default), not a number.
        max_new.fill("")
        max_new.press("Tab")
        idle(page)
        expect(max_new).to_have_value("")
        # A fraction or an exponent arrives as typed: an integer field would have sent
        # "2.5" as 2 (a 2-token request added) and "1e5" as 1 (one step run).
        length = page.get_by_role("spinbutton", name="…or N random tokens")
        length.fill("2.5")
        length.press("Tab")
        click(page, "Add request")
        shows(page.get_by_test_id("stAlert").first,
              "Refused: N random tokens must be a whole number; got 2.5")
        steps.fill("1e5")
        steps.press("Tab")
        idle(page)
        click(page, "Step N")
        shows(page.get_by_test_id("stAlert").first,
              "Refused: Steps must be 1 to 10,000; got 100,000")
        expect(page.locator(".pl-metric[data-label='Filled slots']")).to_have_text("23 / 24")
        sidebar = page.get_by_test_id("stSidebar")
        pool = sidebar.get_by_role("spinbutton", name="Pool size (blocks)")
        pool.fill("2.5")
        pool.press("Tab")
        shows(sidebar.get_by_test_id("stAlert"), "Pool size must be a whole number; got 2.5")
        pool.fill("32")
        pool.press("Tab")
        idle(page)
        expect(sidebar.get_by_test_id("stAlert")).to_have_count(0)
        length.fill("")
        length.press("Tab")
        idle(page)
        click(page, "Add request")
        status_line(page, "Step 2: add B")
        shoot(page, screenshots / "21-numbers-past-range.png")
    finally:
        page.context.close()


# ---- user text loads nothing -------------------------------------------------------------

IMAGE = "![x](http://example.invalid/a.png)"
CHILD = "![y](https://example.invalid/b.png)"
SCENARIO: dict[str, Any] = {
    "name": f"Story {IMAGE}",
    "description": f"$x$ :red[red] {IMAGE}",
    "config": {"num_blocks": 8, "block_size": 4},
    "steps": [
        {"op": "add", "request": IMAGE, "prompt": "abcdef", "narration": f"**{IMAGE}** arrives."},
        {"op": "fork", "request": IMAGE, "child": CHILD, "narration": f"It forks: {CHILD}"},
        {"op": "grow", "request": "![z](http://example.invalid/z.png)"},
    ],
}
LOCAL_HOSTS = {"127.0.0.1", "localhost"}


def test_markdown_in_user_text_makes_the_browser_fetch_nothing(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = open_playground(browser, app_url)
    fetched: list[str] = []

    def record(request: Request) -> None:
        if urlsplit(request.url).scheme in ("http", "https", "ws", "wss"):
            fetched.append(request.url)

    page.context.on("request", record)
    try:
        main = page.get_by_test_id("stMain")
        page.get_by_role("textbox", name="Request id").fill(IMAGE)
        page.get_by_label("Prompt text").fill(f"see {CHILD}")
        click(page, "Add request")
        status_line(page, as_written(f"Step 1: add {IMAGE}"))
        # The request controls are drawn disabled until there is a request; for a moment
        # after the first Add the browser may hold both: the field is the enabled one.
        child = page.get_by_role("textbox", name="Child id").and_(page.locator(":enabled"))
        child.fill(CHILD)
        child.press("Tab")
        click(page, "Fork")
        status_line(page, as_written(f"Step 2: fork {IMAGE} → {CHILD}"))
        # The same id again is refused, and the refusal quotes it.
        page.get_by_role("textbox", name="Request id").fill(IMAGE)
        click(page, "Add request")
        status_line(page, as_written(f"Refused: request '{IMAGE}' already exists"))
        page.locator(".st-key-focus_req").get_by_role("combobox").click()
        page.get_by_role("option", name=IMAGE, exact=True).click()
        shows(main, as_written(f"Request {IMAGE} holds blocks"))
        page.locator("path[aria-label^='Block 0:']").hover()     # the cell's tooltip
        page.wait_for_timeout(500)
        shoot(page, screenshots / "21-markdown-ids-playground.png")

        page.get_by_role("link", name="Scenarios").click()
        shows(page.get_by_role("button", name="Next", exact=True))
        idle(page)
        page.get_by_role("button", name="Upload your own scenario").click()
        story: FilePayload = {"name": "story.json", "mimeType": "application/json",
                              "buffer": json.dumps(SCENARIO).encode()}
        page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(files=[story])
        main = page.get_by_test_id("stMain")
        shows(main, as_written(f"Story {IMAGE} (uploaded: story.json)"))
        shows(main, as_written(SCENARIO["description"]))
        page.keyboard.press("Escape")
        idle(page)
        for step in (1, 2, 3):
            page.get_by_role("button", name="Next", exact=True).click()
            shows(page.get_by_test_id("stMain"), f"Viewing step {min(step, 2)} of 3")
        narration = page.locator(".st-key-tour_narration")
        shows(narration, as_written(f"It forks: {CHILD}"))
        # The refusal: the first alert (the control run's panel below has its own).
        shows(page.get_by_test_id("stAlert").first, as_written(
            "The engine refused step 3 (grow): request '![z](http://example.invalid/z.png)' "
            "does not exist"))
        page.get_by_role("button", name="Back", exact=True).click()
        shows(page.get_by_test_id("stMain"), "Viewing step 1 of 3")
        shows(narration, as_written(f"**{IMAGE}** arrives."))
        shoot(page, screenshots / "22-markdown-scenario.png")
    finally:
        page.context.close()
    outside = [u for u in fetched if urlsplit(u).hostname not in LOCAL_HOSTS]
    assert not outside, outside
    assert fetched, "no request was recorded at all"


# ---- the pages' addresses ------------------------------------------------------------------

NAV_TITLES = ("Playground", "Scenarios", "Contiguous vs paged")
# Records, from the page's first frame, the first and the last moment (ms) the
# sidebar's navigation showed anything but the pages' titles.
_RECORD_NAV = """
window.navOther = [];
window.navSeen = new Set();
new MutationObserver(() => {
  for (const a of document.querySelectorAll('[data-testid="stSidebarNavLink"]')) {
    const title = a.innerText.trim().split("\\n").pop();
    window.navSeen.add(title);
    if (!TITLES.includes(title)) window.navOther.push(performance.now());
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
""".replace("TITLES", json.dumps(NAV_TITLES))
# Streamlit's first message to a fresh server's first session lists pages/'s files; the
# app's navigation replaces it once app.py runs. That used to be after its imports and
# first engine (seconds); now it is the first thing app.py does.
NAV_SETTLES_MS = 1000


@pytest.mark.parametrize(("path", "heading", "lands"), [
    ("/lab", "Playground", "/lab"), ("/tour", "Scenarios", "/tour"),
    ("/fragmentation", "Contiguous vs paged", "/fragmentation"),
    # The page scripts' file names: on a fresh server Streamlit would run the file by
    # itself, without the app's session set-up (a traceback, before ui/entry.py). This
    # one's server is make run's (ui/serve.py), with the app's modules imported before
    # its first run.
    ("/playground", "Playground", "/lab"),
    # ...with the link's scenario and step.
    ("/scenarios?scenario=03-growth&step=2", "Scenarios", "/tour?scenario=03-growth&step=2"),
    ("/compare", "Contiguous vs paged", "/fragmentation"),
    # ...with the link's tab.
    ("/compare?tab=Memory+calculator", "Contiguous vs paged",
     "/fragmentation?tab=Memory+calculator"),
], ids=["lab", "tour", "fragmentation", "launcher-playground", "scenarios", "compare",
        "compare-tab"])
def test_each_address_opens_its_page_on_a_fresh_server(
        browser: Browser, screenshots: Path, path: str, heading: str, lands: str,
        request: pytest.FixtureRequest) -> None:
    # A fresh server: Streamlit resolves a server's first run differently (by file name).
    launcher = request.node.callspec.id.startswith("launcher")
    log_name = ("test_browser_reliability" + ("_launcher" if launcher else "")
                + re.sub(r"\W", "_", path))
    with serve("app.py", log_name, launcher=launcher) as url:
        page = browser.new_context(viewport={"width": 1500, "height": 1400}).new_page()
        page.set_default_timeout(T)
        page.add_init_script(_RECORD_NAV)
        try:
            page.goto(f"{url}{path}")
            shows(page.get_by_role("heading", name=heading, exact=True))
            idle(page)
            page.wait_for_timeout(1000)     # a dialog would be open by now
            # pages/'s raw file names ("app", "compare", ...) were gone at once, if shown.
            assert set(NAV_TITLES) <= set(page.evaluate("Array.from(window.navSeen)"))
            other = page.evaluate("window.navOther")
            assert not other or other[-1] - other[0] < NAV_SETTLES_MS, other[-1] - other[0]
            expect(page.get_by_text("Page not found")).to_have_count(0)
            expect(page).to_have_url(re.compile(re.escape(f"{url}{lands}") + r"(\?.*)?$"),
                                     timeout=T)
            expect(page.get_by_test_id("stException")).to_have_count(0)
            if path == "/playground":
                # The same file name on a server past its first run: the same page.
                page.goto(f"{url}{path}")
                shows(page.get_by_role("button", name="Add request"))
                expect(page).to_have_url(f"{url}/lab", timeout=T)
            if "tab=" in path:
                # The tab the link names is the one open, and the only one drawn.
                expect(page.get_by_role("tab", name="Memory calculator")).to_have_attribute(
                    "aria-selected", "true")
                shows(in_app(page).get_by_text("819,200 bytes per token (800 KiB)"))
                expect(page.get_by_text("5 slots are free in total")).to_have_count(0)
            if path != "/lab":
                return
            shows(page.get_by_role("button", name="Add request"))
            shoot(page, screenshots / "23-lab-address.png")

            # The root opens the Playground at its own address.
            page.goto(url)
            shows(page.get_by_role("button", name="Add request"))
            expect(page).to_have_url(f"{url}/lab", timeout=T)
            expect(page.get_by_text("Page not found")).to_have_count(0)

            # An unknown address says so, and the Playground opens behind the notice.
            page.goto(f"{url}/no-such-page")
            shows(page.get_by_text("Page not found"))
            shows(page.get_by_role("button", name="Add request"))
        finally:
            page.context.close()


# ---- a click while a model loads -------------------------------------------------------------

def test_a_click_while_a_new_models_weights_load_lands_on_the_new_engine(
        browser: Browser, screenshots: Path) -> None:
    # A fresh server: SmolLM2's weights are not loaded yet (seconds on a small CPU).
    with serve("app.py", "test_browser_reliability_load_click") as url:
        page = browser.new_context(viewport={"width": 1500, "height": 1400}).new_page()
        page.set_default_timeout(T)
        try:
            page.goto(f"{url}/lab")
            shows(page.get_by_role("button", name="Add request"))
            idle(page)
            sidebar = page.get_by_test_id("stSidebar")
            sidebar.get_by_role("combobox", name="Model", exact=True).click()
            page.get_by_role("option", name=re.compile("^SmolLM2")).click()
            loading = page.get_by_text("Loading SmolLM2").first
            shows(loading)
            # The engine has no state, so the new model applies at once; this click
            # supersedes that run. It used to stop it before the new engine was built:
            # the request went to the old tiny-byte engine and the sidebar asked again.
            click(page, "Add request")
            # While waiting, the click's run shows the load in the page (the superseded
            # run's bar is in the sidebar), with no Stop button: a load runs to its end.
            shows(page.get_by_test_id("stMain").get_by_text("Loading SmolLM2"))
            assert page.get_by_role("button", name="Stop stepping").count() == 0
            # A second click during the load supersedes the first one's run, which used
            # to drop that click: both act, in the order they were made.
            click(page, "Add request")
            status_line(page, "Step 2: add B")
            idle(page)
            # What ran while the clicks waited stands above, in order.
            said = status_lines(page).all_inner_texts()
            assert said[0].startswith("New engine: ") and said[-1].startswith("Step 2: add B")
            # SmolLM2's tokenizer: 7 tokens (tiny-byte's would be 23, one per byte).
            picked(page, "B · running · 7 tokens")
            expect(in_app(page).get_by_text(re.compile(r"events: 1 prefix_hit"))).to_have_count(1)
            expect(sidebar.get_by_role("button", name="Apply and reset")).to_have_count(0)
            shows(sidebar, "loaded in this process")
            shoot(page, screenshots / "25-add-during-model-load.png")
        finally:
            page.context.close()


# ---- several sessions at once ---------------------------------------------------------------

SESSIONS = 4


def test_four_sessions_at_once_each_see_only_their_own_requests(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # Half on the torch kernel, half on the default Triton one (its interpreter keeps
    # process-wide state): every click below is sent to all four before any is awaited,
    # so the server runs the four sessions' operations at the same time.
    pages: list[Page] = []
    try:
        for i in range(SESSIONS):
            if i % 2 == 0:
                pages.append(open_playground(browser, app_url))
                continue
            page = browser.new_context(viewport={"width": 1500, "height": 2400}).new_page()
            page.set_default_timeout(T)
            page.goto(app_url)
            shows(page.get_by_role("button", name="Add request"))
            idle(page)
            pages.append(page)
        step = 0
        for r in (1, 2):
            for i, page in enumerate(pages):
                page.get_by_role("textbox", name="Request id").fill(f"S{i}R{r}")
                click(page, "Add request")
            step += 1
            for i, page in enumerate(pages):
                status_line(page, f"Step {step}: add S{i}R{r}")
            for page in pages:
                click(page, "Step")
            step += 1
            for page in pages:
                status_line(page, f"Step {step}: step")
        for i, page in enumerate(pages):
            idle(page)
            expect(page.get_by_test_id("stException")).to_have_count(0)
            layouts = page.locator(".pl-layouts")
            shows(layouts, f"S{i}R1 (running, 25 tokens")
            shows(layouts, f"S{i}R2 (running, 24 tokens")
            seen = set(re.findall(r"S\d+R\d+", page.get_by_test_id("stMain").inner_text()))
            assert seen == {f"S{i}R1", f"S{i}R2"}, (i, seen)
        shoot(pages[-1], screenshots / "24-four-sessions.png")
    finally:
        for page in pages:
            page.context.close()


# ---- a reload near the server's K/V limit --------------------------------------------------

def test_a_reload_gets_the_pool_its_closed_session_held(
        browser: Browser, monkeypatch: pytest.MonkeyPatch, screenshots: Path) -> None:
    """A server of 1 MiB of K/V and a pool of 400 blocks (0.78 MiB): after a reload the
    old session, which Streamlit keeps two minutes for a reconnect, still held its
    pool, and the same pool in the new session was refused for those two minutes. The
    server's limit now ends the session no browser is connected to."""
    monkeypatch.setenv("PAGEDLAB_SERVER_KV_MIB", "1")
    with serve("app.py", "test_browser_reliability_reload_limit") as url:
        page = browser.new_context(viewport={"width": 1500, "height": 1400}).new_page()
        page.set_default_timeout(T)
        try:
            for visit in ("first", "after the reload"):
                if visit == "first":
                    page.goto(f"{url}/lab")
                else:
                    page.reload()
                shows(page.get_by_role("button", name="Add request"))
                idle(page)
                metric = page.locator(".pl-metric[data-label='Free blocks']")
                expect(metric).to_have_text("32", timeout=T)
                sidebar = page.get_by_test_id("stSidebar")
                pool = sidebar.get_by_role("spinbutton", name="Pool size (blocks)")
                pool.fill("400")
                pool.press("Tab")
                expect(metric).to_have_text("400", timeout=T)
                idle(page)
                expect(sidebar.get_by_test_id("stAlert")).to_have_count(0)
            shoot(page, screenshots / "26-reload-near-the-server-limit.png")
        finally:
            page.context.close()


def _open_both(browser: Browser, address: str, button: str, pages: list[Page]) -> None:
    """Two people's tabs on `address`, each drawn to its `button`, appended to `pages`
    (for the caller to close). Both open before either closes: a connection after the
    close would make Streamlit drop the closed tab's session itself, not PagedLab."""
    for _ in range(2):
        page = browser.new_context(viewport={"width": 1400, "height": 1400}).new_page()
        pages.append(page)
        page.set_default_timeout(T)
        page.goto(address)
        shows(page.get_by_role("button", name=button))
        idle(page)


def test_a_closed_tabs_long_run_gives_its_slot_back_on_a_quiet_server(
        browser: Browser, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamlit drops a disconnected session only when another session connects or
    disconnects: on a quiet server a closed tab's replay held one of the server's two
    slots for long runs until it ended, however long after the reconnect window. With a
    window of 2 s, the closed tab's session is ended and its replay stopped."""
    monkeypatch.setenv("STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL", "2")
    with serve("app.py", "test_browser_reliability_quiet_reaper") as url:
        pages: list[Page] = []
        try:
            _open_both(browser, f"{url}/fragmentation?tab=Real+deployment",
                       "Replay the whole trace", pages)
            closing, staying = pages
            # azure-conv, the default: four replays of 19,365 requests, 13 s or more.
            panel = closing.get_by_role("tabpanel", name="Real deployment")
            panel.get_by_role("button", name="Replay the whole trace").click()
            shows(panel.get_by_test_id("stProgress"))
            closing.context.close()
            pages.remove(closing)
            # The window, the reaper's next look and the replay's next progress report.
            staying.wait_for_timeout(6_000)
            staying.get_by_role("button", name="Replay the whole trace").click()
            shows(staying.get_by_test_id("stProgress"))
            staying.get_by_role("tab", name="Trace simulator").click()
            staying.get_by_role("button", name="Run simulation").click()
            shows(staying.get_by_text("Last run: sharegpt, 1,000 requests"))
            expect(staying.get_by_text("The server is already running")).to_have_count(0)
        finally:
            for page in pages:
                page.context.close()


def test_a_closed_tabs_step_n_stops_and_saves_what_it_ran(browser: Browser,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A Step N runs in its session's script thread: a closed tab's went on for minutes
    after its session was ended, holding its pool and saving nothing, and a person
    opening its link got a copy of the state before it. With a reconnect window of 2 s,
    the ended session's step stops and is saved as far as it ran."""
    monkeypatch.setenv("STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL", "2")
    with serve("app.py", "test_browser_reliability_closed_step_n") as url:
        pages: list[Page] = []
        try:
            _open_both(browser, f"{url}/lab", "Add request", pages)
            closing, staying = pages
            sidebar = closing.get_by_test_id("stSidebar")
            sidebar.get_by_text("torch", exact=True).click()
            shows(sidebar, "Next step runs on torch")
            # A Step N of 10,000 iterations (the most one takes) never runs out of work.
            room_for_a_long_step(closing, T)
            idle(closing)
            closing.get_by_role("button", name="Add request").click()
            shows(in_app(closing).get_by_text("Step 1: add A"))
            idle(closing)
            # The address names the session once the add's run has written it.
            read = "() => new URLSearchParams(location.search).get('session')"
            closing.wait_for_function(read, timeout=T)
            sid = closing.evaluate(read)
            assert sid
            steps = closing.get_by_role("spinbutton", name="Steps")
            steps.fill("10000")
            steps.press("Tab")
            closing.get_by_role("button", name="Step N").click()
            shows(closing.get_by_text(re.compile(r"Stepping the batch \(10,000 iterations\)")))
            closing.context.close()
            pages.remove(closing)
            # Another browser opening the link gets a copy of what was saved: the state
            # after the step, once the closed tab's session has ended and the step stopped
            # (the window, the reaper's next look and an iteration: a few seconds).
            opened = staying.get_by_text(re.compile(r"you are working on a copy of it \(step "
                                                    r"(\d+),"))
            saved = None
            for _ in range(15):
                staying.goto(f"{url}/lab?session={sid}")
                shows(opened)
                idle(staying)
                found = re.search(r"copy of it \(step (\d+),", opened.inner_text())
                assert found is not None
                saved = int(found.group(1))
                if saved == 2:
                    break
                staying.wait_for_timeout(2_000)
            assert saved == 2, "the closed tab's step was not stopped and saved"
            # Stopped part-way: fewer than the 10,000 iterations asked for.
            tokens = int(staying.locator(".pl-metric[data-label='Filled slots']").inner_text()
                         .split("/")[0].replace(",", "").strip())
            assert 23 < tokens < 23 + 10_000, tokens
        finally:
            for page in pages:
                page.context.close()
