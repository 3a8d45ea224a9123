"""assets/a11y.js's read-out around a change of tab, in a real Chromium, on the orders
of events Streamlit makes: which drawings are news, read out, and which are a tab's
first drawing, not read.

The runs a page sees vary with the server's load (a short run's start and end can reach
the page together, its state never changing; a change made mid-run joins the run), so
the script is driven here directly on a page of the same shape: a tab bar keyed as
ui.compare's, a result box, a field. tests/test_browser_a11y.py reads real pages.
"""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Browser, Page

from ui import a11y

pytestmark = pytest.mark.browser

PAGE = f"""
<div data-testid="stApp" data-test-script-state="notRunning">
  <div class="st-key-{a11y.TAB_KEY}"><div role="tablist">
    <button role="tab" aria-selected="true">A</button>
    <button role="tab" aria-selected="false">B</button>
  </div></div>
  <div data-testid="stMain">
    <div class="st-key-section_result">A's result</div>
    <input id="field" aria-label="A field">
    <button id="apply">Apply</button>
  </div>
</div>"""

# What a step does to the page: a tab picked, the run state as the page shows it, the
# result box drawn, a person's act ("enter" in the field, "press" the button) or what
# changes nothing ("tab" out of the field, "focus" it with a click, "arrow" in its
# text), a pause.
STEPS = {
    "pick B": """for (const t of document.querySelectorAll("[role='tab']")) {
                   t.setAttribute('aria-selected', String(t.innerText === 'B')); }""",
    "run": "document.querySelector('[data-testid=stApp]')"
           ".setAttribute('data-test-script-state', 'running')",
    "rerun": "document.querySelector('[data-testid=stApp]')"
             ".setAttribute('data-test-script-state', 'rerunRequested')",
    "end": "document.querySelector('[data-testid=stApp]')"
           ".setAttribute('data-test-script-state', 'notRunning')",
}

# Each case: its steps ("draw TEXT" draws the result), and what is read out after them.
CASES = {
    # The tab's first drawing alone is not news ...
    "a tab's first run": (["pick B", "run", "draw B's first", "end"], []),
    # ... a change after it is.
    "a change after the tab's run": (
        ["pick B", "run", "draw B's first", "end", "wait", "enter", "run", "draw B's new",
         "end"], ["B's new"]),
    # The tab's run unseen (its start and end came together), then a change: the
    # change's run is not the tab's first.
    "a change after an unseen run": (
        ["pick B", "draw B's first", "wait", "enter", "run", "draw B's new", "end"],
        ["B's new"]),
    # ... and the change's run unseen too.
    "two unseen runs": (["pick B", "draw B's first", "wait", "enter", "draw B's new"],
                        ["B's new"]),
    # A change made while the tab's run draws joins that run: one run, then its end.
    "a change mid-run": (
        ["pick B", "run", "draw B's first", "enter", "rerun", "run", "draw B's new", "end"],
        ["B's new"]),
    # A button pressed mid-run is a change too.
    "a button mid-run": (
        ["pick B", "run", "draw B's first", "press", "rerun", "run", "draw B's new", "end"],
        ["B's new"]),
    # What changes nothing is no act: the tab's first drawing, drawn on after it, is
    # still not news.
    "a Tab key mid-run": (["pick B", "run", "draw B's", "tab", "draw B's first", "end"], []),
    "a field focused mid-run": (["pick B", "run", "draw B's", "focus", "draw B's first", "end"],
                                []),
    "an arrow in a field mid-run": (
        ["pick B", "run", "draw B's", "arrow", "draw B's first", "end"], []),
    "a field focused before the run": (["pick B", "focus", "run", "draw B's first", "end"],
                                       []),
}


def heard_after(page: Page, steps: list[str]) -> list[str]:
    """Do `steps` on PAGE with the script installed: what the live region said."""
    def run(js: str) -> None:
        page.add_script_tag(content=js)

    page.set_content(PAGE)
    run(a11y.script())
    page.wait_for_timeout(400)          # the first read, of the page as it is
    run("""window.heard = [];
      const live = document.getElementById('pagedlab-live');
      new MutationObserver(() => { if (live.textContent) window.heard.push(live.textContent); })
        .observe(live, {childList: true, characterData: true, subtree: true});""")
    for step in steps:
        if step.startswith("draw "):
            run(f"document.querySelector('.st-key-section_result').innerText = "
                f"{json.dumps(step.removeprefix('draw '))}")
        elif step == "wait":
            page.wait_for_timeout(400)
        elif step == "enter":
            page.locator("#field").press("Enter")
        elif step == "tab":
            page.locator("#field").press("Tab")
        elif step == "focus":
            page.locator("#field").click()
        elif step == "arrow":
            page.locator("#field").press("ArrowRight")
        elif step == "press":
            page.locator("#apply").click()
        else:
            run(STEPS[step])
    page.wait_for_timeout(600)          # a read comes 250 ms after the page settles
    heard: list[str] = page.evaluate("window.heard")
    return heard


@pytest.mark.parametrize("case", CASES)
def test_a_tabs_first_drawing_is_not_news_and_a_change_is(browser: Browser,
                                                          case: str) -> None:
    steps, said = CASES[case]
    page = browser.new_page()
    try:
        assert heard_after(page, steps) == said
    finally:
        page.close()


# A scenario's page while it plays: its narration, and the translator drawn after it,
# which a play's runs often have not drawn again (stale) when the read comes.
PLAY_PAGE = f"""
<div data-testid="stApp" data-test-script-state="notRunning">
  <div data-testid="stMain">
    <div class="st-key-{a11y.PLAYING}" id="mark"></div>
    <div class="st-key-tour_narration" id="story">Step 1 of 5</div>
    <div class="st-key-tour_tr_said" id="said">translator at step 1</div>
  </div>
</div>"""


@pytest.mark.parametrize("stopped_by", ["pause", "the play's end"])
def test_after_a_play_only_its_own_words_are_news(browser: Browser, stopped_by: str) -> None:
    page = browser.new_page()
    try:
        page.set_content(PLAY_PAGE)
        page.add_script_tag(content=a11y.script())
        page.wait_for_timeout(400)
        page.add_script_tag(content="""window.heard = [];
          const live = document.getElementById('pagedlab-live');
          new MutationObserver(() => { if (live.textContent) window.heard.push(live.textContent); })
            .observe(live, {childList: true, characterData: true, subtree: true});""")

        def do(js: str, wait: int = 400) -> None:
            page.add_script_tag(content=js)
            page.wait_for_timeout(wait)
        app = "document.querySelector('[data-testid=stApp]')"
        # A play's step: its narration read as drawn; the translator, stale, redrawn later.
        do(f"{app}.setAttribute('data-test-script-state', 'running');"
           "document.getElementById('said').setAttribute('data-stale', 'true');"
           "document.getElementById('story').innerText = 'Step 2 of 5';")
        do("document.getElementById('said').innerText = 'translator at step 2';")
        # The play stops: a Pause's run draws the same step; a play's end says so.
        end = ("document.getElementById('story').innerText = 'Step 2 of 5';" if
               stopped_by == "pause" else
               "document.getElementById('story').insertAdjacentHTML('beforebegin',"
               " '<div class=\"st-key-tour_messages--1\">Played to the end.</div>');")
        do("document.getElementById('mark').remove();"
           "document.getElementById('said').removeAttribute('data-stale');"
           f"{end} {app}.setAttribute('data-test-script-state', 'notRunning');", 700)
        heard: list[str] = page.evaluate("window.heard")
        assert heard == (["Step 2 of 5"] if stopped_by == "pause" else
                         ["Step 2 of 5", "Played to the end."])
    finally:
        page.close()
