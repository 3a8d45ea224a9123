"""The command line's reports on stderr: one `kind: message` line each."""

from __future__ import annotations

import sys


def say(kind: str, message: str) -> None:
    """One `kind: message` line on stderr, however many lines the message held.

    Messages quote what the user gave (paths, expectation paths, a CSV file's name); a
    line break in one must not make a reader, or a script, see two reports.
    """
    one = message.replace("\r", "\\r").replace("\n", "\\n")
    sys.stderr.write(f"{kind}: {one}\n")
