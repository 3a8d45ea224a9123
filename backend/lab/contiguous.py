"""A contiguous KV arena: each request reserves ONE unbroken region, placed first-fit.

This is how serving systems stored the KV cache before PagedAttention (the
paper's "Orca (Max)", "Orca (Pow2)" and "Orca (Oracle)" baselines): a request
gets one region of `capacity` token slots big enough for the longest answer it
might produce, at the lowest address where it fits. How big depends on the policy:

    max     a fixed maximum sequence length (default 2048) for every request
    pow2    the next power of two of the request's final length (prompt + output)
    oracle  exactly the final length (a system that knows the future)

A reservation never exceeds the arena: a policy that asks for more (say
"max" with max_len 2048 in a 1000-slot arena) reserves the whole arena, the
longest region that could ever exist. A request whose final length is larger
than the arena (or, under "max", than max_len) can never fit and is refused.

Every slot of the arena is in exactly one of five states (the PagedAttention
paper's Figure 2: token states, reservation, internal and external
fragmentation, free), and they always sum to `capacity`. The value types,
with a drawing of the five states and why external fragmentation is judged
against a required allocation size, are in backend.lab.contiguous_types;
the ASCII memory map is drawn by backend.lab.contiguous_render.

Every mutating method validates completely before it changes anything, so a
`PagedLabError` leaves the arena exactly as it was; `OutOfBlocksError` (a
subclass) means "no room right now", everything else means "never". Costs
are O(number of regions) per placement, O(1) for growth and the totals.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

from backend.core.checks import check_int
from backend.core.errors import IntegrityError, OutOfBlocksError, PagedLabError
from backend.core.words import counted
from backend.lab.contiguous_render import render_segments
from backend.lab.contiguous_types import (
    FitAnswer,
    FitReason,
    Hole,
    MemoryBreakdown,
    Region,
    Segment,
    SegmentKind,
)

ContiguousPolicy = Literal["max", "pow2", "oracle"]
CONTIGUOUS_POLICIES: tuple[ContiguousPolicy, ...] = ("max", "pow2", "oracle")
DEFAULT_MAX_LEN = 2048


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    assert n >= 1
    return 1 << (n - 1).bit_length()


@dataclass(slots=True)
class _Slot:
    """Mutable record behind a `Region`."""

    start: int
    reserved: int
    final_len: int
    tokens: int


class ContiguousArena:
    """`capacity` token slots; each request holds one contiguous region (first-fit).

    Reads never mutate; `reserve`, `grow` and `release` do, and say so.
    """

    def __init__(self, capacity: int, policy: ContiguousPolicy = "oracle", *,
                 max_len: int = DEFAULT_MAX_LEN) -> None:
        check_int(capacity, "capacity", 1)
        check_int(max_len, "max_len", 1)
        if policy not in CONTIGUOUS_POLICIES:
            raise PagedLabError(
                f"policy must be one of {', '.join(CONTIGUOUS_POLICIES)}, got {policy!r}")
        self.capacity = capacity
        self.policy: ContiguousPolicy = policy
        self.max_len = max_len
        self._slots: dict[str, _Slot] = {}
        # Region starts in address order, and who starts there.
        self._starts: list[int] = []
        self._owner_at: dict[int, str] = {}
        # Totals kept incrementally so the simulator reads them in O(1).
        self.reserved_total = 0
        self.final_total = 0      # sum of min(final_len, reserved): token + reservation slots
        self.tokens_total = 0
        # Bumped by every placement change, so callers can cache hole scans.
        self.version = 0

    # ---- reads -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slots

    @property
    def free_total(self) -> int:
        return self.capacity - self.reserved_total

    def reservation_size(self, final_len: int) -> int:
        """Reads only: the region the policy reserves for a request of `final_len` tokens.

        Never more than the arena. Raises PagedLabError if `final_len` is not
        an integer >= 1 or the request can never fit (longer than the arena,
        or than max_len under "max").
        """
        check_int(final_len, "final_len", 1)
        if final_len > self.capacity:
            raise PagedLabError(
                f"a request of {counted(final_len, 'token')} can never fit in an arena of "
                f"{counted(self.capacity, 'slot')}")
        if self.policy == "max" and final_len > self.max_len:
            raise PagedLabError(
                f"a request of {final_len:,} tokens is longer than the maximum sequence "
                f"length {self.max_len:,} that the max policy reserves")
        return min(self._policy_size(final_len), self.capacity)

    def _policy_size(self, final_len: int) -> int:
        """The region the policy asks for, before capping at the arena."""
        if self.policy == "max":
            return self.max_len
        if self.policy == "pow2":
            return next_pow2(final_len)
        return final_len

    def region(self, request_id: str) -> Region:
        """Reads only: the request's region. Raises PagedLabError if it holds none."""
        return self._region(request_id, self._get(request_id))

    def regions(self) -> list[Region]:
        """Reads only: every region in address order."""
        return [self._region(self._owner_at[s], self._slots[self._owner_at[s]])
                for s in self._starts]

    def holes(self) -> list[Hole]:
        """Reads only: maximal free runs in address order (O(regions))."""
        out: list[Hole] = []
        pos = 0
        slots = self._slots
        owner_at = self._owner_at
        for s in self._starts:
            if s > pos:
                out.append(Hole(pos, s - pos))
            pos = s + slots[owner_at[s]].reserved
        if pos < self.capacity:
            out.append(Hole(pos, self.capacity - pos))
        return out

    def largest_hole(self) -> int:
        return max((h.length for h in self.holes()), default=0)

    def first_fit(self, size: int) -> int | None:
        """Reads only: the lowest start of a hole of at least `size` slots, or None."""
        pos = 0
        slots = self._slots
        owner_at = self._owner_at
        for s in self._starts:
            if s - pos >= size:
                return pos
            pos = s + slots[owner_at[s]].reserved
        return pos if self.capacity - pos >= size else None

    def fits(self, final_len: int) -> FitAnswer:
        """Reads only: would a new request of `final_len` tokens get a region now?

        Raises PagedLabError only if `final_len` is not an integer >= 1; a
        request that can never fit is answered with reason "never".
        """
        check_int(final_len, "final_len", 1)
        holes = self.holes()
        free = self.free_total
        largest = max((h.length for h in holes), default=0)
        try:
            size = self.reservation_size(final_len)
        except PagedLabError:
            size = max(self._policy_size(final_len), final_len)
            return FitAnswer(final_len, size, False, None, free, largest, "never")
        start = next((h.start for h in holes if h.length >= size), None)
        if start is not None:
            return FitAnswer(final_len, size, True, start, free, largest, "fits")
        reason: FitReason = "external_fragmentation" if free >= size else "not_enough_free"
        return FitAnswer(final_len, size, False, None, free, largest, reason)

    def fragmented(self, required: int | None) -> bool:
        """Reads only: whether the free slots together would hold a region of `required`
        slots but no hole does (False if None). Then every free slot is external
        fragmentation; with too few free in total they are simply free."""
        if required is None or self.free_total < required:
            return False
        return self.first_fit(required) is None

    def external_slots(self, required: int | None) -> int:
        """Reads only: every free slot when the arena is `fragmented` for `required`, else 0."""
        return self.free_total if self.fragmented(required) else 0

    def breakdown(self, required: int | None = None) -> MemoryBreakdown:
        """Reads only: the arena's slots by state right now (Figure 2 definitions).

        `required` is the region size (slots) external fragmentation is
        judged against: the size the next waiting request needs. None counts
        every free slot as free.
        """
        if required is not None:
            check_int(required, "required", 1)
        ext = self.external_slots(required)
        return MemoryBreakdown(
            token_states=self.tokens_total,
            reservation=self.final_total - self.tokens_total,
            internal_fragmentation=self.reserved_total - self.final_total,
            external_fragmentation=ext,
            free=self.free_total - ext,
            required=required,
        )

    def segments(self, required: int | None = None) -> list[Segment]:
        """Reads only: the whole arena as runs of one state each, in address order."""
        if required is not None:
            check_int(required, "required", 1)
        out: list[Segment] = []
        # Every hole is in the same state: the free slots are fragmented or free together.
        hole_kind: SegmentKind = ("external_fragmentation" if self.fragmented(required)
                                  else "free")

        def hole(start: int, length: int) -> None:
            out.append(Segment(start, length, None, hole_kind))

        pos = 0
        for r in self.regions():
            if r.start > pos:
                hole(pos, r.start - pos)
            p = r.start
            parts: tuple[tuple[int, SegmentKind], ...] = (
                (r.tokens, "token_states"), (r.reservation, "reservation"),
                (r.internal_fragmentation, "internal_fragmentation"))
            for length, kind in parts:
                if length:
                    out.append(Segment(p, length, r.request_id, kind))
                    p += length
            pos = r.end
        if pos < self.capacity:
            hole(pos, self.capacity - pos)
        return out

    def render(self, required: int | None = None, *, width: int = 64) -> str:
        """Reads only: an ASCII memory map, one glyph per slot (or per group of slots).

        See `render_segments`: wider arenas are drawn a group of slots per
        character, each showing the state holding most of its slots.
        """
        check_int(width, "width", 1)
        return render_segments(self.segments(required), self.capacity, width=width)

    def check_integrity(self) -> None:
        """Reads only: raise IntegrityError if regions overlap or totals disagree."""
        problems: list[str] = []
        pos = 0
        for s in self._starts:
            r = self._slots[self._owner_at[s]]
            if r.start != s or s < pos:
                problems.append(f"region at {s} overlaps the one before it (ends at {pos})")
            if not 0 <= r.tokens <= min(r.final_len, r.reserved):
                problems.append(f"region at {s} holds {r.tokens} tokens (reserved "
                                f"{r.reserved}, final {r.final_len})")
            pos = s + r.reserved
        if pos > self.capacity:
            problems.append(f"the last region ends at {pos}, past capacity {self.capacity}")
        if len(self._starts) != len(self._slots):
            problems.append(f"{len(self._starts)} starts for {len(self._slots)} regions")
        if self.reserved_total != sum(r.reserved for r in self._slots.values()):
            problems.append("reserved_total disagrees with a recount")
        if self.final_total != sum(min(r.final_len, r.reserved) for r in self._slots.values()):
            problems.append("final_total disagrees with a recount")
        if self.tokens_total != sum(r.tokens for r in self._slots.values()):
            problems.append("tokens_total disagrees with a recount")
        if problems:
            raise IntegrityError(f"{counted(len(problems), 'arena invariant')} broken: "
                                 + "; ".join(problems))

    # ---- mutations ---------------------------------------------------------

    def reserve(self, request_id: str, final_len: int, *, tokens: int = 0) -> Region:
        """Mutates: give a new request its region at the lowest hole that fits.

        `tokens` is how many of its `final_len` tokens it already holds
        (0 <= tokens <= final_len). Raises PagedLabError for a duplicate or
        empty id, a bad size, or a request that can never fit;
        OutOfBlocksError if no hole is large enough right now (the message
        says whether that is external fragmentation).
        """
        if not isinstance(request_id, str) or not request_id:
            raise PagedLabError(f"request id must be a non-empty string, got {request_id!r}")
        if request_id in self._slots:
            raise PagedLabError(f"request {request_id!r} already holds a region")
        size = self.reservation_size(final_len)
        check_int(tokens, "tokens", 0)
        if tokens > final_len:
            raise PagedLabError(
                f"request {request_id!r} cannot hold {tokens} tokens: its final length "
                f"is {final_len}")
        start = self.first_fit(size)
        if start is None:
            raise OutOfBlocksError(f"request {request_id!r}: {self.fits(final_len).message}")
        slot = _Slot(start, size, final_len, tokens)
        self._slots[request_id] = slot
        bisect.insort(self._starts, start)
        self._owner_at[start] = request_id
        self.reserved_total += size
        self.final_total += min(final_len, size)
        self.tokens_total += tokens
        self.version += 1
        return self._region(request_id, slot)

    def grow(self, request_id: str, n: int = 1) -> Region:
        """Mutates: the request fills `n` more slots of its region (nothing moves).

        Raises PagedLabError if the request holds no region, `n` < 1, or it
        would pass its final length (a contiguous region cannot grow in place).
        """
        slot = self._get(request_id)
        check_int(n, "n", 1)
        if slot.tokens + n > slot.final_len:
            raise PagedLabError(
                f"request {request_id!r} holds {slot.tokens} of its {slot.final_len} tokens; "
                f"{n} more would pass its final length")
        slot.tokens += n
        self.tokens_total += n
        return self._region(request_id, slot)

    def release(self, request_id: str) -> Region:
        """Mutates: free the request's region; returns it as it was."""
        slot = self._get(request_id)
        region = self._region(request_id, slot)
        del self._slots[request_id]
        self._starts.pop(bisect.bisect_left(self._starts, slot.start))
        del self._owner_at[slot.start]
        self.reserved_total -= slot.reserved
        self.final_total -= min(slot.final_len, slot.reserved)
        self.tokens_total -= slot.tokens
        self.version += 1
        return region

    # ---- internals ---------------------------------------------------------

    def _get(self, request_id: str) -> _Slot:
        slot = self._slots.get(request_id)
        if slot is None:
            raise PagedLabError(f"request {request_id!r} holds no region (unknown or released)")
        return slot

    @staticmethod
    def _region(request_id: str, slot: _Slot) -> Region:
        return Region(request_id, slot.start, slot.reserved, slot.final_len, slot.tokens)
