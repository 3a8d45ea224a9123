"""Allocator events: one record for every change a user can watch happen."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

EventKind = Literal["alloc", "free", "share", "cow", "prefix_hit", "evict", "preempt", "move"]
EVENT_KINDS: tuple[EventKind, ...] = (
    "alloc", "free", "share", "cow", "prefix_hit", "evict", "preempt", "move",
)


class Event(NamedTuple):
    """One allocator event (immutable).

    `step` is the number of the operation that caused it (1-based). `request`
    and `block` may be None (a move of a cached block has no request; a
    preemption names no single block). `cow` and `move` carry `src` and `dst`.
    `ref_count` is the block's reference count after the event, where one
    applies: a `free` with `ref_count` 1 means the request let go of a block
    that another request still holds.

    A named tuple rather than a dataclass: the allocator records one for
    every block it hands out, shares or releases, and a tuple is built in C
    (several times faster than a frozen dataclass, which sets each field
    from Python) and, holding only ints, strings and None, is dropped from
    the garbage collector's tracking, so a long event log costs collections
    nothing.
    """

    step: int
    kind: EventKind
    request: str | None
    block: int | None
    src: int | None = None
    dst: int | None = None
    ref_count: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step, "kind": self.kind, "request": self.request, "block": self.block,
        }
        if self.kind in ("cow", "move"):
            out["src"] = self.src
            out["dst"] = self.dst
        if self.ref_count is not None:
            out["ref_count"] = self.ref_count
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> Event:
        """Parse an event written by `to_json`; KeyError/TypeError/ValueError on bad data."""
        kind = data["kind"]
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        return Event(
            step=_int(data["step"]), kind=kind,
            request=_opt_str(data.get("request")), block=_opt_int(data.get("block")),
            src=_opt_int(data.get("src")), dst=_opt_int(data.get("dst")),
            ref_count=_opt_int(data.get("ref_count")),
        )


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def describe(event: Event) -> str:
    """One plain-English line for the event log."""
    who = f"request {event.request}" if event.request is not None else "the engine"
    b = event.block
    rc = event.ref_count
    match event.kind:
        case "alloc":
            return f"{who} took free block {b}"
        case "free":
            if rc:
                return f"{who} released block {b}; still held by {rc} other holder(s)"
            return f"{who} released block {b}; it is free again (ref count 0)"
        case "share":
            return f"{who} shares block {b} (ref count now {rc})"
        case "cow":
            return (f"{who} wrote into shared block {event.src}: copied it to block "
                    f"{event.dst} first (copy-on-write)")
        case "prefix_hit":
            return (f"{who} found its prompt prefix in block {b} (prefix-cache hit) and shares it "
                    f"(ref count now {rc})")
        case "evict":
            return f"block {b} lost its cached prefix to make room for {who}"
        case "preempt":
            return f"{who} was preempted: its blocks are released and it will be recomputed"
        case "move":
            return f"block data moved from physical block {event.src} to {event.dst}"
    raise AssertionError(event.kind)



_new_tuple = tuple.__new__


def new_event(step: int, kind: EventKind, request: str | None, block: int | None,
              src: int | None, dst: int | None, ref_count: int | None) -> Event:
    """`Event(step, kind, request, block, src, dst, ref_count)`, for the allocator's hot paths.

    Skips the named tuple's keyword-handling __new__ (a Python function) and
    builds the tuple directly: the same object.
    """
    return _new_tuple(Event, (step, kind, request, block, src, dst, ref_count))
