"""The contiguous policies (max, pow2, oracle) for the replay, on `ContiguousArena`.

A request is admitted only when its whole region fits (first-fit); since the
region is sized for the request's final length up front, it never needs to
grow and nobody is ever preempted. The arena records each request's tokens at
admission; the replay keeps the lengths after that in closed form (calling
`grow` for every token of a long trace would cost more than everything else),
so the token and reservation split comes from the replay, and the arena
supplies placement, the reserved totals and the holes.
"""

from __future__ import annotations

import numpy as np

from backend.core.errors import PagedLabError
from backend.lab.contiguous import DEFAULT_MAX_LEN, ContiguousArena, ContiguousPolicy


class ContiguousPolicyMemory:
    """One `ContiguousArena` of `capacity` slots under `policy`."""

    growth_period: int | None = None
    reserves_ahead = True

    def __init__(self, capacity: int, policy: ContiguousPolicy, *,
                 max_len: int = DEFAULT_MAX_LEN) -> None:
        self.capacity = capacity
        self.arena = ContiguousArena(capacity, policy, max_len=max_len)
        self._ids: list[str] = []
        # external_slots is asked after every event; the hole scan only
        # changes when a region is placed or freed, or the head changes.
        self._ext_key: tuple[int, int | None] = (-1, None)
        self._ext = 0

    @property
    def allocated(self) -> int:
        return self.arena.reserved_total

    @property
    def committed(self) -> int:
        return self.arena.final_total

    def prepare(self, final_len: np.ndarray) -> None:
        """Raise PagedLabError if the longest request could never get a region."""
        longest = int(final_len.max())
        try:
            self.arena.reservation_size(longest)
        except PagedLabError as e:
            raise PagedLabError(f"the longest request cannot run: {e}") from None
        self._ids = [str(i) for i in range(len(final_len))]

    def try_admit(self, i: int, tokens: int, final_len: int) -> bool:
        arena = self.arena
        if arena.first_fit(arena.reservation_size(final_len)) is None:
            return False
        arena.reserve(self._ids[i], final_len, tokens=tokens)
        return True

    def grow(self, i: int, tokens: int) -> bool:
        raise AssertionError("contiguous regions are sized up front and never grow")

    def release(self, i: int, *, preempted: bool) -> None:
        assert not preempted
        self.arena.release(self._ids[i])

    def external_slots(self, head_final_len: int | None) -> int:
        required = None if head_final_len is None else self.arena.reservation_size(head_final_len)
        key = (self.arena.version, required)
        if key != self._ext_key:
            self._ext_key = key
            self._ext = self.arena.external_slots(required)
        return self._ext

    def block_counts(self) -> None:
        return None
