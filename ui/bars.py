"""A progress bar for one long backend call on a page, gone when the call ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import streamlit as st

# Moves the bar: fraction done (0..1) and the text beside it.
Advance = Callable[[float, str], None]


@contextmanager
def progress_bar(text: str, *, lazy: bool = False) -> Iterator[Advance]:
    """Yield a function that moves a bar; the bar is removed however the block ends.

    With `lazy`, nothing is drawn until the first move, so that work found
    already done (a cache hit) shows no bar that would only flicker.
    """
    bar = None if lazy else st.progress(0.0, text=text)

    def advance(fraction: float, text: str) -> None:
        nonlocal bar
        fraction = min(max(fraction, 0.0), 1.0)
        if bar is None:
            bar = st.progress(fraction, text=text)
        else:
            bar.progress(fraction, text=text)

    try:
        yield advance
    finally:
        if bar is not None:
            bar.empty()
