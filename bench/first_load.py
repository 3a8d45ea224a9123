"""Benchmark: a fresh server's first page load, served by make run's launcher and by
`streamlit run app.py`.

For each way, alternating, `--repeat` times: start a server on a free port, wait for
its health check, then time Chromium (Debian's, headless) from opening /lab to the
Playground's *Add request* button being visible. Prints both times per start.

    .venv/bin/python bench/first_load.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from machine import cpu_name
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WAYS = {"python -m ui.serve": [sys.executable, "-m", "ui.serve"],
        "streamlit run app.py": [str(Path(sys.executable).with_name("streamlit")), "run",
                                 "app.py"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def first_load(command: list[str], chromium: str) -> tuple[float, float]:
    """Seconds from start to healthy, and from opening /lab to the Add request button."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        env = dict(os.environ, PAGEDLAB_DATA_DIR=data)
        start = time.perf_counter()
        server = subprocess.Popen(
            [*command, "--server.port", str(port), "--server.address", "127.0.0.1",
             "--server.headless", "true", "--server.fileWatcherType", "none",
             "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                           timeout=1)
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit(f"{command} exited with {server.returncode}") from None
                    time.sleep(0.1)
            healthy = time.perf_counter() - start
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page()
                opened = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/lab")
                page.get_by_role("button", name="Add request").wait_for(timeout=120_000)
                shown = time.perf_counter() - opened
                browser.close()
        finally:
            server.terminate()
            server.wait()
    return healthy, shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is not on PATH (scripts/ensure-chromium)")
    print(f"# {datetime.date.today()} {cpu_name()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}")
    print("| server | healthy after start, s | first visitor's page, s |")
    print("|---|---:|---:|")
    for _ in range(args.repeat):
        for name, command in WAYS.items():
            healthy, shown = first_load(command, chromium)
            print(f"| `{name}` | {healthy:.1f} | {shown:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
