"""The Scenarios page in a real Chromium: a link, Next, Back, Play and Pause, a download.

Screenshots go to build/screenshots/tour-*.png (test artifacts).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, FilePayload, Page, Route, expect, sync_playwright

from tests.browser_support import CHROMIUM_ARGS, in_app
from tests.test_browser import T, metric_is, shoot, shows

pytestmark = pytest.mark.browser

STEP = re.compile(r"Step (\d+) of 6:")
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
HEADING = "[data-testid='stMain'] h1"
STEP_ANY = re.compile(r"Step \d+ of \d+:")


def narration(page: Page) -> str:
    return page.locator(".st-key-tour_narration").inner_text()


def viewed(page: Page) -> int:
    found = STEP.search(narration(page))
    assert found is not None, narration(page)
    return int(found.group(1))


def step_shown(page: Page, n: int) -> None:
    # While a rerun draws, Streamlit may keep the narration it replaces beside the new one
    # until the run ends (a stale element, where an element above it came or went): the
    # step's own first, then the old one gone.
    shows(page.locator(".st-key-tour_narration", has_text=f"Step {n} of 6:"))
    expect(page.locator(".st-key-tour_narration")).to_have_count(1, timeout=T)


def test_step_back_play_and_download_a_scenario(app_url: str, chromium_path: str,
                                                screenshots: Path, tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2400},
                                    accept_downloads=True)
            page.set_default_timeout(T)
            # A server's very first session resolves pages before the app has registered
            # them and briefly reports "page not found"; open the app once, as any earlier
            # visitor would have, so the link below is what a person following it sees.
            page.goto(app_url)
            expect(page.get_by_role("button", name="Add request")).to_be_visible(timeout=60_000)

            page.goto(f"{app_url}/tour?scenario=08-fork-copy-on-write")
            shows(page.get_by_role("heading", name="Fork and copy-on-write"))
            step_shown(page, 0)
            nxt = page.get_by_role("button", name="Next", exact=True)
            for n in (1, 2, 3):
                nxt.click()
                step_shown(page, n)
            story = page.locator(".st-key-tour_narration")
            shows(story, "grow A2 +1")
            shows(story, "A2 generates a token")
            shows(page.locator(".pl-checks"), "cow events in this step: 1")
            expect(page.locator(".pl-check[data-ok='0']")).to_have_count(0)
            metric_is(page, "Copy-on-write copies", "1")
            metric_is(page, "Shared blocks", "2")
            shows(page.locator(".pl-events"), "request A2 wrote into shared block 2: copied it "
                                              "to block 3 first (copy-on-write)")
            expect(page).to_have_url(re.compile(r"scenario=08-fork-copy-on-write&step=3$"))
            shoot(page, screenshots / "tour-01-copy-on-write.png")

            # Back: the fork, before anything was copied.
            page.get_by_role("button", name="Back", exact=True).click()
            step_shown(page, 2)
            shows(story, "A2 forks from A")
            metric_is(page, "Copy-on-write copies", "0")
            metric_is(page, "Shared blocks", "3")
            expect(page).to_have_url(re.compile(r"step=2&applied=3$"))
            shoot(page, screenshots / "tour-02-back-to-the-fork.png")

            # Download the viewed step's snapshot.
            with page.expect_download() as info:
                page.get_by_role("button", name="Snapshot", exact=True).click()
            download = info.value
            assert download.suggested_filename == "08-fork-copy-on-write-step-0002.json"
            path = tmp_path / download.suggested_filename
            download.save_as(path)
            snap = json.loads(path.read_text())
            assert snap["step"] == 2 and snap["schema_version"] == 1
            assert [r["id"] for r in snap["requests"]] == ["A", "A2"]
            assert snap["metrics"]["shared_blocks"] == 3 and snap["metrics"]["cow_copies"] == 0

            # A reload keeps the step viewed and the step applied past it.
            page.reload()
            step_shown(page, 2)
            shows(page.locator("[data-testid='stCaptionContainer']",
                               has_text="Viewing step"), "Viewing step 2 of 6 · 3 applied")

            # Play from step 2 (step 3 is replayed, later ones computed), then Pause. At
            # 2 s a step, the Pause sent once step 4 shows lands well before step 6 even
            # on a loaded machine (at 1 s it could miss step 5's wait).
            speed = page.get_by_role("slider", name="Seconds per step")
            speed.focus()
            speed.press("End")
            expect(speed).to_have_attribute("aria-valuetext", "2 s", timeout=T)
            page.get_by_role("button", name="Play", exact=True).click()
            pause = page.get_by_role("button", name="Pause", exact=True)
            expect(pause).to_be_visible(timeout=T)
            # The play applies the steps: Next, above and over the pool, waits for a Pause.
            for name in ("Next", "Next step"):
                expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
            step_shown(page, 4)
            pause.click()
            expect(page.get_by_role("button", name="Play", exact=True)).to_be_visible(timeout=T)
            expect(page.get_by_role("button", name="Next", exact=True)).to_be_enabled()
            stopped_at = viewed(page)
            page.wait_for_timeout(3000)       # longer than a play step: nothing moves now
            assert viewed(page) == stopped_at and 4 <= stopped_at < 6
            # The view is where the play got to: a step under way when Pause was clicked
            # is shown once taken, not left one behind ("Viewing step 4 · 5 applied").
            shows(in_app(page).get_by_text(re.compile(
                rf"Viewing step {stopped_at} of 6 · {stopped_at} applied so far")))
            # Play again runs to the end and stops by itself.
            page.get_by_role("button", name="Play", exact=True).click()
            step_shown(page, 6)
            shows(in_app(page).get_by_text("Played to the end: step 6 of 6."))
            expect(page.get_by_role("button", name="Play", exact=True)).to_be_disabled(timeout=T)
            shoot(page, screenshots / "tour-03-played-to-the-end.png")

            # The contiguous arena beside the paged pool.
            page.goto(f"{app_url}/tour?scenario=01-contiguous-problem&step=5")
            shows(page.get_by_role("heading", name="The contiguous allocation problem"))
            shows(page.locator(".st-key-tour_narration"), "Step 5 of 5:")
            shows(in_app(page).get_by_text(
                "D waits with 4 tokens: a request that will reach 5 tokens"))
            expect(page.locator(".pl-check[data-ok='0']")).to_have_count(0)
            shoot(page, screenshots / "tour-04-contiguous-arena.png")

            # Continue in the Playground: it takes this state and keeps working.
            page.get_by_role("button", name="Continue in the Playground").click()
            shows(page.get_by_role("heading", name="Playground"))
            shows(in_app(page).get_by_text("Restored “The contiguous allocation problem”: step 5"))
            metric_is(page, "Used blocks", "12 / 16")
            shows(page.get_by_role("heading", name="Export and import"))
            page.get_by_role("button", name="Step", exact=True).click()
            shows(in_app(page).get_by_text("Step 6: step"))
            shoot(page, screenshots / "tour-05-continued-in-the-playground.png")
            # One Back returns to the step it continued from (Streamlit changed the
            # address three times on the way: one entry, assets/history.js).
            page.go_back()
            shows(page.locator(".st-key-tour_narration"), "Step 5 of 5:")
            expect(page).to_have_url(re.compile(r"/tour\?scenario=01-contiguous-problem&step=5$"))
        finally:
            browser.close()


VIEWING = re.compile(r"Viewing step (\d+) of \d+ · (\d+) applied so far")


def test_a_pause_during_a_fast_play_shows_the_step_the_play_reached(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # At a quarter second a step, a Pause often arrives before the browser has the
    # slider at the play's newest step, and used to carry the one before: the slider's
    # callback moved the view back ("Viewing step 4 of 9 · 5 applied so far"), in about
    # half of all tries. Four tries, each at another moment of the play.
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    try:
        page.set_default_timeout(T)
        for attempt in range(4):
            page.goto(f"{app_url}/tour?scenario=05-continuous-batching&step=0")
            caption = page.get_by_text(VIEWING)
            shows(caption)
            speed = page.get_by_role("slider", name="Seconds per step")
            speed.focus()
            speed.press("Home")
            expect(speed).to_have_attribute("aria-valuetext", "0.25 s", timeout=T)
            page.get_by_role("button", name="Play", exact=True).click()
            page.wait_for_timeout(1300 + 290 * attempt)
            page.get_by_role("button", name="Pause", exact=True).click()
            expect(page.get_by_role("button", name="Play", exact=True)).to_be_visible(
                timeout=T)
            page.wait_for_timeout(1000)    # a step under way when Pause came is shown
            found = VIEWING.search(caption.inner_text())
            assert found is not None
            assert found.group(1) == found.group(2), (attempt, found.group(0))
        shoot(page, screenshots / "tour-06-paused-fast-play.png")
    finally:
        page.close()


def test_a_new_speed_during_a_play_keeps_it_playing(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # A speed changed as a step is drawn came with the slider of steps as the browser
    # had it (the step before, or the newest as its range grew): the slider's callback
    # took it for the person's and stopped the play, without a word, in 6 of 8 tries.
    # Two tries, at two moments of a step.
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    try:
        page.set_default_timeout(T)
        for attempt in range(2):
            page.goto(f"{app_url}/tour?scenario=10-beam-search&step=0")
            caption = page.get_by_text(VIEWING)
            shows(caption)
            page.wait_for_selector(IDLE, timeout=T)
            page.get_by_role("button", name="Play", exact=True).click()
            shows(caption, re.compile(r"Viewing step [2-9]\b"))
            page.wait_for_timeout(450 * attempt)
            speed = page.get_by_role("slider", name="Seconds per step")
            speed.focus()
            speed.press("ArrowLeft")
            expect(speed).to_have_attribute("aria-valuetext", "0.5 s", timeout=T)
            found = VIEWING.search(caption.inner_text())
            assert found is not None
            # The play goes on past the step shown when the speed changed.
            page.wait_for_function(
                "n => (document.body.innerText.match(/Viewing step (\\d+) of/) || [])[1] >= n",
                arg=min(int(found.group(1)) + 2, 9), timeout=T)
            speed.press("ArrowRight")   # back to 1 s for the next try
            expect(speed).to_have_attribute("aria-valuetext", "1 s", timeout=T)
        shoot(page, screenshots / "tour-speed-changed-during-a-play.png")
    finally:
        page.close()


def test_a_long_step_shows_how_far_it_is_and_the_time_limit(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # An uploaded scenario may ask for thousands of iterations, under the page's 60 s
    # limit; Next's step (a callback) draws its bar at the top of the page, Play's by
    # the controls, neither stays once the step is done, and Stop ends one part-way.
    story = {"name": "Long step", "config": {"num_blocks": 64, "block_size": 16},
             "steps": [{"op": "add", "request": "A", "prompt_len": 20},
                       {"op": "step", "count": 150}, {"op": "step", "count": 150},
                       {"op": "step", "count": 100000}]}
    page = browser.new_page(viewport={"width": 1366, "height": 1200})
    try:
        page.set_default_timeout(T)
        page.goto(f"{app_url}/tour?scenario=03-growth")
        shows(page.get_by_role("button", name="Next", exact=True))
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        page.get_by_role("button", name="Upload your own scenario").click()
        long: FilePayload = {"name": "long.json", "mimeType": "application/json",
                             "buffer": json.dumps(story).encode()}
        page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(files=[long])
        shows(page.get_by_test_id("stMain"), "Long step (uploaded: long.json)")
        page.keyboard.press("Escape")
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        nxt = page.get_by_role("button", name="Next", exact=True)
        nxt.click()
        shows(page.get_by_test_id("stMain"), "Viewing step 1 of 4")
        page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']")
        bar = page.get_by_test_id("stProgress")
        said = re.compile(r"^Step 2, step ×150: \d+ iterations? of 150 done, \d+ s of the "
                          r"60 s limit$")
        header_stop = page.locator("[data-testid='stStatusWidget'] button")
        nxt.click()
        expect(bar).to_have_count(1)
        # Drawn as the step starts, shown once it has run a moment (ui/progress.py).
        expect(bar).to_be_visible()
        assert said.match(bar.inner_text().strip()), bar.inner_text()
        # Streamlit's own Stop would end the page's run and leave the step going on,
        # the page frozen at the bar: only the page's Stop shows beside it.
        expect(page.get_by_role("button", name="Stop this step")).to_be_visible()
        expect(header_stop).to_have_count(1)
        expect(header_stop).to_be_hidden()
        # At the top: above the page's title.
        title = page.get_by_role("heading", name="Scenarios", exact=True).bounding_box()
        box = bar.bounding_box()
        assert box is not None and title is not None and box["y"] < title["y"]
        shows(page.get_by_test_id("stMain"), "Viewing step 2 of 4")
        expect(bar).to_have_count(0)
        # Play's bar sits under the controls' caption.
        page.get_by_role("button", name="Play", exact=True).click()
        expect(bar).to_have_count(1)
        assert bar.inner_text().strip().startswith("Step 3, step ×150: ")
        caption = page.get_by_text("Viewing step 2 of 4").bounding_box()
        box = bar.bounding_box()
        assert box is not None and caption is not None and box["y"] > caption["y"]
        shoot(page, screenshots / "tour-07-long-step-bar.png")
        # The play goes on to step 4, of 100,000 iterations: stopped by its button.
        shows(page.get_by_test_id("stMain"), "Viewing step 3 of 4")
        expect(bar).to_have_count(1)
        assert bar.inner_text().strip().startswith("Step 4, step ×100,000: ")
        page.get_by_role("button", name="Stop this step").click()
        shows(page.get_by_test_id("stMain"), re.compile(
            r"Step 4, step ×100,000, was stopped as you asked, at iteration [\d,]+ of "
            r"100,000\. The run ends at step 3; Reset runs the scenario again from step 0\."))
        expect(bar).to_have_count(0)
        expect(page.get_by_role("button", name="Play", exact=True)).to_be_visible()
    finally:
        page.close()


def opened(page: Page, name: str) -> None:
    """The page titled `name` is open, its run done."""
    expect(page.locator(HEADING)).to_have_text(name, timeout=T)
    page.wait_for_selector(IDLE, timeout=T)


def test_one_back_leaves_the_page_and_each_step_is_one_entry(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    """The browser's Back and Forward on the Scenarios page (assets/history.js and the
    link the page writes): opened from the sidebar or by its address, the page is one
    entry of the browser's history, each step taken another, and Back to the bare
    address shows the first scenario's fresh engine, which is what it stood for."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        page.set_default_timeout(T)
        story = page.locator(".st-key-tour_narration")
        nxt = page.get_by_role("button", name="Next", exact=True)
        link = re.compile(r"/tour\?scenario=01-contiguous-problem&step=1$")

        page.goto(f"{app_url}/lab")
        opened(page, "Playground")
        # The first scenario's fresh engine is what the bare address opens: it stays
        # bare, and one Back leaves.
        page.get_by_role("link", name="Scenarios").click()
        opened(page, "Scenarios")
        shows(story, "Step 0 of 5:")
        expect(page).to_have_url(f"{app_url}/tour")
        page.go_back()
        opened(page, "Playground")
        expect(page).to_have_url(f"{app_url}/lab")
        # A step is an entry of its own.
        page.go_forward()
        opened(page, "Scenarios")
        nxt.click()
        shows(story, "Step 1 of 5:")
        expect(page).to_have_url(link)
        # Opened again from the sidebar, the page writes its link at once, one entry
        # with its path, whichever Streamlit writes first: one Back leaves, to a
        # Playground whose address carries no scenario's link.
        page.get_by_role("link", name="Playground").click()
        opened(page, "Playground")
        page.get_by_role("link", name="Scenarios").click()
        opened(page, "Scenarios")
        shows(story, "Step 1 of 5:")
        expect(page).to_have_url(link)
        page.go_back()
        opened(page, "Playground")
        expect(page).to_have_url(f"{app_url}/lab")
        # Further back: the step, then the bare entry, which shows step 0 (with the
        # step applied past it kept), then the Playground.
        page.go_back()
        opened(page, "Scenarios")
        shows(story, "Step 1 of 5:")
        page.go_back()
        opened(page, "Scenarios")
        shows(story, "Step 0 of 5:")
        expect(page).to_have_url(re.compile(r"scenario=01-contiguous-problem&step=0&applied=1$"))
        page.go_back()
        opened(page, "Playground")
        # Opened by its address, the first scenario's fresh engine keeps it bare; a step
        # is an entry by the time it shows: a Back then goes to step 0, and one more
        # leaves.
        page.goto(f"{app_url}/tour")
        opened(page, "Scenarios")
        shows(story, "Step 0 of 5:")
        expect(page).to_have_url(f"{app_url}/tour")
        nxt.click()
        shows(story, "Step 1 of 5:")
        page.go_back()
        opened(page, "Scenarios")
        shows(story, "Step 0 of 5:")
        page.go_back()
        opened(page, "Playground")
    except BaseException:
        shoot(page, screenshots / "tour-history-failed.png")
        raise
    finally:
        page.close()


def test_back_during_a_play_stops_it_and_a_back_keeps_an_upload(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    """The browser's Back during a play shows the step gone to and stops the play there
    (it went on and wrote its next step over that entry); leaving the page stops a play;
    an uploaded scenario is still there after a Back to it, and its steps are entries of
    the browser's history as a shipped scenario's are."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        page.set_default_timeout(T)
        story = page.locator(".st-key-tour_narration")
        play = page.get_by_role("button", name="Play", exact=True)
        pause = page.get_by_role("button", name="Pause", exact=True)

        def stays(text: str) -> None:
            """`text` is shown, and still is two play steps later (at the slowest speed,
            or four at the speed a page opened again starts at), no play on."""
            shows(story, text)
            page.wait_for_timeout(4500)
            expect(story).to_contain_text(text, timeout=1000)
            expect(pause).to_have_count(0, timeout=1000)

        page.goto(f"{app_url}/tour?scenario=05-continuous-batching&step=0")
        opened(page, "Scenarios")
        speed = page.get_by_role("slider", name="Seconds per step")
        speed.focus()
        speed.press("End")
        expect(speed).to_have_attribute("aria-valuetext", "2 s", timeout=T)
        page.wait_for_selector(IDLE, timeout=T)
        # Back during a play.
        play.click()
        shows(story, "Step 2 of ")
        page.go_back()
        stays("Step 1 of ")
        expect(play).to_be_enabled(timeout=T)
        # Another page during a play, then the page again: where the play was.
        play.click()
        shows(story, "Step 2 of ")
        page.get_by_role("link", name="Playground").click()
        opened(page, "Playground")
        page.get_by_role("link", name="Scenarios").click()
        expect(page.locator(HEADING)).to_have_text("Scenarios", timeout=T)
        shows(story, STEP_ANY)
        shown = STEP_ANY.search(story.inner_text())
        assert shown is not None
        stays(shown.group(0))
        # An upload, a step of it, another page, and Back.
        page.get_by_role("button", name="Upload your own scenario").click()
        mine: FilePayload = {"name": "mine.json", "mimeType": "application/json",
                             "buffer": json.dumps({"name": "Mine", "steps": [
                                 {"op": "add", "request": "A", "prompt": "hi"},
                                 {"op": "step"}]}).encode()}
        page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(files=[mine])
        shows(page.get_by_test_id("stMain"), "Mine (uploaded: mine.json)")
        page.keyboard.press("Escape")
        page.wait_for_selector(IDLE, timeout=T)
        page.get_by_role("button", name="Next", exact=True).click()
        shows(story, "Step 1 of 2:")
        page.wait_for_selector(IDLE, timeout=T)
        page.get_by_role("link", name="Contiguous vs paged").click()
        opened(page, "Contiguous vs paged")
        page.go_back()
        opened(page, "Scenarios")
        shows(page.get_by_test_id("stMain"), "Mine (uploaded: mine.json)")
        shows(story, "Step 1 of 2:")
        upload_at = re.compile(r"/tour\?scenario=upload-[0-9a-f]{12}&step=0(&applied=1)?$")
        expect(page).to_have_url(re.compile(r"/tour\?scenario=upload-[0-9a-f]{12}&step=1$"))
        # Back: the upload's step before, then the scenario it was uploaded over, and
        # Forward to the upload again (the browser's Back and Forward lost it before).
        page.go_back()
        expect(page).to_have_url(upload_at)
        expect(story).not_to_contain_text("Step 1 of 2:", timeout=T)
        page.go_back()
        expect(page).to_have_url(re.compile(r"scenario=05-continuous-batching"))
        expect(page.get_by_test_id("stMain")).not_to_contain_text("Mine (uploaded",
                                                                 timeout=T)
        page.go_forward()
        expect(page).to_have_url(upload_at)
        shows(page.get_by_test_id("stMain"), "Mine (uploaded: mine.json)")
    except BaseException:
        shoot(page, screenshots / "tour-play-history-failed.png")
        raise
    finally:
        page.close()


def test_a_file_picked_in_place_of_a_refused_one_is_read_however_slow_its_upload(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    """A new file in place of a refused one reruns the page twice: once as the old file
    leaves the uploader (its refusal, said once, goes), then with the new file. The
    refusal's going moved the picker up a place, Streamlit drew the upload popover
    afresh, and a file still uploading then was dropped without a word. The new file's
    upload is held here until that first rerun has ended."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    held: list[str] = []

    def hold_the_second(route: Route) -> None:
        if route.request.method == "PUT":
            held.append(route.request.url)
            if len(held) == 2:
                # The rerun that removes the first file runs meanwhile.
                page.wait_for_timeout(3000)
        route.continue_()

    try:
        page.set_default_timeout(T)
        page.route("**/_stcore/upload_file/**", hold_the_second)
        page.goto(f"{app_url}/tour?scenario=03-growth&step=0")
        shows(page.get_by_role("button", name="Next", exact=True))
        page.wait_for_selector(IDLE, timeout=T)
        page.get_by_role("button", name="Upload your own scenario").click()
        wrong: FilePayload = {"name": "wrong.json", "mimeType": "application/json",
                              "buffer": b"[]"}
        page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(files=[wrong])
        shows(page.get_by_test_id("stMain"), "Scenario file refused: wrong.json: a scenario "
                                             "must be a JSON object, got an array")
        page.wait_for_selector(IDLE, timeout=T)
        mine: FilePayload = {"name": "mine.json", "mimeType": "application/json",
                             "buffer": json.dumps({"name": "Mine", "steps": [
                                 {"op": "add", "request": "A", "prompt": "hi"}]}).encode()}
        page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(files=[mine])
        shows(page.get_by_test_id("stMain"), "Loaded mine.json: “Mine”, 1 step.")
        expect(page).to_have_url(re.compile(r"/tour\?scenario=upload-[0-9a-f]{12}&step=0$"))
        assert len(held) == 2
    finally:
        shoot(page, screenshots / "tour-upload-in-place-of-a-refused-one.png")
        page.close()
