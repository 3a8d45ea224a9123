"""The block grid's legend, one list of entries for the page (HTML) and for exports (marks).

The page draws the legend as text beside the grid (html.legend_html); an exported
PNG or SVG has no page around it, so `grid_chart` draws the same entries as
Vega-Lite marks under the grid: a picture on a slide explains itself.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

import altair as alt

from backend.core.words import counted
from backend.views.grid import (
    CACHED_DASH,
    CACHED_FILL,
    CACHED_LABEL,
    CACHED_STROKE,
    FREE_FILL,
    INK,
    MUTED,
    PALETTE,
    grid_spec,
)
from backend.views.model import Snapshot, owner_index

EntryKind = Literal["owner", "cached", "free", "shared", "bar", "more"]

# An exported legend lists at most this many requests (a pool may hold hundreds).
MAX_EXPORT_OWNERS = 24
MAX_EXPORT_ID_CHARS = 24
CACHED_TEXT = (f"{CACHED_LABEL} = in the free queue with its K/V kept for a prefix hit "
               "(dashed border)")


def swatch_html(background: str, border: str, *, width: int = 12, height: int = 12,
                border_w: int = 1, dashed: bool = False,
                margin: str = "0 4px -1px 0") -> str:
    """One swatch of a page's legend: a small box filled `background` and edged `border`
    (dashed or solid), set in the line of text it explains. The grid's, the arena's and
    the memory maps' legends draw theirs with it, so they look alike."""
    return (f"<span style='display:inline-block;width:{width}px;height:{height}px;"
            f"border-radius:2px;margin:{margin};border:{border_w}px "
            f"{'dashed' if dashed else 'solid'} {border};background:{background}'></span>")


@dataclass(frozen=True, slots=True)
class LegendEntry:
    kind: EntryKind
    text: str              # what the entry says (a request's id, for an owner)
    fill: str = FREE_FILL  # the swatch: fill, its opacity, border colour, dashed or not
    opacity: float = 1.0
    stroke: str = MUTED
    stroke_w: float = 1.0
    dashed: bool = False

    @property
    def swatch(self) -> bool:
        return self.kind in ("owner", "cached", "free", "shared")


def legend_entries(snap: Snapshot, request_ids: list[str] | None = None) -> list[LegendEntry]:
    """The entries in order: each running request's colour, then what the marks mean.

    Swatches look like the cells they stand for (the same fill, opacity, border).
    """
    slots = owner_index(snap)
    ids = [r["id"] for r in snap["requests"] if r["status"] == "running"] \
        if request_ids is None else request_ids
    out = [LegendEntry("owner", rid, PALETTE[slots[rid] % len(PALETTE)], 0.35) for rid in ids]
    out += [
        LegendEntry("cached", CACHED_TEXT, CACHED_FILL, 0.6, CACHED_STROKE, 1.2, dashed=True),
        LegendEntry("free", "free"),
        LegendEntry("shared", "×N = shared by N tables (heavy border)", FREE_FILL, 1.0, INK,
                    2.0),
        LegendEntry("bar", "bottom bar = filled slots"),
    ]
    return out


# ---- the legend as marks, for exports ---------------------------------------------------

SWATCH = 12        # px
ROW_H = 18
CHAR_W = 5.4       # px per character of 11 px text: a generous average for sans-serif


def _export_entries(snap: Snapshot) -> list[LegendEntry]:
    entries = legend_entries(snap)
    owners = [e for e in entries if e.kind == "owner"]
    rest = [e for e in entries if e.kind != "owner"]
    shown = [e if len(e.text) <= MAX_EXPORT_ID_CHARS
             else LegendEntry("owner", e.text[:MAX_EXPORT_ID_CHARS - 1] + "…", e.fill, e.opacity)
             for e in owners[:MAX_EXPORT_OWNERS]]
    if len(owners) > MAX_EXPORT_OWNERS:
        more = counted(len(owners) - MAX_EXPORT_OWNERS, "more request")
        shown.append(LegendEntry("more", f"… and {more}"))
    return shown + rest


def legend_rows(snap: Snapshot, width: int) -> list[dict[str, Any]]:
    """Each entry placed in pixels, left to right, wrapping at `width`."""
    rows = []
    x = y = 0.0
    for e in _export_entries(snap):
        w = (SWATCH + 5 if e.swatch else 0) + CHAR_W * len(e.text) + 14
        if x > 0 and x + w > width:
            x, y = 0.0, y + ROW_H
        rows.append({
            "x0": x, "x1": x + SWATCH, "y0": y + 3, "y1": y + 3 + SWATCH,
            "tx": x + (SWATCH + 5 if e.swatch else 0), "ty": y + 3 + SWATCH / 2,
            "text": e.text, "swatch": e.swatch, "dashed": e.dashed, "fill": e.fill,
            "opacity": e.opacity, "stroke": e.stroke, "stroke_w": e.stroke_w,
        })
        x += w
    return rows


def legend_spec(snap: Snapshot, width: int) -> dict[str, Any]:
    """The legend as a Vega-Lite layered view with its data inline (pixel coordinates)."""
    rows = legend_rows(snap, width)
    height = (max(r["y0"] for r in rows) if rows else 0) + ROW_H

    def px(field: str) -> dict[str, Any]:
        return {"field": field, "type": "quantitative", "scale": None}

    def swatches(dashed: bool) -> dict[str, Any]:
        # A dash is a mark property in Vega-Lite, not an encoding: one layer each.
        return {
            "transform": [{"filter": f"datum.swatch && {'' if dashed else '!'}datum.dashed"}],
            "mark": {"type": "rect", "cornerRadius": 2,
                     **({"strokeDash": CACHED_DASH} if dashed else {})},
            "encoding": {"x": px("x0"), "x2": {"field": "x1"}, "y": px("y0"),
                         "y2": {"field": "y1"},
                         "fill": {"field": "fill", "type": "nominal", "scale": None},
                         "fillOpacity": px("opacity"),
                         "stroke": {"field": "stroke", "type": "nominal", "scale": None},
                         "strokeWidth": px("stroke_w")},
        }

    return {
        "data": {"values": rows},
        "width": width, "height": height,
        "layer": [
            swatches(dashed=False), swatches(dashed=True),
            {"mark": {"type": "text", "fontSize": 11, "color": INK, "align": "left",
                      "baseline": "middle"},
             "encoding": {"x": px("tx"), "y": px("ty"),
                          "text": {"field": "text", "type": "nominal"}}},
        ],
    }


def grid_chart(snap: Snapshot, *, page: int = 0, focus_blocks: Collection[int] = (),
               selectable: bool = True, legend: bool = True) -> alt.TopLevelMixin:
    """The grid (`grid_spec`) with its data inline and, under it, its legend.

    For exports and notebooks: what a PNG or SVG of the grid shows. Without the
    legend it is `grid_spec`'s layered chart as it is.
    """
    df, spec = grid_spec(snap, page=page, focus_blocks=focus_blocks, selectable=selectable)
    data = {"values": df.to_dict("records")}
    if not legend:
        return alt.LayerChart.from_dict({**spec, "data": data}, validate=False)
    top: dict[str, Any] = {k: spec[k] for k in ("$schema", "config", "autosize", "title",
                                                "params") if k in spec}
    view = {"data": data, "width": spec["width"], "height": spec["height"],
            "layer": spec["layer"]}
    return alt.VConcatChart.from_dict(
        {**top, "spacing": 12, "vconcat": [view, legend_spec(snap, int(spec["width"]))]},
        validate=False)
