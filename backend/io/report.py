"""The command line's reports on stderr, one `kind: message` line each, and its output on
stdout."""

from __future__ import annotations

import sys


def say(kind: str, message: str) -> None:
    """One `kind: message` line on stderr, however many lines the message held.

    Messages quote what the user gave (paths, expectation paths, a CSV file's name); a
    line break in one must not make a reader, or a script, see two reports.
    """
    one = message.replace("\r", "\\r").replace("\n", "\\n")
    sys.stderr.write(f"{kind}: {one}\n")


class StdoutError(Exception):
    """stdout could not be written (a full disk, a closed terminal): no fault of the input,
    so `python -m backend` says it in one line and exits 70. A reader that went away is
    BrokenPipeError, which is left as it is (backend/__main__.py)."""


def out(text: str) -> None:
    """`text` on stdout, flushed now: a write that fails fails here, as StdoutError, not in
    the interpreter's flush at exit, where only a traceback could say it."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(f"cannot write to stdout: {exc.strerror or exc}") from None
