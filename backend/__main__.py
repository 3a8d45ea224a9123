"""`python -m backend`: see backend/io/cli.py."""

import os
import sys

from backend.io.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # The reader of stdout went away (`simulate ... | head -1`): nothing left to say to
    # it, and no traceback. Python would flush stdout again at exit and fail again, so
    # stdout goes to devnull first.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
raise SystemExit(code)
