"""What the Playground draws in colour can be read: WCAG 2 contrast ratios, computed from
the colours the views hand the browser (4.5:1 for text, 3:1 for a bar that carries a
number)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from backend import views
from backend.core.config import EngineConfig
from backend.engine.engine import Engine
from backend.engine.ops import Add, Finish, Step
from backend.io.snapshot import export_snapshot
from backend.views import grid, html
from backend.views.compare import charts

WHITE = "#FFFFFF"


def _channels(colour: str) -> tuple[float, float, float]:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return r, g, b


def _over(colour: str, opacity: float, background: str) -> str:
    """`colour` at `opacity` over an opaque `background`, as the browser blends it."""
    return "#" + "".join(f"{round(c * opacity + b * (1 - opacity)):02X}"
                         for c, b in zip(_channels(colour), _channels(background), strict=True))


def _over_white(colour: str, opacity: float) -> str:
    return _over(colour, opacity, WHITE)


def _luminance(colour: str) -> float:
    def linear(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in _channels(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_formula_matches_wcag_reference_pairs() -> None:
    assert contrast("#000000", WHITE) == pytest.approx(21.0)
    assert contrast("#767676", WHITE) == pytest.approx(4.54, abs=0.01)
    assert contrast(WHITE, WHITE) == 1.0


@pytest.fixture(scope="module")
def grid_of_every_colour() -> object:
    """A grid with a request in each of the palette's colours, one cached block and one
    request picked (the others fade)."""
    e = Engine(EngineConfig(num_blocks=40, block_size=4), kernel="torch")
    for i in range(len(grid.PALETTE) + 1):
        e.apply(Add(f"R{i}", prompt=f"request number {i} here", max_new_tokens=8))
    e.apply(Step(1))
    e.apply(Finish("R0"))
    snap = export_snapshot(e)
    picked = {b for r in snap["requests"] if r["id"] == "R1" for b in r["block_table"]}
    return views.grid_frame(snap, focus_blocks=picked)


def test_every_cells_number_bar_and_faded_text_can_be_read(grid_of_every_colour: object
                                                          ) -> None:
    df = grid_of_every_colour
    used = df[df["state"] == "used"]                                    # type: ignore[index]
    assert used["cell_color"].nunique() == len(grid.PALETTE)
    for _, cell in df.iterrows():                                       # type: ignore[attr-defined]
        tint = _over_white(cell["cell_color"], cell["cell_opacity"])
        # The block's number in its corner, and the owner's label.
        assert contrast(grid.ID_INK, tint) >= 4.5, cell["id"]
        assert contrast(grid.INK, tint) >= 4.5, cell["id"]
        # As drawn: a faded cell (a highlight elsewhere) at its alpha, its text and bar
        # at theirs, over it.
        faded = _over_white(tint, cell["alpha"])
        for ink in (grid.INK, grid.ID_INK):
            assert contrast(_over(ink, cell["text_alpha"], faded), faded) >= 4.5, cell["id"]
        if cell["num_filled"]:
            bar = _over(cell["bar_color"], cell["text_alpha"], faded)
            assert contrast(bar, faded) >= 3.0, (cell["id"], cell["bar_color"])
    assert (df["alpha"] < 1).any() and (df["state"] == "cached").any()  # type: ignore[index]


def test_event_badges_and_muted_playground_text_can_be_read() -> None:
    for kind, colour in html._KIND_BADGE.items():
        assert contrast(WHITE, colour) >= 4.5, kind
    # Every colour the Playground's HTML writes for text, on the lightest background
    # it sits on (#FAFAFA).
    source = Path(html.__file__).read_text(encoding="utf-8")
    colours = set(re.findall(r"[^-]color:(#[0-9A-Fa-f]{3,6})\b", source))
    assert colours
    for colour in colours:
        full = colour if len(colour) == 7 else "#" + "".join(c * 2 for c in colour[1:])
        if full.upper() == WHITE:
            continue            # the badges' text, checked above on their fills
        assert contrast(full, "#FAFAFA") >= 4.5, colour


def test_the_compare_pages_memory_states_differ_in_lightness_as_said() -> None:
    """charts.py's promise: each state at least 1.3 times the luminance of the next
    darker (+0.05, WCAG's flare), except token states and external fragmentation, the
    two darkest, which differ in hue (blue against red)."""
    by_kind = dict(zip(charts.KIND_DOMAIN, charts.KIND_COLORS, strict=True))
    order = ["token states", "external fragmentation", "internal fragmentation",
             "reservation", "free"]
    for darker, lighter in itertools.pairwise(order):
        assert _luminance(by_kind[darker]) < _luminance(by_kind[lighter])
        ratio = contrast(by_kind[darker], by_kind[lighter])
        assert darker == "token states" or ratio >= 1.3, (darker, lighter, ratio)
