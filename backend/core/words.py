"""Counts in messages and labels: "1 slot", "2 slots", "1,024 blocks"; and the verb
that follows a count: "1 table holds it", "2 tables hold it"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (with thousands separators) and `noun`, in the plural (`plural`, else
    noun + "s") unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def agrees(n: int, singular: str, plural: str) -> str:
    """The verb form that agrees with a count of `n`: agrees(1, "is", "are") == "is"."""
    return singular if n == 1 else plural
