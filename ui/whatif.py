"""The Playground's physical-order what-if: one request's blocks read sorted by physical id.

Runs backend/engine/whatif.py on a copy of the pool and shows both readings
side by side: the blocks in the order read, the next token and its
neighbours, and how far the logits and each layer's attention moved.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.prompts import sampling_of
from backend.engine.whatif import OrderWhatIf, Reading, physical_order
from backend.views.text import md_code, plain_md
from backend.views.tokens import quoted_piece
from backend.views.whatif import draw_note, outcome
from ui.kept import keep_result, kept_result

KEY = "whatif_report"


def _pieces(engine: Engine, tokens: list[int]) -> str:
    return "".join(engine.token_pieces(tokens))


def _quoted(engine: Engine, token: int) -> str:
    return quoted_piece(_pieces(engine, [token]))


# Marks the slot this forward writes the last token's K/V into (the last one read).
WRITTEN = "▸"


def _slots(engine: Engine, slots: list[int | None]) -> str:
    """A block's slots as read: each token's text, a slot past the block's filled ones
    as "·" (as in the block layouts)."""
    return "".join("·" if t is None else _pieces(engine, [t]) for t in slots)


def _column(engine: Engine, w: OrderWhatIf, r: Reading, title: str) -> None:
    st.markdown(f"**{title}**: table {r.table}")
    *whole, last = w.slots_read(r.table)
    # Wrapped: a long request's reading ends, with its ▸, past the column's edge.
    st.code(" | ".join([*(_slots(engine, b) for b in whole),
                        _slots(engine, last[:-1]) + WRITTEN + _slots(engine, last[-1:])]),
            language=None, wrap_lines=True)
    over = w.overwritten(r.table)
    if over is not None:
        # The last token's own slot, in the block its table ends with, holds its K/V too
        # (written when the engine computed it): that block is read elsewhere here.
        new, old = (f"{_quoted(engine, w.tokens[p])} (position {p})"
                    for p in (w.position, over))
        st.caption(plain_md(f"{WRITTEN} This forward writes the K/V of {new} over that of "
                            f"{old}: position {w.position} is read twice, position {over} "
                            "not at all."))
    differ = f"its logits differ from the engine's by at most {r.logits_diff:.1e}"
    if r.next_token is None:
        # A beam's next token is no draw: the search ranks the group's extensions.
        st.markdown(f"Next token: the beam search's choice, not a draw: it keeps the "
                    f"group's extensions with the highest cumulative log-probability, so "
                    f"this beam goes on with its likeliest tokens (the table's first rows, "
                    f"or past them for a wide beam), as many as make that cut, ends on the "
                    f"end-of-sequence token, or is dropped · {differ}")
    else:
        # A draw, not the argmax: with a temperature it may come from past the table's rows.
        drawn = draw_note(r, *sampling_of(engine.config, engine.model))
        st.markdown(f"Next token (the engine's seeded draw): "
                    f"{md_code(_quoted(engine, r.next_token))}{drawn} · {differ}")
    st.dataframe(pd.DataFrame([{"token": _quoted(engine, t), "probability": p}
                               for t, p in r.top]), hide_index=True, width="stretch",
                 column_config={"probability": st.column_config.NumberColumn(
                     "probability (T = 1)", format="%.3f",
                     help="The model's plain softmax (temperature 1). The engine draws with "
                          "its own temperature and top-p, which reshape it.")})


def panel(engine: Engine, past_step: int | None = None, to_newest: str = "") -> None:
    """The panel, over the live engine. `past_step`: the step whose state the page shows
    instead (a timeline pick), where the panel only says how to reach the live state
    (`to_newest`, an imperative): it reads the live K/V tensors, which hold the newest
    state, and its requests, blocks and tokens beside a past state's tables read as if
    they were that state's."""
    # Its content runs only while it is open (on_change="rerun"), as the control run's.
    with st.expander("What if a request's blocks were read in physical order?",
                     key="whatif_open", on_change="rerun") as box:
        if not box.open:
            return
        if past_step is not None:
            st.caption(plain_md(
                f"The page shows step {past_step:,}'s state; this reads a request's blocks "
                f"from the live K/V tensors, which hold the newest state, step "
                f"{engine.step:,}: {to_newest} to use it."))
            return
        st.caption(
            "Recomputes one request's next-token prediction on a copy of the pool, through "
            "its block table and through the same blocks sorted by physical id. A table not "
            "in physical order, sorted, reads the token history out of order (the text the "
            "button shows): only the table says which token is where. The prediction changes "
            "only where sorting moves the request's last block away from the end: a table "
            "9, 2, 14 sorts to 2, 9, 14 and keeps its last block last, so the model reads the "
            "same slots and predicts the same, to float rounding; 14, 2, 9 (after a Shuffle, "
            "say) sorts to 2, 9, 14, which moves its last block, 9, into the middle. Why: each "
            "key carries its own position, so attention over the same slots in another order "
            "sums the same; but the kernel reads every slot of each logical block except the "
            "last, and only the filled slots of the last. Moved, the partly filled block, if "
            "any, is read whole, a full one is cut short, and the new token's K/V lands in "
            "another token's slot. Table order gives the engine's logits back.")
        live = [rid for rid in engine.running
                if engine.requests[rid].logits is not None and not engine.requests[rid].prefilling]
        if not live:
            st.caption("No running request with its prompt computed: add one.")
            return
        c = st.columns([2, 1])
        rid = c[0].selectbox("Request to read", live, key="whatif_pick", persist_state="session")
        if c[1].button("Read in physical order", key="btn_whatif"):
            try:
                keep_result(KEY, engine, (engine.step, physical_order(engine, rid)))
            except PagedLabError as exc:
                st.error(plain_md(str(exc)))
        kept = kept_result(KEY, engine)
        if kept is None:
            return
        step, w = kept
        if step != engine.step or w.request not in engine.requests:
            st.caption(f"As of step {step}; press again for the current state.")
        if w.sorted_already:
            st.info(f"{plain_md(w.request)}'s table is already in physical order: both "
                    "readings are the same.")
        left, right = st.columns(2)
        with left:
            _column(engine, w, w.table_order, "Table order")
        with right:
            _column(engine, w, w.physical_order, "Physical order")
        st.markdown(outcome(w))
        st.caption("Each block's slots as the kernel read them, · for a slot past the "
                   "block's filled ones (zeros, or K/V a former holder left there); the last "
                   f"block is read up to the last token's position, {WRITTEN}, where this "
                   "forward writes that token's K/V.")
