// PagedLab's rule for the browser's history, installed once per browser tab by
// ui/start.py beside assets/a11y.js: one entry per thing the person does.
//
// Streamlit pushes an entry for every change of the address, and one click can make
// several: a page opened from the sidebar pushes its bare path and then the link its
// run writes (Scenarios: ?scenario=…&step=…), or that link on the old page's path
// first (/lab?scenario=…) and then its own path; "Continue in the Playground" pushed
// /tour, /tour?session=… and then /lab?session=…. Back went to those in-between
// addresses, each a page showing the same or the wrong thing: two Backs or three to
// leave a page, and a Playground address carrying a scenario's link.
//
// So the first change of the address after a key or a click is an entry, and the
// changes after it, until the person acts again, replace that entry. A scenario's play
// (PLAYING drawn) takes one view after another with no click between: each is an entry
// of its own, the last included. The browser's Back and Forward are not the person
// acting on the page: a change of the address their run makes (Streamlit's redirect
// from / to /lab pushes one) replaces the entry gone to, keeping the entries after it
// for Forward. A Contiguous vs paged tab is in the address (a link opens it), but
// Streamlit writes it in place (replaceState, not seen here): switching tabs is no
// entry.
//
// An address that is no page's (/, and the pages' file names such as /scenarios) only
// opens a page: app.py's redirect pushes the page's address over it on a tab's first
// run, before this script loads, and a Back to it opened that same page again, a
// second Back needed to leave. Back or Forward onto such an entry goes on past it.
(() => {
  if (window.__pagedlabHistory) return;
  window.__pagedlabHistory = true;

  const PLAYING = __PLAYING__;
  const PAGES = __PAGES__;    // the pages' own addresses, the last part of the path
  const history = window.history;
  const push = history.pushState.bind(history);
  const replace = history.replaceState.bind(history);
  // The person acted since the address last changed. At first, whether they have acted
  // on the page at all: Streamlit loads this script a second or so after the tab's
  // first run, and a click may come before it (an address changed with none before it
  // fills in the one the tab was opened at). A modifier key alone is no act.
  let acted = navigator.userActivation?.hasBeenActive ?? false;
  const MODIFIERS = ["Shift", "Control", "Alt", "AltGraph", "Meta", "CapsLock"];
  document.addEventListener("pointerdown", () => { acted = true; }, true);
  document.addEventListener("keydown", (e) => {
    if (!MODIFIERS.includes(e.key)) acted = true;
  }, true);

  // The last change came in a play: the play's last view, whose run draws the play
  // stopped, perhaps before its address changes, is an entry too.
  let played = false;
  // The entry shown, to tell a Back from a Forward (Chromium's Navigation API; where
  // there is none, a move onto a redirect's entry is taken for a Back).
  const at = () => window.navigation?.currentEntry?.index ?? -1;
  let shown = at();
  window.addEventListener("popstate", () => {
    // A click that changed no address (Step on the Playground) is not left to make
    // this Back's redirect an entry, which would drop the entries after it.
    acted = false;
    played = false;
    const was = shown;
    shown = at();
    // An address that is no page's: gone on past, the way the person was going.
    if (PAGES.includes(location.pathname.split("/").filter(Boolean).pop() ?? "")) return;
    if (was >= 0 && shown > was) {
      history.forward();
    } else if (window.navigation?.canGoBack ?? true) {
      // (With nothing before it, the redirect runs and takes the entry: the page
      // stays, as it would.)
      history.back();
    }
  });

  history.pushState = (state, unused, url) => {
    const playing = document.querySelector(`.st-key-${PLAYING}`) !== null;
    if (acted || playing || played) {
      push(state, unused, url);
    } else {
      replace(state, unused, url);
    }
    acted = false;
    played = playing;
    shown = at();
  };
})();
