"""How much KV cache real models need, and how many tokens and requests a GPU holds.

Every token keeps a key and a value vector per KV head in every layer:

    bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_dim x bytes per element
    bytes per block = bytes per token x block_size

The paper's OPT-13B (40 layers, 40 heads of 128, fp16) needs 2 x 40 x 40 x 128 x 2
= 819,200 bytes, about 800 KB, per token. Grouped-query attention (fewer KV
heads than query heads) is why current models need far less.

Capacity: from the GPU's memory take a reserve (activations, the CUDA context,
allocator slack: vLLM's default gpu_memory_utilization of 0.9 reserves 10%) and
the weights (parameters x bits / 8); what is left holds KV. With blocks, only
whole blocks fit, and a request of L tokens takes ceil(L / block_size) blocks.

GPU sizes are in GiB (2^30 bytes): a "40 GB" A100 has 40 GiB, as nvidia-smi
reports it. Shapes below are from each model's Hugging Face `config.json`; the
comments name the fields. Parameter counts are those the model cards publish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from backend.core.checks import check_int
from backend.core.errors import PagedLabError

GIB = 1 << 30
DEFAULT_BLOCK_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers of a model that size its KV cache and its weights."""

    name: str
    num_layers: int     # config.json: num_hidden_layers
    num_heads: int      # num_attention_heads (query heads)
    num_kv_heads: int   # num_key_value_heads (= num_attention_heads when absent)
    head_dim: int       # head_dim, else hidden_size // num_attention_heads
    num_params: int
    source: str         # the Hugging Face repository the shape comes from
    note: str = ""
    # Layers that attend only within the last `window` tokens (config.json's
    # sliding_window, on every other layer for Gemma 2); 0: every layer sees everything.
    window: int = 0
    window_layers: int = 0

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes per element."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def windowed_share(self, tokens: int) -> float:
        """The share of `kv_bytes_per_token x tokens` a request of `tokens` tokens needs
        when its windowed layers keep only their last `window` tokens: 1.0 up to the
        window (or without one). Gemma-2-9B at 8,192 tokens: (21 x 8,192 + 21 x 4,096) /
        (42 x 8,192) = 0.75."""
        if not self.window or tokens <= self.window:
            return 1.0
        full = self.num_layers - self.window_layers
        return (full * tokens + self.window_layers * self.window) / (self.num_layers * tokens)

    def kv_bytes_per_block(self, block_size: int, dtype_bytes: int = 2) -> int:
        return self.kv_bytes_per_token(dtype_bytes) * block_size

    def weight_bytes(self, bits: int = 16) -> int:
        """Parameters x bits / 8, rounded up to whole bytes."""
        return -(-self.num_params * bits // 8)


MODELS: dict[str, ModelShape] = {m.name: m for m in (
    # hidden_size 5120 / 40 heads = 128; no num_key_value_heads (multi-head).
    # 13B parameters as the paper counts them (its Figure 1: 26 GB in fp16).
    ModelShape("OPT-13B", 40, 40, 40, 128, 13_000_000_000, "facebook/opt-13b",
               "the PagedAttention paper's model"),
    # num_key_value_heads 32: multi-head attention.
    ModelShape("Llama-2-7B", 32, 32, 32, 128, 6_738_415_616, "meta-llama/Llama-2-7b-hf"),
    # hidden_size 2048, head_dim 64, num_key_value_heads 8.
    ModelShape("Llama-3.2-1B", 16, 32, 8, 64, 1_235_814_400, "meta-llama/Llama-3.2-1B"),
    # hidden_size 4096 / 32 heads = 128, num_key_value_heads 8; max_position_embeddings 8192.
    ModelShape("Llama-3-8B", 32, 32, 8, 128, 8_030_261_248, "meta-llama/Meta-Llama-3-8B",
               "the simulator's deployment preset (8,192-token context)"),
    # hidden_size 4096, head_dim 128, num_key_value_heads 8.
    ModelShape("Llama-3.1-8B", 32, 32, 8, 128, 8_030_261_248, "meta-llama/Llama-3.1-8B"),
    # hidden_size 8192, head_dim 128, num_key_value_heads 8.
    ModelShape("Llama-3.1-70B", 80, 64, 8, 128, 70_553_706_496, "meta-llama/Llama-3.1-70B"),
    # hidden_size 4096 / 32 heads = 128, num_key_value_heads 8.
    ModelShape("Mistral-7B", 32, 32, 8, 128, 7_241_732_096, "mistralai/Mistral-7B-v0.1"),
    # hidden_size 896 / 14 heads = 64, num_key_value_heads 2.
    ModelShape("Qwen2.5-0.5B", 24, 14, 2, 64, 494_032_768, "Qwen/Qwen2.5-0.5B"),
    # hidden_size 3584 / 28 heads = 128, num_key_value_heads 4.
    ModelShape("Qwen2.5-7B", 28, 28, 4, 128, 7_615_616_512, "Qwen/Qwen2.5-7B"),
    # hidden_size 8192 / 64 heads = 128, num_key_value_heads 8.
    ModelShape("Qwen2.5-72B", 80, 64, 8, 128, 72_706_203_648, "Qwen/Qwen2.5-72B"),
    # head_dim 256 (explicit: hidden_size 3584 is not 16 x 256), num_key_value_heads 8.
    # sliding_window 4096 on every other layer (21 of 42).
    ModelShape("Gemma-2-9B", 42, 16, 8, 256, 9_241_705_984, "google/gemma-2-9b",
               "every other layer attends within a 4096-token window; beyond 4096 "
               "tokens those layers need less than this formula counts",
               window=4096, window_layers=21),
)}


def get_model(name: str) -> ModelShape:
    """The named model, or PagedLabError listing the names."""
    found = MODELS.get(name)
    if found is None:
        raise PagedLabError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return found


@dataclass(frozen=True, slots=True)
class BlockCapacity:
    """What fits with one block size."""

    block_size: int
    bytes_per_block: int
    num_blocks: int
    kv_tokens: int           # num_blocks x block_size
    blocks_per_request: int  # ceil(request_len / block_size)
    requests: int            # requests of request_len that fit at once
    tail_waste_slots: int    # empty slots in each such request's last block


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """The KV room of one model on one GPU; `per_block` has one entry per block size."""

    model: ModelShape
    gpu_bytes: int
    reserve_bytes: int
    weight_bytes: int
    kv_bytes: int            # gpu - reserve - weights
    bytes_per_token: int
    kv_tokens: int           # kv_bytes // bytes_per_token (slot-exact, no blocks)
    request_len: int
    requests: int            # kv_tokens // request_len
    per_block: tuple[BlockCapacity, ...]


def kv_capacity(shape: ModelShape | str, gpu_gib: float, *, weight_bits: int = 16,
                kv_dtype_bytes: int = 2, reserve_fraction: float = 0.1,
                request_len: int = 2048,
                block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES) -> KVCapacity:
    """Reads only: how many KV tokens and requests of `request_len` tokens fit.

    Raises PagedLabError for a bad argument or weights that leave no room.
    """
    m = get_model(shape) if isinstance(shape, str) else shape
    if not (isinstance(gpu_gib, (int, float)) and gpu_gib > 0):
        raise PagedLabError(f"GPU memory must be a positive number of GiB, got {gpu_gib!r}")
    if not 0 <= reserve_fraction < 1:
        raise PagedLabError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
    for what, v in (("weight_bits", weight_bits), ("kv_dtype_bytes", kv_dtype_bytes),
                    ("request_len", request_len)):
        check_int(v, what, 1)
    if not block_sizes:
        raise PagedLabError("the calculator needs at least one block size")
    for b in block_sizes:
        check_int(b, "a block size", 1)
    gpu = round(gpu_gib * GIB)
    reserve = int(gpu * reserve_fraction)
    weights = m.weight_bytes(weight_bits)
    kv = gpu - reserve - weights
    if kv <= 0:
        raise PagedLabError(
            f"{m.name}'s weights ({weights / GIB:.1f} GiB) and the reserve "
            f"({reserve / GIB:.1f} GiB) do not leave room for KV in {gpu_gib:g} GiB")
    per_token = m.kv_bytes_per_token(kv_dtype_bytes)
    per_block: list[BlockCapacity] = []
    for bs in block_sizes:
        nb = kv // (per_token * bs)
        need = -(-request_len // bs)
        per_block.append(BlockCapacity(bs, per_token * bs, nb, nb * bs, need, nb // need,
                                       need * bs - request_len))
    tokens = kv // per_token
    return KVCapacity(m, gpu, reserve, weights, kv, per_token, tokens, request_len,
                      tokens // request_len, tuple(per_block))


def binary_size(n: int) -> str:
    """Bytes in binary units (B, KiB, MiB, GiB, TiB) at a precision a reader can trust:
    exact where three decimals hold the value exactly (5,505,024 -> "5.25 MiB", Gemma-2-9B's
    16-token block; 819,200 -> "800 KiB"), else three significant digits, halves rounded
    up (26,000,000,000 -> "24.2 GiB"). One decimal would show 5.25 MiB as "5.2 MiB", a
    block smaller than it is."""
    k = 0
    while k < 4 and n >= 1024 ** (k + 1):
        k += 1
    unit = ("B", "KiB", "MiB", "GiB", "TiB")[k]
    value = Fraction(n, 1024 ** k)
    if (value * 1000).denominator == 1:
        shown = f"{Decimal(int(value * 1000)).scaleb(-3):,f}".rstrip("0").rstrip(".")
        return f"{shown} {unit}"
    places = max(0, 2 - math.floor(math.log10(value)))
    rounded = (Decimal(value.numerator) / Decimal(value.denominator)).quantize(
        Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{rounded:,f} {unit}"


def kv_table(kv_dtype_bytes: int = 2) -> list[dict[str, object]]:
    """Reads only: one row per known model, for display (bytes per token and per 16-block)."""
    return [{
        "model": m.name, "layers": m.num_layers, "heads": m.num_heads,
        "kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
        "params_b": m.num_params / 1e9,
        "kv_bytes_per_token": m.kv_bytes_per_token(kv_dtype_bytes),
        "kv_bytes_per_block16": m.kv_bytes_per_block(16, kv_dtype_bytes),
        "source": m.source,
    } for m in MODELS.values()]
