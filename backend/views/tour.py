"""Views for the Scenarios page: the narrated numbers, checked, and the contiguous arena's map.

Pure functions of a frame's data (backend/sessions/tour.py), like the other views: the
page renders what they return and tests read the same HTML.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

import pandas as pd

from backend.core.words import counted, visible
from backend.views.compare.frames import PAPER_SYSTEMS, POLICY_SHORT
from backend.views.describe import capped, span
from backend.views.glossary import path_help
from backend.views.grid import CACHED_FILL, INK, MUTED, PALETTE
from backend.views.html import term_html
from backend.views.legend import swatch_html
from backend.views.metrics import CARD_NAMES
from backend.views.model import Snapshot, owner_index

MAX_VALUE_CHARS = 120

# The swap metrics have no card: the Host pool's caption says them, in these words.
HOST_NAMES = {
    "cpu_used_blocks": "host pool: blocks holding swapped-out K/V",
    "swapped_requests": "host pool: requests swapped out",
    "swap_outs": "host pool: swap-outs so far",
    "swap_ins": "host pool: swap-ins so far",
}

# The arena map is as wide as a 16-column block grid (16 cells of 46 px), so a
# one-slot-per-block pool and an arena of the same capacity line up slot for slot.
ARENA_WIDTH = 16 * 46
ARENA_HEIGHT = 40
# A run's label fits when the run is this many px per character wide, plus a margin: the
# arena's 11 px bold text.
CHAR_PX = 7.5
LONG_MARGIN_PX = 8
SHORT_MARGIN_PX = 6

ARENA_KINDS = {
    # kind: (label in the legend, fill opacity over the owner's colour, dashed border)
    "token_states": ("tokens", 0.35, False),
    "reservation": ("reserved for future tokens", 0.08, True),
    "internal_fragmentation": ("reserved, never used (internal fragmentation)", 0.0, True),
    "external_fragmentation": ("hole too small for the next request (external "
                               "fragmentation)", 1.0, True),
    "free": ("free", 1.0, False),
}
EXTERNAL_FILL = "#FBE3D6"


def _short(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def _short_middle(text: str) -> str:
    """`text` cut in the middle if long: a request's text ends with what it generated
    (after a chat template's long opening), which a cut at the end would hide."""
    if len(text) <= MAX_VALUE_CHARS:
        return text
    head = MAX_VALUE_CHARS // 3
    return text[:head] + "…" + text[len(text) - (MAX_VALUE_CHARS - head - 1):]


def _plain(value: Any) -> str:
    """Any JSON value in words: no braces, no quoted keys; lists of numbers in brackets."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, list):
        if not value:
            return "none"
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            return "[" + ", ".join(_plain(v) for v in value) + "]"    # a table, a token list
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_plain(v)}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False)


def format_value(value: Any) -> str:
    """A JSON value as a reader says it, shortened if long (see `value_text` for a path's)."""
    return _short(_plain(value))


def _slots(start: int, length: int) -> str:
    return f"slot {start}" if length == 1 else f"slots {start}–{start + length - 1}"


def value_text(path: str, value: Any) -> str:
    """The value at an expectation's `path`, in the words of what it is.

    A contiguous region, an address and the arena's holes are spelled out; text
    is quoted (its spaces matter) with control characters escaped as the layouts show
    them (a line break as \\n, `words.visible`); a keyword such
    as a finish reason loses its underscores. Anything else is `format_value`.
    """
    parts = path.split(".")
    head = parts[0]
    try:
        if head == "contiguous" and parts[1:2] == ["regions"] and isinstance(value, dict):
            return _short(f"{_slots(value['start'], value['reserved'])} ({value['reserved']} "
                          f"reserved), {_holding(value['tokens'])}, final length "
                          f"{value['final_len']}")
        if head == "contiguous" and parts[1:] == ["holes"] and isinstance(value, list):
            return _short(", ".join(f"{_slots(start, length)} ({length})"
                                    for start, length in value) or "none")
        if head == "address" and isinstance(value, dict):
            return (f"logical block {value['logical_block']}, offset {value['offset']} → "
                    f"physical block {value['physical_block']}, slot {value['slot']}")
    except (KeyError, TypeError, ValueError):
        pass    # an uploaded scenario's odd value: shown plainly below
    if isinstance(value, str):
        if head == "text":
            # Quoted, as its spaces matter; a line break as \n, as the layouts show it
            # (HTML would fold a raw one into a space).
            return _short_middle(f"“{visible(value)}”")
        if value.replace("_", "").isalpha() and value.islower():
            return value.replace("_", " ")
    return format_value(value)


# The kernel panel's fields as its lines say them.
KERNEL_NAMES = {"num_seqs": "kernel: sequences in its last step",
                "num_query_tokens": "kernel: query tokens in its last step",
                "max_abs_err": "kernel: max |paged − contiguous reference|"}


# Fields of requests and blocks whose names read badly as words ("num tokens").
FIELD_WORDS = {"num_tokens": "token count", "num_filled": "filled slots",
               "prompt_len": "prompt length", "num_preemptions": "preemptions",
               "num_computed": "tokens computed", "cum_logprob": "cumulative log-probability",
               "max_new_tokens": "max new tokens"}


def describe_path(path: str) -> str:
    """An expectation's path in words: 'requests.A.block_table' -> "A's block table"."""
    parts = path.split(".")
    head, rest = parts[0], parts[1:]

    def words(s: str) -> str:
        return FIELD_WORDS.get(s, s.replace("_", " "))

    # An id may hold dots (samples and beams are ID.k); in a request's path it runs to
    # the field, the last part that is not a list position ("requests.B.13.block_table.0").
    field = max((i for i, p in enumerate(rest) if not p.isdigit()), default=0)
    if head == "requests" and field >= 1:
        return (f"{'.'.join(rest[:field])}'s {words(rest[field])}"
                + "".join(f" [{i}]" for i in rest[field + 1:]))
    if head == "blocks" and len(rest) == 2:
        return f"block {rest[0]}: {words(rest[1])}"
    if head == "cpu_blocks" and len(rest) == 2:
        return f"host block {rest[0]}: {words(rest[1])}"
    if head == "metrics" and len(rest) == 1:
        return CARD_NAMES.get(rest[0]) or HOST_NAMES.get(rest[0]) or words(rest[0])
    if head == "kernel" and len(rest) == 1:
        return KERNEL_NAMES.get(rest[0], f"kernel {words(rest[0])}")
    if head == "address" and len(rest) >= 2:
        return f"address of {'.'.join(rest[:-1])}'s token {rest[-1]}"
    # Event kinds as the event log's badges name them ("prefix_hit", "swap_out").
    if head == "events" and len(rest) == 1:
        return f"{rest[0]} events so far"
    if head == "step_events" and len(rest) == 1:
        return f"{rest[0]} events in this step"
    if head == "text" and rest:
        return f"{'.'.join(rest)}'s text"
    if head == "contiguous":
        return "contiguous arena: " + " ".join(words(p) for p in rest)
    return path


def checks_html(checks: Sequence[Any]) -> str:
    """'What you should see': each narrated number with ✓ or ✗ and the value shown.

    `checks` are backend.sessions.tour.Check rows. Each row carries `data-ok` and its
    raw path (`data-path`) for readers of the HTML; the term's tooltip says what it
    means (glossary) and names the path, as the scenario file writes it.
    """
    if not checks:
        return "<div class='pl-checks' style='color:#666'>No numbers to check at this step.</div>"
    rows = []
    for c in checks:
        mark, color = ("✓", "#1A7F37") if c.ok else ("✗", "#B2182B")
        if c.ok:
            value = f"<b>{escape(value_text(c.path, c.got))}</b>"
        elif c.problem is not None and c.got is None:
            value = (f"expected <b>{escape(value_text(c.path, c.expected))}</b>, "
                     f"{escape(c.problem)}")
        else:
            value = (f"expected <b>{escape(value_text(c.path, c.expected))}</b>, the engine "
                     f"shows <b>{escape(value_text(c.path, c.got))}</b>")
        meaning = path_help(c.path)
        tip = f"{meaning} ({c.path})" if meaning else c.path
        rows.append(
            f"<div class='pl-check' data-ok='{int(c.ok)}' data-path='{escape(c.path, quote=True)}'"
            f" style='padding:2px 0;border-bottom:1px solid #EEE'>"
            f"<span style='display:inline-block;width:1.4em;font-weight:700;color:{color}'>"
            f"{mark}</span>{term_html(describe_path(c.path), tip)}: {value}</div>")
    return "<div class='pl-checks' style='font-size:14px'>" + "".join(rows) + "</div>"


# ---- the contiguous arena -------------------------------------------------------

def arena_frame(arena: dict[str, Any], snap: Snapshot) -> pd.DataFrame:
    """One row per run of slots in one state: geometry, colour and label.

    Owners get the colour the block grid gives the same request, so a request
    is one colour in both memories.
    """
    slots = owner_index(snap)
    rows = []
    for seg in arena["segments"]:
        kind = seg["kind"]
        owner = seg["owner"]
        label, opacity, dashed = ARENA_KINDS[kind]
        if owner is not None:
            color = PALETTE[slots.get(owner, 0) % len(PALETTE)]
        else:
            color = EXTERNAL_FILL if kind == "external_fragmentation" else "#FFFFFF"
        end = seg["start"] + seg["length"]
        long, short = _segment_words(kind, owner)
        px = seg["length"] * ARENA_WIDTH / arena["capacity"]
        rows.append({
            "x0": seg["start"], "x1": end, "xc": seg["start"] + seg["length"] / 2,
            "kind": label, "owner": owner or "", "color": color, "opacity": opacity,
            "dash": dashed, "text": _fitting(long, short, px), "long": long, "short": short,
            "slots": f"{seg['start']}–{end - 1}" if seg["length"] > 1 else str(seg["start"]),
            "length": seg["length"],
            "aria": f"slots {seg['start']} to {end - 1}: {label}"
                    + (f", request {owner}" if owner else ""),
        })
    return pd.DataFrame(rows)


def _segment_words(kind: str, owner: str | None) -> tuple[str, str]:
    """The words inside a run of slots: (long, short), the short ones for a narrow run."""
    return {
        "token_states": (owner or "", owner or ""),
        "reservation": (f"{owner} reserved", f"({owner})"),
        "internal_fragmentation": (f"{owner} unused", f"({owner})"),
        "external_fragmentation": ("hole", ""),
        "free": ("", ""),
    }[kind]


def _fitting(long: str, short: str, px: float) -> str:
    """The words a run `px` wide on screen shows: the long ones, the short, or none.
    (`_fitting_expr` is the same rule in Vega, for the width the chart is drawn at.)"""
    if px >= CHAR_PX * len(long) + LONG_MARGIN_PX:
        return long
    return short if px >= CHAR_PX * len(short) + SHORT_MARGIN_PX else ""


def _fitting_expr(cap: int) -> str:
    """`_fitting` as a Vega expression over a row of `arena_frame`, at the width the
    arena is drawn: a phone draws it narrower than ARENA_WIDTH, where the words chosen
    for the full width ("B reserved" in two slots) would run into the next run."""
    px = f"datum.length * width / {cap}"
    return (f"{px} >= {CHAR_PX} * length(datum.long) + {LONG_MARGIN_PX} ? datum.long : "
            f"{px} >= {CHAR_PX} * length(datum.short) + {SHORT_MARGIN_PX} ? datum.short : ''")


def arena_spec(arena: dict[str, Any], snap: Snapshot) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The arena as one horizontal bar of slots (Vega-Lite spec without its data).

    Tokens are tinted in the owner's colour, reserved-but-empty slots are the
    same colour faint with a dashed border, holes white (pale orange when too
    small for the request that waits). Labels say the same in text.
    """
    df = arena_frame(arena, snap)
    cap = arena["capacity"]
    xs = {"domain": [0, cap], "nice": False, "zero": False}
    x = {"field": "x0", "type": "quantitative", "scale": xs,
         # Flush labels: the first and last do not stick out past the ends, so the
         # arena is exactly as wide as the grid above it, at any width.
         "axis": {"title": "slot", "values": _ticks(cap), "grid": False, "labelFontSize": 10,
                  "labelFlush": True, "titleFontSize": 10, "titleFontWeight": "normal"}}
    y = {"value": 2}

    def runs(dashed: bool) -> dict[str, Any]:
        # Vega-Lite draws a rect's dash only as a mark property, not as an encoding,
        # hence one layer for solid borders and one for dashed ones.
        return {
            "transform": [{"filter": "datum.dash" if dashed else "!datum.dash"}],
            "mark": {"type": "rect", "aria": False, "cornerRadius": 2, "stroke": MUTED,
                     "strokeWidth": 1, **({"strokeDash": [4, 2]} if dashed else {})},
            "encoding": {
                "x": x, "x2": {"field": "x1"}, "y": y, "y2": {"value": ARENA_HEIGHT - 2},
                "fill": {"field": "color", "type": "nominal", "scale": None},
                "fillOpacity": {"field": "opacity", "type": "quantitative", "scale": None},
                "tooltip": [{"field": "slots", "type": "nominal"},
                            {"field": "kind", "type": "nominal", "title": "state"},
                            {"field": "owner", "type": "nominal", "title": "request"}],
                "description": {"field": "aria", "type": "nominal"}}}

    layers: list[dict[str, Any]] = [runs(dashed=False), runs(dashed=True)]
    if cap <= 64:
        # Slot boundaries, so a reader can count slots as in the paged grid.
        layers.append({
            "data": {"values": [{"s": s} for s in range(1, cap)]},
            "mark": {"type": "rule", "color": CACHED_FILL, "strokeWidth": 0.6, "aria": False},
            "encoding": {"x": {"field": "s", "type": "quantitative", "scale": xs},
                         "y": {"value": 2}, "y2": {"value": ARENA_HEIGHT - 2}}})
    layers.append(
        {"transform": [{"filter": "datum.long != ''"}],
         "mark": {"type": "text", "fontSize": 11, "fontWeight": "bold", "color": INK,
                  "baseline": "middle", "aria": False, "text": {"expr": _fitting_expr(cap)}},
         "encoding": {"x": {"field": "xc", "type": "quantitative", "scale": xs},
                      "y": {"value": ARENA_HEIGHT / 2}}})
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": ARENA_WIDTH, "height": ARENA_HEIGHT,
        "autosize": {"type": "pad"},
        "config": {"view": {"stroke": None}},
        "layer": layers,
        # The chart's aria-label; each run of slots keeps its own (the "aria" column).
        "description": arena_description(df, arena),
    }
    return df, spec


def arena_description(df: pd.DataFrame, arena: dict[str, Any]) -> str:
    """The arena in two sentences, from the runs `arena_frame` draws: each request's
    region and the slots in each state ("A contiguous arena of 16 slots, reservations of
    the exact final length as in the paper's Orca (Oracle), first fit; one region per
    request: A in slots 0–5 and C in slots 9–13. Slots by state: tokens 8, ...")."""
    owned = df[df["owner"] != ""]
    regions = [f"{owner} in slots {span(int(rows['x0'].min()), int(rows['x1'].max()) - 1)}"
               for owner, rows in owned.groupby("owner", sort=False)]
    where = (f"one region per request: {capped(regions)}" if regions else "no request in it")
    lengths = df.groupby("kind", sort=False)["length"].sum()
    states = ", ".join(f"{label} {int(lengths[label]):,}" for label, _, _ in
                       ARENA_KINDS.values() if label in lengths)
    return (f"A contiguous arena of {counted(arena['capacity'], 'slot')}, "
            f"{_reservations(arena['policy'])}; {where}. Slots by state: {states}.")


def _reservations(policy: str) -> str:
    """How an arena's policy reserves, in the words the Contiguous vs paged page uses and
    with the paper's name for it: "oracle" alone named none of them. The final length is
    the arena's (prompt + max_new_tokens, backend/io/contiguous_mirror.py)."""
    return (f"reservations of the {POLICY_SHORT[policy]} as in the paper's "
            f"{PAPER_SYSTEMS[policy]}, first fit")


def _ticks(capacity: int) -> list[int]:
    step = next(s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536,
                            1 << 20) if capacity / s <= 16)
    return list(range(0, capacity + 1, step))


def _holding(slots: int) -> str:
    """How many of an arena's slots hold tokens: "2 holding tokens", "1 holding a token"."""
    return f"{slots} holding {'a token' if slots == 1 else 'tokens'}"


def arena_caption(arena: dict[str, Any]) -> str:
    """The arena's slots by state (the paper's Figure 2 categories) in one line, then the
    reserved but empty slots as their sum, with the two meanings of "internal
    fragmentation" said side by side: the PagedAttention text counts all of them (unused
    space inside an allocation), the paper only those never to be used. Each figure
    once, so a reader does not meet the term with two numbers and no sum between."""
    b = arena["breakdown"]
    future, never = b["reservation"], b["internal_fragmentation"]
    unused = future + never
    text = "which the text calls internal fragmentation (unused space inside an allocation)"
    if not unused:
        empty = "none"
    elif not never:
        empty = (f"{unused}, all for future tokens, {text}; the paper calls none of them so, "
                 "since each will be used")
    elif not future:
        empty = (f"{unused}, none of them ever to be used: internal fragmentation in the "
                 "text's sense and the paper's")
    else:
        empty = (f"{unused} ({future} + {never}), {text}; the paper counts only the {never} "
                 "never used")
    return (f"{arena['capacity']} slots, {_reservations(arena['policy'])}: "
            f"{_holding(b['token_states'])} · {future} reserved for future tokens · "
            f"{never} reserved, never used · "
            f"{b['external_fragmentation']} external fragmentation · {b['free']} free. "
            f"Reserved but empty now: {empty}.")


def arena_message(arena: dict[str, Any]) -> str | None:
    """Why the first waiting request cannot be placed, if one waits, and which placed
    requests hold a different number of tokens here from the paged pool, and why."""
    fit = arena.get("next_fit")
    waiting = arena.get("waiting") or []
    parts = []
    if fit is not None and waiting:
        arrived = fit.get("tokens")
        holding = "" if arrived is None else f" with {counted(arrived, 'token')}"
        parts.append(f"{waiting[0]} waits{holding}: {fit['message']}.")
    if len(waiting) > 1:
        parts.append(f"Also waiting: {', '.join(waiting[1:])}.")
    never = arena.get("never_fits") or []
    if never:
        parts.append(f"Never fits in this arena: {', '.join(never)}.")
    # The arena runs on its own clock: whichever side made a request wait is behind.
    for rid, counts in (arena.get("out_of_step") or {}).items():
        here, there = counts["here"], counts["paged"]
        why = "it waited here for a region" if here < there else "the paged pool ran it later"
        pool = (f"the paged pool finished it at {there}" if counts.get("paged_status") ==
                "finished" else f"{there} in the paged pool")
        parts.append(f"{rid} holds {counted(here, 'token')} here and {pool}: {why}.")
    return " ".join(parts) or None


def arena_legend_html() -> str:
    """What the arena's fills and marks mean, in words next to each swatch."""
    items = [
        ("rgba(0,114,178,.35)", False, "A = A's tokens"),
        ("rgba(0,114,178,.08)", True, "A reserved = room kept for A's future tokens"),
        ("#FFF", True, "A unused = reserved beyond A's final length (internal fragmentation)"),
        (EXTERNAL_FILL, True,
         "hole = free, but too small for the waiting request (external fragmentation)"),
        ("#FFF", False, "free"),
    ]
    parts = [f"<span style='margin-right:12px'>"
             f"{swatch_html(fill, MUTED, width=18, dashed=dashed)}{escape(text)}</span>"
             for fill, dashed, text in items]
    return ("<div class='pl-arena-legend' style='font-size:12px;line-height:1.9'>"
            + "".join(parts) + "</div>")
