"""A snapshot's tokens as text: each token's piece under the snapshot's model.

tiny-byte's tokens are bytes (shown as `engine.sampling.render_tokens` shows
them); a real model's are BPE tokens, shown as the text each stands for, so
the block layouts, the grid's tooltips and the address translator show where
token boundaries fall. The tokenizer comes from the models package
(`registry.codec_for`, read once per process); no weights are loaded.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from backend.core.config import TINY_BYTE
from backend.core.errors import PagedLabError
from backend.core.words import legible
from backend.models.registry import codec_for
from backend.views.host_pool import on_device

Snapshot = dict[str, Any]


def model_of(snap: Snapshot) -> str:
    """The model a snapshot's tokens belong to (older snapshots: tiny-byte's bytes)."""
    model = snap["config"].get("model", TINY_BYTE)
    return model if isinstance(model, str) else TINY_BYTE


def token_pieces(snap: Snapshot, tokens: list[int]) -> list[str]:
    """Each token's own text under the snapshot's model: a byte of tiny-byte as
    `engine.sampling.render_tokens` shows it, a BPE token as the bytes it stands for
    (" cat", "ing", "<|im_start|>"), so a reader sees where token boundaries fall.

    A real model's tokenizer comes from its file (read once per process); where
    that is not installed, each token shows as its id, ⟨id⟩, instead of failing.
    """
    try:
        return codec_for(model_of(snap)).pieces(tokens)
    except PagedLabError:
        return [f"⟨{t}⟩" for t in tokens]


def quoted_piece(piece: str) -> str:
    """A token's piece in quotes, so a leading space shows. Not `repr`: a piece writes
    a line break as the two characters \\n already, which `repr` would double. A piece
    holding a single quote takes double quotes (`"'"`, not `'''`), and one holding both
    escapes its single quotes (a piece writes a backslash as two already)."""
    if "'" not in piece:
        return "'" + piece + "'"
    if '"' not in piece:
        return '"' + piece + '"'
    return "'" + piece.replace("'", "\\'") + "'"


def split_characters(snap: Snapshot, tokens: list[int]) -> list[str | None]:
    """For each token, the character(s) whose UTF-8 bytes it shares with a neighbour (see
    `models.tokenizer.split_characters`), else None; all None without the tokenizer."""
    try:
        return codec_for(model_of(snap)).split_characters(tokens)
    except PagedLabError:
        return [None] * len(tokens)


# The lone surrogates "surrogateescape" decodes bytes that are no UTF-8 to.
_NOT_UTF8 = re.compile("[\udc80-\udcff]+")


def _bytes_text(data: bytes) -> str:
    """`data` as UTF-8 text (`legible`), each byte that is no UTF-8 as \\xNN: a typed
    "\\xff" reads "\\\\xff", apart from that byte."""
    text = data.decode("utf-8", "surrogateescape")
    out, at = [], 0
    for bad in _NOT_UTF8.finditer(text):
        out.append(legible(text[at:bad.start()]))
        out.extend(f"\\x{ord(ch) - 0xDC00:02x}" for ch in bad.group())
        at = bad.end()
    out.append(legible(text[at:]))
    return "".join(out)


def token_text(snap: Snapshot, tokens: list[int]) -> str:
    """`tokens` as one line of text under the snapshot's model, to be read rather than to
    show token boundaries: tiny-byte's bytes and a real model's tokens decoded as UTF-8
    (a character split across bytes or tokens whole again; a byte that is no UTF-8 as
    \\xNN), control characters escaped and a typed backslash doubled (`words.legible`).
    Where the tokenizer is not installed, each token as its id, ⟨id⟩."""
    model = model_of(snap)
    if model == TINY_BYTE:
        return _bytes_text(bytes(tokens))
    try:
        codec = codec_for(model)
    except PagedLabError:
        return "".join(f"⟨{t}⟩" for t in tokens)
    # From the bytes, as tiny-byte's: the tokenizer's own decode writes a character cut
    # short (an answer ended mid-character) as U+FFFD, which a typed "�" also reads.
    return _bytes_text(b"".join(map(codec.token_bytes, tokens)))


def answer_tokens(snap: Snapshot, req: dict[str, Any]) -> list[int]:
    """What a snapshot's request `req` generated, as its answer reads: without the model's
    end-of-sequence token where the request ended on it ("...Paris.", not
    "...Paris.<|im_end|>"). The request's tokens keep it (the exports' `tokens`); only a
    last token that is the model's end-of-sequence is left out, whatever `finish_reason`
    a restored file gave."""
    generated = req["tokens"][req["prompt_len"]:]
    if not generated or req.get("finish_reason") != "eos":
        return generated
    model = model_of(snap)
    try:
        eos = None if model == TINY_BYTE else codec_for(model).eos_token_id
    except PagedLabError:      # the tokenizer is not installed: shown as ids, all of them
        return generated
    return generated[:-1] if eos is not None and generated[-1] == eos else generated


# A cell's tooltip shows at most this many of its block's tokens (a 256-slot block's
# text would not fit a tooltip, and a page of 1024 cells must stay quick to build).
TOOLTIP_TOKENS = 16


def block_tokens(snap: Snapshot, block_ids: Collection[int]) -> dict[int, str]:
    """The tokens each of `block_ids` holds, as text for its tooltip ("" if none known).

    A used block's come from the first table that holds it, a cached block's
    from its prefix-cache entry. A real model's tokens are each quoted, as the address
    translator writes them (`'The' ' cat'`), so their boundaries show whatever a piece
    holds (a separator such as "|" is also a token); tiny-byte's bytes read as text.
    """
    wanted = set(block_ids)
    bs = int(snap["config"]["block_size"])
    found: dict[int, list[int]] = {}
    for req in snap["requests"]:
        if not on_device(snap, req):
            continue
        tokens = req["tokens"]
        for i, b in enumerate(req["block_table"]):
            if b in wanted and b not in found:
                found[b] = tokens[i * bs:(i + 1) * bs]
    by_hash = {n["hash"]: n["tokens"] for n in snap.get("prefix_cache", [])}
    for b in snap["blocks"]:
        if b["id"] in wanted and b["id"] not in found and b["hash"] in by_hash:
            found[b["id"]] = by_hash[b["hash"]]
    order = list(found)
    flat = [t for b in order for t in found[b][:TOOLTIP_TOKENS]]
    pieces = token_pieces(snap, flat)
    sep = ""
    if model_of(snap) != TINY_BYTE:
        pieces, sep = [quoted_piece(p) for p in pieces], " "
    out: dict[int, str] = {}
    at = 0
    for b in order:
        n = min(len(found[b]), TOOLTIP_TOKENS)
        text = sep.join(pieces[at:at + n])
        out[b] = text + ("…" if len(found[b]) > n else "")
        at += n
    return out


def block_cache_salt(snap: Snapshot, block_id: int) -> str | None:
    """The cache salt block `block_id`'s key is made under (None: unsalted or no key).

    Read from the key's chain in the snapshot's `prefix_cache`, so a cached block
    that no request holds says it too. A chain is at most a pool's blocks long (and
    the walk stops there, whatever a file holds).
    """
    digest = snap["blocks"][block_id]["hash"]
    if digest is None:
        return None
    nodes = {n["hash"]: n for n in snap.get("prefix_cache", [])}
    for _ in range(len(snap["blocks"]) + 1):
        node = nodes.get(digest)
        if node is None:
            return None
        if node["parent"] is None:
            salt = node.get("cache_salt")
            return salt if isinstance(salt, str) else None
        digest = node["parent"]
    return None
