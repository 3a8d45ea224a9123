"""Counts in messages and labels: "1 slot", "2 slots", "1,024 blocks"; lists as prose,
"A, B and C"; the verb
that follows a count: "1 table holds it", "2 tables hold it"; a message's first
word capitalised where it is a plain word; and user text made safe to show on one
line."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal

# A first word of lower-case letters only, ending the message or followed by a blank,
# ",", ":" or ";": "policy must be", "trace: ...". Not a file name with an extension
# ("trace.csv: ..."), a field name ("num_blocks must ..."), an id in quotes, or a word
# with digits or capitals ("fp8", "iOS").
_PLAIN_FIRST_WORD = re.compile(r"[a-z]+(?=[\s,:;]|$)")

# Format characters an emoji needs to stay whole: the zero-width (non-)joiner and the
# tag characters of flags. Every other one (the bidi overrides and isolates among
# them, which would reverse the text around them) is shown escaped.
_KEPT_FORMAT = {0x200C, 0x200D, *range(0xE0020, 0xE0080)}


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (with thousands separators) and `noun`, in the plural (`plural`, else
    noun + "s") unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def joined(items: Sequence[object]) -> str:
    """'A', 'A and B', 'A, B and C' ('' for none)."""
    words = [str(x) for x in items]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def percent(x: float) -> str:
    """A fraction as a percentage with one decimal, halves rounded up as a reader would:
    13/16 reads "81.3%", where Python's own formatting rounds an exact half to even
    ("81.2%", yet "18.8%" for 9/48). Short of the whole, never "100.0%": 1,999 of 2,000
    blocks used reads "99.9%", beside the one block still free."""
    return _short_of_whole(tenths(100 * x), x < 1) + "%"


def percent_of(part: int, whole: int) -> str:
    """`part` of `whole` as `percent` shows a fraction, computed exactly: 51/80 reads
    "63.8%", where the float 1 - 29/80 lands just under the half and reads "63.7%"."""
    shown = f"{(Decimal(100 * part) / Decimal(whole)).quantize(_TENTH, ROUND_HALF_UP)}"
    return _short_of_whole(shown, part < whole) + "%"


def _short_of_whole(shown: str, short: bool) -> str:
    """A percentage rounded up to 100.0 from a share short of the whole: 99.9."""
    return "99.9" if short and shown == "100.0" else shown


_TENTH = Decimal("0.1")
# Past this, a float's neighbours are further apart than a tenth: no half to round,
# and Decimal's 28 digits would not hold the quantized value.
_NO_HALVES = 2.0**52


def tenths(x: float) -> str:
    """`x` to one decimal, with thousands separators, halves rounded up as a reader
    would: a mean batch of 1.25 reads "1.3" (Python's own formatting rounds an exact
    half to even: "1.2"). The simulator's sentences and its bars' labels both use it,
    so the two agree. Not a finite number: "nan", "inf"."""
    if not math.isfinite(x) or abs(x) >= _NO_HALVES:
        return f"{x:,.1f}"
    return f"{Decimal(repr(float(x))).quantize(_TENTH, rounding=ROUND_HALF_UP):,}"


def agrees(n: int, singular: str, plural: str) -> str:
    """The verb form that agrees with a count of `n`: agrees(1, "is", "are") == "is"."""
    return singular if n == 1 else plural


def sentence(message: str) -> str:
    """`message` starting with a capital, as a sentence on its own: "policy must be one
    of ..." reads "Policy must be one of ...". Only a first word of lower-case letters
    alone is capitalised (see _PLAIN_FIRST_WORD), so a file name with its extension, a
    field name with "_", or a quoted id keeps its spelling; a one-word name in plain
    lower case would not."""
    if _PLAIN_FIRST_WORD.match(message):
        return message[0].upper() + message[1:]
    return message


def visible_byte(b: int) -> str:
    """A byte that stands alone (tiny-byte's token, a byte no UTF-8 character holds) as
    text: ASCII as `visible` shows it ("a", "\\n", "\\x1b"), any other byte as "\\xNN".
    A table lookup: layouts and tooltips show thousands of bytes on every rerun."""
    return _BYTE_TEXT[b]


def visible(text: str) -> str:
    """`text` with every character as itself ("Café", "🍰", "東京", an emoji's joiners)
    except control and other format characters, written as Python escapes ("\\n",
    "\\t", "\\u202e"), so a label shows a line break and cannot be reversed by one.
    Those past ASCII are always \\uNNNN (a no-break space is "\\u00a0"), since
    \\xNN stands for a byte that is no character (`visible_byte`)."""
    return "".join(ch if ch.isprintable() or ord(ch) in _KEPT_FORMAT else _escaped(ch)
                   for ch in text)


def legible(text: str) -> str:
    r"""`visible(text)` with each backslash doubled, for text read as a line (a status
    line, a request's prompt and output): a typed backslash and n then reads "\\n",
    apart from a line break's "\n". Display only: a snapshot's `text` keeps
    `visible`'s form, which restore compares with the tokens."""
    return visible(text.replace("\\", "\\\\"))


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x80:
        return ch.encode("unicode_escape").decode("ascii")
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_BYTE_TEXT: tuple[str, ...] = tuple(visible(chr(b)) if b < 0x80 else f"\\x{b:02x}"
                                    for b in range(256))
