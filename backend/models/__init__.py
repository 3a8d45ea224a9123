"""Models: a tokenizer plus a forward pass that writes and reads K/V through a paged cache.

    batch      ForwardBatch (a packed prefill + decode batch), its outputs, and
               `PagedKV`, the per-layer cache tensors a model reads and writes
    tiny_byte  the tiny seeded byte-level transformer (RMSNorm, RoPE, GQA,
               SwiGLU): nonsense text, real K/V, fast on a CPU

May import: backend.kernels and backend.core. Entry point: `tiny_byte.TinyByteLM`.
"""
