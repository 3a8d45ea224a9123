"""PagedLab's kernels: paged attention, K/V writes and block copies, and how they are chosen.

Three backends share one interface (`KernelBackend`):

    name                  device  what runs
    "triton"              cuda    the Triton kernels, compiled for the GPU
    "triton-interpreter"  cpu     the Triton kernels, run by Triton's interpreter; for
                                  attention its batched variant by default (many
                                  sequences per program, see backend.kernels.attention)
    "torch"               either  vectorized torch (the fast CPU path, torch_path.py);
                                  on a CPU its decode rows run PagedLab's compiled
                                  operator when it is built (backend.kernels.native)

Bounds checks that read tensor data (a device-to-host copy on a GPU) are off unless a
call asks (`check_bounds=True`) or PAGEDLAB_KERNEL_CHECKS=1 is set (backend.kernels.checks);
shape, dtype and device checks always run.

Triton's interpreter must be switched on (TRITON_INTERPRET=1) before `@triton.jit`
decorates a kernel, so this package sets it, when torch sees no GPU, before it imports
the modules that define kernels. On a GPU machine a CPU run wraps the same kernel source
in the interpreter instead (`attention.kernel_variant`).

May import: backend.core.errors only (import contracts in pyproject.toml). Entry
points: `select_kernels`, `reference_paged_attention`, `ReferenceCheck`.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from backend.core.errors import PagedLabError
from backend.kernels import attention, cache_ops, native
from backend.kernels.checks import CHECKS_ENV, ReferenceCheck, checks_enabled, resolve_checks
from backend.kernels.plan import StepPlan, usable
from backend.kernels.reference import reference_paged_attention
from backend.kernels.torch_path import torch_paged_attention
from backend.kernels.validate import Verdicts, call_signature, metadata_signature

__all__ = [
    "CHECKS_ENV",
    "KernelBackend",
    "ReferenceCheck",
    "StepPlan",
    "TorchKernels",
    "TritonKernels",
    "available_devices",
    "checks_enabled",
    "reference_paged_attention",
    "select_kernels",
]

DEVICES = ("auto", "cpu", "cuda")
KERNELS = ("auto", "triton", "torch")
# The torch backend's passed argument checks, shared by every engine in the process.
_VERDICTS = Verdicts()


@runtime_checkable
class KernelBackend(Protocol):
    """What the engine calls on every model step.

    write_kv: cache.view(-1, kvh, D)[slot_mapping[t]] = key[t] (and value), mutating the
        two caches at those slots only.
    paged_attention: causal grouped-query attention of the packed new tokens against their
        paged history; returns [T, H, D] in the query's dtype (into `out` when given).
        `plan` is the step's StepPlan over these tables and lengths (backend.kernels.plan):
        what a backend derives from them is then computed once for every layer.
    copy_blocks: dst_cache[dst_ids[i]] = src_cache[src_ids[i]] for every i (whole blocks).
    Invalid arguments raise PagedLabError before anything is written; arguments only
    their data shows to be invalid (an out-of-pool table entry, a repeated slot) are
    caught when bounds checks are on (`check_bounds`, None: PAGEDLAB_KERNEL_CHECKS).
    """

    name: str
    device: torch.device

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None: ...

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                        out: torch.Tensor | None = None, num_splits: int | None = None,
                        check_bounds: bool | None = None,
                        plan: StepPlan | None = None) -> torch.Tensor: ...

    def copy_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None: ...


def _check_device(backend: KernelBackend, tensor: torch.Tensor, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise PagedLabError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if not attention.same_device(tensor.device, backend.device):
        raise PagedLabError(f"{what} is on {tensor.device} but the {backend.name} backend runs "
                            f"on {backend.device}")


class TritonKernels:
    """The Triton kernels: compiled on a GPU, interpreted on the CPU (see `name`).

    `attention_variant` picks the attention kernel ("auto", "tiled", "batched"; see
    backend.kernels.attention): tests run the GPU-shaped tiled kernel in the interpreter.
    """

    def __init__(self, device: torch.device, *, attention_variant: str = "auto") -> None:
        self.device = device
        self.interpret = device.type != "cuda"
        self.attention_variant = attention_variant
        kernel = attention.kernel_variant(attention._paged_attention_kernel, self.interpret)
        attention.choose_variant(attention_variant, interpreted=attention.is_interpreted(kernel),
                                 num_splits=None, config=None)
        # TRITON_INTERPRET=1 set by hand on a GPU machine also interprets: say so.
        self.name = "triton-interpreter" if attention.is_interpreted(kernel) else "triton"

    def __repr__(self) -> str:
        return (f"TritonKernels(name={self.name!r}, device={str(self.device)!r}, "
                f"attention_variant={self.attention_variant!r})")

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                 check_bounds: bool | None = None) -> None:
        """See `KernelBackend`; `check_bounds` also validates the slot values."""
        _check_device(self, k_cache, "k_cache")
        cache_ops.write_kv(key, value, k_cache, v_cache, slot_mapping,
                           check_bounds=check_bounds, interpret=self.interpret)

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                        out: torch.Tensor | None = None, num_splits: int | None = None,
                        check_bounds: bool | None = None,
                        plan: StepPlan | None = None) -> torch.Tensor:
        """See `KernelBackend` and `attention.paged_attention`; `plan` is not used (a
        launch's tile map is cheap next to the interpreted or compiled kernel)."""
        _check_device(self, query, "query")
        return attention.paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                         query_start_loc, scale, out=out,
                                         num_splits=num_splits, check_bounds=check_bounds,
                                         interpret=self.interpret,
                                         variant=self.attention_variant)

    def copy_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor, *,
                    check_bounds: bool | None = None) -> None:
        """See `KernelBackend`; `check_bounds` also validates the ids."""
        _check_device(self, src_cache, "src_cache")
        cache_ops.copy_blocks(src_cache, dst_cache, src_ids, dst_ids,
                              check_bounds=check_bounds, interpret=self.interpret)


class TorchKernels:
    """Vectorized torch: the same contracts as the Triton kernels, fast on a CPU."""

    name = "torch"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __repr__(self) -> str:
        return f"TorchKernels(device={str(self.device)!r})"

    def decode_path(self) -> str:
        """In words, how this backend computes decode rows (one new token each)."""
        if self.device.type != "cpu":
            return "decodes gather each sequence's blocks for torch's SDPA"
        loaded = native.status()
        if loaded.loaded:
            return ("decodes run PagedLab's compiled CPU operator, reading K/V through "
                    "the block tables (no gather)")
        return (f"the compiled decode operator is {loaded.reason}: decodes gather each "
                "sequence's blocks for torch's SDPA")

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                 check_bounds: bool | None = None) -> None:
        """See `KernelBackend`."""
        _check_device(self, k_cache, "k_cache")
        cache_ops.validate_write_kv(key, value, k_cache, v_cache, slot_mapping,
                                    check_bounds=resolve_checks(check_bounds))
        cache_ops.torch_write_kv(key, value, k_cache, v_cache, slot_mapping)

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, *,
                        out: torch.Tensor | None = None, num_splits: int | None = None,
                        check_bounds: bool | None = None,
                        plan: StepPlan | None = None) -> torch.Tensor:
        """See `KernelBackend`; `num_splits` is validated and otherwise ignored.

        Without bounds checks, a call shaped like one that passed before (its tensors'
        shapes, dtypes, strides and devices and its scalars: validate.call_signature and
        metadata_signature) skips the argument checks, which otherwise cost about as
        much as a small decode: with a `plan`, a step's layers after the first look only
        at the plan's memo; a step's first layer looks in the process's passed verdicts.
        """
        _check_device(self, query, "query")
        checks = resolve_checks(check_bounds)

        def validate() -> bool:
            attention.validate_paged_attention(query, k_cache, v_cache, block_tables,
                                               seq_lens, query_start_loc, scale, out=out,
                                               num_splits=num_splits, check_bounds=checks)
            return True

        plan = usable(plan, block_tables, seq_lens, query_start_loc)
        signature = None if checks else \
            call_signature(query, k_cache, v_cache, out, scale, num_splits)

        def validate_once() -> None:
            assert signature is not None
            meta = metadata_signature(block_tables, seq_lens, query_start_loc)
            if meta is None:
                validate()  # it names the argument that is not a tensor
            else:
                _VERDICTS.check(signature + meta, validate)

        if signature is None:
            validate()
        elif plan is None:
            validate_once()
        else:
            # A failed validation raises before the memo keeps anything.
            plan.memo(("valid", signature), validate_once)
        return torch_paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                     query_start_loc, scale, out=out, plan=plan)

    def copy_blocks(self, src_cache: torch.Tensor, dst_cache: torch.Tensor,
                    src_ids: torch.Tensor, dst_ids: torch.Tensor, *,
                    check_bounds: bool | None = None) -> None:
        """See `KernelBackend`."""
        _check_device(self, src_cache, "src_cache")
        cache_ops.validate_copy_blocks(src_cache, dst_cache, src_ids, dst_ids,
                                       check_bounds=resolve_checks(check_bounds))
        cache_ops.torch_copy_blocks(src_cache, dst_cache, src_ids, dst_ids)


def available_devices() -> list[str]:
    """Devices this machine can run: ["cpu"], plus "cuda" when torch sees a GPU."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def select_kernels(device: str = "auto", kernel: str = "auto") -> KernelBackend:
    """The backend for a device ("auto", "cpu", "cuda") and kernel ("auto", "triton", "torch").

    "auto" device: cuda when torch sees a GPU, else cpu. "auto" kernel: Triton (compiled
    on cuda, interpreted on cpu). Raises PagedLabError for an unknown name, or for "cuda"
    on a machine without a GPU. Creates nothing on the device.
    """
    if device not in DEVICES:
        raise PagedLabError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if kernel not in KERNELS:
        raise PagedLabError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PagedLabError("device 'cuda' requested but torch sees no CUDA GPU; "
                            "use --device cpu or auto")
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else \
        torch.device("cpu")
    if kernel == "torch":
        return TorchKernels(dev)
    return TritonKernels(dev)
