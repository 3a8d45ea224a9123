"""PagedLab's backend: the allocator, the engine, the model and the kernels (no Streamlit)."""
