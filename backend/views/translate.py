"""The address translator's arithmetic: a token position to its block, offset and slot.

position ÷ block size → logical block and offset; the block table's entry →
physical block; slot = physical block × block size + offset. The live engine
translates with `Engine.read_kv`, which also reads the stored key; a past
state has only its snapshot, so `snapshot_address` translates from the
snapshot's block tables (the same arithmetic as `BlockTables.translate`, and
the same refusals as `Engine.translate`). Either address is written out by
`arithmetic_md` and `token_md`, so a past step reads as the live one does;
only the K/V vectors need the live tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from backend.core.errors import PagedLabError
from backend.paging.block_types import Address
from backend.paging.checks import check_position
from backend.views.text import plain_md
from backend.views.tokens import TOOLTIP_TOKENS, quoted_piece

Snapshot = dict[str, Any]

# Each token's own text under a model: Engine.token_pieces, or views.token_pieces
# bound to a snapshot.
Pieces = Callable[[list[int]], list[str]]


def running_ids(snap: Snapshot) -> list[str]:
    """The snapshot's running request ids in admission order, as `Engine.running` was:
    the requests whose block tables hold device blocks."""
    return list(snap["scheduler"]["running"])


def address_of(table: Sequence[int], block_size: int, position: int) -> Address:
    """Where `position` lives under block table `table`. The caller has checked that
    the table covers the position (`check_position`)."""
    logical, offset = divmod(position, block_size)
    physical = table[logical]
    return Address(position, logical, offset, physical, physical * block_size + offset)


def snapshot_request(snap: Snapshot, request_id: str) -> dict[str, Any]:
    """The snapshot's request `request_id`; a PagedLabError naming it if it has none."""
    for req in snap["requests"]:
        if req["id"] == request_id:
            return dict(req)
    raise PagedLabError(f"request {request_id!r} does not exist")


def snapshot_address(snap: Snapshot, request_id: str, position: int) -> Address:
    """The address `Engine.translate` gave for this request and position in the state
    `snap` records, or the PagedLabError it raised: a request that is not running
    holds no device blocks, and a position its table does not cover is refused.

    A request whose prompt a token budget spreads over steps has a table that covers
    only its first `num_computed_tokens` tokens (the engine's block manager holds
    only those), so only those positions translate.
    """
    req = snapshot_request(snap, request_id)
    if request_id not in running_ids(snap):
        raise PagedLabError(f"request {request_id!r} is {req['status']}: it holds no blocks")
    covered = int(req.get("num_computed_tokens", req["num_tokens"]))
    check_position(request_id, covered, position)
    return address_of(req["block_table"], int(snap["config"]["block_size"]), position)


def arithmetic_md(addr: Address, block_size: int, table: Sequence[int]) -> str:
    """The translation as three Markdown lines: the division, the table's entry, the slot."""
    return (f"position **{addr.position}** ÷ block size **{block_size}** → logical block "
            f"**{addr.logical_block}**, offset **{addr.offset}**  \n"
            f"block table {list(table)} → entry {addr.logical_block} is physical block "
            f"**{addr.physical_block}**  \n"
            f"slot = {addr.physical_block} × {block_size} + {addr.offset} = **{addr.slot}**")


def token_md(tokens: Sequence[int], addr: Address, block_size: int, pieces: Pieces) -> str:
    """"Token 97 ('a') · block 2 holds 'a' 'b' …" as Markdown shown as written: the token
    at the address and the tokens of its block, each as its piece under the model
    (`pieces`), quoted so spaces show; the first views.tokens.TOOLTIP_TOKENS of a large
    block. `tokens` are the request's, the address one of its own."""
    tok = int(tokens[addr.position])
    start = addr.logical_block * block_size
    block = [int(t) for t in tokens[start:start + block_size]]
    shown = pieces(block[:TOOLTIP_TOKENS])
    more = " …" if len(block) > len(shown) else ""
    held = " ".join(quoted_piece(p) for p in shown) + more
    # A piece may hold any character (a byte, " cat", "*"): escaped, not read as Markdown.
    return (f"Token {tok} ({plain_md(quoted_piece(pieces([tok])[0]))}) · block "
            f"{addr.physical_block} holds {plain_md(held)}")
