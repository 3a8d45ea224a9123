"""The seed's example: requests A, B and C in a contiguous arena and in a paged pool of 16 slots."""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.core.words import counted, sentence
from backend.lab.compare.seed_example import seed_example
from backend.views.compare import charts
from backend.views.compare import seed as seed_views
from ui import a11y, layout, numbers
from ui.compare import label, refuse


def seed_section() -> None:
    st.markdown(
        "The seed text (the PagedAttention explainer this lab is built to show) gives "
        "this example: requests **A, B and C** will reach **6, 3 and 5** tokens "
        "(they arrive with 2, 1 and 2 and gain one per decode step). The contiguous arena "
        "reserves one unbroken region per request, sized from its final length by the "
        "policy chosen below and placed first-fit; the paged pool of the same 16 slots takes "
        "blocks only for the tokens that exist. Two decode steps later a new request D "
        "arrives. Which requests run, wait or finish depends on the policy: the lines under "
        "the fields say what happened.")
    # The policy's name ("contiguous, exact final length") needs 240 px of field: where
    # the page is narrow (beside the sidebar in a 1024 px window) D's length goes under.
    layout.wrap_below("cmp_seed_fields", [240, 130, 130])
    with st.container(key="cmp_seed_fields"):
        c1, c2, c3 = st.columns(3)
    with numbers.fields() as f:
        policy = c1.selectbox("Contiguous policy", ["oracle", "pow2", "max"],
                              key="cmp_seed_policy", persist_state="session", format_func=label)
        block_size = c2.segmented_control("Paged block size", [1, 2, 4], default=1,
                                          required=True, key="cmp_seed_block_size",
                                          persist_state="session")
        new_len = f.number(c3, "D's final length", 2, 16, 5, key="cmp_seed_new_len")
    try:
        ex = seed_example(str(policy), int(block_size or 1), int(new_len or 5))
    except PagedLabError as e:
        refuse(e)
        return
    # Told from the run itself: under "max" B and C never start in the arena, under
    # "pow2" C waits, so one fixed sentence would be wrong for two policies of three.
    # Read out when a field's change redraws them (ui/a11y.py).
    with a11y.said("cmp_seed", "result"):
        st.markdown(seed_views.seed_arena_story(ex))
        st.markdown(seed_views.seed_pool_story(ex) + " Then D arrives with "
                    f"{counted(ex.new_len - 1, 'token')} and will reach {ex.new_len}.")
    st.header("Contiguous arena", anchor=False)
    st.altair_chart(charts.slot_strip(seed_views.seed_arena_slots(ex), f"{ex.capacity} slots, one "
                                      "region per request"), key="cmp_seed_arena_chart")
    m1, m2, msg = st.columns([1, 1, 3])
    m1.metric("Free slots", ex.arena[1].free_total, help="After the two decode steps")
    m2.metric("Largest hole", ex.arena[1].largest_hole, help="After the two decode steps")
    with msg:
        (st.success if ex.fit.fits else st.warning)(f"{sentence(ex.fit.message)}.")
    st.caption("The arena's kinds are the paper's (Figure 2): reservation is room a request "
               "will still fill, internal fragmentation room past its final length that it "
               "never will. The seed text calls both together internal fragmentation (its "
               "own example: room reserved for sixteen tokens while nine are present, which "
               "scenario 15 on the Scenarios page steps through). In "
               "the paged pool below, a block's empty slots are its internal fragmentation: "
               "at most block size − 1 per request, filled as it grows.")
    st.header("Paged pool", anchor=False)
    st.altair_chart(charts.slot_strip(seed_views.seed_pool_slots(ex), f"{len(ex.pool[-1].blocks)} "
                                      f"blocks of {block_size}, the same {ex.capacity} slots"),
                    key="cmp_seed_pool_chart")
    m1, msg = st.columns([2, 3])
    m1.metric("Free blocks after D", ex.pool[-1].free_blocks)
    with msg:
        # Placed, but short of blocks for the next step: a warning, not a success.
        placed = ex.d_table is not None and not ex.short_next_step
        (st.success if placed else st.warning)(ex.pool_message + ".")
    st.markdown("**The arena, stage by stage**")
    # "len", so that every column fits beside the sidebar in a 1024 px window.
    st.dataframe(seed_views.seed_stage_table(ex), hide_index=True, key="cmp_seed_stages",
                 column_config={"holes (start, length)": st.column_config.Column(
                     "holes (start, len)", help="each hole's first slot and length")})
    st.markdown("**The pool's block tables after D**")
    st.dataframe(seed_views.seed_block_tables(ex), hide_index=True, key="cmp_seed_tables")
    st.caption("A block table lists a request's physical blocks in token order. "
               + seed_views.seed_reuse_sentence(ex))
    st.markdown("The arena at the last stage as text, one character per slot:")
    st.code(ex.arena[-1].text, language=None)
