"""Number fields whose range is checked on the server, not in the browser.

A browser keeps a number outside a field's bounds to itself (the field turns red,
with a tooltip) and sends the last one inside them, so whatever the page then does
uses a number the field no longer shows. These fields carry no bounds: every number
typed arrives, and one out of range is refused with a message naming the field.

A section draws its fields as one group, so that a refused number leaves the fields
after it on screen (a user fixing two numbers sees both) and the section stops only
where it would first use one:

    with numbers.fields() as f:
        requests = f.number(c[0], "Requests", 1, 200, 40, key="cmp_map_requests")
        seed = f.number(c[1], "Seed", 0, 1_000_000, 0, key="cmp_map_seed")
    run(requests, seed)          # not reached when either was refused

and the page draws it through `section`, which shows the refusal under the fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.views.text import plain_md

Number = int | float


class OutOfRangeError(PagedLabError):
    """Fields hold numbers outside their ranges; the message names each, one per line."""


def _number(v: Number) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:,.10g}"


def out_of_range(label: str, lo: Number, hi: Number, got: Number) -> str:
    """What a refusal says: "Steps must be 1 to 10,000; got 20,000"."""
    return f"{label} must be {_number(lo)} to {_number(hi)}; got {_number(got)}"


class Fields:
    """A group of number fields, each checked against its range (see `fields`)."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def number(self, where: Any, label: str, min_value: Number, max_value: Number,
               value: Number | None, **kwargs: Any) -> Any:
        """`where.number_input(label, value=value, **kwargs)` checked against its range.

        Returns the field's number (None when blank). A number outside
        min_value..max_value is noted, and its nearest bound returned only so that the
        fields after it can be drawn (a later field's range may follow from it): the
        group's end refuses it before anything uses it.
        """
        got = where.number_input(label, value=value, **kwargs)
        if got is None or min_value <= got <= max_value:
            return got
        self.problems.append(out_of_range(label, min_value, max_value, got))
        return min(max(got, min_value), max_value)


@contextmanager
def fields() -> Iterator[Fields]:
    """A group of number fields; leaving it raises OutOfRangeError naming every refused one.

    An exception raised inside the group passes through unchanged.
    """
    group = Fields()
    yield group
    if group.problems:
        raise OutOfRangeError("\n".join(group.problems))


def section(draw: Callable[[], None]) -> None:
    """Draw a section; a refused number stops it there, with the fields' message."""
    try:
        draw()
    except OutOfRangeError as exc:
        # One line per refused field (a hard break between them); the other sections
        # are drawn as usual.
        st.error("  \n".join(plain_md(line) for line in str(exc).splitlines()))
