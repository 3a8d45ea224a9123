"""Words for a chart's text alternative: what a screen reader says for the whole chart.

Vega-Lite's top-level `description` becomes the chart's aria-label; without one a
screen reader names every chart "Vega visualization". Each chart builder says in a
sentence or two what it draws and its main figures (`grid.grid_description` is the
model), computed from the frame it draws. These helpers keep those sentences alike:
lists joined as prose (backend.core.words.joined), long ones cut short, numbers written
as the charts write them.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.core.words import joined

# A chart's description names at most this many items of a list (bars, stages, heads):
# read aloud, a longer list buries the sentence's point.
MAX_LISTED = 5


def capped(items: Sequence[object], limit: int = MAX_LISTED) -> str:
    """`joined`, with at most `limit` items: 'A, B, C and 4 more' past it."""
    words = [str(x) for x in items]
    if len(words) <= limit:
        return joined(words)
    return ", ".join(words[:limit]) + f" and {len(words) - limit:,} more"


def trend(points: Sequence[str]) -> str:
    """`joined`, or past MAX_LISTED points the first and the last, which say the trend
    ('from 0.0% at block size 1 to 71.0% at block size 256'): a table beside the chart
    lists every point."""
    return f"from {points[0]} to {points[-1]}" if len(points) > MAX_LISTED else joined(points)


def span(lo: int, hi: int) -> str:
    """A range of whole numbers as an axis reads it: '0–120', or '7' for one."""
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def number(x: float, places: int = 1) -> str:
    """A measured value with thousands separators and `places` decimals: 1234.56 ->
    '1,234.6' (whole counts pass places=0)."""
    return f"{x:,.{places}f}"
