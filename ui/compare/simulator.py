"""The trace simulator: `python -m backend simulate` on the page, every policy on one trace.

`simulate_cached` is shared with the block-size section, which replays one trace per
block size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES
from backend.lab.contiguous import DEFAULT_MAX_LEN
from backend.lab.sim.simulator import POLICIES, SimConfig, SimResult, simulate_workload
from backend.views.compare import charts
from backend.views.compare import frames as views
from ui.compare import SYNTHETIC_NOTE, label

PAGE_MAX_REQUESTS = 20_000   # the CLI handles 100k; the page stays interactive
SIM_STATE = "cmp_sim_last"   # the last simulator run: its parameters and results


@st.cache_data(show_spinner=False, max_entries=64)
def simulate_cached(workload: str, policy: str, requests: int, rate: float, capacity: int,
                    block_size: int, max_len: int, seed: int, _progress: Any = None
                    ) -> SimResult:
    config = SimConfig(policy, capacity, block_size, max_len)  # type: ignore[arg-type]
    return simulate_workload(workload, config, requests=requests, rate=rate, seed=seed,
                             progress=_progress)


def _run_policies(workload: str, policies: Sequence[str], params: dict[str, Any]
                  ) -> list[SimResult]:
    """Simulate each policy in turn, feeding one progress bar across all of them.

    In turn rather than with `sweep`'s process pool: the bar then moves with every
    request, each policy's result is cached on its own, and on a small machine the
    pool's start-up (every worker imports the backend afresh) eats most of its gain.
    """
    bar = st.progress(0.0, text="Simulating...")
    results: list[SimResult] = []
    for idx, policy in enumerate(policies):
        def tick(done: int, total: int, idx: int = idx, policy: str = policy) -> None:
            bar.progress(min(1.0, (idx + done / total) / len(policies)),
                         text=f"{policy}: {done:,} of {total:,} requests finished")
        results.append(simulate_cached(workload, policy, _progress=tick, **params))
    bar.empty()
    return results


def simulator_section() -> None:
    st.markdown(
        "`python -m backend simulate` on this page: a seeded trace with Poisson arrivals "
        "replayed through each allocation policy with continuous batching. The page runs "
        f"up to {PAGE_MAX_REQUESTS:,} requests; the command line handles 100k.")
    c = st.columns(4)
    workload = c[0].selectbox("Workload", ["sharegpt", "alpaca"], key="cmp_sim_workload")
    requests = c[1].number_input("Requests", 1, PAGE_MAX_REQUESTS, 1000, step=100,
                                 key="cmp_sim_requests")
    rate = c[2].number_input("Rate (requests/s)", 0.01, 10_000.0, 4.0, key="cmp_sim_rate")
    seed = c[3].number_input("Seed", 0, 1_000_000, 0, key="cmp_sim_seed")
    c = st.columns(4)
    capacity = c[0].number_input("Capacity (token slots)", 1, 1 << 24, 15360, step=1024,
                                 key="cmp_sim_capacity")
    block_size = c[1].selectbox("Block size (paged)", SWEEP_BLOCK_SIZES, index=4,
                                key="cmp_sim_block_size")
    max_len = c[2].number_input("Max reservation (max policy)", 1, 1 << 24, DEFAULT_MAX_LEN,
                                key="cmp_sim_max_len")
    policies = st.multiselect("Policies", list(POLICIES), default=list(POLICIES),
                              key="cmp_sim_policies", format_func=label)
    if st.button("Run simulation", type="primary", key="cmp_sim_run"):
        if not policies:
            st.error("Choose at least one policy.")
        else:
            params = {"requests": int(requests), "rate": float(rate),
                      "capacity": int(capacity), "block_size": int(block_size),
                      "max_len": int(max_len), "seed": int(seed)}
            ordered = [p for p in views.POLICY_ORDER if p in policies]
            try:
                ran = _run_policies(str(workload), ordered, params)
            except PagedLabError as e:
                # Never leave an earlier run on screen as if it answered these parameters.
                st.session_state.pop(SIM_STATE, None)
                st.error(str(e))
            else:
                st.session_state[SIM_STATE] = {"workload": workload, **params, "results": ran}
    last = st.session_state.get(SIM_STATE)
    if last is None:
        st.caption("Choose the parameters and press Run simulation.")
        return
    results: list[SimResult] = last["results"]
    st.caption(f"Last run: {last['workload']}, {last['requests']:,} requests at "
               f"{last['rate']:g}/s, {last['capacity']:,} token slots, seed {last['seed']}.")
    metrics = views.policy_metrics(results)
    st.markdown(views.batch_gain_sentence(results))
    a, b = st.columns(2)
    a.altair_chart(charts.policy_bars(metrics, "mean batch size", "Mean batch size"),
                   width="stretch", key="cmp_sim_batch_chart")
    b.altair_chart(charts.policy_bars(metrics, "token states", "Token-state share",
                                      percent=True, paper_field="paper token states"),
                   width="stretch", key="cmp_sim_token_chart")
    a, b = st.columns(2)
    a.altair_chart(charts.policy_bars(metrics, "preemptions", "Preemptions", integer=True),
                   width="stretch", key="cmp_sim_preempt_chart")
    b.caption("Red ticks: the paper's Figure 2 token-state shares for the same kinds of "
              "system. Only paged memory preempts: a contiguous region is sized for the final "
              "length up front, so it never runs out while growing; paged memory grows "
              "block by block and, when it runs out, sends the newest request back to be "
              "recomputed.")
    st.altair_chart(charts.breakdown_bars(views.memory_long(results)), width="stretch",
                    key="cmp_sim_breakdown_chart")
    st.dataframe(views.breakdown_table(results), hide_index=True, key="cmp_sim_table")
    st.dataframe(metrics, hide_index=True, key="cmp_sim_metrics", column_order=[
        "policy", "requests/s", "normalized latency (s/token)", "iterations", "preemptions"],
        column_config={"requests/s": st.column_config.NumberColumn(format="%.3f"),
                       "normalized latency (s/token)":
                           st.column_config.NumberColumn(format="%.4f")})
    st.info(SYNTHETIC_NOTE)
