"""`python -m backend`: see backend/io/cli.py."""

import os
import sys

from backend.io.cli import main
from backend.io.report import StdoutError, say

# The status of a process a closed pipe ends (128 + SIGPIPE), as a shell reports it. Not
# 1: `run --check` exits 1 for an unmet expectation, and a pass piped into a reader that
# had already gone would read as a mismatch.
CLOSED_PIPE = 141


def _quiet_stdout() -> None:
    """stdout to devnull: Python flushes it again at exit, and would fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # The reader of stdout went away (`simulate ... | head -1`): nothing left to say to
    # it, and no traceback.
    _quiet_stdout()
    code = CLOSED_PIPE
except StdoutError as exc:
    # Not the input's fault: exit 70, as CONTRACT.md's additions say for such failures.
    _quiet_stdout()
    say("error", str(exc))
    code = 70
raise SystemExit(code)
