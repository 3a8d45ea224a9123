"""Number fields whose range is checked on the server, not in the browser.

A browser keeps a number outside a field's bounds to itself (the field turns red,
with a tooltip) and sends the last one inside them, so whatever the page then does
uses a number the field no longer shows. These fields carry no bounds: every number
typed arrives, and one out of range is refused with a message naming the field.
"""

from __future__ import annotations

from typing import Any

from backend.core.errors import PagedLabError

Number = int | float


class OutOfRangeError(PagedLabError):
    """A field holds a number outside its range; the section that drew it stops there."""


def _number(v: Number) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:,.10g}"


def out_of_range(label: str, lo: Number, hi: Number, got: Number) -> str:
    """What a refusal says: "Steps must be 1 to 10,000; got 20,000"."""
    return f"{label} must be {_number(lo)} to {_number(hi)}; got {_number(got)}"


def number_field(where: Any, label: str, min_value: Number, max_value: Number,
                 value: Number | None, **kwargs: Any) -> Any:
    """`where.number_input(label, value=value, **kwargs)` checked against its range.

    Returns the field's number (None when blank). Raises OutOfRangeError for one outside
    min_value..max_value, which pages/compare.py catches around each section.
    """
    got = where.number_input(label, value=value, **kwargs)
    if got is not None and not min_value <= got <= max_value:
        raise OutOfRangeError(out_of_range(label, min_value, max_value, got))
    return got
