"""The one error PagedLab raises for a caller's mistake.

Every operation validates its input before it changes anything, so when a
`PagedLabError` escapes, the state it was aimed at is exactly as it was. The
message is written for the person who made the request: it names the thing
that is wrong and, where it helps, what would be accepted instead.

Internal invariants use `assert` (or `IntegrityError`), never this class: an
invariant failure is a bug in PagedLab, not something a user can fix.
"""

from __future__ import annotations


class PagedLabError(ValueError):
    """A request PagedLab refuses, with a message a person can act on."""


class OutOfBlocksError(PagedLabError):
    """The pool has too few free blocks right now (it may have room later)."""


class IntegrityError(AssertionError):
    """An allocator invariant does not hold. Always a bug, never user input."""
