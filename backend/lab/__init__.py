"""The "why paging?" laboratory: contiguous memory against paged memory, in numbers.

    contiguous     the contiguous arena (max / pow2 / oracle, first-fit) and the
                   Figure 2 memory breakdown; contiguous_types, contiguous_render
    sim/           the trace simulator: replay loop, paged and contiguous policies,
                   vLLM's scheduler budgets, per-iteration timelines, runs and their cache
    workloads      synthetic ShareGPT- and Alpaca-shaped traces
    traces         recorded traces: the Azure LLM inference trace 2023, CSV traces
    deployment     the real-deployment preset (Llama-3-8B on one H200, Azure traces)
    sharing        memory saved by parallel sampling and beam search
    memory_calc    KV bytes per token and block for real model shapes
    compare/       the comparison page's computations (seed example, memory maps,
                   block-size sweep)

May import: paging and core (the simulator drives the real block manager, with
no tensors). Entry points: `sim.simulator.simulate` / `simulate_run`,
`traces.workload_trace`, `deployment.deployment`, `contiguous.ContiguousArena`.
"""
