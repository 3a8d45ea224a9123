"""Small HTML fragments for the views that must be text in the page (not canvas).

Block layouts, the legend and the event log are text a reader (and a browser
test, and a screen reader) can select; charts draw on a canvas. Every piece of
user-supplied text (request ids, token text) is escaped here.
"""

from __future__ import annotations

from html import escape

import pandas as pd

from backend.core.words import counted
from backend.views.glossary import EVENTS
from backend.views.grid import CACHED_LABEL, INK, PALETTE
from backend.views.legend import legend_entries, swatch_html
from backend.views.metrics import MetricItem
from backend.views.model import (
    Chunk,
    Snapshot,
    owner_index,
    request_of,
    text_by_block,
)

_CHIP = ("display:inline-block;margin:2px 4px 2px 0;border:1px solid {border};"
         "border-left:6px solid {color};border-radius:4px;padding:1px 6px 2px 6px;"
         "background:{bg};vertical-align:top;")
_LABEL = "display:block;font-size:11px;color:#555;line-height:1.3;"
# pre-wrap keeps every space visible; break-all keeps a 256-slot block from running
# off the page.
_TEXT = ("display:block;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;"
         "font-size:13px;white-space:pre-wrap;word-break:break-all;max-width:36ch;"
         "color:#1F1F1F;line-height:1.35;")


# A term that explains itself on hover: dotted underline, a help cursor, the title.
_TERM = "text-decoration:underline dotted #9A9A9A;text-underline-offset:3px;cursor:help;"


def term_html(text: str, tip: str) -> str:
    """`text` (escaped) with `tip` as its tooltip, marked as having one."""
    return (f"<span class='pl-term' title='{escape(tip, quote=True)}' style='{_TERM}'>"
            f"{escape(text)}</span>")


def _color(slot: int) -> str:
    return PALETTE[slot % len(PALETTE)]


# A real model's tokens on alternating tints, so each token's extent shows (where a
# word splits, which token a leading space belongs to).
_TOKEN_TINTS = ("rgba(0,114,178,0.10)", "rgba(230,159,0,0.16)")


def _title(piece: str, split: str | None) -> str:
    """A token's tooltip: its text, and the character its bytes are part of, if split."""
    if split is None:
        return piece
    return f"{piece}: bytes of {split}, a character split across tokens"


# The dots of a partial block's empty slots: faint on purpose, and decorative, since the
# chip's label says the same in words ("3/4, partial").
EMPTY_SLOT_COLOUR = "#BBBBBB"
# A tiny-byte token written by its code ("\\n", "\\x1b") is tinted, so it reads apart
# from the characters "\\" and "n" typed into a prompt, each a token of its own.
_ESCAPE_STYLE = "color:#6A3D9A;background:rgba(106,61,154,0.10);border-radius:2px;"
_NAMED_BYTES = {"\\n": "a line break", "\\t": "a tab", "\\r": "a carriage return"}


def escape_title(piece: str) -> str:
    """What a byte written by its code is: "one byte, 0x0a: a line break"."""
    code = ord(piece.encode("ascii").decode("unicode_escape"))
    return f"one byte, 0x{code:02x}" + (f": {_NAMED_BYTES[piece]}" if piece in _NAMED_BYTES
                                        else ", shown by its code")


def _byte_html(piece: str, split: str | None) -> str:
    """One tiny-byte token: a character as itself, a byte written by its code tinted."""
    coded = len(piece) > 1
    if split is None and not coded:
        return escape(piece)
    tip = _title(piece, split) if split is not None else escape_title(piece)
    style = (_ESCAPE_STYLE if coded else "") + (_TERM if split is not None else "")
    kind = "pl-split" if split is not None else "pl-esc"
    return (f"<span class='{kind}' title='{escape(tip, quote=True)}' style='{style}'>"
            f"{escape(piece)}</span>")


def pieces_html(chunk: Chunk, start: int = 0, stop: int | None = None) -> str:
    """The chunk's tokens [start, stop), escaped: tiny-byte's bytes as one string (a byte
    written by its code tinted, `pl-esc`), a real model's pieces each in its own tinted
    span (`pl-tok`, its text as the title). A token holding part of a split character
    ("\\xe2" of "☕") names it in its title."""
    pieces = chunk.pieces[start:stop]
    split = (chunk.split or (None,) * len(chunk.pieces))[start:stop]
    if not chunk.subword:
        # A plain character inline: layouts of long prompts build thousands per rerun.
        return "".join(escape(p) if ch is None and len(p) == 1 else _byte_html(p, ch)
                       for p, ch in zip(pieces, split, strict=True))
    # Tinted by position in the request, so the tints alternate across chunks too.
    first = chunk.logical * chunk.block_size + start
    return "".join(
        f"<span class='pl-tok' title='{escape(_title(p, ch), quote=True)}' style='background:"
        f"{_TOKEN_TINTS[(first + i) % 2]};border-radius:2px'>"
        f"{escape(p)}</span>"
        for i, (p, ch) in enumerate(zip(pieces, split, strict=True)))


def chip_html(chunk: Chunk, color: str, *, highlight: bool = False) -> str:
    """One logical block of a request: 'L1 → P2 ×2 (3/4)' over the characters it holds."""
    where = "no block" if chunk.physical is None else f"P{chunk.physical}"
    if chunk.physical is None and chunk.pending:
        where = "no block yet"
    label = f"L{chunk.logical} → {where}"
    if chunk.ref_count >= 2:
        label += f" ×{chunk.ref_count}"
    if chunk.partial and chunk.physical is not None:
        label += f" ({chunk.num_filled}/{chunk.block_size}, partial)"
    if chunk.pending:
        label += f", {chunk.pending} to prefill"
    # Tokens still to prefill are greyed and struck through: their K/V is not in the
    # block yet. The empty slots of a partial block show as dots: the tail waste, in place.
    done = len(chunk.pieces) - chunk.pending
    text = pieces_html(chunk, 0, done)
    if chunk.pending:
        text += ("<span style='color:#6E6E6E;text-decoration:line-through'>"
                 f"{pieces_html(chunk, done)}</span>")
    text += f"<span style='color:{EMPTY_SLOT_COLOUR}'>" + "·" * (
        chunk.block_size - len(chunk.pieces)) + "</span>"
    border = INK if highlight else "#D0D0D0"
    bg = "#FFF8DC" if highlight else "#FAFAFA"
    return (f"<span class='pl-chip' style='{_CHIP.format(border=border, color=color, bg=bg)}'>"
            f"<span style='{_LABEL}'>{escape(label)}</span>"
            f"<span style='{_TEXT}'>{text}</span></span>")


def request_layout_html(snap: Snapshot, request_id: str, *,
                        highlight_blocks: frozenset[int] = frozenset(),
                        focused: bool = False) -> str:
    """A request's text laid out by block, each chunk labelled with where it lives."""
    req = request_of(snap, request_id)
    slot = owner_index(snap)[request_id]
    color = _color(slot)
    chunks = text_by_block(snap, request_id)
    status = req["status"]
    note = {
        "running": "",
        "waiting": " — waiting: holds no blocks until a step admits it",
        "finished": " — finished: its blocks were released",
    }.get(status, "")
    computed = req.get("num_computed_tokens")
    if status == "running" and computed is not None:
        note = (f" — prefilling: {computed:,} of {req['num_tokens']:,} tokens computed; the rest "
                "take their blocks as the token budget schedules them")
    parent = f", forked from {escape(req['parent'])}" if req["parent"] else ""
    if req.get("cache_salt"):
        parent += f", cache salt '{escape(req['cache_salt'])}'"
    head = (f"<div style='margin:6px 0 2px 0;font-size:14px'>"
            f"{'▶ ' if focused else ''}<b>{escape(request_id)}</b> "
            f"<span style='color:#555'>({escape(status)}, {counted(req['num_tokens'], 'token')}, "
            f"prompt {req['prompt_len']:,}{parent}){escape(note)}</span></div>")
    if status != "running":
        text = "".join(pieces_html(c) for c in chunks)
        return head + f"<div style='{_TEXT}color:#666;white-space:pre-wrap'>{text}</div>"
    body = "".join(chip_html(c, color, highlight=c.physical in highlight_blocks)
                   for c in chunks)
    return head + f"<div>{body}</div>"


def layouts_html(snap: Snapshot, request_ids: list[str], *,
                 highlight_blocks: frozenset[int] = frozenset(),
                 focused: frozenset[str] = frozenset()) -> str:
    return "<div class='pl-layouts'>" + "".join(
        request_layout_html(snap, rid, highlight_blocks=highlight_blocks,
                            focused=rid in focused) for rid in request_ids) + "</div>"


def legend_html(snap: Snapshot, request_ids: list[str] | None = None) -> str:
    """What the grid's colours and marks mean, in words next to each swatch.

    The entries are legend.legend_entries, the ones an exported grid draws too.
    """
    parts = []
    for e in legend_entries(snap, request_ids):
        text = escape(e.text)
        if e.kind == "cached":
            # The word as the grid draws it: in italics.
            text = text.replace(CACHED_LABEL, f"<i>{CACHED_LABEL}</i>", 1)
        elif e.kind == "shared":
            text = text.replace("×N", "<b>×N</b>", 1)
        swatch = (swatch_html(_rgba(e.fill, e.opacity), e.stroke, dashed=e.dashed,
                              border_w=max(1, round(e.stroke_w))) if e.swatch else "")
        # Each entry moves to the next line whole; one longer than the line (the cached
        # entry on a phone) wraps inside itself rather than running off the page.
        parts.append(f"<span style='margin-right:12px;display:inline-block;max-width:100%'>"
                     f"{swatch}{text}</span>")
    return "<div class='pl-legend' style='font-size:12px;line-height:1.9'>" + " ".join(parts) \
        + "</div>"


def _rgba(hex_color: str, opacity: float) -> str:
    """A swatch's fill as the grid shows it: its colour at the cell's opacity, over white."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{opacity:g})"


# White 11 px text on each: 4.5:1 or more (the palette's own hues had 2.3 to 4.0 for
# some), the hues kept.
_KIND_BADGE = {
    "alloc": "#0072B2", "free": "#6B6B6B", "share": "#00785A", "cow": "#B34E00",
    "prefix_hit": "#A8437F", "evict": "#7F6A00", "preempt": "#B2182B", "move": "#1F6FA0",
    "swap_out": "#6A3D9A", "swap_in": "#237A1E", "fork": "#8A6508",
}


# The event log's tallest: as high as its rows up to this, then it scrolls. A fixed box
# left a few events in a tall empty frame and many in a strip; this keeps about 25 rows in
# view beside the kernel and translator, and leaves a short window room for its heading.
EVENT_LOG_MAX_HEIGHT = "min(560px, 70vh)"


def event_log_html(events: pd.DataFrame) -> str:
    """The event log (newest first): step, a labelled kind and the plain-English line,
    as tall as its rows up to `EVENT_LOG_MAX_HEIGHT`, scrolling past it."""
    if events.empty:
        return "<div class='pl-events' style='color:#666'>No events yet.</div>"
    rows = []
    for step, kind, text in zip(events["step"], events["kind"], events["what happened"],
                                strict=True):
        badge = (f"<span style='flex:0 0 auto;min-width:74px;font-size:11px;"
                 f"font-weight:600;color:#fff;background:{_KIND_BADGE[kind]};border-radius:3px;"
                 f"padding:0 5px;margin-right:6px;text-align:center;cursor:help' "
                 f"title='{escape(EVENTS.get(kind, ''), quote=True)}'>{escape(kind)}</span>")
        # A row of three columns: a line that wraps stays in the text's column.
        rows.append(f"<div style='display:flex;align-items:baseline;padding:1px 0;"
                    f"border-bottom:1px solid #EEE'>"
                    f"<span style='flex:0 0 58px;color:#555'>step {step}</span>{badge}"
                    f"<span style='flex:1 1 auto;min-width:0'>{escape(text)}</span></div>")
    # A log to assistive technology: named, and read as a list of lines, newest first.
    return ("<div class='pl-events' role='log' aria-label='Event log, newest first' "
            # Framed, as the box it was: a row cut at its foot reads as more to scroll.
            f"style='font-size:13px;max-height:{EVENT_LOG_MAX_HEIGHT};overflow-y:auto;"
            "border:1px solid #DDD;border-radius:8px;padding:4px 10px'>"
            + "".join(rows) + "</div>")


def metrics_html(items: list[MetricItem]) -> str:
    """The metrics as compact cards, one per group; each value carries its label.

    `data-label` lets a reader of the page's HTML (a test, a scraper) find a
    number by its name; each label is a term whose tooltip explains it, and a
    closed "What these numbers mean" below the cards says the same to a keyboard.
    """
    groups: dict[str, list[MetricItem]] = {}
    for m in items:
        groups.setdefault(m.group, []).append(m)
    cards = []
    for group, ms in groups.items():
        rows = "".join(
            f"<div style='display:flex;justify-content:space-between;gap:10px;padding:1px 0'>"
            f"<span style='color:#555'>{term_html(m.label, m.help)}</span>"
            # The value on one line ("0 blocks (0 tokens)" split after its "(0"
            # read as two figures); a narrow card wraps the label instead.
            f"<b class='pl-metric' style='white-space:nowrap;text-align:right' "
            f"data-label='{escape(m.label, quote=True)}'>{escape(m.value)}</b></div>"
            for m in ms)
        cards.append(f"<div style='flex:1 1 210px;border:1px solid #E3E6EA;border-radius:6px;"
                     f"padding:6px 10px;background:#FBFCFD'><div style='font-size:11px;"
                     f"text-transform:uppercase;letter-spacing:.04em;color:#666;"
                     f"margin-bottom:2px'>{escape(group)}</div>{rows}</div>")
    # The tooltips again, where a keyboard reaches them: a title shows only to a mouse.
    meanings = "".join(
        f"<dt style='font-weight:600;font-size:13px;margin:4px 0 0 0;padding:0'>"
        f"{escape(m.label)}</dt><dd style='font-size:13px;margin:0 0 0 12px;padding:0'>"
        f"{escape(m.help)}</dd>" for m in items)
    glossary = ("<details class='pl-meanings' style='flex:1 1 100%;color:#444'>"
                "<summary style='cursor:pointer;color:#444'>What these numbers mean</summary>"
                f"<dl style='margin:4px 0 0 0'>{meanings}</dl></details>")
    return ("<div class='pl-metrics' style='display:flex;flex-wrap:wrap;gap:8px;"
            "font-size:13px'>" + "".join(cards) + glossary + "</div>")
