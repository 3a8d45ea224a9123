"""assets/a11y.js's focus keeper in a real Chromium, on runs the page sees and runs it
does not: a button whose own press disables or removes it hands the keyboard's focus on,
one that opens another page leaves it on that page's heading, and an option picked from
a select's list gives it back to the select.

A busy server's short run can reach the page with its start and end together, the run
state never changing, so the script is driven here directly on a page of Streamlit's
shape: a row of buttons (Next, Reset), as the Scenarios page's. tests/test_browser_a11y.py
presses the real pages' buttons.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page

from ui import a11y

pytestmark = pytest.mark.browser

PAGE = """
<div data-testid="stApp" data-test-script-state="notRunning">
  <div data-testid="stMain">
    <input id="field" aria-label="A field">
    <div class="st-key-pick"><input id="pick" role="combobox" aria-label="Scenario"></div>
    <div class="st-key-tab"><div role="tablist">
      <div id="tabA" role="tab" tabindex="0" aria-selected="true">A</div>
      <div id="tabB" role="tab" tabindex="-1" aria-selected="false">B</div>
    </div></div>
    <div data-testid="stHorizontalBlock">
      <div class="st-key-next"><button id="next">Next</button></div>
      <div class="st-key-reset"><button id="reset">Reset</button></div>
    </div>
    <div data-testid="stHorizontalBlock">
      <div class="st-key-dl" data-testid="stDownloadButton"><button id="dl">Get</button></div>
      <div class="st-key-dl2" data-testid="stDownloadButton"><button id="dl2">Other</button></div>
    </div>
    <div class="st-key-chart"><button id="full" aria-label="Fullscreen">⛶</button></div>
  </div>
</div>
<div id="list" role="listbox" hidden><div id="opt" role="option" tabindex="-1">02</div></div>"""

STATE = "document.querySelector('[data-testid=stApp]').setAttribute('data-test-script-state', {})"
STEPS = {
    "run": STATE.format("'running'"),
    "end": STATE.format("'notRunning'"),
    "disable next": "document.getElementById('next').disabled = true",
    # A select's options, drawn at the page's end (as Streamlit's are), one taking the
    # focus as the arrow keys move through them; then the list gone with the choice.
    "open list": "document.getElementById('list').hidden = false;"
                 " document.getElementById('opt').focus()",
    "close list": "document.getElementById('list').remove()",
    # A tab bar drawn again by the run an arrow key started: the choice moves, and the
    # focus drops to the page's body.
    "choose B": "document.getElementById('tabA').setAttribute('aria-selected', 'false');"
                " document.getElementById('tabB').setAttribute('aria-selected', 'true');"
                " document.getElementById('tabB').tabIndex = 0;"
                " document.getElementById('tabA').tabIndex = -1;",
    "drop focus": "document.activeElement.blur()",
    "remove next": "document.querySelector('.st-key-next').remove()",
    # As Streamlit does to a download button while the server builds its file, no run.
    "disable dl": "document.getElementById('dl').disabled = true",
    "enable dl": "document.getElementById('dl').disabled = false",
    # As a chart's full screen does: its button hidden, and the page's elements changed
    # (the frame drawn over the page), which the script watches.
    "hide full": "document.getElementById('full').style.display = 'none';"
                 " document.body.appendChild(document.createElement('div'))",
    # Another page's address, then its heading drawn, as a page switch's run writes them.
    "new address": "history.pushState(null, '', '/lab')",
    "draw title": "const h = document.createElement('h1'); h.id = 'title';"
                  " h.textContent = 'Playground';"
                  " document.querySelector('[data-testid=stMain]').prepend(h)",
}

# Each case: the control the keyboard focuses, the steps after it ("press" is Enter on the
# focused control), and where the focus is then (None: the page's body).
CASES = {
    # Next on the last step: its run disables it, and the focus goes on to Reset ...
    "disabled by a run seen": ("next", ["press", "run", "disable next", "end"], "reset"),
    # ... also when the page never saw that run: its start and end came together.
    "disabled by a run unseen": ("next", ["press", "disable next"], "reset"),
    "removed by a run unseen": ("next", ["press", "remove next"], "reset"),
    # A download button disabled for a moment by its own press keeps it: the next
    # download would take a second Enter meant for this one.
    "a download building its file": ("dl", ["press", "disable dl", "enable dl"], "dl"),
    # A control the person did not press, changed by no run the page saw, is not the
    # page's to move: what a widget does by itself (a chart's full screen hiding its
    # button) is that widget's.
    "hidden with no press and no run": ("full", ["hide full"], None),
    # Nor is a full-screen button's own press: its Close button takes the focus
    # (a chart's, not drawn here), not the control after it.
    "full screen pressed": ("full", ["press", "hide full"], None),
    # An option picked from the keyboard: back to its select, not to the control before
    # the list (the page's last), with its run seen or not.
    "an option picked, its run unseen": ("pick", ["open list", "press", "close list"], "pick"),
    "an option picked, its run seen": ("pick", ["open list", "press", "run", "close list",
                                                "end"], "pick"),
    # An arrow key on a tab: the focus that the bar's redraw drops goes to the tab chosen.
    "a tab chosen by an arrow key": ("tabA", ["arrow", "choose B", "drop focus"], "tabB"),
    # A button that opens another page (Continue in the Playground): the new page's
    # heading takes the focus, from where Tab walks that page from its top ...
    "another page": ("next", ["press", "run", "new address", "remove next", "draw title",
                              "end"], "title"),
    # ... also when the old page was cleared, its run seen to end, before the new address
    # was written (a busy server): the focus had gone on to Reset and stayed there.
    "another page, its address late": ("next", ["press", "remove next", "new address", "run",
                                                "draw title", "end"], "title"),
}

# PAGE is served from this address, whose path a step changes as a page switch does.
ORIGIN = "http://pagedlab.test"


def focus_after(page: Page, start: str, steps: list[str]) -> str | None:
    """Focus `start` from the keyboard on PAGE with the script installed, do `steps`:
    the id of the element with the focus then (None: the body)."""
    page.route(f"{ORIGIN}/**", lambda route: route.fulfill(body=PAGE, content_type="text/html"))
    page.goto(f"{ORIGIN}/tour")
    page.add_script_tag(content=a11y.script())
    page.wait_for_timeout(300)
    # Tab to it from the field, as a keyboard user does.
    page.locator("#field").focus()
    while page.evaluate("document.activeElement.id") != start:
        page.keyboard.press("Tab")
    for step in steps:
        if step == "arrow":
            page.keyboard.press("ArrowRight")
        elif step == "press":
            # The buttons do nothing here: what the press changes are the steps after it,
            # as its run's drawing would be.
            page.keyboard.press("Enter")
        else:
            page.add_script_tag(content=STEPS[step])
        page.wait_for_timeout(150)
    page.wait_for_timeout(300)
    found: str | None = page.evaluate(
        "document.activeElement === document.body ? null : document.activeElement.id")
    return found


@pytest.mark.parametrize("case", CASES)
def test_a_pressed_control_that_goes_hands_the_focus_on(browser: Browser, case: str) -> None:
    start, steps, expected = CASES[case]
    page = browser.new_page()
    try:
        assert focus_after(page, start, steps) == expected
    finally:
        page.close()
