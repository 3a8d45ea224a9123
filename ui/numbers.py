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

Every field here keeps its number for the browser session (persist_state="session"),
as the app's other fields do: Streamlit forgets a field its page did not draw, so a
number typed and not yet applied would be lost on a visit to another page.

A field for a whole number is drawn as a float field (`whole_input`) and read through
`whole`: an integer field would send "2.5" as 2 and "1e5" as 1 (the browser's parse,
then Streamlit's `int()`), so the page would act on a number nobody typed. A float
field sends what was typed, and `whole` refuses a fraction by the field's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.views.text import plain_md
from ui import a11y

Number = int | float

# The largest whole number a browser's number field holds exactly (a JavaScript
# number's 53-bit significand): a larger one typed arrives rounded to a nearby one.
MAX_EXACT = (1 << 53) - 1


# Text a browser cannot read as a number ("1e309", a lone "-" or "e") never leaves it:
# the page keeps the field's last number while the field shows the text, and Enter or
# leaving the field then puts back the value the page drew it with (Streamlit's number
# field commits its default for a blank). The input is `:invalid` meanwhile (its
# badInput; these fields carry no bounds, and the lowest float as their step base makes
# no typed number a step mismatch), so a rule can say so under the field, in the
# browser, with no run of the page.
UNREADABLE = ("Not a number the browser can read: the page still has this field's last "
              "number, and Enter or leaving the field puts back its starting value.")
_UNREADABLE_CSS = (
    '[data-testid="stNumberInput"]:has(input:invalid) input { color: #b2182b; }'
    '[data-testid="stNumberInput"]:has(input:invalid)::after {'
    f' content: "{UNREADABLE}"; display: block; color: #b2182b;'
    ' font-size: 0.8rem; line-height: 1.3; margin-top: 0.25rem; }'
)


def mark_unreadable() -> None:
    """Draw the rule that flags a number field holding text the browser cannot read as
    a number (see UNREADABLE). Once per page run, before its fields."""
    st.html(f"<style>{_UNREADABLE_CSS}</style>")


class OutOfRangeError(PagedLabError):
    """Fields hold numbers outside their ranges; the message names each, one per line."""


def number_text(v: Number) -> str:
    """A number as a refusal quotes it: with thousands separators, a whole-number field's
    20000.0 as "20,000" (as a browser shows it), and a fraction in full ("2.0000000001",
    never rounded to look whole); from 1e21 on, as a browser writes it ("1e+21")."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        v = int(v)
    elif isinstance(v, int) and abs(v) >= 10**21:
        v = float(v)    # a typed 1e300 that `whole` made an int: not 301 digits
    return f"{v:,}"


def out_of_range(label: str, lo: Number, hi: Number, got: Number) -> str:
    """What a refusal says: "Steps must be 1 to 10,000; got 20,000"."""
    return f"{label} must be {number_text(lo)} to {number_text(hi)}; got {number_text(got)}"


def whole_input(where: Any, label: str, *, value: Number | None = None,
                step: Number = 1, **kwargs: Any) -> float | None:
    """`where.number_input` for a whole number, as a float field (see the module's note).

    Shown with "%g", so 7 reads "7", not "7.00". Returns what the field holds; read it
    through `whole` (or `Fields.number`), which refuses a fraction.
    """
    kwargs.setdefault("persist_state", "session")
    got = where.number_input(label, value=None if value is None else float(value),
                             step=float(step), format="%g", **kwargs)
    return None if got is None else float(got)


def whole(label: str, value: Number | None) -> int | None:
    """A whole-number field's value as an int (None when blank).

    Raises PagedLabError naming `label` for a fraction ("Steps must be a whole number;
    got 2.5"), and for infinity or NaN. Ranges are the caller's to check. An int passes
    as it is: session state a page wrote itself holds ints.
    """
    if value is None or isinstance(value, int):
        return value
    if not math.isfinite(value) or not float(value).is_integer():
        raise PagedLabError(not_whole(label, value))
    return int(value)


def not_whole(label: str, got: Number) -> str:
    """What a refusal of a fraction says: "Steps must be a whole number; got 2.5"."""
    return f"{label} must be a whole number; got {number_text(got)}"


class Fields:
    """A group of number fields, each checked against its range (see `fields`)."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def number(self, where: Any, label: str, min_value: Number, max_value: Number,
               value: Number | None, **kwargs: Any) -> Any:
        """`where.number_input(label, value=value, **kwargs)` checked against its range.

        Returns the field's number (None when blank). With whole bounds (ints) the field
        is a whole-number one (`whole_input`) and returns an int. Either kind shows its
        number with "%g" (7.5, not 7.50); a field for fractions may pass its own `format`.
        A number outside min_value..max_value, or a fraction in a whole-number field, is
        noted, and a number in range returned only so that the fields after it can be
        drawn (a later field's range may follow from it): the group's end refuses it
        before anything uses it.
        """
        is_whole = isinstance(min_value, int) and isinstance(max_value, int)
        if is_whole:
            got = whole_input(where, label, value=value, **kwargs)
        else:
            kwargs.setdefault("persist_state", "session")
            # "%g", as the whole-number fields: Streamlit's default "%.2f" showed a typed
            # 0.005 as "0.01" beside a refusal quoting 0.005, and ran 123.456 shown as
            # "123.46". The browser formats it, with JavaScript's own digits: 1e6 reads
            # "1000000", not Python's "1e+06".
            kwargs.setdefault("format", "%g")
            got = where.number_input(label, value=value, **kwargs)
        if got is None:
            return None
        # One refusal per field: the range's, else the fraction's.
        if not (math.isfinite(got) and min_value <= got <= max_value):
            self.problems.append(out_of_range(label, min_value, max_value, got))
            got = min(max(got, min_value), max_value) if math.isfinite(got) else min_value
        elif is_whole and not float(got).is_integer():
            self.problems.append(not_whole(label, got))
        return math.floor(got) if is_whole else got


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
        # One line per refused field (a hard break between them); the page's other
        # sections (another part of the same tab) are drawn as usual. Read out to a
        # screen reader when it is new (ui/a11y.py).
        with a11y.refused(str(exc)):
            st.error("  \n".join(plain_md(line) for line in str(exc).splitlines()))
