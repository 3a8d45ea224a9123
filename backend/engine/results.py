"""The engine's typed results: what an operation did, what ran, what a check found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from backend.engine.ops import Op
from backend.paging.block_types import AllocatorMetrics
from backend.paging.events import Event

# Logits two correct runs may differ by: the same math in another order (batch
# composition, prefix hits, chunked prefill). Past it, something read other K/V.
LOGIT_TOLERANCE = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 2e-1}


def logit_tolerance(dtype: str) -> float:
    """How far apart two correct computations in `dtype` may be (an unknown dtype: the
    widest)."""
    return LOGIT_TOLERANCE.get(dtype, LOGIT_TOLERANCE["bfloat16"])


@dataclass(frozen=True, slots=True)
class KernelReport:
    """What ran the last model step, and how far it was from the reference.

    `restored`: these figures were read from the snapshot the engine was restored
    from, not measured by a step of this engine; the engine's next model step
    replaces the report with one it measured (restored False). Not written to
    snapshots, so a restored state exports the file it came from.
    """

    backend: str                  # "triton", "triton-interpreter" or "torch"
    device: str
    max_abs_err: float | None     # None before any step, or when checking is off
    time_ms: float | None         # wall time of the last model step, all layers
    num_seqs: int = 0
    num_query_tokens: int = 0
    name: str = "paged_attention"
    restored: bool = False


class Prefill(NamedTuple):
    """One prefill chunk an operation ran: `tokens` of `request`'s prompt (or of its
    history, recomputed after a preemption) computed, after which `computed` of its
    `total` tokens have their K/V in the cache."""

    request: str
    tokens: int
    computed: int
    total: int


@dataclass(frozen=True, slots=True)
class OpResult:
    """What one operation did.

    `host_released`: (request, host blocks) for each swapped-out request that finished
    while its K/V sat in the host pool; those blocks are not the allocator's, so no
    event of its log tells of them. `swapped_in`: the admissions of `admitted` that
    brought a swapped-out request's K/V back from the host pool (one per admission).
    `waits`: (request, why) for the request an `add` left waiting, with the first of
    admission's rules that holds it back (Scheduler.why_waiting).
    """

    step: int
    op: Op
    events: tuple[Event, ...]
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    generated: tuple[tuple[str, int], ...]   # (request, token) in generation order
    prefilled: tuple[Prefill, ...] = ()
    host_released: tuple[tuple[str, int], ...] = ()
    swapped_in: tuple[str, ...] = ()
    waits: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Verification:
    """The paged state against a contiguous recomputation (see verify_recomputation)."""

    num_requests: int
    num_tokens: int
    max_kv_err: float        # largest |cached K/V - recomputed K/V| over all slots, layers
    max_logit_err: float     # largest |pending logits - recomputed logits|
    # The error and the largest |recomputed value| of the layer's keys or values (of one
    # request's logits) where the error is largest against that scale (`bounds`).
    kv_worst: tuple[float, float] = (0.0, 0.0)
    logit_worst: tuple[float, float] = (0.0, 0.0)
    # How many values were compared, and how many of them were left out because the
    # recomputation's own value is NaN or infinite: the model overflows its dtype
    # (float16 ends at 65,504) there, paged or not, so no comparison can tell a paging
    # bug from the overflow. The errors above are over the values left in.
    kv_values: int = 0
    kv_left_out: int = 0
    logit_values: int = 0
    logits_left_out: int = 0

    def bounds(self, tolerance: float) -> tuple[float, float]:
        """What float rounding explains where each error is worst: `tolerance` of the
        largest value there (of 1 when every value is smaller).

        Rounding grows with the values: SmolLM2's keys reach 20 and its logits 30,
        where one bfloat16 step is 0.125, while its first layer's values stay under 1.
        Each layer's keys and values are judged against their own scale, so a block
        read in place of another, which differs by the values themselves, is told in
        every layer."""
        return (tolerance * max(1.0, self.kv_worst[1]),
                tolerance * max(1.0, self.logit_worst[1]))

    def agrees(self, tolerance: float) -> bool:
        """The cached K/V and the pending logits within `bounds(tolerance)` of the
        recomputation: what float arithmetic in another order explains. Over the values
        judged: see `kv_left_out` and `logits_left_out`."""
        kv, logits = self.bounds(tolerance)
        return self.kv_worst[0] <= kv and self.logit_worst[0] <= logits


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    allocator: AllocatorMetrics
    running: int
    waiting: int
    finished: int
    bytes_per_block: int
    kv_bytes: int

    @property
    def bytes_saved_by_sharing(self) -> int:
        return self.allocator.blocks_saved_by_sharing * self.bytes_per_block


@dataclass(slots=True)
class Outcome:
    """What the operation being applied has done so far (becomes its OpResult)."""

    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    generated: list[tuple[str, int]] = field(default_factory=list)
    prefilled: list[Prefill] = field(default_factory=list)
    host_released: list[tuple[str, int]] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
