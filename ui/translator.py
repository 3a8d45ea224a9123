"""The address translator: a request's token position to its block, slot and stored key.

`panel` reads the live engine: its block tables, and the key stored at the
slot in its K/V tensors. `past_panel` translates a past state from its
snapshot alone (backend/views/translate.py), with the same fields and the
same arithmetic; the tensors hold only the newest state, so it shows no key.
Widget keys carry the panel's `prefix` (see ui/panels.py).
"""

from __future__ import annotations

from functools import partial

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from backend import views
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.views import Snapshot
from backend.views.text import plain_md
from backend.views.translate import (
    arithmetic_md,
    running_ids,
    snapshot_address,
    snapshot_request,
    token_md,
)
from ui.numbers import Fields


def _said(prefix: str) -> DeltaGenerator:
    """Where the translation or its refusal goes: keyed for ui/a11y.py, which reads its
    new text out to a screen reader."""
    return st.container(key=f"{prefix}tr_said")


def _fields(running: list[str], num_tokens: dict[str, int], layers: int,
            prefix: str) -> tuple[str, int, int] | None:
    """The request, token position and layer fields; what they hold, or None (said why
    on the page) while a number is missing, out of range or a fraction.

    `running` is not empty; `num_tokens` has each of its requests' token counts.
    """
    ss = st.session_state
    if ss.get(f"{prefix}tr_req") not in running:
        ss[f"{prefix}tr_req"] = running[0]
    # Wide enough at 1024 px for "Layer" and an id such as "A.0" not to be cut.
    c1, c2, c3 = st.columns([2, 2, 1.5])
    rid = c1.selectbox("Request to translate", running, key=f"{prefix}tr_req",
                       persist_state="session")
    n = num_tokens[rid]
    # A position or layer of another request or engine (the pick changed): the nearest one.
    if ss.get(f"{prefix}tr_req_seen") != (rid, n, layers):
        ss[f"{prefix}tr_req_seen"] = (rid, n, layers)
        ss[f"{prefix}tr_pos"] = min(max(0, ss.get(f"{prefix}tr_pos") or 0), n - 1)
        ss[f"{prefix}tr_layer"] = min(max(0, ss.get(f"{prefix}tr_layer") or 0), layers - 1)
    # No bounds in the browser, which would keep a number past them to itself and send
    # the last one inside (ui/numbers.py): one typed out of range is refused here.
    group = Fields()
    pos = group.number(c2, "Token position", 0, n - 1, None, key=f"{prefix}tr_pos",
                       help=f"0 to {n - 1:,}: the request's tokens.")
    layer = group.number(c3, "Layer", 0, layers - 1, None, key=f"{prefix}tr_layer",
                         help=f"0 to {layers - 1}: the model's layers.")
    if group.problems:
        _said(prefix).error("  \n".join(plain_md(line) for line in group.problems))
        return None
    if pos is None or layer is None:
        _said(prefix).caption("Type a token position and a layer.")
        return None
    return rid, pos, layer


def panel(engine: Engine, prefix: str = "", start: str | None = "add a request") -> None:
    """Request + position -> logical block, offset, physical block, slot, and the stored K.
    With no request running, `start` says how one comes."""
    running = list(engine.running)
    if not running:
        st.caption("No request is running: none has token positions to translate."
                   if start is None else
                   f"No request is running: {start} to translate its token positions.")
        return
    picked = _fields(running, {rid: engine.requests[rid].num_tokens for rid in running},
                     engine.config.num_layers, prefix)
    if picked is None:
        return
    rid, pos, layer = picked
    said = _said(prefix)
    try:
        addr, key, _value = engine.read_kv(rid, pos, layer)
    except PagedLabError as exc:  # a stale position after the request changed
        said.error(plain_md(str(exc)))
        return
    bs = engine.config.block_size
    said.markdown(arithmetic_md(addr, bs, engine.block_table(rid)))
    said.caption(f"{token_md(engine.requests[rid].tokens, addr, bs, engine.token_pieces)} · "
                 f"key vector read from layer {layer}'s K tensor at slot {addr.slot}, shape "
                 f"{list(key.shape)} (KV heads × head dim)")
    vdf, vspec = views.vector_spec(key.numpy())
    st.vega_lite_chart(vdf, vspec, width="stretch", key=f"{prefix}tr_chart")
    kdf = pd.DataFrame(key.numpy(), index=[f"K head {h}" for h in range(key.shape[0])])
    kdf.columns = [str(c) for c in kdf.columns]
    st.dataframe(kdf, width="stretch", height=35 * (len(kdf) + 1) + 3,
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in kdf.columns})


def past_panel(snap: Snapshot, to_newest: str | None, prefix: str = "") -> None:
    """`panel` for a past state, from its snapshot: the same fields over the requests
    running in it and the same arithmetic, then, in place of the key, one line saying
    that the key is read from the live tensors, which hold the newest state.

    `to_newest` says how to reach the newest state, as an imperative ("view step 3");
    None when no state that can be shown is theirs.
    """
    running = running_ids(snap)
    if not running:
        st.caption("No request is running in this state: none has token positions to "
                   "translate.")
        return
    picked = _fields(running, {rid: int(snapshot_request(snap, rid)["num_tokens"])
                               for rid in running},
                     int(snap["config"]["num_layers"]), prefix)
    if picked is None:
        return
    rid, pos, layer = picked
    said = _said(prefix)
    try:
        addr = snapshot_address(snap, rid, pos)
    except PagedLabError as exc:  # a position a budgeted prompt has not computed yet
        said.error(plain_md(str(exc)))
        return
    req = snapshot_request(snap, rid)
    bs = int(snap["config"]["block_size"])
    said.markdown(arithmetic_md(addr, bs, req["block_table"]))
    said.caption(token_md(req["tokens"], addr, bs, partial(views.token_pieces, snap)))
    if to_newest is None:
        said.caption(f"Layer {layer}'s key vector at slot {addr.slot} is read from the live "
                     "K/V tensors, which went on past this state into a step that was "
                     "stopped part-way: no state shown here is theirs.")
    else:
        said.caption(f"Layer {layer}'s key vector at slot {addr.slot} is read from the live "
                     f"K/V tensors, which hold the newest state: {plain_md(to_newest)} to "
                     "see it.")
