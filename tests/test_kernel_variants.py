"""The interpreter's batched attention kernel, the torch path, and how launches are chosen.

tests/test_kernels.py runs every backend through the same comparisons with the reference;
this file covers what is particular to each variant: the batched kernel with several
programs, several tiles per context and units that do not fill the last program; the
torch path's groups of sequences and its mixed batches; the choice of variant, tile sizes
and table loads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from backend.core.errors import PagedLabError
from backend.kernels import attention, native, reference_paged_attention, torch_path
from backend.kernels.attention_batched import tile_map
from backend.kernels.attention_tiled import table_loads
from backend.kernels.tuning import BATCHED_TILE_ELEMENTS, BatchedConfig, choose_batched_config
from tests.test_kernels import CUDA, LONG, NAN, SCENARIOS, TOL, make_batch

pytestmark = pytest.mark.skipif(CUDA, reason="the batched kernel is for CPU tensors; a GPU "
                                "machine covers it in test_kernels' interpreter child")


@pytest.fixture
def _gather() -> Iterator[None]:
    """The torch path with the compiled decode operator turned off: what is tested here
    is how it gathers (test_native_decode covers the operator)."""
    with native.turned_off():
        yield


def _check(batch_args: tuple, out: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(out.float(), reference_paged_attention(*batch_args), **TOL[dtype])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("block_m,block_n,block_u", [
    (2, 16, 1),    # one unit per program: as many programs as units
    (2, 32, 8),    # units that do not fill the last program
    (4, 256, 4),
    (64, 64, 2),   # prefill-sized rows, several tiles per context
])
def test_batched_tile_sizes(scenario: str, block_m: int, block_n: int, block_u: int) -> None:
    """Several programs, several tiles, spare units and rows: still the reference."""
    q_lens, seq_lens = SCENARIOS[scenario]
    batch = make_batch(q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=16,
                       block_size=12)
    out = torch.full_like(batch.query, NAN)
    out, launches = attention.plan_paged_attention(
        *batch.args(), out=out, interpret=True, variant="batched",
        config=BatchedConfig(block_m=block_m, block_n=block_n, block_u=block_u))
    assert len(launches) == 1 and len(launches[0].grid) == 1
    launches[0].run()
    _check(batch.args(), out, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_default_is_one_program_for_a_decode_step(dtype: torch.dtype) -> None:
    """32 sequences of the tiny model's shape: one program covers every (sequence, head)."""
    seq_lens = [100 + 7 * b for b in range(32)]
    batch = make_batch([1] * 32, seq_lens, num_heads=4, num_kv_heads=2, head_dim=16,
                       block_size=4, dtype=dtype)
    out, launches = attention.plan_paged_attention(*batch.args(), interpret=True)
    assert launches[0].grid == (1,) and launches[0].constexprs["BLOCK_U"] == 64
    launches[0].run()
    _check(batch.args(), out, dtype)


def test_batched_long_contexts_loop_over_tiles() -> None:
    """Contexts longer than the largest tile: the program loops, results unchanged."""
    batch = make_batch([1, 3, 1], [LONG, 50, 2 * LONG], num_heads=2, num_kv_heads=1,
                       head_dim=8, block_size=16)
    config = BatchedConfig(block_m=16, block_n=128, block_u=2)
    out = attention.paged_attention(*batch.args(), interpret=True, config=config)
    _check(batch.args(), out, torch.float32)


def test_tile_map_covers_every_query_token_once() -> None:
    """Every (sequence, q block) pair with tokens appears once; the rest are spare tiles."""
    batch = make_batch([5, 1, 17, 2], [9, 4, 40, 30])
    shape = attention.validate_paged_attention(*batch.args())
    tile_seq, tile_block = tile_map(shape, batch.query_start_loc, block_q=4)
    starts = batch.query_start_loc.tolist()
    real = {(b, j) for b in range(4) for j in range(-(-(starts[b + 1] - starts[b]) // 4))}
    pairs = list(zip(tile_seq.tolist(), tile_block.tolist(), strict=True))
    assert real <= set(pairs) and len(set(pairs)) == len(pairs)
    assert all(0 <= s < 4 for s, _ in pairs)
    decode = make_batch([1, 1, 1], [3, 9, 2])
    seqs, blocks = tile_map(attention.validate_paged_attention(*decode.args()),
                            decode.query_start_loc, block_q=1)
    assert seqs.tolist() == [0, 1, 2] and blocks.tolist() == [0, 0, 0]


def test_batched_config_fits_the_tile_budget() -> None:
    for tokens, seqs, kvh, group, d, ctx in [(32, 32, 2, 2, 16, 128), (1, 1, 8, 4, 128, 65536),
                                             (500, 40, 8, 4, 128, 4096), (64, 64, 1, 1, 16, 16)]:
        cfg = choose_batched_config(num_tokens=tokens, num_seqs=seqs, num_kv_heads=kvh,
                                    num_queries_per_kv=group, block_d=d, max_context=ctx)
        assert cfg.block_u * max(cfg.block_m, d) * cfg.block_n <= BATCHED_TILE_ELEMENTS
        assert cfg.block_m >= group and cfg.block_n >= 16 and cfg.block_u >= 1
    tiny = choose_batched_config(num_tokens=32, num_seqs=32, num_kv_heads=2,
                                 num_queries_per_kv=2, block_d=16, max_context=128)
    assert tiny == BatchedConfig(block_m=2, block_n=128, block_u=64)


def test_variant_choice() -> None:
    choose = attention.choose_variant
    assert choose("auto", interpreted=True, num_splits=None, config=None) == "batched"
    assert choose("auto", interpreted=True, num_splits=2, config=None) == "tiled"
    assert choose("auto", interpreted=False, num_splits=None, config=None) == "tiled"
    tiled_cfg = attention.AttentionConfig(16, 64, 4, 2)
    assert choose("auto", interpreted=True, num_splits=None, config=tiled_cfg) == "tiled"
    for kwargs, message in [
        ({"variant": "batched", "interpreted": False}, "only in Triton's interpreter"),
        ({"variant": "batched", "interpreted": True, "num_splits": 2}, "does not split"),
        ({"variant": "fast", "interpreted": True}, "unknown attention variant"),
        ({"variant": "tiled", "interpreted": True, "config": BatchedConfig(2, 16, 1)},
         "takes an AttentionConfig"),
    ]:
        args = {"num_splits": None, "config": None, **kwargs}
        with pytest.raises(PagedLabError, match=message):
            choose(args.pop("variant"), **args)


def test_table_loads() -> None:
    assert table_loads(16, 64) == "per_block"
    assert table_loads(1, 64) == "per_block"
    assert table_loads(64, 32) == "per_tile"
    assert table_loads(4096, 64) == "per_tile"
    assert table_loads(12, 64) == "per_token"
    assert table_loads(128, 64) == "per_tile"


@pytest.mark.parametrize("block_size,block_n", [(4, 64), (64, 32), (12, 64), (16, 16)])
def test_tiled_table_loads_in_the_interpreter(block_size: int, block_n: int) -> None:
    """Each way of loading block ids gives the reference's result."""
    q_lens, seq_lens = SCENARIOS["mixed"]
    batch = make_batch(q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=16,
                       block_size=block_size)
    config = attention.AttentionConfig(block_m=16, block_n=block_n, num_warps=4, num_stages=1)
    out, launches = attention.plan_paged_attention(*batch.args(), interpret=True,
                                                   config=config)
    assert launches[0].constexprs["TABLE_LOADS"] == table_loads(block_size, block_n)
    for launch in launches:
        launch.run()
    _check(batch.args(), out, torch.float32)


# ----------------------------------------------------------------------------- torch path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather_bytes", [
    1,           # slices of 16 positions; short sequences end before most slices
    6 << 10,     # fp32 (9 KiB a sequence): slices; bf16: one sequence per group
    20 << 10,    # groups of two (fp32) or four (bf16) whole sequences
    1 << 30,     # everything at once
])
@pytest.mark.usefixtures("_gather")
def test_torch_path_groups_and_slices(monkeypatch: pytest.MonkeyPatch, gather_bytes: int,
                                      dtype: torch.dtype) -> None:
    """However the gathers are cut, the same result; NaN tails and padding unread."""
    monkeypatch.setattr(torch_path, "GATHER_BYTES", gather_bytes)
    # Slices of 16 positions at least, so that a 64-position table is cut into several.
    monkeypatch.setattr(torch_path, "SLICE_MIN_POSITIONS", 16)
    calls: list[int] = []
    original = torch_path._decode_slices
    monkeypatch.setattr(torch_path, "_decode_slices",
                        lambda *a: calls.append(a[3].width) or original(*a))
    seq_lens = [1, 5, 17, 64, 3, 40, 2, 30]
    batch = make_batch([1] * 8, seq_lens, num_heads=6, num_kv_heads=2, head_dim=8,
                       block_size=4, dtype=dtype)
    out = torch.full_like(batch.query, NAN)
    torch_path.torch_paged_attention(*batch.args(), out=out)
    per_position = 2 * 2 * 8 * batch.k_cache.element_size()  # K and V, 2 heads of 8
    length = batch.block_tables.shape[1] * 4
    assert bool(calls) == (length * per_position > gather_bytes)
    if calls:
        assert calls[0] == max(16, gather_bytes // (8 * per_position))
    _check(batch.args(), out, dtype)


@pytest.mark.parametrize("gather", [False, True], ids=["native", "gather"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_path_mixed_batch_into_a_strided_out(dtype: torch.dtype, gather: bool) -> None:
    """Decodes batched and chunks one by one, written into a view of a wider buffer."""
    batch = make_batch([1, 9, 1, 1, 30], [50, 9, 1, 33, 70], num_heads=8, num_kv_heads=2,
                       head_dim=32, block_size=8, dtype=dtype)
    wide = torch.full((batch.query.shape[0], 8, 48), NAN, dtype=dtype)
    out = wide[:, :, 8:40]
    with native.turned_off() if gather else contextlib.nullcontext():
        got = torch_path.torch_paged_attention(*batch.args(), out=out)
    assert got is out
    _check(batch.args(), out, dtype)
    assert torch.isnan(wide[:, :, :8]).all() and torch.isnan(wide[:, :, 40:]).all()


@pytest.mark.parametrize("gather", [False, True], ids=["native", "gather"])
def test_torch_path_ignores_wide_padded_tables(gather: bool) -> None:
    """Tables far wider than the lengths (padding -1 or a NaN block) change nothing."""
    batch = make_batch([1, 1, 1], [3, 7, 2], block_size=2)
    pad = torch.full((3, 40), -1, dtype=torch.int32)
    table = torch.cat([batch.block_tables, pad], dim=1)
    args = list(batch.args())
    args[3] = table
    with native.turned_off() if gather else contextlib.nullcontext():
        out = torch_path.torch_paged_attention(*args)
    _check(batch.args(), out, torch.float32)
