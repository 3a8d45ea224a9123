"""The page with a keyboard and a screen reader, in a real Chromium (ui/a11y.py).

A control that its own press disables or removes keeps the focus on the page; a
result drawn in place (a Playground action's, a scenario step's, a Contiguous vs
paged section's) is put in the polite live region; headings go down one level at a
time, and their help buttons are named for them.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from ui import a11y

pytestmark = pytest.mark.browser

T = 60_000
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

# The focused element: its tag, text or label, widget key and whether it is disabled.
FOCUSED = """() => {
  const a = document.activeElement;
  const box = a.closest('[class*="st-key-"]');
  return {tag: a.tagName, text: (a.innerText || a.getAttribute('aria-label') || '').trim(),
          key: box ? [...box.classList].find((c) => c.startsWith('st-key-')) : null,
          disabled: a.disabled === true, heading: a.closest('h1, h2, h3') !== null};
}"""

# Every drawn heading's level, in the main area and in the sidebar.
HEADINGS = """(where) => [...document.querySelectorAll(
    `[data-testid='${where}'] :is(h1, h2, h3, h4, h5, h6)`)]
  .filter((h) => h.getClientRects().length > 0)
  .map((h) => [Number(h.tagName[1]), h.innerText.trim()])"""


# How the script's holder is laid out: the wrapper Streamlit puts around it, which would
# take the page's 1rem gap between elements, and the holder.
HOLDER_DISPLAY = """() => {
  const holder = document.querySelector('.st-key-pagedlab_a11y');
  return [getComputedStyle(holder.parentElement).display, getComputedStyle(holder).display];
}"""

# Starts keeping everything the live region says, in order, in window.__heard.
HEARD = """() => {
  window.__heard = [];
  const live = document.getElementById('pagedlab-live');
  new MutationObserver(() => { if (live.textContent) window.__heard.push(live.textContent); })
    .observe(live, {childList: true, characterData: true, subtree: true});
}"""


def idle(page: Page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE, timeout=T)


def keyboard_focus(page: Page, target: Locator) -> None:
    """Focus `target` as the keyboard does (to Tab there from the control before it):
    the focus a mouse or a script gives is not the keyboard's (:focus-visible)."""
    target.focus()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Tab")
    expect(target).to_be_focused()


def focused_on(page: Page, key: str) -> None:
    """The focus reaches the enabled control of widget `key` (not the page's body)."""
    page.wait_for_function(
        """(key) => { const a = document.activeElement;
                      return a !== document.body && !a.disabled
                        && a.closest('.' + key) !== null; }""",
        arg=f"st-key-{key}", timeout=T)


def with_a_request(page: Page, app_url: str) -> Locator:
    """The Playground with request A added, its outcome read out; its Add request."""
    page.goto(f"{app_url}/lab")
    add = page.get_by_role("button", name="Add request")
    expect(add).to_be_visible(timeout=T)
    idle(page)   # what the first run draws is the page, not news to read out
    add.click()
    # The outcome, drawn in place, is read out.
    expect(page.locator("#pagedlab-live")).to_contain_text("Step 1: add A", timeout=T)
    return add


def test_focus_moves_on_when_the_pressed_control_is_disabled_or_removed(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1400})
    page.set_default_timeout(T)
    try:
        add = with_a_request(page, app_url)
        live = page.locator("#pagedlab-live")
        idle(page)

        # Finish on the only request disables itself (nothing left to finish): the
        # focus goes on to the next control, Step, not to the page's body.
        keyboard_focus(page, page.get_by_role("button", name="Finish", exact=True).first)
        page.keyboard.press("Enter")
        expect(live).to_contain_text("Step 2: finish A", timeout=T)
        idle(page)
        focused_on(page, "btn_step")
        assert page.evaluate(FOCUSED)["text"] == "Step"

        # Back to live at the top of a past state goes away with it.
        add.click()
        expect(live).to_contain_text("Step 3: add B", timeout=T)
        pick = page.get_by_role("spinbutton", name="Show the state after iteration")
        keyboard_focus(page, pick)
        page.keyboard.type("0")
        page.keyboard.press("Enter")
        # What the pick shows is read, and the focus stays in the field the page redrew
        # (not on its help button, the first control in the field's box).
        expect(live).to_contain_text("Showing the past: the state after step 1", timeout=T)
        idle(page)
        expect(pick).to_be_focused(timeout=T)
        top = page.locator(".st-key-tl_live_top button").first
        expect(top).to_be_visible(timeout=T)
        idle(page)
        keyboard_focus(page, top)
        page.keyboard.press("Enter")
        expect(page.locator(".st-key-tl_live_top")).to_have_count(0, timeout=T)
        # What it did is read, not the next thing the page redrew.
        expect(live).to_contain_text("Back to the live state, after step 3.", timeout=T)
        idle(page)
        # The controls after it were the past view's and went with it: the focus goes
        # to what is now in its place, the live view's first control after the line
        # that says where Back to live went (the metrics' meanings).
        page.wait_for_function("() => document.activeElement.innerText?.trim() "
                               "=== 'What these numbers mean'", timeout=T)

        # A session's Delete asks first; its Cancel goes away with the question, and the
        # focus returns to the row's Delete (what is now where Cancel was).
        page.get_by_role("button", name="New session").click()
        # A saved session's buttons are named for it: "Open session gFaJmxH9…".
        delete = page.get_by_role("button", name=re.compile(r"^Delete session \S{8}…$")).first
        expect(delete).to_be_visible(timeout=T)
        expect(page.get_by_role("button", name=re.compile(r"^Open session \S{8}…$"))
               ).not_to_have_count(0)
        idle(page)
        delete.click()
        cancel = page.get_by_role("button", name="Cancel", exact=True)
        expect(cancel).to_be_visible(timeout=T)
        # The question, drawn below the Delete that keeps the focus, is read out.
        expect(live).to_contain_text("for good? It leaves the list", timeout=T)
        idle(page)
        keyboard_focus(page, cancel)
        page.keyboard.press("Enter")
        expect(cancel).to_have_count(0, timeout=T)
        idle(page)
        expect(delete).to_be_focused(timeout=T)
        # Asked again and confirmed: what the deletion did is read out.
        delete.click()
        page.get_by_role("button", name=re.compile(r"^Delete for good: session \S{8}…$")
                         ).click()
        expect(live).to_contain_text("Deleted saved session", timeout=T)
        idle(page)
        page.screenshot(path=screenshots / "a11y-focus.png")
    except BaseException:
        page.screenshot(path=screenshots / "a11y-focus-failed.png", full_page=True)
        raise
    finally:
        page.close()


def test_a_download_pressed_from_the_keyboard_keeps_the_focus(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    # Streamlit disables a download button while the server builds its file, with no
    # run: the focus waits for it, rather than going on to the next download, where a
    # second Enter would fetch another file.
    page = browser.new_page(viewport={"width": 1440, "height": 1400})
    page.set_default_timeout(T)
    try:
        with_a_request(page, app_url)
        idle(page)
        for name in ("Snapshot", "Blocks (CSV)"):
            button = page.get_by_role("button", name=name, exact=True)
            keyboard_focus(page, button)
            with page.expect_download(timeout=T):
                page.keyboard.press("Enter")
            page.wait_for_timeout(1500)
            expect(button).to_be_focused(timeout=T)
            assert page.evaluate(FOCUSED)["text"].endswith(name)
    except BaseException:
        page.screenshot(path=screenshots / "a11y-download-failed.png", full_page=True)
        raise
    finally:
        page.close()


# Two download buttons as Streamlit draws them, in a page whose script state a test
# sets, with the keeper installed: its rules alone, with no server's timing in them.
DOWNLOADS = """<div data-testid="stApp" data-test-script-state="notRunning">
<div class="st-key-snap"><div data-testid="stDownloadButton"><button id="snap">Snapshot</button>
</div></div><div class="st-key-csv"><div data-testid="stDownloadButton">
<button id="csv">Blocks (CSV)</button></div></div></div>"""


def test_a_download_keeps_the_focus_through_a_run_and_through_a_second_redraw(
        browser: Browser) -> None:
    """While its file is built a download button is disabled, and the focus falls to the
    page's body. It comes back to the button, not the next one: when a run came and
    went meanwhile (a run's end once gave up the wait), when the button drops it
    again as it is redrawn (the focus given back once counted as a new one, and a
    second loss was left alone), and when the focus falls only once the button is
    enabled again."""
    page = browser.new_page()
    try:
        page.set_content(DOWNLOADS + f"<script>{a11y.script()}</script>")
        snap = page.locator("#snap")
        keyboard_focus(page, snap)
        page.keyboard.press("Enter")
        for run in (True, False):
            page.evaluate("() => { document.querySelector('#snap').disabled = true; }")
            page.wait_for_function("() => document.activeElement === document.body",
                                   timeout=T)
            if run:
                for state in ("running", "notRunning"):
                    page.evaluate("(s) => document.querySelector('[data-testid=stApp]')"
                                  ".setAttribute('data-test-script-state', s)", state)
                    page.wait_for_timeout(200)
            page.evaluate("() => { document.querySelector('#snap').disabled = false; }")
            expect(snap).to_be_focused(timeout=T)
        # A file built in a moment: the button is back before the focus falls from it
        # (Chromium drops it as it next renders, by then enabled again). Left alone,
        # the focus stayed on the page's body.
        page.evaluate("""() => { const snap = document.querySelector('#snap');
                                  snap.disabled = true; snap.disabled = false;
                                  snap.blur(); }""")
        expect(snap).to_be_focused(timeout=T)
    finally:
        page.close()


def test_a_control_that_opens_another_page_leaves_the_focus_on_its_heading(
        browser: Browser, app_url: str) -> None:
    # Continue in the Playground goes to another page: the focus goes to its title, from
    # where Tab walks the page from the top, not to a control halfway down it (the block
    # grid's toolbar, as the rule for a control that went away once gave).
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.set_default_timeout(T)
    try:
        page.goto(f"{app_url}/tour?scenario=03-growth&step=0")
        go = page.get_by_role("button", name="Continue in the Playground")
        expect(go).to_be_visible(timeout=T)
        idle(page)
        keyboard_focus(page, go)
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Playground", level=1)).to_be_visible(
            timeout=T)
        idle(page)
        page.wait_for_function("() => document.activeElement.tagName === 'H1'", timeout=T)
        assert page.evaluate(FOCUSED)["text"].startswith("Playground")
        page.keyboard.press("Tab")
        # Tab goes on from the top of the new page's main area.
        assert page.evaluate("() => document.querySelector(\"[data-testid='stMain']\")"
                             ".contains(document.activeElement)")
        # Next on a scenario's last step disables itself and Play: the focus goes on to
        # the row's next button, Reset, not to the speed slider between them. Play to the
        # end likewise, though it was drawn as Pause while it played (the focus went to
        # the slider, where an arrow key changes the speed).
        for name in ("Next", "Play"):
            page.goto(f"{app_url}/tour?scenario=03-growth&step=3")
            pressed = page.get_by_role("button", name=name, exact=True)
            expect(pressed).to_be_enabled(timeout=T)
            idle(page)
            keyboard_focus(page, pressed)
            page.keyboard.press("Enter")
            expect(pressed).to_be_disabled(timeout=T)
            idle(page)
            focused_on(page, "tour_reset")
    finally:
        page.close()


def test_results_drawn_in_place_are_read_out(
        browser: Browser, app_url: str, screenshots: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1400})
    page.set_default_timeout(T)
    live = page.locator("#pagedlab-live")

    def hush() -> None:
        page.evaluate("document.getElementById('pagedlab-live').textContent = ''")

    try:
        page.goto(f"{app_url}/lab")
        step = page.get_by_role("button", name="Step", exact=True)
        expect(step).to_be_visible(timeout=T)
        idle(page)
        # A refusal, and the same refusal again: read both times, by the read-out alone
        # (Streamlit's message there has lost its alert role, which would say it again).
        for _ in range(2):
            hush()
            step.click()
            expect(live).to_contain_text("Refused: Step has nothing to run", timeout=T)
            idle(page)
            shown = page.locator("[class*='st-key-status_line'] [data-testid='stAlertContainer']")
            expect(shown).to_contain_text("Refused: Step has nothing to run")
            assert shown.evaluate_all("els => els.map(e => e.getAttribute('role'))") == [None]
        page.get_by_role("button", name="Add request").click()
        expect(live).to_contain_text("Step 1: add A", timeout=T)
        idle(page)
        # The inspected block (the outcome line is unchanged, so this is what is read).
        block = page.get_by_role("spinbutton", name="Inspect a block")
        block.fill("1")
        block.press("Enter")
        expect(live).to_contain_text("Block 1: used, ref count 1, 4/4 slots filled",
                                     timeout=T)
        # A block outside the pool: the refusal is read.
        block.fill("999")
        block.press("Enter")
        expect(live).to_contain_text("There is no block 999", timeout=T)
        idle(page)

        # Another page's first drawing is that page, not news: nothing is read on the
        # way to Scenarios, nor on the way back to the outcome already read.
        for name in ("Scenarios", "Playground"):
            hush()
            page.get_by_role("link", name=name).click()
            expect(page.locator("[data-testid='stMain'] h1")).to_have_text(name, timeout=T)
            idle(page)
            page.wait_for_timeout(1000)
            expect(live).to_have_text("")

        # Scenarios: Next's narration, pressed the moment the page's first run ends
        # (before the quiet moment the read waits for); Play to the end keeps the focus
        # on the page.
        page.get_by_role("link", name="Scenarios").click()
        nxt = page.get_by_role("button", name="Next", exact=True)
        expect(nxt).to_be_enabled(timeout=T)
        page.wait_for_selector(IDLE, timeout=T)
        keyboard_focus(page, nxt)
        page.keyboard.press("Enter")
        expect(live).to_contain_text("Step 1 of 5:", timeout=T)
        idle(page)
        # Every step a play shows is read, though the play's runs follow each other with
        # hardly a pause: each run's end reads what it drew.
        page.evaluate(HEARD)
        keyboard_focus(page, page.get_by_role("button", name="Play", exact=True))
        page.keyboard.press("Enter")
        expect(live).to_contain_text("Played to the end", timeout=T)
        expect(nxt).to_be_disabled(timeout=T)
        idle(page)
        heard = page.evaluate("window.__heard")
        # The last step's too, drawn with "Played to the end", and only the play's own
        # words: the address translator redrawn beside a step is not its news.
        for n in (2, 3, 4, 5):
            assert any(said.startswith(f"Step {n} of 5:") for said in heard), heard
        assert not [said for said in heard if "block size" in said], heard
        page.wait_for_function("() => document.activeElement !== document.body", timeout=T)
        now = page.evaluate(FOCUSED)
        assert not now["disabled"] and not now["heading"], now
        page.screenshot(path=screenshots / "a11y-read-out.png")
    except BaseException:
        page.screenshot(path=screenshots / "a11y-read-out-failed.png", full_page=True)
        raise
    finally:
        page.close()


# Two watched containers drawn at once, each with a message as Streamlit draws one (an
# operation's line and a failed save's note, say): the script's part 4 takes their roles.
TWO_MESSAGES = """() => {
  const main = document.querySelector("[data-testid='stMain']");
  for (const [key, role, text] of [["st-key-status_line--9999", "alert", "First message."],
                                   ["st-key-store_note", "status", "Second message."]]) {
    const box = document.createElement("div");
    box.className = key;
    box.innerHTML = `<div data-testid="stAlertContainer" role="${role}">${text}</div>`;
    main.appendChild(box);
  }
}"""


def test_messages_in_watched_containers_are_said_by_the_read_out_alone_and_all_of_them(
        browser: Browser, app_url: str) -> None:
    # Each would be announced as it is drawn (its role) and again by the read-out; without
    # the role, the read-out says each one, the second too, though only the first
    # container's text is the action's result.
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(T)
    try:
        page.goto(f"{app_url}/lab")
        expect(page.get_by_role("button", name="Step", exact=True)).to_be_visible(timeout=T)
        idle(page)
        page.evaluate(HEARD)
        page.evaluate(TWO_MESSAGES)
        page.wait_for_function("() => window.__heard.length > 0", timeout=T)
        page.wait_for_timeout(500)
        assert page.evaluate("window.__heard") == ["First message. Second message."]
        roles = page.evaluate("""() => [...document.querySelectorAll(
            "[class*='st-key-status_line--9999'] [data-testid='stAlertContainer'], "
            + "[class*='st-key-store_note'] [data-testid='stAlertContainer']")]
            .map((e) => e.getAttribute('role'))""")
        assert roles == [None, None]
    finally:
        page.close()


def test_the_compare_page_reads_a_sections_new_result(browser: Browser, app_url: str,
                                                      screenshots: Path) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(T)
    live = page.locator("#pagedlab-live")
    try:
        page.goto(f"{app_url}/fragmentation")
        length = page.get_by_role("spinbutton", name="D's final length")
        expect(length).to_be_visible(timeout=T)
        idle(page)
        # A field's change redraws the section's result below it: read out.
        length.fill("9")
        length.press("Enter")
        expect(live).to_contain_text("Under contiguous, exact final length", timeout=T)
        expect(live).to_contain_text("will reach 9", timeout=T)
        idle(page)
        # A number out of range stops the section: the refusal is read.
        length.fill("99")
        length.press("Enter")
        expect(live).to_contain_text("D's final length must be 2 to 16; got 99", timeout=T)
        idle(page)
        # Another tab draws only itself, as another page would: nothing is read ...
        page.evaluate("document.getElementById('pagedlab-live').textContent = ''")
        page.get_by_role("tab", name="Memory calculator").click()
        gpu = page.get_by_role("spinbutton", name="GPU memory (GiB)")
        expect(gpu).to_be_visible(timeout=T)
        idle(page)
        page.wait_for_timeout(1000)
        expect(live).to_have_text("")
        # ... until one of its fields changes what it shows.
        gpu.fill("80")
        gpu.press("Enter")
        expect(live).to_contain_text("Left for KV", timeout=T)
        idle(page)
        # A change made the moment a tab's first run ends, before the quiet moment the
        # read waits for, is read, and it alone: the tab's first drawing is not.
        page.evaluate(HEARD)
        page.get_by_role("tab", name="The seed's example").click()
        expect(length).to_be_visible(timeout=T)
        page.wait_for_selector(IDLE, timeout=T)
        length.fill("10")
        length.press("Enter")
        expect(live).to_contain_text("will reach 10", timeout=T)
        heard = page.evaluate("window.__heard")
        assert heard and all("will reach 10" in said for said in heard), heard
    except BaseException:
        page.screenshot(path=screenshots / "a11y-compare-failed.png", full_page=True)
        raise
    finally:
        page.close()


def test_the_sidebar_and_a_charts_full_screen_work_from_the_keyboard(
        browser: Browser, app_url: str) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(T)
    sidebar = page.locator("[data-testid='stSidebar']")
    collapse = page.get_by_role("button", name="Collapse sidebar")
    expand = page.get_by_role("button", name="Expand sidebar")
    try:
        page.goto(f"{app_url}/fragmentation")
        expect(page.locator("[data-testid='stMain'] h1")).to_be_visible(timeout=T)
        idle(page)
        # The collapse button drawn, and the page's style (ui/a11y.py's holder) in: that is
        # an html element, which Streamlit draws a moment after the run that sent it. Until
        # then the button is hidden as Streamlit hides it, and Tab passes it by.
        page.wait_for_function("""() => {
          const b = document.querySelector("[data-testid='stSidebarCollapseButton']");
          return b !== null && getComputedStyle(b).visibility === 'visible';
        }""")
        # Tab reaches the collapse button (Streamlit hides it until the pointer is over
        # the sidebar), which shows while it has the focus.
        page.keyboard.press("Tab")   # the "Skip to main content" link
        page.keyboard.press("Tab")
        try:
            expect(collapse).to_be_focused()
        except AssertionError as exc:
            raise AssertionError(f"the focus is on {page.evaluate(FOCUSED)}") from exc
        expect(collapse).to_have_css("opacity", "1")
        # Collapsed: the focus goes to the expand button, and Tab leaves the sidebar's
        # controls, now off the page, out.
        page.keyboard.press("Enter")
        expect(sidebar).to_have_attribute("data-collapsed", "true")
        expect(expand).to_be_focused()
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.closest(\"[data-testid='stSidebar']\")"
                             " === null")
        page.keyboard.press("Shift+Tab")
        expect(expand).to_be_focused()
        # Expanded again: the focus goes back to the collapse button.
        page.keyboard.press("Enter")
        expect(sidebar).to_have_attribute("data-collapsed", "false")
        expect(collapse).to_be_focused()

        # A chart's full screen, opened and closed from the keyboard (its close button,
        # or Escape), keeps the focus on that chart's toolbar, not the page's body.
        chart = page.locator("[data-testid='stFullScreenFrame']").filter(
            has=page.locator("[aria-label^='16 slots']")).first
        full = chart.get_by_role("button", name="Fullscreen", exact=True)
        close = chart.get_by_role("button", name="Close fullscreen")
        keyboard_focus(page, full)
        page.keyboard.press("Enter")
        expect(close).to_be_focused()
        page.keyboard.press("Enter")
        expect(full).to_be_focused()
        page.keyboard.press("Enter")
        expect(close).to_be_focused()
        page.keyboard.press("Escape")
        expect(full).to_be_focused()
    finally:
        page.close()


@pytest.mark.parametrize("path", ["lab", "tour", "fragmentation"])
def test_headings_go_down_one_level_at_a_time_and_name_their_help(browser: Browser, app_url: str,
                                              path: str) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(T)
    try:
        page.goto(f"{app_url}/{path}")
        expect(page.locator("[data-testid='stMain'] h1")).to_be_visible(timeout=T)
        idle(page)
        main = page.evaluate(HEADINGS, "stMain")
        assert main[0][0] == 1, main
        # The script's hidden holder, drawn before the page, leaves no gap above its title
        # (once the style it holds is in: Streamlit draws an html element a moment after
        # its place).
        page.wait_for_function(f"() => ({HOLDER_DISPLAY})().every((d) => d === 'none')",
                               timeout=T)
        for (was, _), (now, text) in itertools.pairwise(main):
            assert now <= was + 1, f"{text!r} is h{now} after h{was}: {main}"
        # The sidebar's sections come before the page's h1: h2, as the page's are.
        side = page.evaluate(HEADINGS, "stSidebar")
        assert side and {level for level, _ in side} == {2}, side
        # A section's help button is named for its section, as a field's is.
        expect(page.get_by_role("button", name="Help", exact=True)).to_have_count(0,
                                                                                 timeout=T)
        if path == "lab":
            expect(page.get_by_role("button", name="Help for Event log")).to_have_count(1)
        # No heading carries a "Link to heading" anchor: a Tab stop each, all of one name.
        assert page.evaluate("() => document.querySelectorAll("
                             "':is(h1, h2, h3) a[href^=\"#\"]').length") == 0
    finally:
        page.close()
