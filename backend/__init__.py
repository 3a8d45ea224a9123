"""PagedLab's backend: everything but the Streamlit pages, in one-way layers.

    sessions/            the pages' state machines (Playground history, scenario walk)
    io/   | views/       files and the command line | pure view models for the pages
    engine/ | lab/       the live engine | the contiguous-vs-paged laboratory
    models/              a tokenizer plus a forward pass over a paged KV cache
    paging/ | kernels/   the block allocator | the Triton kernels and their torch twins
    core/                the error type and the engine configuration

A package may import the packages below it, never those above or beside it
(`lint-imports` checks the contracts in pyproject.toml on every `make test`).
Nothing here imports Streamlit. Entry point: `python -m backend` (io/cli.py).
"""
