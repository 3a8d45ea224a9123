"""The address translator: a request's token position to its block, slot and stored key.

Reads the live engine (its block tables and K/V tensors), so it is drawn only
for the current state, never for a past one. Widget keys carry the panel's
`prefix` (see ui/panels.py).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from backend import views
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.views.text import plain_md
from backend.views.tokens import quoted_piece
from ui.numbers import out_of_range


def _block_pieces(engine: Engine, rid: str, logical: int) -> str:
    """The tokens of a request's logical block, each quoted: where the block's token
    boundaries fall (the first views.tokens.TOOLTIP_TOKENS of a large block)."""
    bs = engine.config.block_size
    tokens = list(engine.requests[rid].tokens[logical * bs:(logical + 1) * bs])
    shown = engine.token_pieces(tokens[:views.TOOLTIP_TOKENS])
    more = " …" if len(tokens) > len(shown) else ""
    return " ".join(quoted_piece(p) for p in shown) + more


def panel(engine: Engine, prefix: str = "") -> None:
    """Request + position -> logical block, offset, physical block, slot, and the stored K."""
    ss = st.session_state
    running = list(engine.running)
    if not running:
        st.caption("Add a request to translate its token positions.")
        return
    if ss.get(f"{prefix}tr_req") not in running:
        ss[f"{prefix}tr_req"] = running[0]
    # Wide enough at 1024 px for "Layer" and an id such as "A.0" not to be cut.
    c1, c2, c3 = st.columns([2, 2, 1.5])
    rid = c1.selectbox("Request", running, key=f"{prefix}tr_req")
    n = engine.requests[rid].num_tokens
    layers = engine.config.num_layers
    # A position or layer of another request or engine (the pick changed): the nearest one.
    if ss.get(f"{prefix}tr_req_seen") != (rid, n, layers):
        ss[f"{prefix}tr_req_seen"] = (rid, n, layers)
        ss[f"{prefix}tr_pos"] = min(max(0, ss.get(f"{prefix}tr_pos") or 0), n - 1)
        ss[f"{prefix}tr_layer"] = min(max(0, ss.get(f"{prefix}tr_layer") or 0), layers - 1)
    # No bounds in the browser, which would keep a number past them to itself and send
    # the last one inside (ui/numbers.py): one typed out of range is refused here.
    pos = c2.number_input("Token position", step=1, key=f"{prefix}tr_pos",
                          help=f"0 to {n - 1:,}: the request's tokens.")
    layer = c3.number_input("Layer", step=1, key=f"{prefix}tr_layer",
                            help=f"0 to {layers - 1}: the model's layers.")
    refused = [out_of_range(label, 0, top, got)
               for label, top, got in (("Token position", n - 1, pos), ("Layer", layers - 1, layer))
               if got is not None and not 0 <= got <= top]
    if refused:
        st.error("  \n".join(plain_md(line) for line in refused))
        return
    if pos is None or layer is None:
        st.caption("Type a token position and a layer.")
        return
    try:
        addr, key, _value = engine.read_kv(rid, int(pos), int(layer))
    except PagedLabError as exc:  # a stale position after the request changed
        st.error(plain_md(str(exc)))
        return
    bs = engine.config.block_size
    table = engine.block_table(rid)
    st.markdown(
        f"position **{addr.position}** ÷ block size **{bs}** → logical block "
        f"**{addr.logical_block}**, offset **{addr.offset}**  \n"
        f"block table {table} → entry {addr.logical_block} is physical block "
        f"**{addr.physical_block}**  \n"
        f"slot = {addr.physical_block} × {bs} + {addr.offset} = **{addr.slot}**")
    tok = engine.requests[rid].tokens[addr.position]
    # The token's own text under the engine's model (a byte, or a BPE piece such as
    # " cat"), quoted so its spaces show; any character may be in it: escaped.
    piece = engine.token_pieces([tok])[0]
    st.caption(f"Token {tok} ({plain_md(quoted_piece(piece))}) · block {addr.physical_block} "
               f"holds {plain_md(_block_pieces(engine, rid, addr.logical_block))} · key vector "
               f"read from layer {layer}'s K tensor at slot {addr.slot}, shape {list(key.shape)} "
               "(KV heads × head dim)")
    vdf, vspec = views.vector_spec(key.numpy())
    st.vega_lite_chart(vdf, vspec, width="stretch", key=f"{prefix}tr_chart")
    kdf = pd.DataFrame(key.numpy(), index=[f"K head {h}" for h in range(key.shape[0])])
    kdf.columns = [str(c) for c in kdf.columns]
    st.dataframe(kdf, width="stretch", height=35 * (len(kdf) + 1) + 3,
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in kdf.columns})
