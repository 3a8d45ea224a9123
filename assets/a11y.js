// PagedLab's keyboard and screen-reader help, installed once per browser tab by
// ui/a11y.py (st.html runs it in the page's own document). Four jobs:
//
// 1. Keep the keyboard focus. A button that its own press disables (Finish on the
//    last running request, Next on the last step, Play at the end) or removes (Back
//    to live) drops the focus to the page's body: a screen reader is then nowhere
//    and Tab starts over. Once the run has drawn the page, the focus moves instead
//    to the same control if the page drew it again, else to the next control after
//    where it was, else the one before. Focus a mouse gave is left to the mouse.
//    A button that goes away as it works with no run (the sidebar's collapse, a
//    chart's full screen) hands the focus to the one that takes over; one disabled for
//    a moment with no run (a download while its file is built) keeps it.
// 2. Read out results. Streamlit redraws a result in place, which a screen reader
//    does not announce. The containers whose keys end in one of READ_OUT are
//    watched (a key may end in "--N", a number that tells one message from the
//    same words said again); when their text changes, the new text of the first of
//    them to change is put in a polite live region: once a run has drawn the page,
//    and while a scenario plays, as it is drawn. What a page's (or a Contiguous vs
//    paged tab's) first run draws is not news: the screen reader reads the page.
// 3. Name the section headings' help buttons after their sections, and a saved
//    session's Open and Delete after its session.
// 4. Take the alert and status roles off Streamlit's messages in the watched
//    containers, which the read-out already says: said once, not twice.
(() => {
  if (window.__pagedlabA11y) return;
  window.__pagedlabA11y = true;

  const READ_OUT = __READ_OUT__;
  const TAB_KEY = __TAB_KEY__;
  const PLAYING = __PLAYING__;
  const PLAY_SAYS = __PLAY_SAYS__;
  const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";
  const KEY = "st-key-";
  const running = () => document.querySelector("[data-testid='stApp']")
    ?.getAttribute("data-test-script-state") !== "notRunning";

  const keyOf = (el) => {
    const box = el.closest(`[class*="${KEY}"]`);
    return box ? [...box.classList].find((c) => c.startsWith(KEY)) ?? null : null;
  };
  // Can take the focus now: in the page, enabled, drawn (Streamlit keeps hidden copies
  // of its buttons for measuring), not hidden from assistive technology, not in a
  // collapsed sidebar (drawn off the screen), not a heading's link (shown on hover).
  const usable = (el) => el.isConnected && !el.disabled && el.tabIndex >= 0
    && el.getAttribute("aria-disabled") !== "true" && el.getClientRects().length > 0
    && !el.closest("[inert], [aria-hidden='true'], [data-testid='stHeaderActionElements'], "
      + "[data-testid='stSidebar'][data-collapsed='true']");
  const controls = (root) => [...root.querySelectorAll(FOCUSABLE)].filter(usable);
  const lost = () => {
    const now = document.activeElement;
    return now === null || now === document.body || now === document.documentElement;
  };

  // ---- 1. the focus ------------------------------------------------------------------
  let last = null;     // the control the keyboard last focused
  let like = null;     // what it is, to know it again redrawn: [tag, type]
  let key = null;      // its widget's key: where to look for it redrawn
  let around = [];     // the controls after and before it then, and their keys
  let trail = [];      // its ancestors then, each with the index of the child on the
                       // way down: where it was, should all of those go
  let runs = 0;        // the changes of run state seen in this tab
  let runsThen = 0;    // ... when it was focused
  let pressed = false; // Enter or Space on it since: a run of its own may have come and
                       // gone unseen (its start and end reaching the page together)
  let listed = false;  // a list it opened (a select's options) has had the focus since
  let pathThen = null; // the page it was on
  let keyboard = false;  // the last input was a key, not a pointer
  let handed = null;   // [the control the keeper last gave the focus to, the address then],
                       // until the person acts again

  const following = (el) => controls(document).find(
    (c) => el.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING
      && !el.contains(c));
  const preceding = (el) => controls(document).reverse().find(
    (c) => el.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_PRECEDING);
  const kind = (el) => [el.tagName, el.getAttribute("type") ?? el.getAttribute("role")];

  document.addEventListener("keydown", () => {
    keyboard = true;
    handed = null;
  }, true);
  // A mouse user's focus is where the mouse put it; a click on something that takes
  // no focus puts it on the body on purpose.
  document.addEventListener("pointerdown", () => {
    keyboard = false;
    last = null;
    handed = null;
  }, true);
  // A select's list of options, drawn apart from the page (at its end): the focus an
  // option takes is the select's, which the keeper goes back to once the list has gone.
  // Taken for a control of its own, the option's neighbours were the page's last
  // controls, and picking a scenario sent the focus to the bottom of the page.
  const inList = (el) => el.closest("[role='listbox'], [role='option']") !== null;
  document.addEventListener("focusin", (e) => {
    const el = e.target;
    if (el instanceof Element && last !== null && inList(el)) {
      listed = true;
      return;
    }
    // The control that had it, given it back (by the keeper, or the browser) with no
    // other in between: still the same press, so a later loss is handled as this one
    // was. (Taken for a new focus, a download button that dropped the focus again
    // once its file came, as Streamlit redraws it, left the focus on the body.)
    if (el === last) return;
    if (!(el instanceof Element) || el === document.body
        || !(keyboard || el.matches(":focus-visible"))) {
      last = null;
      return;
    }
    last = el;
    like = kind(el);
    key = keyOf(el);
    around = [following(el), preceding(el)].map((c) => (c ? [c, keyOf(c)] : null));
    trail = [];
    for (let c = el, a = el.parentElement; a && a !== document.body; c = a, a = a.parentElement) {
      trail.push([a, [...a.children].indexOf(c)]);
    }
    runsThen = runs;
    pathThen = location.pathname;
    pressed = false;
    listed = false;
  });

  // The control a widget's box `k` holds of the same kind as `want` ([tag, type]); none
  // if it holds none or several (a box around a section, not a widget's own).
  const byKey = (k, want) => {
    const box = k === null ? null : document.querySelector(`.${CSS.escape(k)}`);
    if (!box) return null;
    const same = controls(box).filter((c) => kind(c).join() === want.join()
      && !(c.getAttribute("aria-label") ?? "").startsWith("Help for "));
    return same.length === 1 ? same[0] : null;
  };

  // Where the focus goes when `last` cannot keep it: the next control after it (the
  // one before, at the end), from the page as it is if it is still there, else the
  // control that followed it then (itself, or what the page drew for its key: a redraw
  // can replace it), else what is now where it was in its nearest ancestor still in
  // the page (what followed it may have gone with it), else the control before it then.
  const then = ([c, k]) => (usable(c) ? c : k === null ? null : byKey(k, kind(c)));
  // A button whose press disabled it hands the focus to a button of its own row where
  // one follows it, else the next control: Next on a scenario's last step (Play is
  // disabled with it) goes to Reset, not to the speed slider, where Enter does nothing
  // and an arrow key changes the speed.
  const rowButton = (el) => {
    const row = el.tagName === "BUTTON" ? el.closest("[data-testid='stHorizontalBlock']") : null;
    if (row === null) return null;
    return controls(row).find((c) => c.tagName === "BUTTON"
      && el.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING) ?? null;
  };
  const after = () => {
    if (last.isConnected) return rowButton(last) ?? following(last) ?? preceding(last) ?? null;
    // Drawn anew under its key and disabled (Play, drawn as Pause while it played): the
    // next button of the row it is in now, as if it had stayed.
    const again = key === null ? null
      : document.querySelector(`.${CSS.escape(key)}`)?.querySelector("button") ?? null;
    const inRow = again === null ? null : rowButton(again);
    if (inRow !== null) return inRow;
    const [next, before] = around;
    return (next && then(next)) ?? where() ?? (before && then(before)) ?? null;
  };
  const where = () => {
    const at = trail.findIndex(([a]) => a.isConnected);
    if (at < 0) return null;
    const [place, from] = trail[at];
    const children = [...place.children];
    for (const child of children.slice(from)) {
      const found = usable(child) ? child : controls(child)[0];
      if (found) return found;
    }
    for (const child of children.slice(0, from).reverse()) {
      const found = usable(child) ? child : controls(child).at(-1);
      if (found) return found;
    }
    return following(place) ?? preceding(place) ?? null;
  };

  // A download button its own press disabled (no download starts a run) while the
  // server builds its file: it comes back in a moment, and keeps the focus then, even
  // if a run came meanwhile. Moved on to the next control, a second Enter meant for this
  // one fetched another file. Given up (to the next control) if it is still disabled
  // after WAIT_MS. Only a download button: any other control disabled by its press was
  // disabled by a run, even one whose start and end reached the page together (Next on
  // a scenario's last step), and hands the focus on at once. Long enough for a file built on a busy server (several
  // seconds under load): given up sooner, the focus went on while the file was coming.
  const WAIT_MS = 30000;
  let waiting = null;   // the control waited for now
  let waited = null;    // the one given up on: the focus moves on from it as usual
  const waitFor = (el) => {
    waiting = el;
    const until = Date.now() + WAIT_MS;
    const tick = () => {
      if (last !== el || !lost()) {        // the person has moved on
        waiting = null;
      } else if (usable(el)) {
        waiting = null;
        el.focus();
      } else if (Date.now() > until || !el.isConnected) {
        waiting = null;
        waited = el;
        refocus();
      } else {
        window.setTimeout(tick, 100);
      }
    };
    window.setTimeout(tick, 100);
  };

  // The new page's heading takes the focus, where Tab goes on from its top, once its run
  // has drawn it (until then it may be the old page's, about to go).
  const toTitle = () => {
    const title = running() ? null : document.querySelector("[data-testid='stMain'] h1");
    if (title === null) return;
    title.tabIndex = -1;
    title.focus();
    last = null;
    handed = null;
  };

  const refocus = () => {
    // The control this handed the focus to as a pressed one went, before the address
    // changed: the press was taking the person to another page all along (on a busy
    // server the old page can be cleared, and the run seen to end, before the new
    // address is written). That page's heading takes the focus, as below.
    if (handed !== null && location.pathname !== handed[1]
        && (document.activeElement === handed[0] || lost())) {
      toTitle();
      return;
    }
    // Only a run, or the control's own press, moves it: what the browser or a widget did
    // by itself (a chart's full screen, a list box opening) is theirs.
    if (last === null || !lost() || (runs === runsThen && !pressed)) return;
    if (pressed && last.isConnected && last !== waited
        && last.closest("[data-testid='stDownloadButton']") !== null) {
      // Its file built sooner than the focus fell (the button disabled and enabled
      // again before Chromium next rendered, or before this looked), it is back
      // already: the focus goes straight to it, where left alone it stayed on the
      // page's body.
      if (usable(last)) last.focus();
      else if (waiting !== last) waitFor(last);
      return;
    }
    if (usable(last)) {
      // Still there: the focus fell from a list it opened, which has closed.
      if (listed) {
        listed = false;
        last.focus();
      }
      return;
    }
    if (location.pathname !== pathThen) {
      // The control took the person to another page (Continue in the Playground): its
      // neighbours there are nothing they chose.
      toTitle();
      return;
    }
    let target = byKey(key, like);
    // Anything else waits for the run to draw the page: until then a control that
    // stays may be missing for a moment.
    if (target === null && !running()) target = after();
    if (target !== null) {
      target.focus();
      handed = [target, location.pathname];
    }
  };

  // Buttons that go away as they work, another taking over, with no run: the sidebar's
  // collapse and expand buttons, a chart's full screen and its close. The focus follows
  // to the other one, not to the page's body, from where Tab would start over.
  // [the pressed button, the one that takes over, the box to find it in]
  const COUNTERPARTS = [
    ["[data-testid='stSidebarCollapseButton'] button", "[data-testid='stExpandSidebarButton']",
      null],
    ["[data-testid='stExpandSidebarButton']", "[data-testid='stSidebarCollapseButton'] button",
      null],
    // (A chart with a text alternative names them "Fullscreen: ...".)
    ["button[aria-label^='Fullscreen']", "button[aria-label^='Close fullscreen']",
      "[data-testid='stFullScreenFrame']"],
    ["button[aria-label^='Close fullscreen']", "button[aria-label^='Fullscreen']",
      "[data-testid='stFullScreenFrame']"],
  ];
  const handOver = (pressed) => {
    for (const [from, to, within] of COUNTERPARTS) {
      if (!pressed.closest(from)) continue;
      const box = within === null ? document : pressed.closest(within);
      let tries = 20;   // until the other button is drawn: a frame or two
      const move = () => {
        const other = box?.querySelector(to);
        if (other && usable(other)) other.focus();
        else if (--tries > 0) window.setTimeout(move, 50);
      };
      window.setTimeout(move, 50);
      return;
    }
  };
  document.addEventListener("click", (e) => {
    if (keyboard && e.target instanceof Element) handOver(e.target);
  }, true);
  // Pressed from the keyboard: what it does is the page's (a run's), except for the
  // buttons above, whose counterpart takes the focus.
  document.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && last !== null && e.target instanceof Element
        && (last.contains(e.target) || inList(e.target))
        && !COUNTERPARTS.some(([from]) => e.target.closest(from))) pressed = true;
  }, true);
  // An arrow key on a tab moves the focus and the choice together; the run that starts
  // draws the tab bar again, which at times drops the focus to the page's body with no
  // event and no change the observer sees. For a while after such a key (until the
  // next key or pointer), a focus lost goes back to the tab the bar shows chosen.
  const TAB_WATCH_MS = 10000;
  let tabWatch = null;
  const stopTabWatch = () => {
    if (tabWatch !== null) window.clearInterval(tabWatch);
    tabWatch = null;
  };
  document.addEventListener("pointerdown", stopTabWatch, true);
  document.addEventListener("keydown", (e) => {
    stopTabWatch();
    const tab = e.target instanceof Element ? e.target.closest("[role='tab']") : null;
    if (tab === null || !e.key.startsWith("Arrow")) return;
    const box = keyOf(tab);
    const until = Date.now() + TAB_WATCH_MS;
    tabWatch = window.setInterval(() => {
      if (Date.now() > until) stopTabWatch();
      else if (lost()) {
        const bar = box === null ? tab.closest("[role='tablist']")
          : document.querySelector(`.${CSS.escape(box)} [role='tablist']`);
        bar?.querySelector("[role='tab'][aria-selected='true']")?.focus();
      }
    }, 100);
  }, true);
  // Escape closes a chart's full screen as its close button does.
  document.addEventListener("keydown", (e) => {
    const close = e.key === "Escape"
      && document.querySelector("button[aria-label^='Close fullscreen']");
    if (close) handOver(close);
  }, true);

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
  let settled = false;       // this page's first run has been drawn and read
  let ended = false;         // ... has ended
  // The page, and on the Contiguous vs paged page its open tab: each tab draws only
  // itself, as a page of its own. The tab is the one the tab bar (keyed TAB_KEY) shows
  // selected, which changes on the click itself, before the run it starts; the address's
  // ?tab= is written at some point of that run or after it, and a read-out keyed to it
  // took the next field's result for the tab's first drawing.
  // A tab bar not drawn (between two drawings of it mid-run) leaves the page as it was.
  let page = null;
  const here = () => {
    const tab = document.querySelector(
      `.${KEY}${CSS.escape(TAB_KEY)} [role='tab'][aria-selected='true']`);
    const path = `${location.pathname}?`;
    if (tab) return `${path}${tab.innerText.trim()}`;
    return page?.startsWith(path) ? page : path;
  };
  page = here();
  let ran = true;            // a run of this page has started (the one that drew this)

  // Whether a container's class names one of READ_OUT (its key, "--N" left aside).
  const readClass = (c) => c.startsWith(KEY)
    && READ_OUT.some((s) => c.slice(KEY.length).replace(/--\d+$/, "").endsWith(s));

  // Mid-run (a play), a box Streamlit has not drawn again yet is stale: its text may be
  // half the old step's.
  const watched = (midRun = false) => {
    const found = new Map();
    for (const box of document.querySelectorAll(`[class*="${KEY}"]`)) {
      const stale = "[data-stale='true']";
      if (midRun && (box.closest(stale) || box.querySelector(stale))) continue;
      for (const c of box.classList) {
        if (readClass(c)) found.set(c, box.innerText.trim());
      }
    }
    return found;
  };

  // Another page or tab: what its first run draws is that page, not news. Looked for
  // while no run is under way, and as one starts or ends: mid-run, a page is the one its
  // run started on (a tab bar being drawn again may show no tab selected for a moment).
  // `when` says whether that run is done: at a run's "end"; "idle" for a new address
  // seen between runs (Streamlit writes a page's address as its run starts, or after
  // it ends); not for a tab, which shows selected on the click, before its run, nor
  // for the browser's Back or Forward ("popstate"), whose address comes first.
  const checkPage = (when) => {
    const now = here();
    if (now === page) return;
    const newPath = !page.startsWith(`${location.pathname}?`);
    page = now;
    settled = false;
    const drawn = when === "end" || (when === "idle" && newPath);
    ran = drawn || running();
    ended = drawn;
  };
  window.addEventListener("popstate", () => checkPage("popstate"));

  // What is drawn now is what was heard: a page's first drawing, and what a run drew.
  // Mid-run, a stale box keeps what was heard of it, so that drawn again with the same
  // words it is not news.
  const hear = (now, midRun) => {
    settled = true;
    if (!midRun) heard.clear();
    for (const [k, text] of now) heard.set(k, text);
  };

  // A person who changes something on a page whose first drawing has not been heard
  // yet changed it as it stood: that is what they had, and what their change's run
  // draws is news. The runs before it do not always show: a short run's start and end
  // can reach the page together, its state never changing, and a change made mid-run
  // joins that run (Streamlit reruns it), with no end between. Only what commits a
  // change counts: Enter or Space, a click on a button or an option, a checkbox's or a
  // field's committed change, a slider moved. Focusing a field, moving in its text, a
  // help or full-screen button, or another tab (a page of its own), which change
  // nothing, would have the rest of the tab's first drawing read as news.
  const NOT_ACTS = "[role='tablist'], [data-testid='stSidebarNav'], [aria-label^='Help'], "
    + "[aria-label^='Fullscreen'], [aria-label^='Close fullscreen']";
  const SLIDER_KEYS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "Home", "End",
    "PageUp", "PageDown"];
  const changed = (target, what) => {
    if (settled || !(target instanceof Element)) return;
    const control = target.closest(what);
    if (control === null || control.closest(NOT_ACTS)) return;
    const midRun = running();
    hear(watched(midRun), midRun);
    ran = true;
  };
  document.addEventListener("click", (e) => changed(e.target, "button, [role='option']"), true);
  document.addEventListener("change", (e) => changed(e.target, "input, select, textarea"), true);
  document.addEventListener("pointerdown", (e) => changed(e.target, "[role='slider']"), true);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") changed(e.target, "input, select, textarea, "
      + "button, [role='option'], [role='combobox'], [role='slider']");
    else if (SLIDER_KEYS.includes(e.key)) changed(e.target, "[role='slider'], [role='radio']");
  }, true);

  // Read once a run has drawn the page; while a scenario plays, as soon as a run has
  // drawn it: a play's runs follow each other with 20-130 ms between them, too short
  // for a quiet moment after a run's end, and at times with none the browser sees.
  let played = false;   // the last read was of a play's drawing
  const readOut = () => {
    if (!running()) checkPage("idle");
    const playing = document.querySelector(`.${KEY}${PLAYING}`) !== null;
    if ((running() && !playing) || !ran) return;
    // The first read after a play (a Pause, its end): mid-play the containers drawn
    // after the narration were often still stale when read, so their newest text was
    // never heard, and a Pause had the translator's arithmetic read as its result. Only
    // the play's own words (its narration, a message) are news then.
    const stopped = played && !playing;
    played = playing;
    const midRun = running();
    const now = watched(midRun);
    const changed = (ending) => [...now].filter(([k, text]) => settled
      && k.replace(/--\d+$/, "").endsWith(ending) && text !== "" && heard.get(k) !== text)
      .map(([k]) => k);
    const news = (ending) => changed(ending).map((k) => now.get(k));
    // One action can change several (an Add also redraws the translator): the first
    // changed in READ_OUT's order is the action's own result. A play's news is only its
    // own words, while it plays (a step's narration still stale when read had the
    // translator redrawn beside it read instead) and when it stops; there, the last
    // step's narration and the end's message can change together, and both are read,
    // the narration first, where the message alone had the last step go unsaid.
    let said = null;
    if (playing || stopped) {
      const told = PLAY_SAYS.flatMap(news);
      if (told.length) said = told.join(" ");
    } else {
      // With the messages of the other changed containers, which have no voice of their
      // own here (part 4): a failed save's note beside the operation's line.
      const keys = READ_OUT.flatMap(changed);
      const first = keys.slice(0, 1);
      const told = [...first.map((k) => now.get(k)), ...alsoSaid(keys, first)];
      if (told.length) said = told.join(" ");
    }
    hear(now, midRun);
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
    // A saved session's buttons say which session (a list of them read "Open, Delete,
    // Open, Delete"): the id as its row shows it, from the widget's key.
    for (const [prefix, name] of SESSION_BUTTONS) {
      for (const box of document.querySelectorAll(`[class*="${KEY}${prefix}"]`)) {
        const k = [...box.classList].find((c) => c.startsWith(`${KEY}${prefix}`));
        const id = k?.slice(KEY.length + prefix.length) ?? "";
        const b = box.querySelector("button");
        if (b && id && !id.startsWith("confirm_") && id !== "cancel") {
          b.setAttribute("aria-label", name(`session ${id.slice(0, 8)}…`));
        }
      }
    }
  };
  const SESSION_BUTTONS = [
    ["btn_open_", (s) => `Open ${s}`],
    ["btn_delete_confirm_", (s) => `Delete for good: ${s}`],
    ["btn_delete_", (s) => `Delete ${s}`],
  ];

  // ---- 4. one voice for a result ----------------------------------------------------
  // Streamlit gives st.error and st.warning the role "alert" and st.info and st.success
  // "status": live regions of their own, which a screen reader announces as they are
  // drawn. In a watched container the read-out above says what is news (and only that:
  // not a page's first drawing, nor a message drawn again unchanged), so there they lose
  // the role, or a result would be said twice; the read-out then says every such message
  // that changed, not only the first container's (`alsoSaid`). Done as the change is seen,
  // before the browser updates what assistive technology sees, on the nodes it added (or
  // whose role changed) alone: the observer sees every change of a page.
  const ALERT = "[data-testid='stAlertContainer']";
  const UNVOICED = "data-pagedlab-unvoiced";
  const watchedBox = (el) => {
    for (let box = el.closest(`[class*="${KEY}"]`); box !== null;
      box = box.parentElement?.closest(`[class*="${KEY}"]`) ?? null) {
      if ([...box.classList].some(readClass)) return true;
    }
    return false;
  };
  const unvoiceIn = (root) => {
    const found = root.matches(`${ALERT}[role]`) ? [root] : [];
    for (const alert of [...found, ...root.querySelectorAll(`${ALERT}[role]`)]) {
      if (watchedBox(alert)) {
        alert.removeAttribute("role");
        alert.setAttribute(UNVOICED, "");
      }
    }
  };
  const unvoice = (changes) => {
    for (const c of changes) {
      if (c.type === "attributes" && c.attributeName === "role") unvoiceIn(c.target);
      for (const node of c.addedNodes) if (node instanceof Element) unvoiceIn(node);
    }
  };
  // The unvoiced messages of the changed containers `keys` other than `told`, which the
  // read-out adds to what it says: they are no alert of their own any more.
  const alsoSaid = (keys, told) => keys.filter((k) => !told.includes(k)).flatMap((k) =>
    [...document.querySelectorAll(`.${CSS.escape(k)} [${UNVOICED}]`)]
      .map((el) => el.innerText.trim()).filter((t) => t !== ""));

  // ---- when the page changes ---------------------------------------------------------
  // Read a moment after the page changes, at most every 250 ms while it keeps changing
  // (charts draw for a second or more after a run, longer than a person waits to act).
  let readSoon = null;
  const readLater = (ms) => {
    if (readSoon === null) {
      readSoon = window.setTimeout(() => { readSoon = null; nameHelp(); readOut(); }, ms);
    }
  };
  new MutationObserver((changes) => {
    unvoice(changes);
    const state = changes.some((c) => c.attributeName === "data-test-script-state");
    if (!running()) checkPage(state ? "end" : "idle");
    else if (state) checkPage("start");
    if (state) {
      // A click soon after a page's first run ended (sooner than the quiet moment the
      // read waits for) starts a run before that drawing was heard: it is heard now,
      // as it stands, or the click's result would be taken for the page's first drawing.
      if (running() && ended && !settled) hear(watched(), false);
      if (!running() && ran) ended = true;
      ran = true;
      runs += 1;   // a run started or ended: either way, one ran
    }
    // Chromium moves the focus off a disabled control when it next renders.
    window.requestAnimationFrame(() => window.setTimeout(refocus, 0));
    readLater(250);
  }).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ["disabled", "aria-disabled", "aria-selected", "data-test-script-state",
      "role"],
  });
  // The run that drew this script may have ended before it ran: what it drew is the
  // page as first read.
  unvoiceIn(document.body);
  readLater(0);
  document.addEventListener("focusout", (e) => {
    if (e.relatedTarget === null) window.setTimeout(refocus, 50);
  });
})();
