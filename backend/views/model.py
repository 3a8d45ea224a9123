"""View models of the engine's state: pandas frames and formatted numbers, no Streamlit.

Everything here reads a snapshot dict (CONTRACT.md's format, as
`backend.io.snapshot.export_snapshot` writes it), so a page can render a live
engine, a recorded scenario step or an uploaded file through the same code.
Nothing here mutates its input.

Costs are linear in the pool and the block-table entries, computed once per
render: holders of every block come from one pass over the tables, never from
a per-block scan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from backend.core.config import TINY_BYTE
from backend.core.words import tenths
from backend.models.tokenizer import TURN_END, TURN_START
from backend.paging.events import SWAP_OUT_RUN, Event, describe, shared_swap_outs
from backend.views.glossary import REQUEST_FIELDS
from backend.views.host_pool import on_device
from backend.views.tokens import (
    Snapshot,
    answer_tokens,
    model_of,
    split_characters,
    token_pieces,
    token_text,
)

# How many of the newest events the log shows; the snapshot keeps them all.
EVENT_LOG_LIMIT = 200


def holders_by_block(snap: Snapshot) -> list[list[str]]:
    """For every physical block, the running requests whose tables hold it (arrival order)."""
    out: list[list[str]] = [[] for _ in range(snap["config"]["num_blocks"])]
    for req in snap["requests"]:
        if not on_device(snap, req):    # a swapped request's table names host blocks
            continue
        for b in dict.fromkeys(req["block_table"]):  # a table never repeats a block; be safe
            out[b].append(req["id"])
    return out


# How many colours the views give requests (grid.PALETTE holds them).
COLOUR_SLOTS = 8


def owner_index(snap: Snapshot) -> dict[str, int]:
    """A colour slot per request, in 0..COLOUR_SLOTS - 1: no two live requests share one
    while at most COLOUR_SLOTS are live.

    A request's own slot is its arrival index modulo COLOUR_SLOTS, so it keeps its
    colour from step to step. Live ones (running, swapped, or holding blocks) take
    theirs in arrival order; one whose slot an earlier live request holds takes the
    next free slot instead, and gets its own back when that request leaves.
    """
    out: dict[str, int] = {}
    taken: set[int] = set()
    for i, req in enumerate(snap["requests"]):
        slot = i % COLOUR_SLOTS
        if req["status"] in ("running", "swapped") or req["block_table"]:
            for k in range(COLOUR_SLOTS):
                if (slot + k) % COLOUR_SLOTS not in taken:
                    slot = (slot + k) % COLOUR_SLOTS
                    break
            taken.add(slot)
        out[req["id"]] = slot
    return out


def blocks_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per physical block, ordered by id.

    Columns: id, state, ref_count, num_filled, block_size, fill (0..1), hash8
    (first 8 hex digits or ""), holders (comma-separated ids), owner (first
    holder or ""), owner_slot (colour slot, -1 if none), shared (ref_count >= 2),
    partial (used and not full).
    """
    blocks = snap["blocks"]
    bs = int(snap["config"]["block_size"])
    holders = holders_by_block(snap)
    slots = owner_index(snap)
    ids = np.fromiter((b["id"] for b in blocks), dtype=np.int64, count=len(blocks))
    refs = np.fromiter((b["ref_count"] for b in blocks), dtype=np.int64, count=len(blocks))
    filled = np.fromiter((b["num_filled"] for b in blocks), dtype=np.int64, count=len(blocks))
    state = [b["state"] for b in blocks]
    owners = [h[0] if h else "" for h in holders]
    df = pd.DataFrame({
        "id": ids,
        "state": state,
        "ref_count": refs,
        "num_filled": filled,
        "block_size": bs,
        "fill": filled / bs,
        "hash8": [(b["hash"] or "")[:8] for b in blocks],
        "holders": [", ".join(h) for h in holders],
        "owner": owners,
        "owner_slot": [slots.get(o, -1) for o in owners],
    })
    df["shared"] = df["ref_count"] >= 2
    df["partial"] = (df["state"] == "used") & (df["num_filled"] < bs)
    return df


@dataclass(frozen=True, slots=True)
class Chunk:
    """The tokens of one logical block of a request, where they live."""

    logical: int
    physical: int | None     # None for a request that holds no blocks
    pieces: tuple[str, ...]  # each token's text (`token_pieces`)
    num_filled: int
    block_size: int
    ref_count: int
    # Whether a token may be more than one character (a real model's BPE pieces):
    # then a view marks each token's extent; tiny-byte's tokens are single bytes.
    subword: bool = False
    # Trailing tokens of `pieces` whose K/V is not written yet: a token budget
    # prefills a long prompt over several steps, and a block holds only the
    # tokens computed so far (`num_filled` counts those).
    pending: int = 0
    # Per token, the character its bytes belong to where that character is split across
    # tokens (its piece shows only its own bytes, "\\xe2"), else None; () when unknown.
    split: tuple[str | None, ...] = ()

    @property
    def text(self) -> str:
        """The block's tokens as one string, for display."""
        return "".join(self.pieces)

    @property
    def partial(self) -> bool:
        return self.num_filled < self.block_size


def text_by_block(snap: Snapshot, request_id: str) -> list[Chunk]:
    """A request's tokens split at block boundaries, each chunk labelled by its block.

    A running request's chunk i lives in physical block table[i]; a waiting or
    finished request holds no blocks, so its chunks have `physical` None. Each
    chunk holds its tokens' pieces under the snapshot's model (`token_pieces`).
    A request still prefilling (`num_computed_tokens` in the snapshot) holds
    blocks for its computed tokens only: the rest of each chunk is `pending`,
    and chunks past its table have no block yet.
    """
    req = request_of(snap, request_id)
    bs = int(snap["config"]["block_size"])
    tokens: list[int] = req["tokens"]
    # A swapped request's blocks are the host pool's (backend.views.host_pool).
    table: list[int] = req["block_table"] if on_device(snap, req) else []
    blocks = snap["blocks"]
    pieces = token_pieces(snap, tokens)
    split = split_characters(snap, tokens)
    subword = model_of(snap) != TINY_BYTE
    computed = computed_tokens(req)
    out = []
    for i in range(0, len(tokens), bs):
        logical = i // bs
        part = tuple(pieces[i:i + bs])
        phys = table[logical] if logical < len(table) else None
        ref = blocks[phys]["ref_count"] if phys is not None else 0
        pending = len(part) - min(len(part), max(0, computed - i))
        out.append(Chunk(logical, phys, part, len(part) - pending, bs, ref, subword, pending,
                         tuple(split[i:i + bs])))
    return out


def computed_tokens(req: dict[str, Any]) -> int:
    """Leading tokens of a request whose K/V is in the cache: all of them, unless a token
    budget is still prefilling its prompt over several steps."""
    computed = req.get("num_computed_tokens")
    return int(req["num_tokens"]) if computed is None else int(computed)


def status_text(req: dict[str, Any]) -> str:
    """'running', 'running (prefill 12/30)', 'finished (max new tokens)', ...: the status
    with what a request is waiting for or why it ended."""
    status = str(req["status"])
    if status == "finished" and req.get("finish_reason") is not None:
        # A snapshot says "finished" for a request finished by hand (a Finish click, a
        # `finish` operation), as the beams panel and the glossary call it.
        reason = req["finish_reason"]
        said = {"finished": "by hand", "context": "context full"}.get(reason)
        return f"finished ({said or reason.replace('_', ' ')})"
    if status == "running" and req.get("num_computed_tokens") is not None:
        return f"running (prefill {computed_tokens(req)}/{req['num_tokens']})"
    if status == "swapped":
        return "swapped to host"
    return status


def request_of(snap: Snapshot, request_id: str) -> dict[str, Any]:
    for req in snap["requests"]:
        if req["id"] == request_id:
            return req
    raise KeyError(request_id)


def table_text(table: list[int], num_tokens: int, block_size: int,
               max_chars: int | None = None) -> str:
    """'0→9 · 1→2 · 2→14 (1/4)': logical → physical, the partial last block marked.

    Longer than `max_chars`, the middle entries give way to "… N more …", so that the
    first entries and the last (with its fill) still show, none cut in half.
    """
    if not table:
        return "—"
    parts = [f"{i}→{b}" for i, b in enumerate(table)]
    tail = num_tokens - (len(table) - 1) * block_size
    if tail < block_size:
        parts[-1] += f" ({tail}/{block_size})"
    text = " · ".join(parts)
    if max_chars is None or len(text) <= max_chars or len(parts) <= 3:
        return text
    # The most entries that fit, split between the two ends (the front one more).
    def ends(keep: int) -> str:
        front, back = parts[:(keep + 1) // 2], parts[len(parts) - keep // 2:]
        return " · ".join([*front, f"… {len(parts) - keep} more …", *back])

    shown = ends(2)
    for keep in range(3, len(parts)):
        longer = ends(keep)
        if len(longer) > max_chars:
            break
        shown = longer
    return shown


BLOCK_TABLE_COLUMN = "block table (logical→physical)"
# The block tables' columns: widths (px) their headers and values fit in ("finished
# (max new tokens)", "generated").
# Together (with the grid's 2 px border) at most the 906 px a 1366 px window, the
# commonest laptop width, gives the table beside the sidebar (a wider table grows every
# column in proportion; a narrower one would hide the block table's end): the block
# table takes the rest, less while beams add a "log p" column.
REQUEST_COLUMN_WIDTHS: dict[str, int] = {
    "request": 76, "status": 166, "parent": 60, "prompt": 62, "generated": 82,
    "tokens": 60, "blocks": 58, "preempted": 82, BLOCK_TABLE_COLUMN: 256, "log p": 70,
    "cache salt": 80,
}
# Columns shown only while some request has their field; each takes its width from
# the block table's, down to MIN_TABLE_PX: past that (beams and salts together) the
# table grows wider and scrolls sideways rather than wrap a block table in a column
# a dozen entries wide.
OPTIONAL_COLUMNS = ("log p", "cache salt")
MIN_TABLE_PX = 176
# The block table column's header in full needs about this width; narrower, it is shown
# as SHORT_TABLE_HEADER (L and P as the layouts under the table name them).
FULL_HEADER_PX = 200
SHORT_TABLE_HEADER = "block table (L→P)"
CHAR_PX = 6               # a block table's characters average 5.4 px; breaks fall short
LINE_PX = 20
MAX_TABLE_LINES = 4

# What each column of `requests_frame` means: the block tables' header tooltips.
REQUEST_COLUMN_HELP: dict[str, str] = {
    "request": "The request's id.",
    "status": REQUEST_FIELDS["status"] + " A finished one says why, in brackets; "
              "'running (prefill n/N)' is a prompt a token budget (max_num_batched_tokens) "
              "prefills over several steps: n of its N tokens have their K/V in the cache.",
    "parent": REQUEST_FIELDS["parent"],
    "prompt": REQUEST_FIELDS["prompt_len"],
    "generated": "Tokens generated so far.",
    "tokens": REQUEST_FIELDS["num_tokens"],
    "blocks": "Entries in its block table: the physical blocks it holds.",
    BLOCK_TABLE_COLUMN: "Each logical block → the physical block that holds it; "
                                      "(n/size) marks a partly filled last block. The layouts "
                                      "below show every entry with its text.",
    "preempted": "Times this request was preempted (its blocks taken back when the pool ran "
                 "out); its K/V is recomputed when it resumes, or with swap preemption "
                 "copied back from the host pool.",
    "log p": "A beam's cumulative log-probability: the sum of its generated tokens' "
             "log-probabilities under the model. Each round keeps the extensions with the "
             "highest; shown only while there are beams.",
    "cache salt": REQUEST_FIELDS["cache_salt"] + " Shown only while a request has one.",
}


def requests_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per request: those holding or awaiting blocks first, then the finished
    ones (a beam search's dropped beams among them), each group in arrival order; its
    status, block table and sizes."""
    bs = int(snap["config"]["block_size"])
    rows = []
    beams = any("beam_width" in req for req in snap["requests"])
    salted = any("cache_salt" in req for req in snap["requests"])
    optional = [*(["log p"] if beams else []), *(["cache salt"] if salted else [])]
    # What MAX_TABLE_LINES lines of the column hold, less half a line for the breaks.
    per_line = _table_width(optional) // CHAR_PX
    max_chars = MAX_TABLE_LINES * per_line - per_line // 2
    live = [r for r in snap["requests"] if r["status"] != "finished"]
    for req in live + [r for r in snap["requests"] if r["status"] == "finished"]:
        cum = req.get("cum_logprob")
        swapped = req["status"] == "swapped"
        rows.append({
            "request": req["id"],
            "status": status_text(req),
            "parent": req["parent"] or "",
            "log p": "" if cum is None else f"{cum:.3f}",
            "cache salt": req.get("cache_salt") or "",
            "prompt": req["prompt_len"],
            "generated": req["num_tokens"] - req["prompt_len"],
            "tokens": req["num_tokens"],
            "blocks": len(req["block_table"]),
            "preempted": req["num_preemptions"],
            # The table covers the computed tokens (all, unless still prefilling).
            BLOCK_TABLE_COLUMN: ("host " if swapped else "")
            + table_text(req["block_table"], computed_tokens(req), bs,
                         max_chars - (5 if swapped else 0)),
        })
    # The block table right after the status: it is what the table is about, and so in
    # view beside the sidebar in a 1024 px window, where the counts after it scroll.
    cols = ["request", "status", BLOCK_TABLE_COLUMN, "parent", *optional,
            "prompt", "generated", "tokens", "blocks", "preempted"]
    return pd.DataFrame(rows, columns=cols)


FINISHED_COLUMNS = ["request", "status", "prompt", "generated text"]
# A chat prompt's last user turn, in the ChatML both models render a chat in
# (backend/models/tokenizer.py), as token_text writes it (a line break as \n): the
# rendered template starts with the same system turn for every chat, which filled the
# column and hid what each one asked.
_LAST_USER_TURN = re.compile(re.escape(f"{TURN_START}user") + r"\\n(.*?)" + re.escape(TURN_END),
                             re.S)


def _prompt_shown(text: str) -> str:
    """A prompt as the Finished panel shows it: a chat's by its last user turn."""
    turns = _LAST_USER_TURN.findall(text)
    return f"…user: {turns[-1]}" if turns else text


def finished_frame(snap: Snapshot) -> pd.DataFrame:
    """One row per finished request but a beam search's (its panel shows those), in
    arrival order: why it finished, its prompt and what it generated, as text to read.
    A finished request holds no blocks, so its text shows nowhere else."""
    rows = [{
        "request": req["id"], "status": status_text(req),
        "prompt": _prompt_shown(token_text(snap, req["tokens"][:req["prompt_len"]])),
        "generated text": _answer_shown(snap, req),
    } for req in snap["requests"] if req["status"] == "finished" and "beam_width" not in req]
    return pd.DataFrame(rows, columns=FINISHED_COLUMNS)


# A request whose one generated token was the end of sequence has no answer text: said so,
# as an empty cell would read as missing data.
EOS_ONLY = "(none: its first token was the end of sequence)"


def _answer_shown(snap: Snapshot, req: dict[str, Any]) -> str:
    answer = answer_tokens(snap, req)
    if not answer and len(req["tokens"]) > req["prompt_len"]:
        return EOS_ONLY
    return token_text(snap, answer)


def _table_width(optional: list[str]) -> int:
    """The block table column's width (px): each optional column shown takes its share,
    down to MIN_TABLE_PX."""
    return max(MIN_TABLE_PX, REQUEST_COLUMN_WIDTHS[BLOCK_TABLE_COLUMN]
               - sum(REQUEST_COLUMN_WIDTHS[c] for c in optional))


def column_label(column: str, width: int | None) -> str | None:
    """The block tables' header of `column` at `width` px (None: its name): the block
    table's in short where an optional column (a cache salt, a beam's log p) left it
    too narrow for the full one, which was cut to "block table (logical→physical"."""
    if column == BLOCK_TABLE_COLUMN and width is not None and width < FULL_HEADER_PX:
        return SHORT_TABLE_HEADER
    return None


def requests_layout(df: pd.DataFrame) -> tuple[dict[str, int], int | None]:
    """The block tables' column widths (px) and row height (None: one line) for `df`.

    Every column gets a width its header and values fit in, the block table the
    rest of the row. A table longer than a line of it gets rows of three or four
    lines, which Streamlit wraps the text in (rows over 64 px); longer still,
    `requests_frame` shows its ends, and the layouts under the table every entry.
    """
    optional = [c for c in OPTIONAL_COLUMNS if c in df.columns]
    widths = {**REQUEST_COLUMN_WIDTHS, BLOCK_TABLE_COLUMN: _table_width(optional)}
    longest = int(df[BLOCK_TABLE_COLUMN].str.len().max()) if len(df) else 0
    lines = -(-longest // (widths[BLOCK_TABLE_COLUMN] // CHAR_PX))
    if lines <= 1:
        return widths, None
    return widths, LINE_PX * min(MAX_TABLE_LINES, max(3, lines)) + 8


def events_frame(snap: Snapshot, limit: int = EVENT_LOG_LIMIT) -> pd.DataFrame:
    """The newest `limit` events, newest first, each with its plain-English line."""
    every = snap["events"]
    first = max(len(every) - limit, 0) if limit else len(every)
    shown = [Event.from_json(e) for e in every[first:]]
    events = shown[::-1]
    # A swap preemption logs the request's swap_out events right before its preempt, so
    # the event before a preempt tells which kind it was, even when it is not shown.
    before = [every[i - 1] if i > 0 else None for i in range(len(every) - 1, first - 1, -1)]
    swap_mode = snap["config"].get("preemption") == "swap"
    caching = snap["config"].get("prefix_caching", True) is not False
    shared = _shared_swap_outs(snap, first, shown) if swap_mode else set()
    last = len(every) - 1
    return pd.DataFrame({
        "step": [e.step for e in events],
        "kind": [e.kind for e in events],
        "request": [e.request or "" for e in events],
        "block": [e.block for e in events],
        "what happened": [describe(e, swapped=prev is not None and prev["kind"] == "swap_out"
                                   and prev["request"] == e.request, swap_mode=swap_mode,
                                   caching=caching, shared=last - i in shared)
                          for i, (e, prev) in enumerate(zip(events, before, strict=True))],
    }, columns=["step", "kind", "request", "block", "what happened"])


def _shared_swap_outs(snap: Snapshot, first: int, shown: list[Event]) -> set[int]:
    """The indices in the whole log of the swap_out events from `first` on (`shown`,
    read already) that copied nothing (events.shared_swap_outs), reading back only to
    the start of the swap-out that the event at `first` may be part of."""
    every = snap["events"]
    start = first
    while start > 0 and every[start - 1]["kind"] in SWAP_OUT_RUN:
        start -= 1
    group_of = {r["id"]: r.get("group") for r in snap["requests"] if r.get("beam_width")}
    window = [Event.from_json(e) for e in every[start:first]] + shown
    return {start + i for i in shared_swap_outs(window, group_of)}


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'. Exact below 1 KiB."""
    if n < 1024:
        return f"{n} B"
    for power, unit in enumerate(("KiB", "MiB", "GiB"), start=1):
        value = n / 1024**power
        # Rounded first, then the unit chosen: 1,048,575 B read "1024 KiB" (the next
        # unit's 1.0), and 102,359 B "100.0 KiB" beside 102,400 B's "100 KiB".
        text = tenths(value)
        if float(text.replace(",", "")) >= 100:
            text = f"{value:.0f}"
        if float(text) < 1024 or unit == "GiB":
            return f"{text} {unit}"
    raise AssertionError(n)
