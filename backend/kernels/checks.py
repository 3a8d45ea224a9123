"""When the kernel path reads tensor data to check it, and the per-step reference check.

Bounds checks (every block-table entry a sequence needs inside the pool, every slot of a
write in range and distinct, ...) must read tables, lengths and slots: on a GPU each is
a device-to-host copy that stalls the step. The tables come from the block manager,
which guarantees them, so the kernel path skips these checks by default; a caller can
ask for them per call (`check_bounds=True`) or for the whole process by setting

    PAGEDLAB_KERNEL_CHECKS=1      (tests and debugging; "0" or unset: off)

Checks of shapes, dtypes, devices and strides read no data and always run.
`check_host_batch` validates the same facts on the host-side lists a batch is built
from, where they cost no device read.

The model's per-step comparison with `reference_paged_attention` goes through
`ReferenceCheck`: on a CPU it runs on every layer of every step, as before; on a GPU,
where the reference's per-sequence loop and the read of its error stall the step, one
forward in PAGEDLAB_REFERENCE_EVERY (default 16) is checked, with a single host read
of the error at the end of the step.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Sequence

import torch

from backend.core.errors import PagedLabError
from backend.kernels.reference import reference_paged_attention

CHECKS_ENV = "PAGEDLAB_KERNEL_CHECKS"
REFERENCE_EVERY_ENV = "PAGEDLAB_REFERENCE_EVERY"
DEFAULT_REFERENCE_EVERY = 16


def checks_enabled() -> bool:
    """Whether PAGEDLAB_KERNEL_CHECKS asks for bounds checks on every call."""
    return os.environ.get(CHECKS_ENV, "0").strip() not in ("", "0")


def resolve_checks(check_bounds: bool | None) -> bool:
    """A call's `check_bounds`: its own value, or the process setting when None."""
    return checks_enabled() if check_bounds is None else bool(check_bounds)


def check_host_batch(tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                     q_lens: Sequence[int], *, num_blocks: int, block_size: int) -> None:
    """The data checks of a paged-attention call, on the lists a batch is built from.

    Raises PagedLabError for a sequence without query tokens, a seq_len below its q_len,
    a table too short for its seq_len, or a used entry outside 0..num_blocks-1. Pure
    Python: meant for where the batch is assembled, so the kernels need not read back.
    """
    if not len(tables) == len(seq_lens) == len(q_lens):
        raise PagedLabError(f"{len(tables)} tables, {len(seq_lens)} seq_lens and "
                            f"{len(q_lens)} q_lens must match")
    for b, (table, seq_len, q_len) in enumerate(zip(tables, seq_lens, q_lens, strict=True)):
        if q_len < 1:
            raise PagedLabError(f"sequence {b} has q_len {q_len}; every sequence needs at "
                                "least one query token")
        if seq_len < q_len:
            raise PagedLabError(f"sequence {b} has seq_len {seq_len} < its q_len {q_len}")
        needed = -(-seq_len // block_size)
        if len(table) < needed:
            raise PagedLabError(f"sequence {b} has seq_len {seq_len}, which needs {needed} "
                                f"blocks of {block_size} slots, but its table has "
                                f"{len(table)}")
        for j in range(needed):
            if not 0 <= table[j] < num_blocks:
                raise PagedLabError(f"block_tables[{b}, {j}] = {table[j]} is not a block of "
                                    f"the pool (0..{num_blocks - 1})")


_FORWARDS = itertools.count()
_FORWARDS_LOCK = threading.Lock()


def reference_every() -> int:
    """One forward in how many is compared with the reference on a GPU (>= 1)."""
    try:
        return max(1, int(os.environ.get(REFERENCE_EVERY_ENV, DEFAULT_REFERENCE_EVERY)))
    except ValueError:
        return DEFAULT_REFERENCE_EVERY


def reference_due(device: torch.device) -> bool:
    """Whether this forward's attention is compared with the reference: always on a CPU;
    on a GPU one forward in `reference_every()` (counted per process)."""
    if device.type != "cuda":
        return True
    with _FORWARDS_LOCK:
        n = next(_FORWARDS)
    return n % reference_every() == 0


class ReferenceCheck:
    """One forward's comparison of every layer's attention with the reference.

    `layer` is called after each layer's paged_attention; `max_abs_err` ends the forward:
    the largest |kernel - reference| over the checked layers (a layer whose difference
    holds a NaN counts as 0), None when checking is off or this forward was not sampled
    (a GPU checks one forward in `reference_every()`).
    The error stays on the device until then, so a checked forward reads the host once.
    """

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.active = enabled and reference_due(device)
        self._err: torch.Tensor | None = None

    def layer(self, attn: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
              query_start_loc: torch.Tensor, scale: float) -> None:
        """Compare one layer's kernel output `attn` with the reference on the same inputs."""
        if not self.active:
            return
        ref = reference_paged_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                        query_start_loc, scale)
        # A layer whose error is NaN adds nothing, as the models' per-layer
        # `max(err, float(...))` did before this class: the figure stays finite,
        # which a snapshot's kernel report must be to restore.
        err = torch.nan_to_num((attn.float() - ref).abs().amax(), nan=0.0, posinf=math.inf)
        self._err = err if self._err is None else torch.maximum(self._err, err)

    def max_abs_err(self) -> float | None:
        """The forward's error (0.0 if no layer was compared), or None if not checked."""
        if not self.active:
            return None
        return 0.0 if self._err is None else float(self._err)
