"""Column layouts that follow the width the page actually has.

Streamlit stacks columns only on a narrow window (640 px), whatever the sidebar
leaves of it: a 1024 px window with the sidebar open gives the page about 570 px,
where three panels side by side cut their labels ("Laye/r", "e.g. 9, 2, :"). These
rules use a CSS container query on a keyed container instead, so they follow the
page's own width (the sidebar open or closed). Each applies to the columns directly
inside the container, not to columns nested in them.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

# The columns directly in `.st-key-KEY`: not those inside one of them.
_ROW = '.st-key-{key} [data-testid="stHorizontalBlock"]:not([data-testid="stColumn"] *)'
_COLUMN = '.st-key-{key} [data-testid="stColumn"]:not([data-testid="stColumn"] *)'
# Streamlit's gap between columns ("small", 1rem).
_GAP_PX = 16


def stack_below(key: str, width_px: int) -> None:
    """The columns in the container keyed `key` go one under the other below `width_px`
    of its width. Call before drawing that container."""
    row, column = _ROW.format(key=key), _COLUMN.format(key=key)
    st.html(f"<style>.st-key-{key} {{ container-type: inline-size; }}"
            f"@container (max-width: {width_px}px) {{ {row} {{ flex-direction: column; }}"
            f"{column} {{ width: 100% !important; flex: 1 1 100% !important; }} }}</style>")


def wrap_below(key: str, min_px: Sequence[int]) -> None:
    """The columns in the container keyed `key` wrap onto the next line rather than the
    i-th shrinking below `min_px[i]`; a row of four that cannot keep them all on one
    line goes two and two. Call before drawing that container."""
    row, column = _ROW.format(key=key), _COLUMN.format(key=key)
    mins = "".join(f"{column}:nth-child({i}) {{ min-width: min({px}px, 100%) !important; }}"
                   for i, px in enumerate(min_px, start=1))
    pairs = ""
    if len(min_px) == 4:
        # Four that do not fit go two and two, not three and a lone one the whole width
        # (a Seed field 820 px wide under three of 270). Only in a row of four: another
        # row in the container keeps its own columns.
        four = f'{row}:has(> [data-testid="stColumn"]:nth-child(4))'
        need = sum(min_px) + 3 * _GAP_PX
        pairs = (f".st-key-{key} {{ container-type: inline-size; }}"
                 f"@container (max-width: {need - 1}px) {{ {four} > [data-testid=\"stColumn\"]"
                 " { flex: 1 1 calc(50% - 0.5rem) !important; } }")
    st.html(f"<style>{row} {{ flex-wrap: wrap; }}{mins}{pairs}</style>")


def wrap_tabs(key: str) -> None:
    """The tab bar in the container keyed `key` wraps its tabs onto a second line where the
    page is too narrow for them all, rather than hiding the last ones behind a scroll
    arrow (a 1024 px window with the sidebar open showed four and a half of eight). The
    lines touch, as one bar. Call before drawing that container."""
    st.html(f"<style>.st-key-{key} [role=tablist] {{ flex-wrap: wrap; row-gap: 0; }}</style>")


def note_below(key: str, width_px: int, text: str) -> None:
    """A caption, drawn here, that shows only while the container keyed `key` is
    narrower than `width_px`: a table of fixed column widths then scrolls sideways,
    which its grid does not show until the pointer is over it. Call inside that
    container."""
    note = f"{key}_narrow"
    st.html(f"<style>.st-key-{key} {{ container-type: inline-size; }}"
            f".st-key-{note} {{ display: none; }}"
            f"@container (max-width: {width_px - 1}px) {{ .st-key-{note} {{ display: flex; }} }}"
            "</style>")
    with st.container(key=note):
        st.caption(text)
