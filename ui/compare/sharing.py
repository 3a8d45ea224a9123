"""Sharing: the block memory that parallel samples and beams save, beside the paper's Figure 15."""

from __future__ import annotations

import threading
from collections import OrderedDict

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.lab.sharing import SharingKind, SharingResult, sharing_experiment
from backend.views.compare import charts, tables

WIDTHS = (2, 4, 6)
KINDS: tuple[tuple[SharingKind, str], ...] = (("parallel", "parallel sampling"),
                                              ("beam", "beam search"))
MAX_ENTRIES = 32

# Finished experiments, shared by every session. A plain bounded cache, not
# st.cache_data: the page must know before computing whether anything is left
# to do, so that it draws its progress bar only then (1,000 requests take some
# 10 s per kind on a small CPU; a bar drawn on every rerun would only flicker),
# and no cached function may draw a bar (CacheReplayClosureError, issue 13).
_DONE: OrderedDict[tuple[str, int, int], list[SharingResult]] = OrderedDict()
_LOCK = threading.Lock()


def _cached(key: tuple[str, int, int]) -> list[SharingResult] | None:
    with _LOCK:
        found = _DONE.get(key)
        if found is not None:
            _DONE.move_to_end(key)
        return found


def _keep(key: tuple[str, int, int], results: list[SharingResult]) -> None:
    with _LOCK:
        _DONE[key] = results
        _DONE.move_to_end(key)
        while len(_DONE) > MAX_ENTRIES:
            _DONE.popitem(last=False)


def _sharing(requests: int, block_size: int) -> list[SharingResult]:
    """Both kinds' results for n = 2, 4, 6; a bar says which kind is being measured."""
    bar = None
    out: list[SharingResult] = []
    try:
        for i, (kind, words) in enumerate(KINDS):
            key = (kind, requests, block_size)
            results = _cached(key)
            if results is None:
                text = (f"Measuring {words} (n = 2, 4, 6) over {requests:,} requests in "
                        f"blocks of {block_size}: {i + 1} of {len(KINDS)}")
                if bar is None:
                    bar = st.progress(i / len(KINDS), text=text)
                else:
                    bar.progress(i / len(KINDS), text=text)
                # One call per kind, all widths at once: the widths share their draws.
                results = sharing_experiment(kind, WIDTHS, requests=requests,
                                             block_size=block_size)
                _keep(key, results)
            out.extend(results)
    finally:
        if bar is not None:
            bar.empty()
    return out


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
