"""Value types of the contiguous arena: regions, holes, fit answers, breakdowns, segments.

`ContiguousArena` (backend.lab.contiguous) returns these; they hold no
reference to it, so views and comparisons can take them without the arena.

Every slot of the arena is in exactly one of five states (the PagedAttention
paper's Figure 2), and they always sum to `capacity`::

    a pow2 arena of 24 slots; required allocation 6 (the next waiting
    request's region size)

    slot     0         1         2
             012345678901234567890123
    kind     ####++~~xxx###+xxxxx####
    owner    AAAAAAAA   BBBB     CCCC

    A  slots 0-7:   reserved 8, final length 6, 4 tokens so far: 2 slots of
                    reservation (it will fill them), 2 of internal fragmentation
    -  slots 8-10:  a hole of 3 < 6: external fragmentation
    B  slots 11-14: reserved 4, final length 4, 3 tokens: 1 slot of reservation
    -  slots 15-19: a hole of 5 < 6: external fragmentation (8 slots are free in
                    all, enough for 6, but in no one piece)
    C  slots 20-23: reserved 4, final length 4, 4 tokens

    # token_states            slots holding a token
    + reservation             slots reserved for tokens the request will still
                              generate: min(final_len, reserved) - tokens
    ~ internal_fragmentation  reserved slots the request will never use:
                              reserved - final_len when positive
    x external_fragmentation  free slots, while the free total would hold the
                              required allocation but no hole does
    . free                    free slots otherwise: a hole could hold it, or
                              all the free slots together could not

With a required allocation of 4 the hole at 15-19 holds it and every free slot
is free; with 9, more than the 8 free in all, every free slot is free too.

External fragmentation follows the seed text: "free space split into separate
regions that cannot satisfy a required larger contiguous allocation": free
space that would suffice if it were in one piece. It is relative to a required
size, which the caller passes: the region size the next waiting request needs
(a question about a hypothetical request passes that request's size). The free
slots count as external fragmentation when together they would hold the
required size but no single hole does; when a hole holds it nothing is
fragmented, and when the free total is too small the request waits for lack of
memory, not for its layout, so they are plain free. With no required size at
all, every free slot is simply free. `ContiguousArena.fits` says the same as a
reason (a `FitAnswer`: "external_fragmentation" when enough is free in total but
no hole is large enough, "not_enough_free" otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from backend.core.words import agrees, counted

SegmentKind = Literal[
    "token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free",
]
SEGMENT_KINDS: tuple[SegmentKind, ...] = (
    "token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free",
)

FitReason = Literal["fits", "external_fragmentation", "not_enough_free", "never"]


@dataclass(frozen=True, slots=True)
class Region:
    """One request's reservation: slots start .. start + reserved - 1."""

    request_id: str
    start: int
    reserved: int
    final_len: int
    tokens: int

    @property
    def end(self) -> int:
        """One past the last slot."""
        return self.start + self.reserved

    @property
    def reservation(self) -> int:
        """Slots the request will still fill."""
        return min(self.final_len, self.reserved) - self.tokens

    @property
    def internal_fragmentation(self) -> int:
        """Reserved slots the request will never fill."""
        return max(0, self.reserved - self.final_len)


@dataclass(frozen=True, slots=True)
class Hole:
    """A maximal run of free slots."""

    start: int
    length: int


@dataclass(frozen=True, slots=True)
class FitAnswer:
    """Whether a request of `final_len` tokens would get a region now, and if not, why.

    `size` is the region the policy would reserve for it. `start` is where
    first-fit would place it (None if it does not fit). `reason`:
    "fits"; "external_fragmentation" (enough slots are free in total but no
    hole is large enough); "not_enough_free" (fewer free slots than `size`);
    "never" (larger than the arena, or than max_len under "max").
    """

    final_len: int
    size: int
    fits: bool
    start: int | None
    free_total: int
    largest_hole: int
    reason: FitReason

    @property
    def message(self) -> str:
        """One plain-English sentence about the answer."""
        # Its final length: the region is sized for the tokens it will reach, not
        # the ones it holds on arrival.
        what = (f"a request that will reach {counted(self.final_len, 'token')} (a region of "
                f"{counted(self.size, 'slot')})")
        free = f"{counted(self.free_total, 'slot')} {agrees(self.free_total, 'is', 'are')} free"
        if self.reason == "fits":
            return f"{what} fits at slot {self.start}"
        if self.reason == "external_fragmentation":
            return (f"{what} does not fit: {free} in total but the largest hole is "
                    f"{self.largest_hole} (external fragmentation)")
        if self.reason == "not_enough_free":
            return f"{what} does not fit: " + (f"only {free}" if self.free_total else
                                               "no slot is free")
        return f"{what} can never fit in this arena"


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """The arena's slots by Figure 2 state; the five counts sum to `capacity`.

    `required` is the allocation size external fragmentation was judged
    against (None: no free slot counts as external fragmentation).
    """

    token_states: int
    reservation: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    required: int | None = None

    @property
    def capacity(self) -> int:
        return (self.token_states + self.reservation + self.internal_fragmentation
                + self.external_fragmentation + self.free)

    def as_dict(self) -> dict[str, int]:
        return {
            "token_states": self.token_states, "reservation": self.reservation,
            "internal_fragmentation": self.internal_fragmentation,
            "external_fragmentation": self.external_fragmentation, "free": self.free,
        }

    def fractions(self) -> dict[str, float]:
        """Each state's share of the capacity (sums to 1)."""
        cap = self.capacity
        return {k: v / cap for k, v in self.as_dict().items()}


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of slots in one state, for drawing memory maps. `owner` is None for holes."""

    start: int
    length: int
    owner: str | None
    kind: SegmentKind
