"""One workload, two memories: a small trace's memory maps, contiguous beside paged."""

from __future__ import annotations

from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.views.compare import charts
from backend.views.compare import frames as views
from ui import a11y, layout, numbers
from ui.compare import SYNTHETIC_NOTE, breakdown, label, panel, refuse


@st.cache_data(show_spinner=False, max_entries=32)
def _maps(workload: str, requests: int, rate: float, seed: int, max_len: int, capacity: int,
          policy: str, block_size: int) -> dict[str, Any]:
    return views.two_memories(workload, requests, rate, seed, max_len, capacity, policy,
                              block_size)


def maps_section() -> None:
    st.markdown(
        "A small seeded workload replayed iteration by iteration through a contiguous arena "
        "(left) and the paged block manager (right), with the same capacity. Each column of "
        "a map is one moment; each slot is coloured by its state, as in the paper's "
        "Figure 2. A request is cut at the maximum sequence length, which is also what the "
        "max policy reserves.")
    policy = str(st.segmented_control("Contiguous policy", ["max", "pow2", "oracle"],
                                      default="max", required=True, key="cmp_map_policy",
                                      persist_state="session",
                                      format_func=label))
    # Two fields a line where the page is narrow (beside the sidebar in a 1024 px window),
    # rather than four of some 120 px.
    layout.wrap_below("cmp_map_fields", [200, 200, 200, 200])
    with (panel("Workload and memory", "cmp_map_open"),
          st.container(key="cmp_map_fields"), numbers.fields() as f):
        c = st.columns(4)
        workload = c[0].selectbox("Workload", ["alpaca", "sharegpt"], key="cmp_map_workload",
                                  persist_state="session")
        requests = f.number(c[1], "Requests", 1, 200, 40, key="cmp_map_requests")
        rate = f.number(c[2], "Rate (requests/s)", 0.1, 1000.0, 20.0, key="cmp_map_rate")
        seed = f.number(c[3], "Seed", 0, 1_000_000, 0, key="cmp_map_seed")
        m = st.columns(3)
        capacity = f.number(m[0], "Capacity (token slots)", 16, 8192, 768, step=16,
                            key="cmp_map_capacity")
        max_len = f.number(m[1], "Maximum sequence length", 2, 8192, 256, step=16,
                           key="cmp_map_max_len")
        block_size = m[2].selectbox("Paged block size", SWEEP_BLOCK_SIZES, index=4,
                                    key="cmp_map_block_size", persist_state="session")
    try:
        data = _maps(str(workload), int(requests), float(rate), int(seed), int(max_len),
                     int(capacity), policy, int(block_size or 16))
    except PagedLabError as e:
        refuse(e)
        return
    if policy == "max" and max_len * 2 > capacity:
        # Said, not left for the map to show: the max policy then runs one at a time.
        size = (f"the whole {int(capacity):,}-slot arena" if max_len >= capacity else
                f"{int(max_len):,} slots, more than half the {int(capacity):,}-slot arena,")
        st.caption(f"The max policy reserves {size} for each request: it holds one request "
                   "at a time.")
    if data["axes"]:
        st.caption(data["axes"])
    st.html(charts.kind_legend_html())
    left, right = st.columns(2, gap="medium")
    for col, side, title in ((left, "left", f"Contiguous: {views.POLICY_SHORT[policy]}"),
                             (right, "right", f"Paged: blocks of {block_size}")):
        shown = data[side]
        with col:
            st.altair_chart(charts.memory_map(shown["segments"], title, int(capacity),
                                              shown["domain"]),
                            width="stretch", key=f"cmp_map_{side}")
            st.altair_chart(charts.fractions_area(shown["fractions"], shown["domain"]),
                            width="stretch", key=f"cmp_area_{side}")
            # The chart's average in numbers: the same figures as the table below.
            st.caption(" ".join(c for c in (shown["caption"], shown["shares"]) if c))
    # Read out when a field's change redraws it (ui/a11y.py).
    with a11y.said("cmp_map", "result"):
        st.markdown(data["finish"])
    st.header("Time-averaged breakdown on this workload", anchor=False)
    breakdown(data["table"], "cmp_map_table")
    st.markdown(views.batch_gain_sentence(data["table"]))
    st.altair_chart(charts.breakdown_bars(views.memory_long(data["table"])), width="stretch",
                    key="cmp_map_bars")
    st.caption(views.STATES_NOTE)
    st.info(SYNTHETIC_NOTE + " The paper's Figure 2 token-state shares, to compare with the "
            "table's \"token states (held)\": Orca (Max) 20.4%, "
            "Orca (Pow2) 26.8%, Orca (Oracle) 38.2%, vLLM 96.3%. On a trace this small, the "
            "ramp-up and the drain (when memory is not full) weigh on every share; the Trace "
            "simulator tab replays thousands of requests.")
