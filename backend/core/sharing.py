"""The sharing measurement's result types and the paper's Figure 15 figures.

Shared by the stochastic estimate (backend/lab/sharing.py) and the
measurement on the live engine (backend/engine/sharing.py), which sit in
sibling layers that must not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SharingKind = Literal["parallel", "beam"]
# The paper's Figure 15 (OPT-13B, Alpaca): saved fraction for n / width 2..6.
PAPER_SAVINGS: dict[str, tuple[float, float]] = {
    "parallel": (0.061, 0.098), "beam": (0.376, 0.552),
}


@dataclass(frozen=True, slots=True)
class SharingTrace:
    """Block counts summed over the decode steps of one or more requests."""

    steps: int
    used_block_steps: int
    unshared_block_steps: int
    cow_copies: int
    peak_used_blocks: int
    peak_unshared_blocks: int

    @property
    def saved_fraction(self) -> float:
        """1 - used / unshared: the share of block memory sharing saves."""
        return 1.0 - self.used_block_steps / self.unshared_block_steps

    def __add__(self, other: SharingTrace) -> SharingTrace:
        return SharingTrace(
            self.steps + other.steps, self.used_block_steps + other.used_block_steps,
            self.unshared_block_steps + other.unshared_block_steps,
            self.cow_copies + other.cow_copies,
            max(self.peak_used_blocks, other.peak_used_blocks),
            max(self.peak_unshared_blocks, other.peak_unshared_blocks))


@dataclass(frozen=True, slots=True)
class SharingResult:
    """Saved fraction for one n / width over many requests, beside the paper's range."""

    kind: str
    n: int
    block_size: int
    requests: int
    saved_fraction: float
    trace: SharingTrace
    paper_low: float
    paper_high: float
