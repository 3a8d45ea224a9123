"""KV bytes per token and per block for real model shapes; capacity on a GPU."""

from __future__ import annotations

import pytest

from backend.core.errors import PagedLabError
from backend.lab.memory_calc import GIB, MODELS, get_model, kv_capacity, kv_table


def test_opt_13b_needs_800_kb_per_token() -> None:
    opt = MODELS["OPT-13B"]
    # 2 (K and V) x 40 layers x 40 heads x 128 x 2 bytes (fp16), the paper's figure.
    assert opt.kv_bytes_per_token() == 2 * 40 * 40 * 128 * 2 == 819_200
    assert opt.kv_bytes_per_token() == 800 * 1024
    assert opt.kv_bytes_per_block(16) == 13_107_200
    assert opt.weight_bytes() == 26_000_000_000


@pytest.mark.parametrize(("name", "per_token"), [
    ("Llama-3.1-8B", 2 * 32 * 8 * 128 * 2),     # 128 KiB
    ("Llama-3.1-70B", 2 * 80 * 8 * 128 * 2),    # 320 KiB
    ("Mistral-7B", 2 * 32 * 8 * 128 * 2),
    ("Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),       # 56 KiB
    ("Qwen2.5-72B", 2 * 80 * 8 * 128 * 2),
    ("Gemma-2-9B", 2 * 42 * 8 * 256 * 2),       # 336 KiB
    ("Llama-2-7B", 2 * 32 * 32 * 128 * 2),      # 512 KiB: no grouped-query attention
])
def test_bytes_per_token_of_current_models(name: str, per_token: int) -> None:
    m = get_model(name)
    assert m.kv_bytes_per_token() == per_token
    assert m.kv_bytes_per_token(dtype_bytes=1) == per_token // 2   # fp8 KV
    assert m.num_heads % m.num_kv_heads == 0                       # a whole GQA group


def test_grouped_query_models_need_less_than_opt_13b() -> None:
    # Even the 70-72B models need less KV per token than OPT-13B: 8 KV heads instead of 40.
    opt = MODELS["OPT-13B"].kv_bytes_per_token()
    assert all(m.kv_bytes_per_token() < opt for m in MODELS.values() if m.name != "OPT-13B")


def test_opt_13b_on_a_40_gib_a100_by_hand() -> None:
    c = kv_capacity("OPT-13B", 40, reserve_fraction=0.1, request_len=2048,
                    block_sizes=(1, 16, 128))
    assert c.gpu_bytes == 40 * GIB == 42_949_672_960
    assert c.reserve_bytes == 4_294_967_296
    assert c.weight_bytes == 26_000_000_000
    assert c.kv_bytes == 42_949_672_960 - 4_294_967_296 - 26_000_000_000 == 12_654_705_664
    assert c.kv_tokens == 12_654_705_664 // 819_200 == 15_447
    assert c.requests == 7          # 2048-token requests, as in the paper's Orca (Max)
    one, sixteen, big = c.per_block
    assert (one.num_blocks, one.kv_tokens) == (15_447, 15_447)
    assert (sixteen.num_blocks, sixteen.kv_tokens) == (965, 15_440)
    assert (sixteen.blocks_per_request, sixteen.requests) == (128, 7)
    assert (big.num_blocks, big.kv_tokens) == (120, 15_360)


def test_llama_8b_on_an_80_gib_gpu_by_hand() -> None:
    c = kv_capacity("Llama-3.1-8B", 80, reserve_fraction=0.25, request_len=1000,
                    block_sizes=(16, 256))
    kv = 80 * GIB - 20 * GIB - 2 * 8_030_261_248
    assert c.kv_bytes == kv == 48_363_986_944
    assert c.kv_tokens == kv // 131_072 == 368_987
    assert c.requests == 368
    sixteen, big = c.per_block
    assert sixteen.num_blocks == kv // (131_072 * 16) == 23_061
    # 1000 tokens: 63 blocks of 16 (8 empty slots), or 4 of 256 (24 empty).
    assert (sixteen.blocks_per_request, sixteen.tail_waste_slots) == (63, 8)
    assert sixteen.requests == 23_061 // 63 == 366
    assert (big.num_blocks, big.blocks_per_request, big.tail_waste_slots) == (1441, 4, 24)
    assert big.requests == 360


def test_calculator_refuses_impossible_setups() -> None:
    with pytest.raises(PagedLabError, match="do not leave room for KV"):
        kv_capacity("Llama-3.1-70B", 80)             # 141 GB of bf16 weights
    assert kv_capacity("Llama-3.1-70B", 80, weight_bits=4).kv_tokens > 0
    with pytest.raises(PagedLabError, match="unknown model"):
        kv_capacity("GPT-5", 80)
    with pytest.raises(PagedLabError, match="reserve_fraction"):
        kv_capacity("OPT-13B", 80, reserve_fraction=1.0)
    with pytest.raises(PagedLabError, match="a block size must be an integer >= 1, got 0"):
        kv_capacity("OPT-13B", 80, block_sizes=(0,))


def test_table_lists_every_model() -> None:
    rows = kv_table()
    assert [r["model"] for r in rows] == list(MODELS)
    assert rows[0]["kv_bytes_per_token"] == 819_200


def test_a_sliding_window_shrinks_only_requests_past_it() -> None:
    gemma = MODELS["Gemma-2-9B"]
    per_layer = gemma.kv_bytes_per_token() // gemma.num_layers
    for tokens in (1, 4096, 4097, 8192, 100_000):
        # Layer by layer: every other one keeps at most its window's tokens.
        kept = sum(per_layer * (min(tokens, 4096) if layer % 2 else tokens)
                   for layer in range(gemma.num_layers))
        assert gemma.windowed_share(tokens) == pytest.approx(
            kept / (gemma.kv_bytes_per_token() * tokens), rel=1e-12)
    assert gemma.windowed_share(8192) == 0.75 and gemma.windowed_share(4096) == 1.0
    # Models without a window are counted exactly by the formula.
    assert all(m.windowed_share(100_000) == 1.0 for m in MODELS.values() if m is not gemma)
