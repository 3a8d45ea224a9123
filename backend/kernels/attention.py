"""Paged attention in Triton: one launch for a mixed batch of decodes and prefill chunks.

Two kernels compute the same causal grouped-query attention through the block tables,
with the same online softmax (fp32, log2 domain):

    "tiled"    backend.kernels.attention_tiled: one program per (q tile, KV head,
               split), tl.dot on 16+ rows, split-K with a reduce: the GPU kernel, and
               what `--kernel triton` compiles on a GPU
    "batched"  backend.kernels.attention_batched: many (q tile, KV head) units per
               program, no split: for Triton's interpreter, which pays per program and
               per operation rather than per element

`variant="auto"` takes "batched" for interpreted launches (unless a split or a tiled
config is asked for) and "tiled" for compiled ones. The tests run both under the
interpreter against the same reference; the tiled one is also compiled for sm_90.

Entry points: `paged_attention` (validate, plan, run) and `plan_paged_attention`
(validate and plan only, for benchmarks and the offline compile test).
"""

from __future__ import annotations

import torch

from backend.core.errors import PagedLabError
from backend.kernels.attention_batched import plan_batched_attention
from backend.kernels.attention_tiled import _paged_attention_kernel, plan_tiled_attention
from backend.kernels.checks import resolve_checks
from backend.kernels.launch import (
    Launch,
    compile_for_gpu,
    is_interpreted,
    kernel_variant,
    resident_capacity,
    sm_count,
)
from backend.kernels.tuning import (
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    AttentionConfig,
    BatchedConfig,
    choose_batched_config,
    choose_config,
    choose_num_splits,
)
from backend.kernels.validate import (
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    AttentionShape,
    require,
    same_device,
    validate_paged_attention,
)

__all__ = [
    "MAX_HEAD_DIM", "MAX_SPLITS", "MIN_TOKENS_PER_SPLIT", "SUPPORTED_DTYPES", "VARIANTS",
    "AttentionConfig", "AttentionShape", "BatchedConfig", "Launch", "choose_batched_config",
    "choose_config", "choose_num_splits", "choose_variant", "compile_for_gpu",
    "is_interpreted", "kernel_variant", "paged_attention", "plan_paged_attention",
    "resident_capacity", "same_device", "sm_count", "validate_paged_attention",
]

VARIANTS = ("auto", "tiled", "batched")


def choose_variant(variant: str, *, interpreted: bool, num_splits: int | None,
                   config: AttentionConfig | BatchedConfig | None) -> str:
    """Resolve "auto" (see the module docstring); refuse what cannot run."""
    require(variant in VARIANTS, f"unknown attention variant {variant!r}; choose one of "
             f"{', '.join(VARIANTS)}")
    if variant == "auto":
        wants_tiled = isinstance(config, AttentionConfig) or (num_splits or 1) > 1
        variant = "batched" if interpreted and not wants_tiled else "tiled"
    if variant == "batched":
        require(interpreted, "the batched attention kernel runs only in Triton's interpreter")
        require((num_splits or 1) == 1, "the batched attention kernel does not split")
        require(not isinstance(config, AttentionConfig),
                "the batched attention kernel takes a BatchedConfig")
    else:
        require(not isinstance(config, BatchedConfig),
                "the tiled attention kernel takes an AttentionConfig")
    return variant


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    check_bounds: bool | None = None,
    interpret: bool = False,
    config: AttentionConfig | BatchedConfig | None = None,
    variant: str = "auto",
) -> torch.Tensor:
    """Causal grouped-query attention of packed new tokens against their paged K/V history.

    Returns `out` (allocated when None) of shape [T, H, D] in the query's dtype; query row
    i of sequence b attends to positions 0..seq_lens[b] - q_len_b + i, query head h reads
    KV head h // (H / kvh). Accumulation is fp32. `num_splits` forces the tiled kernel's
    split-K path (None: `choose_num_splits`); `check_bounds` reads tables and lengths to
    check them (None: the PAGEDLAB_KERNEL_CHECKS setting, off by default); `interpret`
    runs Triton's interpreter (required for CPU tensors); `config` overrides the tile
    sizes (benchmark sweeps); `variant` picks the kernel. Writes only `out`.
    Raises PagedLabError for invalid arguments (see `validate_paged_attention`).
    """
    out, launches = plan_paged_attention(
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out=out,
        num_splits=num_splits, check_bounds=check_bounds, interpret=interpret, config=config,
        variant=variant)
    for launch in launches:
        launch.run()
    return out


def plan_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    check_bounds: bool | None = None,
    interpret: bool = False,
    config: AttentionConfig | BatchedConfig | None = None,
    variant: str = "auto",
) -> tuple[torch.Tensor, list[Launch]]:
    """Validate and allocate like `paged_attention`, and return (out, launches) unrun.

    Tiled: one launch without a split, the attention kernel and the split reduce with
    one. Batched: one launch.
    """
    shape = validate_paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                     query_start_loc, scale, out=out, num_splits=num_splits,
                                     check_bounds=resolve_checks(check_bounds))
    tiled_kernel = kernel_variant(_paged_attention_kernel, interpret)
    interpreted = is_interpreted(tiled_kernel)
    if query.device.type != "cuda" and not interpreted:
        raise PagedLabError("compiled Triton kernels need CUDA tensors; run with the "
                            "interpreter (device cpu) or move the tensors to the GPU")
    variant = choose_variant(variant, interpreted=interpreted, num_splits=num_splits,
                             config=config)
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if variant == "batched":
        assert not isinstance(config, AttentionConfig)
        return out, [plan_batched_attention(shape, query, k_cache, v_cache, block_tables,
                                            seq_lens, query_start_loc, scale, out,
                                            config=config)]
    assert not isinstance(config, BatchedConfig)
    if config is None:
        group = shape.num_heads // shape.num_kv_heads
        # q_len >= 1 for every sequence, so T == batch means every q_len is 1 (no data read).
        config = choose_config(head_dim=shape.head_dim, num_queries_per_kv=group,
                               decode_only=shape.num_tokens == shape.num_seqs,
                               interpret=interpreted)
    return out, plan_tiled_attention(shape, query, k_cache, v_cache, block_tables, seq_lens,
                                     query_start_loc, scale, out, kernel=tiled_kernel,
                                     interpreted=interpreted, config=config,
                                     num_splits=num_splits)
