"""The "why paging?" laboratory: contiguous memory against paged memory, in numbers.

    contiguous     the contiguous arena (max / pow2 / oracle, first-fit) and the
                   Figure 2 memory breakdown; contiguous_types, contiguous_render
    sim/           the trace simulator: replay loop, paged and contiguous policies
    workloads      synthetic ShareGPT- and Alpaca-shaped traces
    sharing        memory saved by parallel sampling and beam search
    memory_calc    KV bytes per token and block for real model shapes
    compare/       the comparison page's computations (seed example, memory maps,
                   block-size sweep)

May import: paging and core (the simulator drives the real block manager, with
no tensors). Entry points: `sim.simulator.simulate`, `contiguous.ContiguousArena`.
"""
