"""Swap or recompute: the paper's section 7.3 comparison, run on the live engine."""

from __future__ import annotations

import streamlit as st

from backend.core.words import counted
from backend.engine.measure import BLOCK_SIZES, PreemptionRun, Workload, swap_vs_recompute
from backend.kernels import select_kernels
from backend.views.compare import swap_recompute as views
from ui import a11y, layout, numbers
from ui.bars import Advance
from ui.compare import background, refuse

STATE = "cmp_swap_last"
JOB = "cmp_swap_job"   # engine runs at work (ui/compare/background.py)
NO_SIZES = ("Choose at least one block size to run: each is run on the engine three times "
            "(never preempting, swapping, recomputing).")


def _what(sizes: list[int], requests: int, slots: int) -> str:
    return (f"block sizes {', '.join(map(str, sizes))}; {counted(requests, 'request')}; "
            f"{slots:,} token slots")


def preemption_section() -> None:
    st.markdown(
        "When the pool runs out, vLLM preempts a request and either **swaps** its blocks to "
        "CPU memory and back, or **recomputes** them: it frees the blocks and later prefills "
        "the prompt and the tokens generated so far again. The paper (section 7.3, "
        "Figure 19) finds swapping slow at small block sizes, where it becomes many small "
        "transfers, and recomputation's cost flat in the block size. Here one overloaded "
        "workload runs through real engines at each block size: in a pool large enough "
        "never to preempt (the reference), then with each method in a pool of the same "
        "token slots at every block size.")
    # The four default block sizes need 300 px of field; where the page is narrow (beside
    # the sidebar in a 1024 px window) the pool's field goes to the next line.
    layout.wrap_below("cmp_swap_fields", [300, 150, 150])
    with st.container(key="cmp_swap_fields"):
        c = st.columns(3)
    with numbers.fields() as f:
        sizes = c[0].multiselect("Block sizes", list(BLOCK_SIZES), default=[1, 4, 16, 64],
                                 key="cmp_swap_sizes", persist_state="session")
        requests = f.number(c[1], "Requests", 2, 64, 16, key="cmp_swap_requests",
                            help="Added at once; prompts of 24-64 tokens, 32-64 new "
                                 "tokens each (seeded).")
        slots = f.number(c[2], "Device pool (token slots)", 64, 8192, 512, step=64,
                         key="cmp_swap_slots")
    # A disabled button says nothing by itself: the caption under it says why.
    if st.button("Run on the engine", key="cmp_swap_run", disabled=not sizes,
                 help=None if sizes else NO_SIZES):
        chosen, count, pool = sorted(sizes), int(requests), int(slots)

        def work(advance: Advance) -> list[PreemptionRun]:
            def show(done: int, total: int) -> bool:
                advance(done / total, f"Engine run {done} of {total} finished")
                return True

            return swap_vs_recompute(chosen, workload=Workload.overloaded(count),
                                     capacity_tokens=pool, progress=show)

        background.begin(JOB, (chosen, count, pool), work, "Running the engines...",
                         _what(chosen, count, pool))

    def record(job: background.Job) -> None:
        # With the fields it was asked for: they may change before the next run.
        st.session_state[STATE] = (job.inputs, job.result)

    background.take(JOB, record, refuse)
    if not sizes:
        st.caption(NO_SIZES)
    # The runs, with the fields they were asked for (which may have changed since).
    kept: tuple[tuple[list[int], int, int], list[PreemptionRun]] | None = (
        st.session_state.get(STATE))
    if not kept or not kept[1]:
        if sizes:
            # No time is promised: it depends on the server and its load (a bar shows
            # the runs' progress, and the results say how long they took).
            st.caption(f"Press Run: {counted(len(sizes), 'block size')}, three engine runs "
                       "each; a bar shows their progress.")
        return
    device = select_kernels("auto", "torch").device.type
    (chosen, count, asked), runs = kept
    st.caption(f"Last run: {_what(chosen, count, asked)}.")
    # Read out when the runs' results are drawn (ui/a11y.py).
    with a11y.said("cmp_swap", "result"):
        st.markdown(views.summary(runs, device, asked))
    st.altair_chart(views.overhead_chart(runs), key="cmp_swap_chart")
    table = views.runs_frame(runs)
    # Every run in view: three per block size.
    # Short headers, the long names as tooltips: all twelve columns fit a 1280 px window
    # beside the sidebar, just (measured; longer figures, as a slower machine's wall ms,
    # can push the last one out). In a narrower one the grid scrolls sideways, with each row's
    # block size and mode pinned in view; the costs come first, so that beside the
    # sidebar in a 1024 px window both methods' are in view before it scrolls.
    num = st.column_config.NumberColumn
    st.dataframe(table, hide_index=True, key="cmp_swap_table", height="content",
                 placeholder="—", column_order=[
                     "block size", "mode", "wall ms", "recomputed tokens", "recompute ms",
                     "swapped blocks", "swap ms", "µs per block", "preemptions", "blocks",
                     "steps", "same tokens"], column_config={
                     "block size": num("block", help="block size (tokens)", pinned=True),
                     "mode": st.column_config.TextColumn(
                         pinned=True, help="roomy: a pool large enough never to preempt, "
                         "whose tokens the others must match; recompute and swap: the pool "
                         "asked for, preempting by that method"),
                     # One number of places per column, so a column's figures line up.
                     "wall ms": num(format="%.1f"), "recompute ms": num(format="%.2f"),
                     "swap ms": num(format="%.2f"),
                     "µs per block": num("µs/block", format="%.1f",
                                         help="µs per block copied: swap ms per swapped block"),
                     "blocks": num(help="device pool, in blocks"),
                     "preemptions": num("preempts", help="preemptions"),
                     "recomputed tokens": num("recomputed",
                                              help="tokens prefilled again after a preemption"),
                     "swapped blocks": num("swapped",
                                           help="blocks copied to the host pool and back"),
                     "same tokens": st.column_config.CheckboxColumn(
                         "same", help="same tokens: every request generated exactly the "
                                      "tokens of the run that never preempted")})
    st.caption("recomputed: tokens prefilled again after a preemption, and recompute ms the "
               "share of each prefill forward's wall time spent on them; swapped: blocks "
               "copied to the host pool and back, swap ms the time inside those copies, and "
               "µs/block that time per block copied; same: every request generated the "
               "tokens of the run that never preempted. Wall ms covers the whole run, "
               "decode steps included.")
