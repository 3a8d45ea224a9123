"""The live engine: CONTRACT.md's six operations over paging, a model and the kernels.

    engine     `Engine`: validates an operation, then runs it (prefill, decode,
               fork, finish, shuffle) on the K/V tensors through the kernels
    scheduler  which requests run: FCFS admission, the preemption victim,
               what can never fit (decides; the engine runs what it decided)
    kv_cache   the K/V tensors, [num_blocks, block_size, kv_heads, head_dim] per layer
    ops        the operations as typed values parsed from JSON
    request    per-request state; sampling: seeded token choice (temperature, top_p)
    prompts    an add's prompt as the model's token ids; the next token of a request
    results    typed results (OpResult, KernelReport, EngineMetrics, Verification)
    checks     recomputation and bookkeeping checks (never on a hot path)

May import: models, paging, kernels, core. Entry point: `engine.Engine.apply`.
"""
