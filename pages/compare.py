"""Contiguous vs paged: the fragmentation lab, the trace simulator and the memory calculator.

Runs inside app.py's navigation or alone (`streamlit run pages/compare.py`); it needs
no engine and keeps its own widget state under the `cmp_` prefix.
"""

# ruff: noqa: E402 (the backend imports follow the search-path fix below)
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# `streamlit run pages/compare.py` puts only pages/ on the search path; the backend
# lives beside it. (Under app.py the repository root is already there.)
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st

from backend.core.errors import PagedLabError
from backend.lab.compare.block_sizes import SWEEP_BLOCK_SIZES, BlockSizePoint, trace_block_sweep
from backend.lab.compare.memory_maps import replay_maps, small_trace
from backend.lab.compare.seed_example import seed_example
from backend.lab.contiguous import DEFAULT_MAX_LEN
from backend.lab.memory_calc import DEFAULT_BLOCK_SIZES, MODELS, kv_capacity
from backend.lab.sharing import SharingResult, sharing_experiment
from backend.lab.sim.simulator import POLICIES, SimConfig, SimResult, simulate, simulate_workload
from backend.views.compare import charts, tables
from backend.views.compare import frames as views

PAGE_MAX_REQUESTS = 20_000   # the CLI handles 100k; the page stays interactive
BLOCK_SIM_RATE = 4.0
BLOCK_SIM_CAPACITY = 15360
SIM_STATE = "cmp_sim_last"   # the last simulator run: its parameters and results
BLOCK_SIM_STATE = "cmp_blocks_sim_last"
SYNTHETIC_NOTE = ("Our numbers come from PagedLab's synthetic traces and simulator, not from "
                  "the paper's testbed (a real model serving real request datasets on a real "
                  "GPU): compare the ordering and the size of the gaps, not the digits.")


# ---- cached computations (keyed by their parameters) ---------------------------------


@st.cache_data(show_spinner=False, max_entries=32)
def _maps(workload: str, requests: int, rate: float, seed: int, max_len: int, capacity: int,
          policy: str, block_size: int) -> dict[str, Any]:
    trace = small_trace(workload, requests, rate, seed, max_len)
    left = replay_maps(trace, policy, capacity, max_len=max_len)
    right = replay_maps(trace, "paged", capacity, block_size=block_size, max_len=max_len)
    lo = min(left.frames[0].iteration, right.frames[0].iteration)
    hi = max(left.frames[-1].iteration, right.frames[-1].iteration) + 1
    out: dict[str, Any] = {"domain": (lo, hi), "finish": views.finish_sentence(left, right)}
    for side, replay in (("left", left), ("right", right)):
        segs, stride = views.map_segments(replay, first=lo, last=hi)
        out[side] = (segs, views.map_fractions(replay, stride), stride)
    out["table"] = [simulate(trace, SimConfig(p, capacity, block_size, max_len))  # type: ignore[arg-type]
                    for p in views.POLICY_ORDER]
    return out


@st.cache_data(show_spinner=False, max_entries=64)
def _simulate(workload: str, policy: str, requests: int, rate: float, capacity: int,
              block_size: int, max_len: int, seed: int, _progress: Any = None) -> SimResult:
    config = SimConfig(policy, capacity, block_size, max_len)  # type: ignore[arg-type]
    return simulate_workload(workload, config, requests=requests, rate=rate, seed=seed,
                             progress=_progress)


@st.cache_data(show_spinner=False, max_entries=16)
def _sharing(requests: int, block_size: int) -> list[SharingResult]:
    return [*sharing_experiment("parallel", (2, 4, 6), requests=requests,
                                block_size=block_size),
            *sharing_experiment("beam", (2, 4, 6), requests=requests, block_size=block_size)]


@st.cache_data(show_spinner=False, max_entries=16)
def _block_sweep(workload: str, requests: int, seed: int) -> list[BlockSizePoint]:
    return trace_block_sweep(workload, requests, seed)


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
        results.append(_simulate(workload, policy, _progress=tick, **params))
    bar.empty()
    return results


# ---- sections -----------------------------------------------------------------------


def _label(policy: str) -> str:
    return views.POLICY_LABELS[policy]


def seed_section() -> None:
    st.markdown(
        "The seed text's example: requests **A, B and C** will reach **6, 3 and 5** tokens "
        "(they arrive with 2, 1 and 2 and gain one per decode step). The contiguous arena "
        "reserves one unbroken region per request, sized for its final "
        "length and placed first-fit; the paged pool of the same 16 slots takes blocks only "
        "for the tokens that exist. After two decode steps B finishes, and a new request "
        "D arrives.")
    c1, c2, c3 = st.columns(3)
    policy = c1.selectbox("Contiguous policy", ["oracle", "pow2", "max"], key="cmp_seed_policy",
                          format_func=_label)
    block_size = c2.segmented_control("Paged block size", [1, 2, 4], default=1,
                                      required=True, key="cmp_seed_block_size")
    new_len = c3.number_input("D's final length", min_value=2, max_value=16, value=5,
                              key="cmp_seed_new_len")
    try:
        ex = seed_example(str(policy), int(block_size or 1), int(new_len or 5))
    except PagedLabError as e:
        st.error(str(e))
        return
    st.subheader("Contiguous arena")
    st.altair_chart(charts.slot_strip(views.seed_arena_slots(ex), f"{ex.capacity} slots, one "
                                      "region per request"), key="cmp_seed_arena_chart")
    m1, m2, msg = st.columns([1, 1, 3])
    m1.metric("Free slots", ex.arena[1].free_total, help="After the two decode steps")
    m2.metric("Largest hole", ex.arena[1].largest_hole, help="After the two decode steps")
    with msg:
        (st.success if ex.fit.fits else st.warning)(f"fits({ex.new_len}): {ex.fit.message}.")
    st.subheader("Paged pool")
    st.altair_chart(charts.slot_strip(views.seed_pool_slots(ex), f"{len(ex.pool[-1].blocks)} "
                                      f"blocks of {block_size}, the same {ex.capacity} slots"),
                    key="cmp_seed_pool_chart")
    m1, msg = st.columns([2, 3])
    m1.metric("Free blocks after D", ex.pool[-1].free_blocks)
    with msg:
        (st.success if ex.d_table is not None else st.warning)(ex.pool_message + ".")
    st.markdown("**The arena, stage by stage**")
    st.dataframe(views.seed_stage_table(ex), hide_index=True, key="cmp_seed_stages")
    st.markdown("**The pool's block tables after D**")
    st.dataframe(views.seed_block_tables(ex), hide_index=True, key="cmp_seed_tables")
    st.caption("A block table lists a request's physical blocks in token order; they need "
               "not be neighbours, so any free block will do.")
    st.markdown("The arena at the last stage as text, one character per slot:")
    st.code(ex.arena[-1].text, language=None)


def maps_section() -> None:
    st.markdown(
        "A small seeded workload replayed iteration by iteration through a contiguous arena "
        "(left) and the paged block manager (right), with the same capacity. Each column of "
        "a map is one moment; each slot is coloured by its state, as in the paper's "
        "Figure 2. A request is cut at the maximum sequence length, which is also what the "
        "max policy reserves.")
    policy = str(st.segmented_control("Contiguous policy", ["max", "pow2", "oracle"],
                                      default="max", required=True, key="cmp_map_policy",
                                      format_func=_label))
    with st.expander("Workload and memory", expanded=False):
        c = st.columns(4)
        workload = c[0].selectbox("Workload", ["alpaca", "sharegpt"], key="cmp_map_workload")
        requests = c[1].number_input("Requests", 1, 200, 40, key="cmp_map_requests")
        rate = c[2].number_input("Rate (requests/s)", 0.1, 1000.0, 20.0, key="cmp_map_rate")
        seed = c[3].number_input("Seed", 0, 1_000_000, 0, key="cmp_map_seed")
        m = st.columns(3)
        capacity = m[0].number_input("Capacity (token slots)", 16, 8192, 768, step=16,
                                     key="cmp_map_capacity")
        max_len = m[1].number_input("Maximum sequence length", 2, 8192, 256, step=16,
                                    key="cmp_map_max_len")
        block_size = m[2].selectbox("Paged block size", SWEEP_BLOCK_SIZES, index=4,
                                    key="cmp_map_block_size")
    try:
        data = _maps(str(workload), int(requests), float(rate), int(seed), int(max_len),
                     int(capacity), policy, int(block_size or 16))
    except PagedLabError as e:
        st.error(str(e))
        return
    domain = data["domain"]
    st.altair_chart(charts.kind_legend(), key="cmp_map_legend")
    left, right = st.columns(2, gap="medium")
    for col, side, title in ((left, "left", f"Contiguous: {views.POLICY_SHORT[policy]}"),
                             (right, "right", f"Paged: blocks of {block_size}")):
        segs, fracs, stride = data[side]
        with col:
            st.altair_chart(charts.memory_map(segs, title, int(capacity), domain),
                            width="stretch", key=f"cmp_map_{side}")
            st.altair_chart(charts.fractions_area(fracs, domain), width="stretch",
                            key=f"cmp_area_{side}")
            if stride > 1:
                st.caption(f"One column per {stride} iterations (a snapshot from each "
                           "span); the shares below average over every iteration.")
    st.markdown(data["finish"])
    st.subheader("Time-averaged breakdown on this workload")
    st.dataframe(views.breakdown_table(data["table"]), hide_index=True, key="cmp_map_table")
    st.markdown(views.batch_gain_sentence(data["table"]))
    st.altair_chart(charts.breakdown_bars(views.memory_long(data["table"])), width="stretch",
                    key="cmp_map_bars")
    st.info(SYNTHETIC_NOTE + " The paper's Figure 2 token-state shares: Orca (Max) 20.4%, "
            "Orca (Pow2) 26.8%, Orca (Oracle) 38.2%, vLLM 96.3%. On a trace this small, the "
            "ramp-up and the drain (when memory is not full) weigh on every share; the Trace "
            "simulator tab replays thousands of requests.")


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
                              key="cmp_sim_policies", format_func=_label)
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


def block_size_section() -> None:
    st.markdown(
        "A request holding t tokens in blocks of B slots needs ceil(t / B) blocks: its last "
        "block wastes up to B - 1 slots, and its block table has ceil(t / B) entries. "
        "Smaller blocks waste less; larger blocks mean fewer entries to store, look up and "
        "manage. Measured over a trace, every request at every iteration of its life:")
    c = st.columns(3)
    workload = c[0].selectbox("Workload", ["sharegpt", "alpaca"], key="cmp_blk_workload")
    requests = c[1].number_input("Requests", 1, 100_000, 1000, step=500, key="cmp_blk_requests")
    seed = c[2].number_input("Seed", 0, 1_000_000, 0, key="cmp_blk_seed")
    try:
        points = _block_sweep(workload, int(requests), int(seed))
    except PagedLabError as e:
        st.error(str(e))
        return
    st.markdown("**The trade-off in numbers:** " + tables.block_tradeoff_sentence(points))
    df = tables.block_sweep_frame(points)
    st.altair_chart(charts.block_sweep_lines(df), key="cmp_blk_chart")
    st.dataframe(df, hide_index=True, key="cmp_blk_table", column_config={
        "tail waste": st.column_config.NumberColumn(format="percent")})
    st.markdown(
        "Tail waste is memory another request could have used. To see what it costs in batch "
        f"size, replay this trace through the paged simulator once per block size (rate "
        f"{BLOCK_SIM_RATE:g}/s, {BLOCK_SIM_CAPACITY:,} token slots).")
    if st.button("Simulate every block size", key="cmp_blk_sim"):
        bar = st.progress(0.0, text="Simulating...")
        results: list[SimResult] = []
        try:
            for i, bs in enumerate(SWEEP_BLOCK_SIZES):
                results.append(_simulate(workload, "paged", int(requests), BLOCK_SIM_RATE,
                                         BLOCK_SIM_CAPACITY, bs, DEFAULT_MAX_LEN, int(seed)))
                bar.progress((i + 1) / len(SWEEP_BLOCK_SIZES), text=f"block size {bs} done")
        except PagedLabError as e:
            st.error(str(e))
        else:
            st.session_state[BLOCK_SIM_STATE] = results
        bar.empty()
    done: list[SimResult] | None = st.session_state.get(BLOCK_SIM_STATE)
    if done:
        st.markdown(tables.block_batch_sentence(done))
        st.altair_chart(charts.block_batch_line(tables.block_batch_frame(done)),
                        width="stretch", key="cmp_blk_batch_chart")


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


def calculator_section() -> None:
    st.markdown(
        "Every token keeps a key and a value vector per KV head in every layer: "
        "**bytes per token = 2 x layers x KV heads x head dim x bytes per element**. "
        "What is left of the GPU after the weights and a reserve holds the KV cache.")
    names = list(MODELS)
    c = st.columns(3)
    name = c[0].selectbox("Model", names, index=names.index("OPT-13B"), key="cmp_calc_model")
    gpu = c[1].number_input("GPU memory (GiB)", 1.0, 4096.0, 40.0, step=8.0,
                            key="cmp_calc_gpu")
    bits = c[2].selectbox("Weight precision", [16, 8, 4], key="cmp_calc_bits",
                          format_func=lambda b: {16: "16-bit (fp16/bf16)", 8: "8-bit",
                                                 4: "4-bit"}[b])
    c = st.columns(3)
    kv_bytes = c[0].selectbox("KV dtype", [2, 4, 1], key="cmp_calc_kv",
                              format_func=lambda b: {4: "fp32 (4 bytes)",
                                                     2: "fp16 / bf16 (2 bytes)",
                                                     1: "fp8 (1 byte)"}[b])
    reserve = c[1].slider("Reserve (activations, runtime)", 0.0, 0.5, 0.1, 0.01,
                          key="cmp_calc_reserve")
    req_len = c[2].number_input("Request length (tokens)", 1, 1_000_000, 2048,
                                key="cmp_calc_len")
    model = MODELS[name]
    per_token = model.kv_bytes_per_token(int(kv_bytes))
    st.markdown(
        f"**{name}**: 2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x "
        f"{model.head_dim} x {kv_bytes} bytes = **{per_token:,} bytes per token "
        f"({tables.human_bytes(per_token)})**"
        + (" - the paper's 800 KB per token." if per_token == 819_200 else "."))
    try:
        cap = kv_capacity(model, float(gpu), weight_bits=int(bits), kv_dtype_bytes=int(kv_bytes),
                          reserve_fraction=float(reserve), request_len=int(req_len),
                          block_sizes=DEFAULT_BLOCK_SIZES)
    except PagedLabError as e:
        st.error(str(e))
    else:
        m = st.columns(4)
        m[0].metric("Weights", tables.human_bytes(cap.weight_bytes))
        m[1].metric("Left for KV", tables.human_bytes(cap.kv_bytes))
        m[2].metric("KV tokens that fit", f"{cap.kv_tokens:,}")
        m[3].metric(f"Requests of {cap.request_len:,} tokens", f"{cap.requests:,}")
        st.dataframe(tables.capacity_blocks_frame(cap), hide_index=True, key="cmp_calc_blocks")
    st.subheader("Model shapes")
    st.dataframe(tables.models_frame(int(kv_bytes)), hide_index=True, key="cmp_calc_models")
    st.caption("Shapes from each model's Hugging Face config.json. Grouped-query attention "
               "(fewer KV heads than query heads) is why current models need far less KV "
               "memory per token than OPT-13B.")


# ---- the page ---------------------------------------------------------------------------

st.title("Contiguous vs paged")
st.caption(
    "Why paging? Systems that reserve one contiguous region per request keep only 20.4% to "
    "38.2% of their KV memory for actual token states (the PagedAttention paper, Figure 2); "
    "paging keeps 96.3%, so 2 to 4 times more requests fit. Here is that effect on the same "
    "workloads, small and large.")
tabs = st.tabs(["The seed's example", "One workload, two memories", "Trace simulator",
                "Block size", "Sharing", "Memory calculator"])
with tabs[0]:
    seed_section()
with tabs[1]:
    maps_section()
with tabs[2]:
    simulator_section()
with tabs[3]:
    block_size_section()
with tabs[4]:
    sharing_section()
with tabs[5]:
    calculator_section()
