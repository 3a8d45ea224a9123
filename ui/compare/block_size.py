"""Block size: tail waste against block-table entries over a trace, and the batch each size runs."""

from __future__ import annotations

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES, BlockSizePoint, trace_block_sweep
from backend.lab.contiguous import DEFAULT_MAX_LEN
from backend.lab.sim.simulator import SimConfig, SimResult
from backend.lab.workloads import make_trace
from backend.views.compare import charts, tables
from ui import a11y, layout, numbers
from ui.compare import background, in_percent, refuse
from ui.compare.sim_inputs import PAGE_MAX_REQUESTS
from ui.compare.sim_runs import run_cached

BLOCK_SIM_RATE = 4.0
BLOCK_SIM_CAPACITY = 15360
BLOCK_SIM_STATE = "cmp_blocks_sim_last"
BLOCK_SIM_JOB = "cmp_blocks_sim_job"   # a sweep at work (ui/compare/background.py)


@st.cache_data(show_spinner=False, max_entries=16)
def _block_sweep(workload: str, requests: int, seed: int) -> list[BlockSizePoint]:
    return trace_block_sweep(workload, requests, seed)


def block_size_section() -> None:
    st.markdown(
        "A request holding t tokens in blocks of B slots needs ceil(t / B) blocks: its last "
        "block wastes up to B - 1 slots, and its block table has ceil(t / B) entries. "
        "Smaller blocks waste less; larger blocks mean fewer entries to store, look up and "
        "manage. Measured over a trace: tail waste averaged over every iteration of every "
        "request's life, table entries both so (life avg) and at each request's final "
        "length (end), which the sentence and chart below use.")
    c = st.columns(3)
    with numbers.fields() as f:
        workload = c[0].selectbox("Workload", ["sharegpt", "alpaca"], key="cmp_blk_workload",
                                  persist_state="session")
        # The simulator's cap: *Simulate every block size* replays the trace once per
        # block size, and 100,000 requests took some 40 minutes of a server's run slot.
        requests = f.number(c[1], "Requests", 1, PAGE_MAX_REQUESTS, 1000, step=500,
                            key="cmp_blk_requests")
        seed = f.number(c[2], "Seed", 0, 1_000_000, 0, key="cmp_blk_seed")
    try:
        points = _block_sweep(workload, int(requests), int(seed))
    except PagedLabError as e:
        refuse(e)
        return
    # Read out when a field's change redraws it (ui/a11y.py).
    with a11y.said("cmp_blk", "result"):
        st.markdown("**The trade-off in numbers:** " + tables.block_tradeoff_sentence(points))
    df = tables.block_sweep_frame(points)
    # The two charts in columns of their own rather than as one picture: side by side
    # they are some 650 px, wider than the page beside the sidebar in a 1024 px window,
    # where the second goes under the first. The third column only keeps the second
    # beside the first where there is room, as one picture placed them. (Altair moved
    # the data the two share up to the picture: each takes it back. Each keeps its plot
    # 260 x 240 px, its axes and title around it, as in the picture.)
    both = charts.block_sweep_lines(df)
    layout.wrap_below("cmp_blk_charts", [340, 340])
    with st.container(key="cmp_blk_charts"):
        places = st.columns([3, 3, 2])
    for place, part, name in zip(places[:2], both.hconcat,
                                 ("cmp_blk_chart", "cmp_blk_entries_chart"), strict=True):
        place.altair_chart(part.properties(data=both.data, autosize="pad"), width="content",
                           key=name)
    # Short headers, the long names as tooltips: every column fits beside the sidebar.
    num = st.column_config.NumberColumn
    shown, waste = in_percent(df, "tail waste", help="empty share of allocated slots, "
                                                     "averaged over every iteration of every "
                                                     "request")
    # Means to two decimals, trailing zeros kept, so a column's figures line up.
    st.dataframe(shown, hide_index=True, key="cmp_blk_table", column_config={
        "tail waste": waste,
        "empty last-block slots at finish": num(
            "empty slots (end)", format="%.2f",
            help="empty slots in a request's last block at its final length, on average"),
        "table entries at finish": num(
            "entries (end)", format="%.2f",
            help="block-table entries of a request at its final length, on average"),
        "largest table at finish": num(
            "largest table", help="the most block-table entries any request reached"),
        "table entries, time-averaged": num(
            "entries (life avg)", format="%.2f",
            help="block-table entries averaged over every iteration of every request's life")})
    st.markdown(
        "Tail waste is memory another request could have used. To see what it costs in batch "
        f"size, replay this trace through the paged simulator once per block size (rate "
        f"{BLOCK_SIM_RATE:g}/s, {BLOCK_SIM_CAPACITY:,} token slots).")
    if st.button("Simulate every block size", key="cmp_blk_sim"):
        # The same cache key as the trace simulator's, so a run made there is reused.
        key = ("synthetic", workload, int(requests), BLOCK_SIM_RATE, int(seed))
        configs = [SimConfig("paged", BLOCK_SIM_CAPACITY, bs, DEFAULT_MAX_LEN)
                   for bs in SWEEP_BLOCK_SIZES]
        wanted = (workload, int(requests), int(seed))
        background.begin(BLOCK_SIM_JOB, wanted, lambda advance: run_cached(
            key, make_trace(wanted[0], wanted[1], BLOCK_SIM_RATE, wanted[2]), configs,
            advance), "Simulating...", f"{workload}, {int(requests):,} requests, seed {int(seed)}")

    def record(job: background.Job) -> None:
        # Kept with the inputs it ran: the fields may change before the next run.
        st.session_state[BLOCK_SIM_STATE] = (job.inputs, [r.result for r in job.result])

    background.take(BLOCK_SIM_JOB, record, refuse)
    last: tuple[tables.BlockRunInputs, list[SimResult]] | None = st.session_state.get(
        BLOCK_SIM_STATE)
    if last and last[1]:
        ran, done = last
        st.caption(tables.block_run_caption(ran, (workload, int(requests), int(seed)),
                                            rate=BLOCK_SIM_RATE, capacity=BLOCK_SIM_CAPACITY))
        with a11y.said("cmp_blk_sim", "result"):
            st.markdown(tables.block_batch_sentence(done))
        st.altair_chart(charts.block_batch_line(tables.block_batch_frame(done)),
                        width="stretch", key="cmp_blk_batch_chart")
