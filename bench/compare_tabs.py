"""Server-side time of the "Contiguous vs paged" page, one tab at a time.

Only the open tab is drawn (pages/compare.py), so a field's change costs its own
tab's section. For each tab, opened by its address (`?tab=...`) in a fresh AppTest
session: the wall time of the first run (its caches cold in this session; the
server-wide ones, such as the Sharing tab's estimate, fill once per process) and
the median of reruns with nothing changed.

    python bench/compare_tabs.py [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from machine import cpu_name  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from ui.compare import TAB_KEY, TABS  # noqa: E402

PAGE = str(ROOT / "pages" / "compare.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="reruns per tab (default 5)")
    args = parser.parse_args()
    rows = []
    for tab in TABS:
        at = AppTest.from_file(PAGE, default_timeout=600)
        at.query_params[TAB_KEY] = tab
        t0 = time.perf_counter()
        at.run()
        first = time.perf_counter() - t0
        assert not at.exception, at.exception
        again = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            at.run()
            again.append(time.perf_counter() - t0)
        rows.append((tab, first, statistics.median(again)))
    print(f"# Contiguous vs paged, one tab drawn ({datetime.date.today().isoformat()})")
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()}, Python "
          f"{platform.python_version()}, streamlit {st.__version__}, {args.runs} reruns each")
    print(f"{'tab':<30}{'first run s':>12}{'rerun s':>10}")
    for tab, first, again in rows:
        print(f"{tab:<30}{first:>12.2f}{again:>10.2f}")
    print(f"the eight reruns together: {sum(r[2] for r in rows):.2f} s (what one rerun "
          "cost while every tab was drawn)")


if __name__ == "__main__":
    main()
