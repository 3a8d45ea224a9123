"""Click to settled in a real browser: the Playground's ordinary actions, end to end.

Starts `streamlit run app.py` on a free port (its saved sessions in a temporary
data directory, so the repository's data/ is left alone), opens the Playground
in Debian's Chromium through Playwright, and times each action from the click
to the page having settled:

    t0       the button's click event, dispatched in the page
    settled  the last script run the click caused has finished (Streamlit marks
             it on the app: data-test-script-state="notRunning", when its status
             widget goes) and the browser has painted after it

Both instants are the page's own clock (performance.now()), read by a
MutationObserver on the app's script-state attribute; a run counts as the last
once nothing has started for QUIET_S after it, so a rerun the action asks for
(st.rerun) is inside the figure. Each sample's line says where the time went:
R<ms> a run started, F<ms> it finished, P<ms> the paint after the last one, JS<ms>
the browser's main thread in tasks over 50 ms (drawing what the server sent). Each
action's status line ("Step 3: step ·
...") is checked to be the one that action writes, so a refused action is an
error, not a fast figure.

The actions, on the default configuration (tiny byte model, the default kernel:
the Triton interpreter on a CPU), each round in a fresh browser context (a new
session) and repeated `--cycles` times there: Add (the default prompt), Step,
Step N with N = 8, Fork (of the request just added), Finish (the fork's child).
A session's first Add is also reported on its own line: it is the click that draws
the most views for the first time. The first click waits for the page to be fully
drawn (see `settle`), as a person would.

    python bench/app_latency.py [--rounds 4] [--cycles 3] [--headed] [--set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from machine import cpu_name
from playwright.sync_api import Browser, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STARTUP_TIMEOUT_S = 90
ACTION_TIMEOUT_S = 60.0
QUIET_S = 1.0        # no new run for this long after a finished one: the click is settled
ACTIONS = ("Add", "Step", "Step N=8", "Fork", "Finish")
FIRST = "first Add"  # a session's first Add (also among "Add"): it draws the most views anew
# (button key, status line the action writes); {n} is the operation's number.
BUTTONS = {"Add": ("btn_add", r"Step {n}: add "), "Step": ("btn_step", r"Step {n}: step"),
           "Step N=8": ("btn_step_n", r"Step {n}: step x8"),
           "Fork": ("btn_fork", r"Step {n}: fork "), "Finish": ("btn_finish", r"Step {n}: finish ")}

# Installed before each click: log every change of the app's script state with the
# time, and for each finished run also the time just after the next paint (a
# setTimeout queued from requestAnimationFrame runs once that frame is drawn).
_WATCH_AND_CLICK = """(selector) => {
  const app = document.querySelector("[data-testid='stApp']");
  const log = [];
  const obs = new MutationObserver(() => {
    const state = app.getAttribute('data-test-script-state');
    const t = performance.now();
    log.push({t, state});
    if (state === 'notRunning') {
      requestAnimationFrame(() => setTimeout(() => log.push({t: performance.now(),
                                                             state: 'painted'}), 0));
    }
  });
  obs.observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
  if (window.__platObs) window.__platObs.disconnect();
  window.__platObs = obs;
  window.__plat = log;
  // The browser's own share: main-thread tasks over 50 ms (Streamlit drawing the page).
  if (!window.__platLong) {
    window.__platLong = [];
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) window.__platLong.push([e.startTime, e.duration]);
    }).observe({type: 'longtask'});
  }
  window.__platLong.length = 0;
  // The visible one: Streamlit may keep a stale, hidden copy of an element beside it.
  const button = [...document.querySelectorAll(selector)].find(
    (b) => b.getClientRects().length > 0 && !b.disabled);
  if (!button) throw new Error('no visible, enabled button ' + selector);
  const t0 = performance.now();
  button.click();
  return t0;
}"""


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serve(data_dir: Path, log: Path, options: list[str]) -> Iterator[str]:
    """`streamlit run app.py` on a free port, saving sessions in `data_dir`; yields its URL.

    `options` are KEY=VALUE Streamlit settings on top of .streamlit/config.toml's.
    """
    flags = [part for kv in options for part in (f"--{kv.partition('=')[0]}",
                                                  kv.partition("=")[2])]
    port = _free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    streamlit = Path(sys.executable).with_name("streamlit")
    env = {**os.environ, "PAGEDLAB_DATA_DIR": str(data_dir)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(streamlit), "run", "app.py", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false",
             # The code under test is fixed for the run: a module re-imported when a
             # file changes beside a live engine makes its classes strangers
             # ("unknown operation Step(...)"), which is no bug of the app's.
             "--server.fileWatcherType", "none", *flags],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                sys.exit(f"streamlit exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"streamlit did not become healthy in {STARTUP_TIMEOUT_S} s")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def settle(page: Page) -> None:
    """Wait for the page to be drawn and idle (used outside the timed clicks).

    The app reads "notRunning" before a new page's first script run has even
    started, so that state alone does not mean the page is shown: wait for the
    Playground's last section, for no element still drawn as a loading skeleton,
    and for the state to stay "notRunning" for QUIET_S.
    """
    idle = page.locator("[data-testid='stApp'][data-test-script-state='notRunning']")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    while True:
        idle.wait_for()
        expect(page.get_by_test_id("stStatusWidget")).to_have_count(0)
        expect(page.get_by_test_id("stSkeleton")).to_have_count(0)
        page.wait_for_timeout(QUIET_S * 1e3)
        if idle.count() and not page.get_by_test_id("stStatusWidget").count():
            return


def status_text(page: Page) -> str:
    alerts = page.get_by_test_id("stAlert")
    return alerts.first.inner_text() if alerts.count() else ""


def click_to_settled(page: Page, key: str) -> tuple[float, str]:
    """Click the button with widget key `key`: ms from the click to the settled page, and
    where they went (each run's start and end after the click, and the last paint)."""
    t0: float = page.evaluate(_WATCH_AND_CLICK, f".st-key-{key} button")
    deadline = time.monotonic() + ACTION_TIMEOUT_S
    while True:
        page.wait_for_timeout(100)
        log: list[dict[str, object]] = page.evaluate("() => window.__plat")
        now: float = page.evaluate("() => performance.now()")
        runs = [e for e in log if e["state"] != "painted"]
        if runs and runs[-1]["state"] == "notRunning" and log[-1]["state"] == "painted":
            last = float(runs[-1]["t"])   # type: ignore[arg-type]
            if now - last >= QUIET_S * 1e3:
                painted = float(log[-1]["t"])   # type: ignore[arg-type]
                marks = " ".join(f"{'R' if e['state'] == 'running' else 'F'}"
                                 f"{float(e['t']) - t0:.0f}"  # type: ignore[arg-type]
                                 for e in runs)
                long: list[list[float]] = page.evaluate("() => window.__platLong")
                busy = sum(d for start, d in long if t0 <= start <= painted)
                return painted - t0, f"{marks} P{painted - t0:.0f} JS{busy:.0f}"
        if time.monotonic() > deadline:
            sys.exit(f"{key}: the page did not settle in {ACTION_TIMEOUT_S:.0f} s ({log})")


class AbandonedError(Exception):
    """An action did not do what it should: the round stops, its figures so far stay."""


def one_round(browser: Browser, url: str, cycles: int,
              samples: dict[str, list[float]]) -> None:
    """A new session on the Playground; the five actions `cycles` times."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(ACTION_TIMEOUT_S * 1e3)
        page.goto(url)
        expect(page.get_by_role("button", name="Add request")).to_be_visible()
        settle(page)
        n = 0
        for cycle in range(cycles):
            for action in ACTIONS:
                key, line = BUTTONS[action]
                if action == "Step N=8" and cycle == 0:
                    steps = page.get_by_role("spinbutton", name="Steps")
                    steps.fill("8")
                    steps.press("Tab")
                    page.wait_for_timeout(300)
                    settle(page)
                ms, marks = click_to_settled(page, key)
                n += 1
                text = status_text(page)
                if not re.match(line.format(n=n), text):
                    raise AbandonedError(f"{action}: the status line is {text!r}, not "
                                    f"{line.format(n=n)!r} (refused, or not this action's)")
                samples[action].append(ms)
                if n == 1:
                    samples[FIRST].append(ms)
                print(f"  {action:<9} {ms:7.0f} ms   {marks:<28} {text.splitlines()[0][:44]}",
                      flush=True)
    finally:
        context.close()


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 \
        else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="fresh sessions (default 4)")
    parser.add_argument("--cycles", type=int, default=3,
                        help="times each round runs the five actions (default 3)")
    parser.add_argument("--headed", action="store_true", help="show the browser")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a Streamlit setting for this run, e.g. runner.postScriptGC=false "
                             "(repeatable)")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Debian's chromium is not on PATH (apt-get install chromium)")
    samples: dict[str, list[float]] = {a: [] for a in (*ACTIONS, FIRST)}
    # A first page load on a busy 2-core machine can take longer than expect's 5 s.
    expect.set_options(timeout=ACTION_TIMEOUT_S * 1e3)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="pagedlab-bench-data-") as data, \
            serve(Path(data), ROOT / "build" / "app_latency.streamlit.log", args.set) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=not args.headed,
                                     args=CHROMIUM_ARGS)
        try:
            # A first session warms the server (imports, Triton's interpreter, caches);
            # it is not counted.
            abandoned: list[str] = []
            for r in range(args.rounds + 1):
                print("warm-up:" if r == 0 else f"round {r}:", flush=True)
                try:
                    one_round(browser, url, 1 if r == 0 else args.cycles,
                              samples if r else {a: [] for a in (*ACTIONS, FIRST)})
                except AbandonedError as exc:
                    print(f"  abandoned: {exc}", flush=True)
                    abandoned.append(f"{'warm-up' if r == 0 else f'round {r}'}: {exc}")
            version = browser.version
        finally:
            browser.close()
    import streamlit

    print(f"\n# Click to settled on the Playground ({datetime.date.today().isoformat()})")
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}, streamlit {streamlit.__version__}, "
          f"Chromium {version}; default config (tiny byte model, default kernel)")
    print(f"# load average (1, 5, 15 min) before: {load_before}, after: {load_average()}")
    if args.set:
        print(f"# Streamlit settings: {', '.join(args.set)}")
    print(f"# {args.rounds} sessions x {args.cycles} cycles; settled = last run finished "
          f"and painted, no new run for {QUIET_S:g} s")
    for line in abandoned:
        print(f"# abandoned {line}")
    print(f"{'action':<12}{'n':>4}{'median ms':>11}{'p90 ms':>9}{'max ms':>9}")
    for action in (*ACTIONS, FIRST):
        ms = samples[action]
        if not ms:
            print(f"{action:<12}{0:>4}")
            continue
        print(f"{action:<12}{len(ms):>4}{statistics.median(ms):>11.0f}{p90(ms):>9.0f}"
              f"{max(ms):>9.0f}")


if __name__ == "__main__":
    main()
