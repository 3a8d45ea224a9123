"""The trace simulator: one replay loop (replay) over memory policies (paged, contiguous).

    replay      the continuous-batching loop, event to event, exact per iteration
    timeline    the per-iteration record of a replay
    paged, contiguous   the memory policies
    simulator   SimConfig, SimResult, `simulate` / `simulate_run`, sweeps
    runs        several policies with one progress report; a bounded cache of runs

`simulator.simulate` runs a trace through one policy and returns a SimResult;
`simulator.sweep` runs a grid of them in parallel processes. vLLM's scheduler budgets
(max_num_seqs, max_num_batched_tokens, the watermark) are backend.core.budgets' rules.

May import: the rest of lab, paging and core.
"""
