// PagedLab's keyboard and screen-reader help, installed once per browser tab by
// ui/a11y.py (st.html runs it in the page's own document). Three jobs:
//
// 1. Keep the keyboard focus. A button that its own click disables (Finish on the
//    last running request, Next on the last step, Play at the end) or removes (Back
//    to live) drops the focus to the page's body: a screen reader is then nowhere
//    and Tab starts over. The focus moves instead to the same control if the page
//    redrew it, else to the next control that can take it, else the previous one.
// 2. Read out results. Streamlit redraws a result in place, which a screen reader
//    does not announce. The containers whose keys end in one of READ_OUT are
//    watched; when their text changes after a run, the new text of the first of
//    them to change is put in a polite live region.
// 3. Name the section headings' help buttons after their sections.
(() => {
  if (window.__pagedlabA11y) return;
  window.__pagedlabA11y = true;

  const READ_OUT = __READ_OUT__;
  const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";
  const KEY = "st-key-";

  const keyOf = (el) => {
    const box = el.closest(`[class*="${KEY}"]`);
    return box ? [...box.classList].find((c) => c.startsWith(KEY)) ?? null : null;
  };
  // Can take the focus now: in the page, enabled, drawn (Streamlit keeps hidden copies
  // of its buttons for measuring), not hidden from assistive technology.
  const usable = (el) => el.isConnected && !el.disabled && el.tabIndex >= 0
    && el.getAttribute("aria-disabled") !== "true" && el.getClientRects().length > 0
    && !el.closest("[inert], [aria-hidden='true']");
  const controls = (root) => [...root.querySelectorAll(FOCUSABLE)].filter(usable);
  const lost = () => {
    const now = document.activeElement;
    return now === null || now === document.body || now === document.documentElement;
  };

  // ---- 1. the focus ------------------------------------------------------------------
  let last = null;   // the control that last had the focus
  let trail = [];    // its ancestors then: where it was, should it be removed
  let key = null;    // its widget's key: how to find it again if redrawn

  document.addEventListener("focusin", (e) => {
    const el = e.target;
    if (!(el instanceof Element) || el === document.body) return;
    last = el;
    key = keyOf(el);
    trail = [];
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) trail.push(a);
  });
  // A click on something that takes no focus puts it on the body on purpose.
  document.addEventListener("pointerdown", (e) => {
    if (!(e.target instanceof Element) || !e.target.closest(FOCUSABLE)) last = null;
  }, true);

  const following = (el) => controls(document).find(
    (c) => el.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING
      && !el.contains(c));
  const preceding = (el) => controls(document).reverse().find(
    (c) => el.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_PRECEDING);

  const refocus = () => {
    if (last === null || !lost() || usable(last)) return;
    let target = null;
    if (key !== null) {
      const box = document.querySelector(`.${CSS.escape(key)}`);
      if (box) target = controls(box)[0] ?? null;
    }
    // Where it was: itself if still in the page, else its nearest ancestor that is.
    const place = last.isConnected ? last : trail.find((a) => a.isConnected);
    if (target === null && place) {
      if (place !== last) target = controls(place)[0] ?? null;
      target = target ?? following(place) ?? preceding(place) ?? null;
    }
    if (target !== null) target.focus();
  };

  // ---- 2. the read-out ---------------------------------------------------------------
  const live = document.createElement("div");
  live.id = "pagedlab-live";
  live.setAttribute("role", "status");
  live.setAttribute("aria-live", "polite");
  // Visually hidden, still read (the usual clip pattern).
  live.style.cssText = "position:absolute;width:1px;height:1px;margin:-1px;padding:0;"
    + "overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap;border:0;";
  document.body.appendChild(live);

  const heard = new Map();   // watched key -> its text when last read
  let settled = false;       // the tab's first run has been drawn

  const watched = () => {
    const found = new Map();
    for (const box of document.querySelectorAll(`[class*="${KEY}"]`)) {
      for (const c of box.classList) {
        if (c.startsWith(KEY) && READ_OUT.some((s) => c.endsWith(s))) {
          found.set(c, box.innerText.trim());
        }
      }
    }
    return found;
  };

  const readOut = () => {
    const app = document.querySelector("[data-testid='stApp']");
    if (app && app.getAttribute("data-test-script-state") !== "notRunning") return;
    const now = watched();
    // One action can change several (an Add also redraws the translator): the first
    // changed in READ_OUT's order is the action's own result. What the tab's first
    // run draws is read by the screen reader with the rest of the page.
    let said = null;
    for (const ending of READ_OUT) {
      for (const [k, text] of now) {
        if (said === null && settled && k.endsWith(ending) && text !== ""
            && heard.get(k) !== text) said = text;
      }
    }
    settled = true;
    heard.clear();
    for (const [k, text] of now) heard.set(k, text);
    if (said !== null) {
      // Emptied first, so that the same words said twice are announced twice.
      live.textContent = "";
      window.setTimeout(() => { live.textContent = said; }, 50);
    }
  };

  // ---- 3. names ---------------------------------------------------------------------
  // A section heading's help icon is a button named just "Help" (a list of a page's
  // buttons reads "Help, Help, Help"): named as Streamlit names a field's, "Help for
  // Event log".
  const nameHelp = () => {
    for (const b of document.querySelectorAll("h1 button[aria-label='Help'], "
        + "h2 button[aria-label='Help'], h3 button[aria-label='Help']")) {
      const title = b.closest("h1, h2, h3").querySelector("[data-heading-text]");
      if (title) b.setAttribute("aria-label", `Help for ${title.innerText.trim()}`);
    }
  };

  // ---- when the page changes ---------------------------------------------------------
  // Read a moment after the page changes, at most every 250 ms while it keeps changing
  // (charts draw for a second or more after a run, longer than a person waits to act).
  let readSoon = null;
  const readLater = (ms) => {
    if (readSoon === null) {
      readSoon = window.setTimeout(() => { readSoon = null; nameHelp(); readOut(); }, ms);
    }
  };
  new MutationObserver(() => {
    // Chromium moves the focus off a disabled control when it next renders.
    window.requestAnimationFrame(() => window.setTimeout(refocus, 0));
    readLater(250);
  }).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ["disabled", "aria-disabled", "data-test-script-state"],
  });
  // The run that drew this script may have ended before it ran: what it drew is the
  // page as first read.
  readLater(0);
  document.addEventListener("focusout", (e) => {
    if (e.relatedTarget === null) window.setTimeout(refocus, 50);
  });
})();
