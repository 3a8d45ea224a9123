"""The live engine: CONTRACT.md's six operations over paging, a model and the kernels.

    engine     `Engine`: applies an operation under its lock, all or nothing, and
               runs a step's iterations through the scheduler and the runner
    operations add, grow, fork, finish, shuffle: each validated before it
               changes anything (parallel samples forked here)
    scheduler  which requests run: FCFS admission within vLLM's budgets
               (backend.core.budgets), chunked prefill, the preemption victim,
               swap or recompute, what can never fit (decides, never computes)
    runner     `ModelRunner`: the model, kernels and K/V pools; runs prefill
               chunks, decode batches and block copies (computes, never decides)
    swap       the host block pool that swap preemption copies K/V to and back
    timeline   one row per iteration and each request's latencies, for charts
    kv_cache   the K/V tensors, [num_blocks, block_size, kv_heads, head_dim] per layer
    ops        the operations as typed values parsed from JSON
    request    per-request state; sampling: seeded token choice (temperature, top_p)
    prompts    an add's prompt as the model's token ids; the next token of a request
    results    typed results (OpResult, KernelReport, EngineMetrics, Verification)
    checks     recomputation and bookkeeping checks (never on a hot path)

May import: models, paging, kernels, core. Entry point: `engine.Engine.apply`.
"""
