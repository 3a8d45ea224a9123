"""The integer check every entry point shares, so each refusal reads alike.

A count, size or id a caller passes is an `int` in a closed range; a `bool` is
not one, although Python says it is. The message names the field, the whole
requirement and the value given, with thousands separators where they help:

    block_size must be an integer in 1..256, got 999
    pool size must be an integer in 1..65,536, got 1,000,000,000
    capacity must be an integer >= 1, got 'many'
"""

from __future__ import annotations

import math

from backend.core.errors import PagedLabError

# The largest integer every JSON reader keeps exactly (a double's 53-bit mantissa): the
# bound of a file's counts that have no tighter one (a step number, a preemption count).
MAX_JSON_INT = 2**53 - 1
# The largest a count that operations raise (the step number, the metrics' totals) may
# be for another operation to run: half of MAX_JSON_INT, so the counts that operation
# writes still fit a file every reader (PagedLab's restore included) keeps exactly. A
# snapshot may hold up to MAX_JSON_INT; past this, its state can be viewed, not stepped.
MAX_COUNTER = 2**52


# Past this many characters a quoted value is cut short: a file's values are anyone's.
SHOWN_CHARS = 40


def shown(value: object) -> str:
    """`value` as a message quotes it, in JSON's words: an int with thousands separators
    (a long one cut short, with its count of digits), a string or number as written
    (cut short past SHOWN_CHARS), null, true and false; an array or object by its kind;
    NaN and an infinite number in words."""
    if isinstance(value, bool) or value is None:
        return json_kind(value)
    if isinstance(value, int):
        digits = len(str(abs(value)))
        if digits <= SHOWN_CHARS:
            return f"{value:,}"
        return f"{str(value)[:13]}… ({digits:,} digits)"
    if isinstance(value, list | dict):
        return json_kind(value)
    if isinstance(value, float) and not math.isfinite(value):
        # Python's reader takes NaN and Infinity, which JSON has no words for, and reads
        # a number past the largest float (1e400) as infinite: "got inf" said neither.
        if math.isnan(value):
            return "NaN (not a number; JSON has no such value)"
        sign = "-" if value < 0 else ""
        return f"{sign}Infinity (or a number too large to hold, such as {sign}1e400)"
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    if isinstance(value, str):
        # Cut inside its quotes, so it still reads as a string: 'xxxx…'.
        cut = repr(value[:SHOWN_CHARS])
        return cut[:-1] + "…" + cut[-1]
    return text[:SHOWN_CHARS - 1] + "…"


def json_kind(value: object) -> str:
    """What JSON calls `value`'s kind: "null", "true", "an integer", "an array", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    for kind, name in ((int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def int_requirement(low: int, high: int | None = None) -> str:
    """"an integer in 1..256" or, with no upper bound, "an integer >= 1"."""
    return f"an integer >= {low:,}" if high is None else f"an integer in {low:,}..{high:,}"


def check_int(value: object, what: str, low: int, high: int | None = None) -> int:
    """`value`, if it is an int (not a bool) in low..high (high None: no upper bound).

    Raises PagedLabError "`what` must be an integer in low..high, got value".
    """
    if (isinstance(value, bool) or not isinstance(value, int) or value < low
            or (high is not None and value > high)):
        raise PagedLabError(f"{what} must be {int_requirement(low, high)}, got {shown(value)}"
                            + written_as_float(value, low, high))
    return value


def written_as_float(value: object, low: int | None = None, high: int | None = None) -> str:
    """For a whole number a file wrote as a float (1e3, 1000.0), the way to write it: a
    JSON reader hands such a number over as a float, which no count accepts. Nothing
    when the number would be refused as an integer too (outside low..high)."""
    if not (isinstance(value, float) and value.is_integer() and abs(value) <= MAX_JSON_INT):
        return ""
    n = int(value)
    if (low is not None and n < low) or (high is not None and n > high):
        return ""
    return write_it_as(n)


def write_it_as(n: int) -> str:
    """The hint for a whole number written with a decimal point or an exponent."""
    return f" (write it as {n}, without a decimal point or exponent)"


def unicode_text(text: str, what: str) -> int:
    """`text`'s size in UTF-8 bytes; a PagedLabError naming `what` if it holds a lone
    surrogate, which a JSON escape ("\\ud800", half an emoji's pair) can write but no
    text holds: nothing can encode it, so it would fail wherever it is shown or saved."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise PagedLabError(f"{what} is not valid Unicode text (it holds a lone surrogate)"
                            ) from None


def file_kind(raw: object) -> str | None:
    """Which of PagedLab's two JSON files a decoded object plainly is: "snapshot" (it has
    'schema_version' and no 'steps'), "scenario" (the reverse), else None. A file given
    where the other kind belongs is refused by saying where it goes."""
    if not isinstance(raw, dict) or ("schema_version" in raw) == ("steps" in raw):
        return None
    return "snapshot" if "schema_version" in raw else "scenario"
