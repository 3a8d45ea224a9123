"""Sharing: the block memory that parallel samples and beams save, beside the paper's Figure 15."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import streamlit as st

from backend.core.config import SMOLLM2, TINY_BYTE
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.sharing import (
    instruction_prompts,
    mean_prompt_tokens,
    measure_sharing,
    recorded_results,
)
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.lab.sharing import SharingKind, SharingResult, sharing_experiment
from backend.views.compare import charts, tables
from backend.views.compare.frames import sharing_kinds
from ui import a11y, layout, numbers
from ui.bars import Advance, progress_bar
from ui.compare import background, in_percent, panel, refuse

WIDTHS = (2, 4, 6)
KINDS: tuple[tuple[SharingKind, str], ...] = (("parallel", "parallel sampling"),
                                              ("beam", "beam search"))
MAX_ENTRIES = 32
LIVE = "cmp_share_live_results"
LIVE_JOB = "cmp_share_live_job"   # engine runs at work (ui/compare/background.py)
_THREADS = re.compile(r"(\d+) thread\(s\)")

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
    out: list[SharingResult] = []
    with progress_bar("", lazy=True) as advance:
        for i, (kind, words) in enumerate(KINDS):
            key = (kind, requests, block_size)
            results = _cached(key)
            if results is None:
                advance(i / len(KINDS),
                        f"Measuring {words} (n = 2, 4, 6) over {requests:,} requests in "
                        f"blocks of {block_size}: {i + 1} of {len(KINDS)}")
                # One call per kind, all widths at once: the widths share their draws.
                results = sharing_experiment(kind, WIDTHS, requests=requests,
                                             block_size=block_size)
                _keep(key, results)
            out.extend(results)
    return out


def _show(results: list[SharingResult], key: str) -> None:
    """Sentence, bars against the paper's band, and the table of block counts."""
    df = tables.sharing_frame(results)
    # Read out when a run's results are drawn (ui/a11y.py).
    with a11y.said(key, "result"):
        st.markdown(tables.sharing_sentence(results))
    # One chart per kind, in columns that wrap: as one faceted picture the two panels are
    # some 560 px wide, and a phone's page (about 360 px) cut off the second. Each keeps
    # its 200 px panel (some 268 px with its axis), and side by side they still fit
    # beside the sidebar of a 1024 px window (a page of 564 px).
    kinds = sharing_kinds(df)
    layout.wrap_below(f"{key}_charts", [270] * len(kinds))
    with st.container(key=f"{key}_charts"):
        places = st.columns(len(kinds)) if kinds else []
    for place, kind in zip(places, kinds, strict=True):
        place.altair_chart(charts.sharing_bars(df[df["kind"] == kind]),
                           key=f"{key}_chart_{kind.split()[0]}")
    st.caption("Shaded band: the paper's range for the same kind of sharing (Figure 15).")
    shown, saved = in_percent(df, "saved", help="block memory that sharing saved, "
                                                "time-averaged over the run: 1 - held ÷ "
                                                "unshared, in block-steps")
    # Short headers, the long names as tooltips. The saving, the paper's range and the
    # block-steps it is computed from come first: beside the sidebar in a 1024 px window
    # they are in view before it scrolls. The peaks, another measure, follow.
    col, num = st.column_config.Column, st.column_config.NumberColumn
    st.dataframe(shown, hide_index=True, key=f"{key}_table", column_order=[
        "kind", "n", "saved", "paper range", "block-steps held", "block-steps unshared",
        "peak blocks shared", "peak blocks unshared", "copy-on-write copies", "requests"],
        column_config={
        "kind": col(pinned=True), "saved": saved, "paper low": None, "paper high": None,
        "paper range": col("paper", help="the paper's range for this kind (Figure 15)"),
        "block-steps held": num("held", help="blocks in use, summed over every decode step "
                                             "(block-steps)"),
        "block-steps unshared": num(
            "unshared", help="blocks the same sequences would have held with blocks of their "
                             "own, summed over every decode step (block-steps)"),
        "copy-on-write copies": num("CoW copies", help="copy-on-write copies the engine made"),
        "peak blocks shared": num("peak blocks", help="the most blocks in use at once"),
        "peak blocks unshared": num(
            "peak unshared", help="the most blocks the same sequences would have held at "
                                  "once, each with blocks of its own"),
        "requests": num(help="requests in the run, one prompt each")})


def sharing_section() -> None:
    st.markdown(
        "Paging lets sequences share blocks: the samples of one prompt share the prompt's "
        "blocks, and beam candidates share their common ancestors' blocks; a shared, partly "
        "filled block is copied only when one of them writes into it (copy-on-write). Below, "
        "the block memory sharing saves, time-averaged over every step, beside the paper's "
        "Figure 15 (OPT-13B on Alpaca): measured on PagedLab's engine, which forks, copies "
        "and drops the sequences itself (`add` with `n`, or with `beam_width`: beam search "
        "on the model's log-probabilities).")
    _recorded()
    # Each part stops on its own numbers: the other is drawn as usual.
    numbers.section(_live)
    # Keyed, so it stays open when a refusal above it changes the page's elements.
    with panel("Estimate for a whole Alpaca-like workload (modelled, not run)",
               "cmp_share_estimate_open"):
        numbers.section(_estimate)


def _machine(recorded: str) -> str:
    """The recording's machine with its thread count in words: bench/sharing_engine.py
    writes "x86_64, 1 thread(s)", shown as "x86_64, 1 thread" (and "2 threads")."""
    return _THREADS.sub(lambda m: counted(int(m[1]), "thread"), recorded)


def _recorded() -> None:
    st.markdown("**SmolLM2-135M on the engine** (recorded by `bench/sharing_engine.py`)")
    try:
        meta, results = recorded_results()
    except (OSError, ValueError, KeyError) as exc:
        st.warning(f"No recorded measurement to show ({type(exc).__name__}); run "
                   "bench/sharing_engine.py --out assets/measured/sharing-smollm2.json.")
        return
    st.caption(f"{meta.get('model')}, {counted(results[0].requests, 'instruction prompt')}, "
               f"block size {results[0].block_size}, up to {meta.get('max_new_tokens')} new "
               f"tokens, prefix caching off; measured {meta.get('date')} on "
               f"{_machine(str(meta.get('machine')))} in {meta.get('seconds')} s.")
    _show(results, "cmp_share_recorded")
    model = str(meta.get("model"))
    prompt = mean_prompt_tokens(model)
    parallel = [r for r in results if r.kind == "parallel"]
    steps = max(r.trace.steps for r in parallel) / parallel[0].requests if parallel else 0
    st.info(
        "What differs from the paper, and why: the saving is the shared blocks' share of "
        "all blocks, so it depends on how long outputs are beside prompts. Here the chat "
        f"template (its system prompt included) makes a prompt {prompt:.0f} tokens on "
        f"average and a group of samples runs {steps:.0f} steps (outputs of at most "
        f"{meta.get('max_new_tokens')} tokens), so the shared prompt is a larger part of "
        "every sample than in the paper's runs (OPT-13B on Alpaca, shorter prompts and "
        "longer outputs), and parallel sampling saves more than it did. Beam search "
        "shares most of each beam's history, prompt or not, so it lands near the paper's "
        "range.")


def _what(model: str, prompts: int, block_size: int, max_new_tokens: int) -> str:
    return (f"{model}, {counted(prompts, 'instruction prompt')}, block size {block_size}, up "
            f"to {max_new_tokens} new tokens")


def _live() -> None:
    st.markdown("**Run it here**: the same measurement on this server's engine")
    # Two fields a line where the page is narrow (beside the sidebar in a 1024 px window).
    layout.wrap_below("cmp_share_fields", [200, 200, 200, 200])
    with st.container(key="cmp_share_fields"):
        c = st.columns(4)
    with numbers.fields() as f:
        model = c[0].selectbox("Model", (TINY_BYTE, SMOLLM2), key="cmp_share_model",
                               persist_state="session",
                               help="tiny-byte takes seconds; SmolLM2 about a second per "
                                    "sequence step on a CPU, so several minutes for all "
                                    "prompts.")
        prompts = f.number(c[1], "Prompts", 1, len(instruction_prompts()), 4,
                           key="cmp_share_prompts")
        new = f.number(c[2], "Max new tokens", 4, 256, 32, key="cmp_share_new")
        block = c[3].selectbox("Block size", SWEEP_BLOCK_SIZES, index=4,
                               key="cmp_share_block", persist_state="session")
    if st.button("Measure on the engine", key="cmp_share_run"):
        chosen, count, size, limit = model, int(prompts), int(block), int(new)

        def work(advance: Advance) -> list[SharingResult]:
            kinds = len(KINDS)
            results: list[SharingResult] = []
            for i, (kind, words) in enumerate(KINDS):
                def show(done: int, total: int, i: int = i, words: str = words) -> bool:
                    advance((i + done / total) / kinds,
                            f"{words}: run {done} of {total} finished")
                    return True

                results += measure_sharing(kind, WIDTHS, instruction_prompts()[:count],
                                           model=chosen, block_size=size,
                                           max_new_tokens=limit, progress=show)
            return results

        asked = _what(chosen, count, size, limit)
        background.begin(LIVE_JOB, asked, work, "Starting the engines...", asked)

    def record(job: background.Job) -> None:
        # With the fields it was asked for: they may change before the next run.
        st.session_state[LIVE] = (job.inputs, job.result)

    background.take(LIVE_JOB, record, refuse)
    kept: tuple[str, list[SharingResult]] | None = st.session_state.get(LIVE)
    if kept and kept[1]:
        st.caption(f"Last run: {kept[0]}.")
        _show(kept[1], "cmp_share_live")
    else:
        st.caption("Press the button: tiny-byte over 4 prompts takes a few seconds.")


def _estimate() -> None:
    st.caption("For sizes the engine cannot run here: a stochastic model on PagedLab's "
               "block manager, over Alpaca-like prompt and output lengths.")
    c = st.columns(2)
    with numbers.fields() as f:
        requests = f.number(c[0], "Requests", 1, 1000, 100, step=50,
                            key="cmp_share_requests")
        block_size = c[1].selectbox("Block size", SWEEP_BLOCK_SIZES, index=4,
                                    key="cmp_share_block_size", persist_state="session")
    try:
        results = _sharing(int(requests), int(block_size))
    except PagedLabError as e:
        refuse(e)
        return
    _show(results, "cmp_share")
    st.info("An estimate, not a run: beam choices are modelled stochastically (at every "
            "step each new beam picks its parent uniformly at random among the current "
            "beams); real beam search, as measured above, picks by score. Parallel samples "
            "draw their own output lengths from the workload.")
