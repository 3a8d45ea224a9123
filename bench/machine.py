"""What the benchmarks print about the machine they ran on (no torch, no backend imports).

Run as scripts, the benchmarks find this module on their sys.path, next to them.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo (lscpu's source) gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
