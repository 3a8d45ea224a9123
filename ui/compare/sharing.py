"""Sharing: the block memory that parallel samples and beams save, beside the paper's Figure 15."""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.lab.sharing import SharingResult, sharing_experiment
from backend.views.compare import charts, tables


@st.cache_data(show_spinner=False, max_entries=16)
def _sharing(requests: int, block_size: int) -> list[SharingResult]:
    return [*sharing_experiment("parallel", (2, 4, 6), requests=requests,
                                block_size=block_size),
            *sharing_experiment("beam", (2, 4, 6), requests=requests, block_size=block_size)]


def sharing_section() -> None:
    st.markdown(
        "Paging lets sequences share blocks: the samples of one prompt share the prompt's "
        "blocks, and beam candidates share their common ancestors' blocks; a shared, partly "
        "filled block is copied only when one of them writes into it (copy-on-write). Below, "
        "the block memory sharing saves, time-averaged over every decode step, on "
        "Alpaca-like prompts and outputs, beside the paper's Figure 15 (OPT-13B on Alpaca).")
    c = st.columns(2)
    requests = c[0].number_input("Requests", 1, 1000, 100, step=50, key="cmp_share_requests")
    block_size = c[1].selectbox("Block size", SWEEP_BLOCK_SIZES, index=4,
                                key="cmp_share_block_size")
    try:
        results = _sharing(int(requests), int(block_size))
    except PagedLabError as e:
        st.error(str(e))
        return
    df = tables.sharing_frame(results)
    st.markdown(tables.sharing_sentence(results))
    st.altair_chart(charts.sharing_bars(df), key="cmp_share_chart")
    st.caption("Bars: PagedLab; shaded band: the paper's range (parallel sampling 6.1%-9.8%, "
               "beam search 37.6%-55.2%).")
    st.dataframe(df, hide_index=True, key="cmp_share_table", column_config={
        "saved": st.column_config.NumberColumn(format="percent"),
        "paper low": None, "paper high": None})
    st.info("There is no trained model here, so beam choices are modelled stochastically: "
            "at every step each new beam picks its parent uniformly at random among the "
            "current beams. Real beam search picks by score; the model reproduces the "
            "mechanism and the order of magnitude, not the paper's exact numbers. "
            "Parallel samples draw their own output lengths from the workload.")
