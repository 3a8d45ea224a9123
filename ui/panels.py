"""The views of an engine's state: metrics, the block grid, tables, events, kernel, addresses.

Each panel draws from a snapshot dict (so a page replaying a scenario can draw the
same views); only the address translator's key vector (ui/translator.py) and the
Kernel panel's check (ui/kernel_panel.py) need the live engine, since they read K/V
from the tensors. Widget keys carry a `prefix` so two pages can each keep their own
selection; `session.VIEW_PREFIXES` lists the prefixes whose keys `session.init` seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from backend import views
from backend.core.config import TINY_BYTE
from backend.core.errors import PagedLabError
from backend.core.words import agrees, counted
from backend.engine.engine import Engine
from backend.views import Snapshot
from backend.views.glossary import EVENTS
from backend.views.host_pool import has_host_pool, host_summary, host_view
from backend.views.model import column_label
from backend.views.text import plain_md
from backend.views.tokens import model_of
from ui import kernel_panel, layout, translator
from ui.memo import memo
from ui.numbers import number_text, whole, whole_input

# Requests whose text is laid out by block; the table above lists every request.
MAX_LAYOUTS = 12

# What each section shows, as its heading's tooltip (the "?" beside it).
HELP = {
    "pool": "Every physical KV block of the pool, one cell each: tinted in its holder's colour "
            "with the holder's id, ×N when N block tables share it, a bar for its filled "
            "slots. A cached block is free but keeps its K/V for a prefix hit.",
    "tables": "Each request's block table maps its logical blocks (0, 1, 2, ...) to physical "
              "blocks anywhere in the pool: the indirection that lets KV memory be allocated a "
              "block at a time. Hover a column's name for what it counts.",
    # Every kind with its meaning: a kind's badge says it on hover, which no keyboard
    # reaches; this tooltip opens on focus too.
    "events": "What the allocator did, newest first. Each kind (its badge says the same on "
              "hover):\n\n" + "\n".join(f"- **{kind}**: {what}" for kind, what in EVENTS.items()),
    "kernel": "Which attention kernel ran the last model step, where, how long it took, and the "
              "largest difference between its output and a plain torch reference computed "
              "over the same paged cache (max |paged − contiguous reference|). The Triton "
              "kernel combines two separate concerns: paging decides where K/V lives (it "
              "reads each block where the table points), and FlashAttention-style tiling "
              "decides how the attention arithmetic moves (tile by tile with an online "
              "softmax, never holding the whole score matrix). Neither changes what "
              "attention computes, only the order of its float sums, so the reference "
              "check holds it to a contiguous computation within float rounding.",
    "translator": "How a token's position becomes an address in the pool: logical block and "
                  "offset, the block table's entry, the physical block and slot, and the key "
                  "vector stored there.",
}


# ---- metrics ------------------------------------------------------------------

def metrics(snap: Snapshot) -> None:
    st.html(views.metrics_html(views.metric_items(snap)))


# ---- focus: a request and its blocks, or a block and its holders -----------------

@dataclass(frozen=True, slots=True)
class Focus:
    blocks: frozenset[int]       # blocks the grid outlines
    requests: frozenset[str]     # requests the layouts mark and list first
    caption: str
    refused: bool = False        # the caption says why the typed block cannot be shown


def _focus(snap: Snapshot, prefix: str) -> Focus:
    ss = st.session_state
    rid = ss.get(f"{prefix}focus_req")
    blk = ss.get(f"{prefix}focus_block")
    ids = {r["id"] for r in snap["requests"]}
    if isinstance(rid, str) and rid in ids:
        req = views.request_of(snap, rid)
        # Request ids (and, from an uploaded snapshot, every field) are someone's text.
        name = plain_md(rid)
        if req["status"] == "swapped":
            host = ", ".join(map(str, req["block_table"]))
            return Focus(frozenset(), frozenset({rid}),
                         f"Request **{name}** is swapped out: its K/V is in host blocks "
                         f"{host} (the host pool below), and it holds no device blocks.")
        table = req["block_table"]
        text = (f"Request **{name}** holds blocks {', '.join(map(str, table))}." if table
                else f"Request **{name}** is {plain_md(str(req['status']))}: it holds no "
                     "blocks.")
        return Focus(frozenset(table), frozenset({rid}), text)
    try:
        blk = whole("Inspect a block", blk)
    except PagedLabError as e:
        return Focus(frozenset(), frozenset(), plain_md(str(e)), refused=True)
    if blk is not None and not 0 <= blk < len(snap["blocks"]):
        # The field has no bounds in the browser (which would keep such a number to
        # itself, as README's number fields say): the refusal is said here instead.
        return Focus(frozenset(), frozenset(),
                     f"There is no block {number_text(blk)}: this pool's ids run "
                     f"0..{len(snap['blocks']) - 1:,}.", refused=True)
    if blk is not None:
        b = snap["blocks"][blk]
        holders = views.holders_by_block(snap)[blk]
        held = f"held by {plain_md(', '.join(holders))}" if holders else "held by no request"
        # What it holds, as its tooltip says it: for a cached block, the prefix it keeps
        # for a later prompt, which is what one asks of it.
        tokens = views.block_tokens(snap, [blk]).get(blk, "")
        if tokens and model_of(snap) == TINY_BYTE:
            tokens = f"“{tokens}”"
        text = (f"Block **{blk}**: {b['state']}, ref count {b['ref_count']}, "
                f"{b['num_filled']}/{snap['config']['block_size']} slots filled, "
                f"{_hash_words(snap, b)}{_salted(snap, blk)}, {held}."
                + (f" It holds {plain_md(tokens)}." if tokens else ""))
        return Focus(frozenset({blk}), frozenset(holders), text)
    return Focus(frozenset(), frozenset(), "")


def _hash_words(snap: Snapshot, b: dict[str, Any]) -> str:
    """A block's prefix hash, its first 8 hex digits, or why it has none ("hash —" left a
    newcomer to guess)."""
    if b["hash"]:
        return f"hash {plain_md(b['hash'][:8])}"
    if not snap["config"].get("prefix_caching", True):
        return "no hash (prefix caching is off)"
    if b["ref_count"]:
        return "no hash yet (a block is hashed once full, so later prompts can share it)"
    return "no hash (it keeps no cached prefix)"


def _salted(snap: Snapshot, block_id: int) -> str:
    """' (keyed under cache salt ...)' for a block whose key is salted, else ''."""
    salt = views.block_cache_salt(snap, block_id)
    return "" if salt is None else f" (keyed under cache salt {plain_md(repr(salt))})"


def _on_focus_request(prefix: str) -> None:
    st.session_state[f"{prefix}focus_block"] = None


def _on_focus_block(prefix: str) -> None:
    st.session_state[f"{prefix}focus_req"] = None


def _on_grid_select(prefix: str) -> None:
    """A click on a grid cell selects that block (a double click clears it)."""
    ss = st.session_state
    state = ss.get(f"{prefix}grid")
    points = (state or {}).get("selection", {}).get(views.SELECTION, [])
    ss[f"{prefix}focus_block"] = int(points[0]["id"]) if points else None
    ss[f"{prefix}focus_req"] = None


# ---- the block pool ---------------------------------------------------------------

def fitted(spec: dict[str, Any], key: str) -> DeltaGenerator:
    """A container as wide as the chart `spec` asks for, or the column if that is narrower.

    A chart drawn inside it at width="stretch" keeps its own size in a wide
    window and narrows with a narrow one (its cells squeeze, its text shrinks:
    see views.grid), rather than overflowing the column and scrolling the whole
    page sideways.
    """
    return st.container(width=int(spec["width"]), key=key)


def pool(snap: Snapshot, prefix: str = "") -> Focus:
    """The grid with its focus controls and legend; returns the focus for other panels."""
    ss = st.session_state
    n = len(snap["blocks"])
    ids = [r["id"] for r in snap["requests"]]
    if ss.get(f"{prefix}focus_req") not in (None, *ids):
        ss[f"{prefix}focus_req"] = None
    c1, c2, c3 = st.columns([2, 2, 2])
    c1.selectbox("Highlight a request", [None, *ids], key=f"{prefix}focus_req",
                 persist_state="session",
                 format_func=lambda v: "none" if v is None else v, placeholder="none",
                 on_change=_on_focus_request, args=(prefix,))
    # A third of the page beside its step buttons leaves the text some 90 px at 1024 px
    # with the sidebar open: "click or type an id" lost its end.
    whole_input(c2, "Inspect a block", key=f"{prefix}focus_block",
                placeholder="an id, or click", on_change=_on_focus_block, args=(prefix,))
    pages = views.num_pages(n)
    page = _page_field(n, f"{prefix}grid_page", "Blocks shown", c3)
    focus = _focus(snap, prefix)
    if pages > 1:
        odf, ospec = memo("overview", snap, None, lambda: views.overview_spec(snap))
        with fitted(ospec, f"{prefix}overview_box"):
            st.vega_lite_chart(odf, ospec, width="stretch", key=f"{prefix}overview")
    st.markdown(f"**{views.grid_title(snap, page)}**")
    df, spec = memo("grid", snap, (page, focus.blocks),
                    lambda: views.grid_spec(snap, page=page, focus_blocks=focus.blocks,
                                            titled=False))
    with fitted(spec, f"{prefix}grid_box"):
        st.vega_lite_chart(df, spec, key=f"{prefix}grid",
                           on_select=lambda: _on_grid_select(prefix),
                           selection_mode=views.SELECTION, width="stretch")
    st.caption("Click a block, or type its id under *Inspect a block*, to see who holds it "
               "(double-click clears); hover for details.")
    if focus.caption:
        # Keyed for ui/a11y.py, which reads the inspected block out to a screen reader.
        said = st.container(key=f"{prefix}focus_said")
        (said.error if focus.refused else said.markdown)(focus.caption)
    st.html(views.legend_html(snap))
    if has_host_pool(snap):
        _host_pool(snap, focus, prefix)
    return focus


def _page_field(n: int, key: str, label: str, where: Any = st) -> int:
    """The page of a pool of `n` blocks its grid draws: picked in field `key` where the
    pool is more than one page (views.PAGE_SIZE blocks), else 0."""
    pages = views.num_pages(n)
    ss = st.session_state
    if ss.get(key, 0) >= pages:     # a smaller pool than the page last picked
        ss[key] = 0
    if pages == 1:
        return 0
    size = views.PAGE_SIZE

    def blocks(p: int) -> str:
        return f"{p * size:,}–{min(n, (p + 1) * size) - 1:,}"

    return int(where.selectbox(label, list(range(pages)), key=key, persist_state="session",
                               format_func=blocks))


def _host_pool(snap: Snapshot, focus: Focus, prefix: str) -> None:
    """The host pool of swap preemption, drawn like the device pool (read-only)."""
    host = host_view(snap)
    st.markdown("**Host pool (swap space)**")
    st.caption(plain_md(host_summary(snap)))
    blocks = frozenset(b for r in host["requests"] if r["id"] in focus.requests
                       and r["status"] == "swapped" for b in r["block_table"])
    page = _page_field(len(host["blocks"]), f"{prefix}host_grid_page", "Host blocks shown")
    st.markdown(f"**{views.grid_title(host, page)}**")
    df, spec = views.grid_spec(host, page=page, focus_blocks=blocks, selectable=False,
                               titled=False)
    with fitted(spec, f"{prefix}host_grid_box"):
        st.vega_lite_chart(df, spec, key=f"{prefix}host_grid", width="stretch")


# ---- block tables -------------------------------------------------------------------

def block_tables(snap: Snapshot, focus: Focus | None = None, prefix: str = "") -> None:
    """The requests' table, their beam searches, text layouts and finished requests;
    `prefix` keys the expanders (see `_expander_key`)."""
    focus = focus or Focus(frozenset(), frozenset(), "")
    df = views.requests_frame(snap)
    if df.empty:
        # The empty table is drawn even so: the browser then builds its grid with the
        # page rather than during the first Add (the costliest part of that click).
        st.caption("No requests yet: each one added gets a row here.")
    widths, row_height = views.requests_layout(df)
    # An empty table still has one row's height, for its "empty" line. Past a dozen
    # rows (six tall ones) the table scrolls, and says so: its grid shows no scrollbar
    # until the pointer is over it.
    row = row_height or 35
    visible = 12 if row_height is None else 6
    # The widths fit a 1366 px window beside the sidebar; in a narrower one the table
    # scrolls sideways, with each row's request pinned in view, and a line says so.
    # An empty table has nothing to scroll to, and no request to keep in view: its note
    # is drawn (keeping the grid's place in the page) but never shown.
    wide = 0 if df.empty else sum(widths.get(c, 0) for c in df.columns) + 2
    with st.container(key=f"{prefix}req_table"):
        layout.note_below(f"{prefix}req_table", wide,
                          "The table is wider than the page: scroll it sideways for the "
                          "rest of its columns (the request stays in view).")
        st.dataframe(df, hide_index=True, width="stretch", row_height=row_height,
                     height=35 + row * min(max(len(df), 1), visible) + 3,
                     column_config={c: st.column_config.Column(
                         column_label(c, widths.get(c)), help=h, width=widths.get(c),
                         pinned=c == "request" or None)
                                    for c, h in views.REQUEST_COLUMN_HELP.items()})
    if len(df) > visible:
        st.caption(f"{len(df)} requests, {visible} in view: scroll the table for the "
                   "rest.")
    for group in views.beam_groups(snap):
        _beam_group(snap, group, prefix)
    live = [r["id"] for r in snap["requests"] if r["status"] != "finished"]
    order = [r for r in live if r in focus.requests] + [r for r in live
                                                         if r not in focus.requests]
    shown = order[:MAX_LAYOUTS]
    if shown:
        # Markdown: "\\\\n" shows as \n.
        coded = (" A tinted \\\\n or \\\\xNN is one byte written by its code; a typed "
                 "backslash is a character of its own." if model_of(snap) == TINY_BYTE else "")
        st.caption("Each request's text, split where its blocks split: L = logical block, "
                   "P = physical block, ×N = shared by N tables, · = an empty slot." + coded)
        st.html(memo("layouts", snap, (tuple(shown), focus.blocks, focus.requests),
                     lambda: views.layouts_html(snap, shown, highlight_blocks=focus.blocks,
                                                focused=focus.requests)))
    hidden = len(order) - len(shown)
    finished = len(snap["requests"]) - len(live)
    notes = []
    if hidden:
        notes.append(f"{counted(hidden, 'more running or waiting request')}: highlight "
                     f"{agrees(hidden, 'it', 'one')} to show it first")
    if finished:
        notes.append(f"{counted(finished, 'finished request')} "
                     f"{agrees(finished, 'holds', 'hold')} no blocks")
    if notes:
        st.caption("; ".join(notes) + ".")
    _finished(snap, finished, prefix)


def _expander_key(prefix: str, name: str, *parts: object) -> str:
    """An expander's key. Keyed, an expander keeps its identity, so it stays as the person
    left it (open or closed) when an element above it comes or goes (a warning, a status
    line, the past-state banner); unkeyed, it is drawn anew, closed. `parts` that change
    give a new identity on purpose, drawn with its new `expanded` default. Each part is
    hashed: a request id is the user's text, and keys become CSS class names.

    Keyed by page, not by view: the Playground's past view (prefix "past_") shows the
    same panel as its live one, which must stay as it was across the banner."""
    page = "" if prefix == "past_" else prefix
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    return f"{page}{name}_{digest}"


def _finished(snap: Snapshot, finished: int, prefix: str) -> None:
    """What each of the `finished` requests generated: they hold no blocks, so no layout
    shows them. A beam search's are in its own panel."""
    df = views.finished_frame(snap)
    if df.empty:
        return
    beams = finished - len(df)
    with st.expander(f"Finished: what {counted(len(df), 'request')} generated",
                     expanded=True, key=_expander_key(prefix, "finished_open")):
        if beams:
            st.caption(f"{beams:,} more finished {agrees(beams, 'beam', 'beams')}: see the "
                       "beam search panels above (collapsed once a search ends).")
        # The generated text second, where a narrow window still shows it; the prompt,
        # often the longest, last.
        st.dataframe(df, hide_index=True, width="stretch",
                     height=min(35 + 35 * len(df) + 3, 320),
                     column_order=["request", "status", "generated text", "prompt"],
                     column_config={"request": st.column_config.Column(width=90),
                                    "status": st.column_config.Column(width=190),
                                    "generated text": st.column_config.Column(width=320)})


def _beam_group(snap: Snapshot, group: views.BeamGroup, prefix: str) -> None:
    """A beam search's beams with their text and score, best first."""
    # The group's id is the user's text: shown as written, not as Markdown. Open while
    # the search runs, closed once it ends (a new identity then).
    with st.expander(plain_md(f"Beam search {group.summary}"), expanded=group.live > 0,
                     key=_expander_key(prefix, "beam_open", group.group, group.live > 0)):
        st.caption("Each step keeps the best one-token extensions of the live beams by "
                   "cumulative log-probability (log p). A beam extended twice forked (its "
                   "blocks shared, copied on the next write); one with no survivor was "
                   "dropped and its blocks released. log p sums over a beam's own tokens, so "
                   "one dropped early, with fewer of them, can read higher than a complete "
                   "one: a round only compares extensions of the same length (no length "
                   "penalty).")
        df = views.beams_frame(snap, group.group)
        # Three decimals on every row, as the block tables show it: a number column
        # would drop a trailing zero (-18.92 above -18.913) and read less precise.
        st.dataframe(df, hide_index=True, width="stretch",
                     height=min(35 + 35 * len(df) + 3, 320),
                     column_config={"log p": st.column_config.NumberColumn(format="%.3f")})


# ---- events -----------------------------------------------------------------------

def events(snap: Snapshot) -> None:
    total = len(snap["events"])
    df, html = memo("events", snap, None, lambda: _event_log(snap))
    shown = f"newest {len(df)} of {total}" if total > len(df) else f"{total}"
    st.caption(f"Newest first ({shown} events).")
    # Not in a fixed-height container: the log's own box follows its rows up to a cap and
    # scrolls past it (views.event_log_html).
    st.html(html)


def _event_log(snap: Snapshot) -> tuple[pd.DataFrame, str]:
    df = views.events_frame(snap)
    return df, views.event_log_html(df)


# ---- the lower half of a state view ----------------------------------------------


def tables_events_kernel(snap: Snapshot, focus: Focus, engine: Engine | None, prefix: str = "",
                         to_newest: str | None = "view the newest state",
                         start: str | None = "add a request") -> None:
    """Block tables, then the event log beside the kernel panel and address translator.

    `start` says, as an imperative, how a request comes to run on this page (the
    Scenarios page has no Add: "press Next"), for panels with nothing to show yet; None
    where nothing can (a scenario's last step).

    `engine` is the live engine when `snap` is its current state; for a past
    state it is None, and the translator works from `snap` alone, with no key
    vector: the live tensors hold only the newest state, which `to_newest`
    says how to reach, as an imperative ("view step 3"); None when no state
    shown is theirs (a scenario step stopped part-way took them past it).
    """
    st.header("Block tables", anchor=False, help=HELP["tables"])
    block_tables(snap, focus, prefix)
    # Side by side where the page is wide; one under the other where it is not (a 1024 px
    # window with the sidebar open left the translator 190 px: "Laye/r").
    layout.stack_below(f"{prefix}lower", 820)
    with st.container(key=f"{prefix}lower"):
        log, side = st.columns([3, 2], gap="large")
    with log:
        st.header("Event log", anchor=False, help=HELP["events"])
        events(snap)
    with side:
        st.header("Kernel", anchor=False, help=HELP["kernel"])
        kernel_panel.kernel(snap, engine, prefix=prefix, start=start)
        st.header("Address translator", anchor=False, help=HELP["translator"])
        if engine is not None:
            translator.panel(engine, prefix=prefix, start=start)
        else:
            translator.past_panel(snap, to_newest, prefix=prefix)
