"""Allocator events: one record for every change a user can watch happen.

`Event` is what readers see; `EventLog` is how the block manager keeps them:
flat records, turned into `Event`s only when read.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, overload

from backend.core.words import counted

EventKind = Literal["alloc", "free", "share", "cow", "prefix_hit", "evict", "preempt", "move",
                    "swap_out", "swap_in", "fork"]
EVENT_KINDS: tuple[EventKind, ...] = (
    "alloc", "free", "share", "cow", "prefix_hit", "evict", "preempt", "move",
    "swap_out", "swap_in", "fork",
)
# A kind's code is its index in EVENT_KINDS; a record packs it below the step.
(ALLOC, FREE, SHARE, COW, PREFIX_HIT, EVICT, PREEMPT, MOVE,
 SWAP_OUT, SWAP_IN, FORK) = range(len(EVENT_KINDS))
KIND_BITS = 4
KIND_MASK = (1 << KIND_BITS) - 1
KIND_CODES: dict[str, int] = {kind: code for code, kind in enumerate(EVENT_KINDS)}


class Event(NamedTuple):
    """One allocator event (immutable).

    `step` is the number of the operation that caused it (1-based). `request`
    and `block` may be None (a move of a cached block has no request; a
    preemption names no single block). `cow` and `move` carry `src` and `dst`;
    so do `swap_out` (device block `src` copied to host block `dst`) and
    `swap_in` (host block `src` copied to device block `dst`), whose `block`
    is the device block. A `fork` names the new request and no block; the
    `share` events after it, one per block of its parent, are its table.
    `ref_count` is the block's reference count after the event, where one
    applies: a `free` with `ref_count` 1 means the request let go of a block
    that another request still holds.

    A named tuple rather than a dataclass: readers build many (a snapshot
    builds the whole log), and a tuple is built in C, several times faster
    than a frozen dataclass, which sets each field from Python. The
    allocator itself records events in an `EventLog`, which builds them
    only when they are read.
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
        if self.kind in ("cow", "move", "swap_out", "swap_in"):
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


def describe(event: Event, swapped: bool = False, swap_mode: bool = False,
             caching: bool = True, shared: bool = False) -> str:
    """One plain-English line for the event log.

    `shared`: for a swap_out, whether an earlier beam of its group put that device
    block in that host block in the same swap-out (`shared_swap_outs`): nothing copied.

    `swapped`: for a preempt event, whether the request's blocks went to the host
    pool (swap preemption writes a swap_out event per block just before it), not
    released to be recomputed; the event itself does not say. `swap_mode`: whether
    the engine preempts by swapping, so that a preemption without it found the host
    pool too full. `caching`: whether the pool keeps prefix-cache keys (a freed block
    then may keep its cached prefix).
    """
    who = f"request {event.request}" if event.request is not None else "the engine"
    b = event.block
    rc = event.ref_count
    match event.kind:
        case "alloc":
            return f"{who} took free block {b}"
        case "free":
            if rc:
                return f"{who} released block {b}; still held by {counted(rc, 'other holder')}"
            # The event does not say whether the block keeps a prefix-cache key: a full
            # block of a prefix-caching pool stays "cached" (a hit) until it is reused.
            keeps = ", keeping its cached prefix if it has one" if caching else ""
            return (f"{who} released block {b}; no one holds it (ref count 0), so it is back "
                    f"in the free queue{keeps}")
        case "share":
            return f"{who} shares block {b} (ref count now {rc})"
        case "cow":
            return (f"{who} wrote into shared block {event.src}: copied it to block "
                    f"{event.dst} first (copy-on-write)")
        case "prefix_hit":
            # Ref count 1: no request held the block; it waited, cached, in the free queue.
            how = ("takes it back from the free queue, nothing recomputed" if rc == 1
                   else "shares it")
            return (f"{who} found its prompt prefix in block {b} (prefix-cache hit) and {how} "
                    f"(ref count now {rc})")
        case "evict":
            return f"block {b} lost its cached prefix to make room for {who}"
        case "preempt":
            if swapped:
                return (f"{who} was preempted: its K/V went to the host pool (swap_out) and "
                        "its device blocks are released; it resumes from there, nothing "
                        "recomputed")
            full = " (the host pool had no room for its K/V)" if swap_mode else ""
            return (f"{who} was preempted: its blocks are released and it will be "
                    f"recomputed{full}")
        case "move":
            # A shuffle's moves are one permutation, applied at once (paging/remap.py):
            # listed one by one, 0 -> 9 before 9 -> 21 would read as 9 overwritten first.
            return (f"block data moved from physical block {event.src} to {event.dst} "
                    "(all moves of a shuffle at once)")
        case "swap_out":
            if shared:
                return (f"{who} was swapped out: block {event.src}'s K/V is already in host "
                        f"block {event.dst}, copied there for another beam of its group, "
                        "and it shares that copy")
            return (f"{who} was swapped out: block {event.src}'s K/V copied to host block "
                    f"{event.dst}")
        case "swap_in":
            return (f"{who} was swapped in: host block {event.src}'s K/V copied to block "
                    f"{event.dst}")
        case "fork":
            return (f"{who} was forked: it shares every block of its parent's table, nothing "
                    "copied (a share event per block, in the same step)")
    raise AssertionError(event.kind)



# The kinds of a unit's swap-out run: each request's swap_out events, then its frees
# and its preempt.
SWAP_OUT_RUN = frozenset({"swap_out", "free", "preempt"})


def shared_swap_outs(events: Sequence[Event], group_of: Mapping[str, str | None]) -> set[int]:
    """The indices of the `swap_out` events that copied nothing: a beam group is swapped
    out as one unit, and a device block that several of its beams hold is copied once,
    to one host block that each beam's `swap_out` names. Such an event follows, in the
    same run of the unit's swap_out, free and preempt events, one of a beam of the same
    group (`group_of[request]`) naming the same host block. O(events)."""
    out: set[int] = set()
    seen: set[tuple[str, int]] = set()
    for i, e in enumerate(events):
        if e.kind not in SWAP_OUT_RUN:
            seen.clear()
        elif e.kind == "swap_out" and e.request is not None and e.dst is not None:
            group = group_of.get(e.request)
            if group is None:
                continue
            if (group, e.dst) in seen:
                out.add(i)
            seen.add((group, e.dst))
    return out


_new_tuple = tuple.__new__


def new_event(step: int, kind: EventKind, request: str | None, block: int | None,
              src: int | None, dst: int | None, ref_count: int | None) -> Event:
    """`Event(step, kind, request, block, src, dst, ref_count)`, for the allocator's hot paths.

    Skips the named tuple's keyword-handling __new__ (a Python function) and
    builds the tuple directly: the same object.
    """
    return _new_tuple(Event, (step, kind, request, block, src, dst, ref_count))


class EventLog(Sequence[Event]):
    """Every event recorded so far, in order: a sequence of `Event`, kept as flat records.

    Reads are those of a sequence of `Event` (len, an index, a slice as a new
    list, iteration, `==` against any sequence of events); each `Event` is
    built when it is read, so the log itself holds no object per event. The
    allocator records one event for every block it hands out, shares or
    releases, and an object per event is what made recording cost: building
    it, and the garbage collections that every new container counts towards.

    Layout: `items` holds four entries per event, ``step << KIND_BITS | kind
    code``, request, block and ref_count (None where the event has none);
    `extra` maps an event's index to its (src, dst) when either is set
    (copies and moves, a few per operation), and `extra_at` lists those
    indices in order. `record` is the writers' call:
    `items.extend` with the four entries of an event without src and dst,
    a C call with no object kept. Steps are ints (the engine's operation
    numbers); any other field value an `Event` may hold is kept as it is.
    """

    __slots__ = ("extra", "extra_at", "items", "record")

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self.items: list[Any] = []
        self.extra: dict[int, tuple[int | None, int | None]] = {}
        # The keys of `extra` in increasing order (events are only ever
        # appended), so a slice finds its own by bisection.
        self.extra_at: list[int] = []
        # Writers bind this once per call: record((code, request, block, ref_count)).
        self.record = self.items.extend
        for event in events:
            self.append(event)

    def add(self, step: int, kind: int, request: str | None, block: int | None,
            src: int | None = None, dst: int | None = None,
            ref_count: int | None = None) -> None:
        """Mutates: record one event by its fields (`kind` is a code from KIND_CODES)."""
        if src is not None or dst is not None:
            i = len(self.items) >> 2
            self.extra[i] = (src, dst)
            self.extra_at.append(i)
        self.items.extend((step << KIND_BITS | kind, request, block, ref_count))

    def append(self, event: Event) -> None:
        """Mutates: record an `Event` (a restored snapshot's log is rebuilt this way)."""
        step, kind, request, block, src, dst, ref_count = event
        self.add(step, KIND_CODES[kind], request, block, src, dst, ref_count)

    def __len__(self) -> int:
        return len(self.items) >> 2

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        n = len(self)
        if isinstance(index, slice):
            start, stop, stride = index.indices(n)
            if stride == 1:
                # An operation that recorded nothing reads an empty slice.
                return self._build(start, stop) if start < stop else []
            return [self._event(i) for i in range(start, stop, stride)]
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("event index out of range")
        return self._event(i)

    def __iter__(self) -> Iterator[Event]:
        return self._events(0, len(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventLog):
            return self.items == other.items and self.extra == other.extra
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"EventLog({list(self)!r})"

    def _event(self, i: int) -> Event:
        j = i << 2
        code, request, block, ref_count = self.items[j:j + 4]
        src, dst = self.extra.get(i, _NO_EXTRA)
        return _new_tuple(Event, (code >> KIND_BITS, EVENT_KINDS[code & KIND_MASK], request,
                                  block, src, dst, ref_count))

    def _build(self, start: int, stop: int) -> list[Event]:
        """Events start..stop-1 (0 <= start <= stop <= len) as a new list.

        One comprehension over the flat records (the engine builds its
        operation's events after every operation, a snapshot all of them),
        then the few events with a src or dst, found by bisection, are put
        right: O(events built + log of the copies and moves recorded).
        """
        flat = iter(self.items[start << 2:stop << 2])
        out = [_new_tuple(Event, (code >> KIND_BITS, EVENT_KINDS[code & KIND_MASK], request,
                                  block, None, None, ref_count))
               for code, request, block, ref_count in zip(flat, flat, flat, flat, strict=True)]
        at = self.extra_at
        for k in range(bisect_left(at, start), bisect_left(at, stop)):
            i = at[k]
            src, dst = self.extra[i]
            out[i - start] = out[i - start]._replace(src=src, dst=dst)
        return out

    def _events(self, start: int, stop: int) -> Iterator[Event]:
        """Events start..stop-1, built a chunk at a time (a long log is not built at once)."""
        for first in range(start, stop, _CHUNK):
            yield from self._build(first, min(stop, first + _CHUNK))


# Events built at a time while a log is iterated.
_CHUNK = 4096
_NO_EXTRA: tuple[None, None] = (None, None)
