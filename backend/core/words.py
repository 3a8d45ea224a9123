"""Counts in messages and labels: "1 slot", "2 slots", "1,024 blocks"; the verb
that follows a count: "1 table holds it", "2 tables hold it"; and a message's first
word capitalised where that leaves every name as written."""

from __future__ import annotations

import re

# A plain lower-case word ending at a space or punctuation other than "." or "_": "policy
# must be", "trace: ...". Not a file name ("trace.csv: ..."), a field name
# ("num_blocks must ..."), an id in quotes, or a word with digits or capitals ("fp8", "iOS").
_PLAIN_FIRST_WORD = re.compile(r"[a-z]+(?=[\s,:;]|$)")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (with thousands separators) and `noun`, in the plural (`plural`, else
    noun + "s") unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def agrees(n: int, singular: str, plural: str) -> str:
    """The verb form that agrees with a count of `n`: agrees(1, "is", "are") == "is"."""
    return singular if n == 1 else plural


def sentence(message: str) -> str:
    """`message` starting with a capital, as a sentence on its own: "policy must be one
    of ..." reads "Policy must be one of ...". A message that starts with a name (a file,
    a field, an id) keeps it exactly as written."""
    if _PLAIN_FIRST_WORD.match(message):
        return message[0].upper() + message[1:]
    return message
