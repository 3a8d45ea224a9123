"""assets/history.js in a real Chromium, on the address's changes in the orders Streamlit
makes them: which become entries of the browser's history.

Streamlit's order varies from run to run (a page's path before or after the link its run
writes), so the rule is driven here directly; tests/test_browser_scenarios.py checks the
pages' Back and Forward end to end.
"""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Browser, Page, expect

from ui import history
from ui.a11y import PLAYING

pytestmark = pytest.mark.browser

T = 60_000
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

# Each case: what happens from /lab, a key pressed ("key", or a modifier alone:
# "shift"), the address changed (a path), a play's mark drawn or removed ("play",
# "stop"), the script loaded ("install"; first, if not named); the entries that adds,
# the address then, and the address after one Back.
CASES = {
    # A sidebar link: the page's bare path, then its link, one entry.
    "path, then link": (["key", "/tour", "/tour?scenario=s&step=0"], 1,
                        "/tour?scenario=s&step=0", "/lab"),
    # ... or its link on the old page's path first: the old page's entry is kept as it was.
    "link on the old path, then path": (
        ["key", "/lab?scenario=s&step=0", "/tour?scenario=s&step=0"], 1,
        "/tour?scenario=s&step=0", "/lab"),
    # Continue in the Playground: three changes, one entry.
    "continue": (["key", "/tour", "/tour?session=x", "/lab?session=x"], 1,
                 "/lab?session=x", "/lab"),
    # Each thing the person does is an entry: a step, another, a page.
    "two steps": (["key", "/tour?step=1", "key", "/tour?step=2"], 2, "/tour?step=2",
                  "/tour?step=1"),
    "a page, a link": (["key", "/tour", "key", "/tour?scenario=s&step=0"], 2,
                       "/tour?scenario=s&step=0", "/tour"),
    # A play: one click, and each view it takes is an entry, the last too, whether its
    # address changes before or after the play's mark is taken away ...
    "a play": (["key", "play", "/tour?step=1", "/tour?step=2", "stop", "/tour?step=3"], 3,
               "/tour?step=3", "/tour?step=2"),
    "a play, its mark last": (["key", "play", "/tour?step=1", "/tour?step=2", "/tour?step=3",
                               "stop"], 3, "/tour?step=3", "/tour?step=2"),
    # ... and a change after that, with no click, is not.
    "after a play": (["key", "play", "/tour?step=1", "stop", "/tour?step=2",
                      "/tour?step=2&x=1"], 2, "/tour?step=2&x=1", "/tour?step=1"),
    # A click the script came too late to see is a click (with none, see below).
    "a click before the script": (["key", "install", "/tour"], 1, "/tour", "/lab"),
    # A modifier alone is no act.
    "a modifier": (["key", "/tour", "shift", "/tour?scenario=s"], 1, "/tour?scenario=s",
                   "/lab"),
}

MARK = """(on) => {
  const mark = document.getElementById('mark');
  if (on && !mark) {
    const div = document.createElement('div');
    div.id = 'mark';
    div.className = 'st-key-' + PLAYING;
    document.body.appendChild(div);
  } else if (!on && mark) {
    mark.remove();
  }
}""".replace("PLAYING", repr(PLAYING))


def entries(page: Page, steps: list[str]) -> tuple[int, str, str]:
    """Do `steps` from /lab: the entries added, the address, and the one before it.

    Each step but a key runs as a page's own script does: Playwright's `evaluate` counts
    as a person's gesture (navigator.userActivation), which the script reads."""
    def run(js: str) -> None:
        page.add_script_tag(content=js)

    run("history.replaceState(null, '', '/lab'); window.before = history.length;")
    if "install" not in steps:
        steps = ["install", *steps]
    for step in steps:
        if step == "install":
            run(history.script())
        elif step == "key":
            page.keyboard.press("Enter")
        elif step == "shift":
            page.keyboard.press("Shift")
        elif step in ("play", "stop"):
            run(f"({MARK})({json.dumps(step == 'play')})")
        else:
            run(f"history.pushState({{}}, '', {json.dumps(step)})")
    added = page.evaluate("history.length - window.before")
    here = page.evaluate("location.pathname + location.search")
    page.go_back()
    back = page.evaluate("location.protocol === 'about:' ? location.href "
                         ": location.pathname + location.search")
    return added, here, back


@pytest.mark.parametrize("case", CASES)
def test_one_entry_per_thing_the_person_does(browser: Browser, app_url: str,
                                             case: str) -> None:
    steps, added, here, back = CASES[case]
    page = browser.new_page()
    try:
        # Any page of the server's origin: the script is all that runs here.
        page.goto(f"{app_url}/_stcore/health")
        assert entries(page, steps) == (added, here, back)
    finally:
        page.close()


def test_a_tabs_first_link_fills_in_the_address_it_was_opened_at(
        browser: Browser, app_url: str) -> None:
    """Before the person has acted on the page at all. The page runs it itself: any
    script Playwright runs in the page counts as the person's gesture."""
    first = (f"<script>{history.script()}</script>"
             "<script>history.pushState({}, '', '/lab?session=x');</script>")
    page = browser.new_page()
    try:
        page.route(f"{app_url}/lab", lambda route: route.fulfill(
            body=first, content_type="text/html"))
        page.goto(f"{app_url}/lab")
        page.wait_for_url(f"{app_url}/lab?session=x")
        # The new page's entry and the blank one a new page starts at: nothing added.
        assert page.evaluate("history.length") == 2
    finally:
        page.close()


def test_a_back_keeps_the_entries_after_it(browser: Browser, app_url: str) -> None:
    """A click that changed no address (Step on the Playground), then Back to an address
    Streamlit redirects (/ to /lab, by a push): the redirect takes the entry gone to, and
    Forward still has the entry Back left."""
    page = browser.new_page()
    try:
        page.goto(f"{app_url}/_stcore/health")
        page.add_script_tag(content="history.replaceState(null, '', '/')")
        page.add_script_tag(content=history.script())
        page.keyboard.press("Enter")
        page.add_script_tag(content="history.pushState({}, '', '/lab?session=x')")
        page.keyboard.press("Enter")       # Step: the address stays
        length = page.evaluate("history.length")
        page.go_back()
        page.add_script_tag(content="history.pushState({}, '', '/lab')")
        assert page.evaluate("[history.length, location.pathname]") == [length, "/lab"]
        page.go_forward()
        assert page.evaluate("location.pathname + location.search") == "/lab?session=x"
    finally:
        page.close()


def test_a_back_goes_past_an_address_that_only_opens_a_page(browser: Browser,
                                                            app_url: str) -> None:
    """/ and a page's file name (/scenarios) open a page by a redirect that pushes the
    page's own address over theirs: one Back from that page leaves, as from any other,
    and Forward comes back to it."""
    page = browser.new_page()
    heading = page.locator("[data-testid='stMain'] h1")
    before = f"{app_url}/_stcore/health"
    try:
        for address, name, opened in (
                ("/", "Playground", "/lab"),
                ("/scenarios?scenario=05-continuous-batching&step=0", "Scenarios",
                 "/tour?scenario=05-continuous-batching&step=0")):
            page.goto(before)
            page.goto(f"{app_url}{address}")
            expect(heading).to_have_text(name, timeout=T)
            page.wait_for_selector(IDLE, timeout=T)
            expect(page).to_have_url(f"{app_url}{opened}")
            page.wait_for_function("window.__pagedlabHistory === true", timeout=T)
            page.go_back()
            page.wait_for_url(before, timeout=T)
            page.go_forward()
            expect(heading).to_have_text(name, timeout=T)
            expect(page).to_have_url(f"{app_url}{opened}", timeout=T)
    finally:
        page.close()
