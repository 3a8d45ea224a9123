"""The physical block pool as a Vega-Lite (Altair) grid: one cell per block.

Each cell says what it holds in more than colour (colour-blind readers, and
grey-scale prints, must lose nothing):

    used     tinted in its owner's colour, the owner's id as text (at most five
             characters: longer ids end in "…"); a bar along the bottom shows the
             filled slots (a full bar is a full block)
    shared   the same, with "×N" (the reference count) and a heavy border
    cached   grey, dashed border, "cached" in italics: free, but its K/V is still
             findable. Request ids are anyone's text, so no letter or glyph is safe
             from being an id; a six-letter word is, as no owner label is longer
             than five characters without an ellipsis (`owner_label`)
    free     white, thin border, no text

A focus (a request, or a block and its holders) fades every other cell. The
chart is a plain function of a snapshot, so it renders the same in the app and
in an exported PNG/SVG.

Pools larger than PAGE_SIZE blocks are drawn a page at a time (`page`), with
`overview_spec` summarising the whole pool. Pages of more than 256 cells use
small cells that carry only the non-colour marks (×N, C); ids and holders are
in every cell's tooltip and aria-label; cached cells keep their dashed border.

`legend.grid_chart` (exports) draws the grid with its legend under it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from backend.core.words import counted
from backend.views.host_pool import is_host
from backend.views.model import COLOUR_SLOTS, Snapshot, blocks_frame
from backend.views.tokens import block_tokens

# Okabe-Ito: distinguishable under the common colour-vision deficiencies. The two
# blues are first and last: at a cell's 35% they are alike, so they meet only when
# eight requests are live (five put slots 0 and 4 side by side).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#7F6A00", "#D55E00", "#F0E442",
           "#56B4E9")
assert len(PALETTE) == COLOUR_SLOTS
CACHED_FILL = "#BDBDBD"
FREE_FILL = "#FFFFFF"
INK = "#1F1F1F"
MUTED = "#8C8C8C"
# A block's number in its corner: at 8 px it needs 4.5:1 on every owner's tint (MUTED
# had 2.0 to 3.0).
ID_INK = "#4D4D4D"
# The filled-slot bar: each owner's colour at half its brightness, 4.5:1 or more on that
# owner's tint (in the colour itself it had 1.2 for yellow); a cached block's in grey.
BAR_PALETTE = tuple("#" + "".join(f"{int(c[i:i + 2], 16) // 2:02X}" for i in (1, 3, 5))
                    for c in PALETTE)
CACHED_BAR = "#555555"
CACHED_STROKE = "#555555"     # darker than a free cell's border, so the dashes show
CACHED_DASH = [3, 2]

# What a cached cell says. An owner's label is its id when that has at most
# OWNER_CHARS characters, else the first OWNER_CHARS - 1 and "…": never six letters.
CACHED_LABEL = "cached"
OWNER_CHARS = 5

# A bold character's width in the grid's font, as a share of its size, on average over
# the characters of a label (for choosing a label that fits before the `limit` cuts one):
# "A.10 ×2" fits the 46 px cell the grid asks for.
BOLD_EM = 0.5

PAGE_SIZE = 1024
# Above this many cells a page is drawn on a canvas: SVG's node per mark makes
# hovering a full page slow. (Streamlit guesses the same from a spec's unfiltered
# layers, which the grid's filtered layers hide from it, so it is said outright.)
CANVAS_CELLS = 1000
SELECTION = "block_pick"   # the Altair selection a click on a cell sets


def grid_shape(num_cells: int) -> tuple[int, int, int, int]:
    """(columns, rows, cell width px, cell height px) for a page of `num_cells` blocks."""
    cols = 16 if num_cells <= 256 else 32
    rows = max(1, -(-num_cells // cols))
    if cols == 16:
        return cols, rows, 46, 40
    return cols, rows, 23, 20


def num_pages(num_blocks: int) -> int:
    return max(1, -(-num_blocks // PAGE_SIZE))


def owner_label(request_id: str) -> str:
    """What a used cell says for its owner: the id, shortened to OWNER_CHARS with "…"."""
    if len(request_id) <= OWNER_CHARS:
        return request_id
    return request_id[:OWNER_CHARS - 1] + "…"


def grid_frame(snap: Snapshot, *, page: int = 0,
               focus_blocks: Collection[int] = ()) -> pd.DataFrame:
    """`blocks_frame` for one page, plus cell geometry, colours, labels and focus."""
    df = blocks_frame(snap)
    paged = num_pages(len(df)) > 1
    lo = page * PAGE_SIZE
    df = df.iloc[lo:lo + PAGE_SIZE].reset_index(drop=True)
    cols = grid_shape(PAGE_SIZE if paged else len(df))[0]
    idx = np.arange(len(df))
    col = idx % cols
    row = idx // cols
    # Cells are unit squares with a gap; the y scale is reversed, so row 0 is on top.
    df["x0"] = col + 0.06
    df["x1"] = col + 0.94
    df["y0"] = row + 0.06
    df["y1"] = row + 0.94
    df["xc"] = col + 0.5
    df["y_label"] = row + 0.42
    df["x_id"] = col + 0.11
    df["y_id"] = row + 0.09
    df["bar_x1"] = df["x0"] + (df["x1"] - df["x0"]) * df["fill"]
    df["bar_y0"] = row + 0.74
    state = df["state"].to_numpy()
    used = state == "used"
    cached = state == "cached"
    slot = df["owner_slot"].to_numpy()
    colour = np.where(slot >= 0, slot, 0) % len(PALETTE)
    df["cell_color"] = np.where(used, np.array(PALETTE)[colour],
                                np.where(cached, CACHED_FILL, FREE_FILL))
    df["cell_opacity"] = np.where(used, 0.35, np.where(cached, 0.6, 1.0))
    df["bar_color"] = np.where(used, np.array(BAR_PALETTE)[colour], CACHED_BAR)
    refs = df["ref_count"].to_numpy()
    shared = refs >= 2
    times = np.char.add("×", refs.astype(str))
    owner = np.array([owner_label(o) for o in df["owner"]], dtype=str)
    df["label"] = np.where(cached, CACHED_LABEL,
                           np.where(shared, np.char.add(np.char.add(owner, " "), times), owner))
    # A label too wide for its cell drawn narrow (a phone) gives up its ×N first: the
    # heavy border says shared, and the owner is the one thing only the text names.
    df["short"] = np.where(cached, CACHED_LABEL, owner)
    # Dense pages have no room for ids, nor for the cached word: only ×N, and the
    # cached cells' dashed border.
    df["mark"] = np.where(shared, times, "")
    df["fill_text"] = df["num_filled"].astype(str) + "/" + df["block_size"].astype(str)
    texts = block_tokens(snap, df["id"].tolist())
    df["tokens"] = [texts.get(int(b), "") for b in df["id"]]
    # What a screen reader announces for a cell (Vega writes it as the cell's aria-label).
    held = np.where(df["holders"].to_numpy() != "", "held by " + df["holders"].astype(str),
                    "held by no request")
    df["aria"] = ("Block " + df["id"].astype(str) + ": " + df["state"].astype(str)
                  + ", ref count " + df["ref_count"].astype(str) + ", "
                  + df["fill_text"] + " slots filled, " + held)
    focus = df["id"].isin(set(focus_blocks)).to_numpy() if focus_blocks else np.ones(len(df),
                                                                                    bool)
    df["focus"] = focus
    df["alpha"] = np.where(focus, 1.0, 0.18)
    # Text and filled-slot bars fade less than the cells: at 0.18 text read at 1.4:1.
    # At 0.85 a block's number still has 4.5:1 over its faded cell.
    df["text_alpha"] = np.where(focus, 1.0, 0.85)
    focused = focus & bool(focus_blocks)
    df["stroke"] = np.where(focused | shared, INK, np.where(cached, CACHED_STROKE, MUTED))
    df["stroke_w"] = np.where(focused, 3.0, np.where(shared, 2.0,
                                                     np.where(cached, 1.2, 0.8)))
    return df


# The columns the chart reads; the rest of grid_frame stays server-side.
CHART_COLUMNS = ["id", "state", "ref_count", "fill_text", "hash8", "holders", "tokens",
                 "num_filled",
                 "x0", "x1", "y0", "y1", "xc", "y_label", "x_id", "y_id", "bar_x1", "bar_y0",
                 "cell_color", "cell_opacity", "bar_color", "label", "short", "mark", "alpha",
                 "stroke", "stroke_w", "aria", "text_alpha"]


def grid_spec(snap: Snapshot, *, page: int = 0, focus_blocks: Collection[int] = (),
              selectable: bool = True, titled: bool = True
              ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The grid as (data, Vega-Lite spec without its data); see the module docstring.

    `titled=False` leaves the title (`grid_title`) to the page, so the first row
    of cells starts at the chart's top edge.

    Written as a plain spec rather than through Altair's builders because
    building and validating the Altair objects costs tens of milliseconds on
    every render; `legend.grid_chart` wraps the same spec as an Altair chart, and the
    tests validate it against the Vega-Lite schema.
    """
    df = grid_frame(snap, page=page, focus_blocks=focus_blocks)[CHART_COLUMNS]
    paged = num_pages(len(snap["blocks"])) > 1
    cols, _, cw, ch = grid_shape(PAGE_SIZE if paged else len(df))
    rows = max(1, -(-len(df) // cols))
    dense = cols > 16
    xs = {"domain": [0, cols], "nice": False, "zero": False}
    ys = {"domain": [0, rows], "nice": False, "zero": False, "reverse": True}

    def q(field: str, scale: dict[str, Any]) -> dict[str, Any]:
        return {"field": field, "type": "quantitative", "scale": scale, "axis": None}

    def raw(field: str, kind: str = "nominal") -> dict[str, Any]:
        return {"field": field, "type": kind, "scale": None}

    tooltip = [
        {"field": "id", "type": "quantitative", "title": "block"},
        {"field": "state", "type": "nominal"},
        {"field": "ref_count", "type": "quantitative", "title": "ref count"},
        {"field": "fill_text", "type": "nominal", "title": "filled slots"},
        {"field": "hash8", "type": "nominal", "title": "hash prefix"},
        {"field": "holders", "type": "nominal"},
        {"field": "tokens", "type": "nominal"},
    ]
    alpha = raw("alpha", "quantitative")
    text_alpha = raw("text_alpha", "quantitative")
    # Drawn cells, fill bars and labels are pictures only; a transparent rect per cell
    # on top of them takes the hover, the click and the screen reader's attention, so a
    # click on a label selects its block too.

    def cells(dashed: bool) -> dict[str, Any]:
        # Vega-Lite draws a rect's dash only as a mark property (an encoding is
        # dropped with a warning), hence one layer of solid cells, one of cached ones.
        return {
            "transform": [{"filter": f"{'' if dashed else '!'}(datum.state == 'cached')"}],
            "mark": {"type": "rect", "cornerRadius": 2, "aria": False,
                     **({"strokeDash": CACHED_DASH} if dashed else {})},
            "encoding": {
                "x": q("x0", xs), "x2": {"field": "x1"}, "y": q("y0", ys),
                "y2": {"field": "y1"},
                "fill": raw("cell_color"), "fillOpacity": raw("cell_opacity", "quantitative"),
                "stroke": raw("stroke"), "strokeWidth": raw("stroke_w", "quantitative"),
                "opacity": alpha,
            },
        }

    bars = {
        "transform": [{"filter": "datum.num_filled > 0"}],
        "mark": {"type": "rect", "aria": False},
        "encoding": {"x": q("x0", xs), "x2": {"field": "bar_x1"}, "y": q("bar_y0", ys),
                     "y2": {"field": "y1"}, "fill": raw("bar_color"), "opacity": text_alpha},
    }
    text_field = "mark" if dense else "label"

    def font(size: float, least: float) -> dict[str, str]:
        # The page may draw the grid narrower than `width` asks (a narrow window):
        # text shrinks with the cells, `size` at full width, never under `least`.
        return {"expr": f"clamp({size} * width / {cols * cw}, {least}, {size})"}

    def within(share: float) -> dict[str, str]:
        # Text at most `share` of a column's drawn width (the cell's rect is 0.88 of it,
        # from 0.06 to 0.94), cut with "…" past it: on a phone a cell is some 22 px, too
        # narrow for "B.0 ×4" at the smallest font. (The tooltip, Inspect a block and the
        # block tables say it whole.)
        return {"expr": f"{share} * width / {cols}"}

    size = font(9, 7) if dense else font(11, 8)
    # The whole label where it fits, else the owner alone ("B.0" for "B.0 ×4"), by the
    # width of a bold character (about half the font's size) at the size drawn. A dense
    # page's ×N takes what room it needs, as it did: "×100" is its longest.
    fits = f"length(datum.label) * {BOLD_EM} * ({size['expr']}) <= ({within(0.88)['expr']})"
    labels = {
        "transform": [{"filter": f"datum.{text_field} != '' && datum.state != 'cached'"}],
        "mark": {"type": "text", "fontSize": size, "fontWeight": "bold",
                 "color": INK, "baseline": "middle", "aria": False,
                 **({} if dense else {"limit": within(0.88),
                                      "text": {"expr": f"{fits} ? datum.label : datum.short"}})},
        "encoding": {"x": q("xc", xs), "y": q("y_label", ys), "opacity": text_alpha,
                     **({"text": {"field": text_field, "type": "nominal"}} if dense else {})},
    }
    layers: list[dict[str, Any]] = [cells(dashed=False), cells(dashed=True), bars, labels]
    if not dense:
        # The cached word in italics and not bold: it reads as a note, not as an owner.
        layers.append({
            "transform": [{"filter": "datum.state == 'cached'"}],
            "mark": {"type": "text", "fontSize": font(10, 7.5), "fontStyle": "italic",
                     "color": INK, "limit": within(0.84),
                     "baseline": "middle", "aria": False},
            "encoding": {"x": q("xc", xs), "y": q("y_label", ys),
                         "text": {"field": "label", "type": "nominal"}, "opacity": text_alpha},
        })
    if not dense:
        layers.append({
            "mark": {"type": "text", "fontSize": 8, "color": ID_INK, "align": "left",
                     "baseline": "top", "limit": within(0.8), "aria": False},
            "encoding": {"x": q("x_id", xs), "y": q("y_id", ys),
                         "text": {"field": "id", "type": "quantitative"}, "opacity": text_alpha},
        })
    hit: dict[str, Any] = {
        "name": "cells",
        "mark": {"type": "rect", "fill": INK, "fillOpacity": 0, "cursor": "pointer"},
        "encoding": {"x": q("x0", xs), "x2": {"field": "x1"}, "y": q("y0", ys),
                     "y2": {"field": "y1"}, "tooltip": tooltip,
                     "description": {"field": "aria", "type": "nominal"}},
    }
    layers.append(hit)
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": cols * cw, "height": rows * ch,
        "config": {"view": {"stroke": None}},
        # Keep the cells their size: the default "fit" squeezes the rows to make room
        # for the title.
        "autosize": {"type": "pad"},
        "layer": layers,
    }
    # The chart's text alternative (Vega writes it as the view's aria-label): what the
    # page holds in sum; each cell then reads its own line, where the grid is SVG.
    spec["description"] = grid_description(snap, df, page)
    if len(df) > CANVAS_CELLS:
        spec["usermeta"] = {"embedOptions": {"renderer": "canvas"}}
    if titled:
        spec["title"] = {"text": grid_title(snap, page), "anchor": "start", "fontSize": 12,
                         "fontWeight": "normal"}
    if selectable:
        # At the top level, naming its view: where Altair hoists a layer's params anyway.
        spec["params"] = [{"name": SELECTION, "views": ["cells"], "select": {
            "type": "point", "fields": ["id"], "on": "click", "clear": "dblclick"}}]
    return df, spec


def grid_description(snap: Snapshot, cells: pd.DataFrame, page: int = 0) -> str:
    """The grid in one sentence, for a screen reader: its blocks by state, and where
    each block is told ("Physical blocks 0–31 (4 slots each): 9 used, 3 of them
    shared, 1 cached, 22 free. ...")."""
    state = cells["state"]
    used = int((state == "used").sum())
    shared = int(((state == "used") & (cells["ref_count"] >= 2)).sum())
    # The host pool caches nothing: "0 cached" there would suggest it could.
    cached = [] if is_host(snap) else [f"{int((state == 'cached').sum()):,} cached"]
    parts = [f"{used:,} used" + (f", {shared:,} of them shared" if shared else ""),
             *cached, f"{int((state == 'free').sum()):,} free"]
    where = ("Each block is described in turn; the block tables below give every request's "
             "blocks in text" if len(cells) <= CANVAS_CELLS else
             "Drawn as a picture; Inspect a block and the block tables below give the same "
             "in text")
    return f"{grid_title(snap, page)}: {', '.join(parts)}. {where}."


def grid_title(snap: Snapshot, page: int = 0) -> str:
    """What the grid (or this page of it) shows."""
    total = len(snap["blocks"])
    each = counted(snap["config"]["block_size"], "slot")
    # The host pool's grid is told apart from the device pool's, which it is drawn like.
    block = "Host pool block" if is_host(snap) else "Physical block"
    if total == 1:
        return f"{block} 0 ({each})"
    if num_pages(total) == 1:
        return f"{block}s 0–{total - 1:,} ({each} each)"
    lo = page * PAGE_SIZE
    hi = min(total, lo + PAGE_SIZE) - 1
    return f"{block}s {lo:,}–{hi:,} of {total:,} ({each} each)"


def overview_frame(snap: Snapshot, group: int = 64) -> pd.DataFrame:
    """Used / cached / free counts per run of `group` blocks, for pools beyond one page."""
    states = np.array([b["state"] for b in snap["blocks"]])
    n = len(states)
    rows = []
    for first in range(0, n, group):
        chunk = states[first:first + group]
        for state in ("used", "cached", "free"):
            rows.append({"first": first, "last": min(first + group, n) - 1, "state": state,
                         "blocks": int((chunk == state).sum())})
    return pd.DataFrame(rows)


def overview_spec(snap: Snapshot, group: int = 64) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A stacked bar per run of `group` blocks: how much of each run is used, cached, free."""
    df = overview_frame(snap, group)
    df["order"] = df["state"].map({"used": 0, "cached": 1, "free": 2})
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        # As wide as a dense page of the grid; fixed sizes, as there (see grid_spec).
        "width": 32 * 23, "height": 90, "autosize": {"type": "pad"},
        "title": {"text": "Whole pool", "anchor": "start", "fontSize": 12},
        "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "first", "type": "ordinal",
                  "title": f"first block of each run of {group}",
                  "axis": {"labelOverlap": True}},
            "y": {"field": "blocks", "type": "quantitative", "title": "blocks", "stack": "zero"},
            "color": {"field": "state", "type": "nominal",
                      "scale": {"domain": ["used", "cached", "free"],
                                "range": [PALETTE[0], MUTED, "#E8E8E8"]},
                      "legend": {"orient": "top", "title": None}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "first", "type": "quantitative"},
                        {"field": "last", "type": "quantitative"},
                        {"field": "state", "type": "nominal"},
                        {"field": "blocks", "type": "quantitative"}],
        },
        "description": overview_description(df, group),
    }
    return df, spec


def overview_description(runs: pd.DataFrame, group: int = 64) -> str:
    """The overview in one sentence, for a screen reader: the pool's blocks by state and
    the run most in use ("Whole pool of 4,096 blocks in runs of 64: 300 used, 0 cached,
    3,796 free; the most used run, blocks 0–63, has 64 used.")."""
    by = runs.groupby("state")["blocks"].sum()
    total = int(by.sum())
    counts = ", ".join(f"{int(by.get(state, 0)):,} {state}" for state in ("used", "cached", "free"))
    used = runs[runs["state"] == "used"]
    busiest = ""
    if not used.empty and int(used["blocks"].max()) > 0:
        row = used.loc[used["blocks"].idxmax()]
        busiest = (f"; the most used run, blocks {int(row['first']):,}–{int(row['last']):,}, "
                   f"has {int(row['blocks']):,} used")
    return (f"Whole pool of {total:,} blocks in runs of {group}: {counts}{busiest}. The "
            "grid below draws the page picked in Blocks shown.")


def icon_pixels(size: int = 32) -> np.ndarray:
    """The app's favicon: a 3 x 3 grid of blocks in the grid's colours, as RGB pixels.

    Drawn here rather than named as a `:material/...:` icon, which Streamlit's page
    loads from fonts.gstatic.com: every viewer's browser would ask Google for it.
    """
    img = np.full((size, size, 3), 255, dtype=np.uint8)
    cell = size // 3
    fills = [PALETTE[0], PALETTE[0], CACHED_FILL, PALETTE[1], PALETTE[0], "#FFFFFF",
             PALETTE[1], CACHED_FILL, PALETTE[2]]
    for i, fill in enumerate(fills):
        r, c = divmod(i, 3)
        rgb = [int(fill[k:k + 2], 16) for k in (1, 3, 5)]
        y, x = r * cell, c * cell
        img[y:y + cell, x:x + cell] = (0x55, 0x55, 0x55)             # the cell's border
        img[y + 1:y + cell - 1, x + 1:x + cell - 1] = rgb
    return img
