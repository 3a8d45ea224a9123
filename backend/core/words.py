"""Counts in messages and labels: "1 slot", "2 slots"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun`, in the plural (`plural`, else noun + "s") unless `n` is 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
