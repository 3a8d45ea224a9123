"""The event log: flat records that read back as exactly the `Event`s recorded.

`EventLog` keeps four entries per event and builds each `Event` when it is
read; everything a reader can do with the list of events it replaced must
give the same answers (indexing, slices, iteration, equality, repr of the
events), and recording must keep no object per event.
"""

from __future__ import annotations

import gc
import random

import pytest

from backend.paging.block_manager import BlockManager
from backend.paging.events import (
    ALLOC,
    EVENT_KINDS,
    KIND_BITS,
    KIND_CODES,
    Event,
    EventLog,
    describe,
    new_event,
)


def random_events(rng: random.Random, n: int) -> list[Event]:
    """Events with every field shape an Event may hold: None, src/dst on any kind."""
    out = []
    for _ in range(n):
        kind = rng.choice(EVENT_KINDS)
        pick = lambda: rng.choice([None, 0, 1, rng.randrange(10**6)])  # noqa: E731
        out.append(Event(rng.randrange(1, 10**9), kind, rng.choice([None, "A", "a b", "ü"]),
                         pick(), pick(), pick(), pick()))
    return out


def test_the_log_reads_back_what_was_appended() -> None:
    rng = random.Random(0)
    events = random_events(rng, 500)
    log = EventLog(events)
    assert len(log) == len(events)
    assert list(log) == events and log == events and events == log
    assert log == EventLog(events) and log != events[:-1] and log != EventLog(events[1:])
    for i in [0, 1, 250, 499, -1, -500]:
        assert log[i] == events[i] and type(log[i]) is Event
    for s in [slice(None), slice(10, 20), slice(490, 900), slice(-5, None), slice(7, 3),
              slice(None, None, 3), slice(400, 10, -7), slice(-1, None, -1)]:
        assert log[s] == events[s]
    with pytest.raises(IndexError):
        log[500]
    with pytest.raises(IndexError):
        log[-501]
    assert repr(log) == f"EventLog({events!r})"
    assert EventLog() == [] and not EventLog() and list(EventLog()) == []


def test_a_record_is_the_event_of_its_fields() -> None:
    log = EventLog()
    log.record(((5 << KIND_BITS) | ALLOC, "A", 3, 1))
    log.add(6, KIND_CODES["cow"], "A", 4, src=3, dst=4, ref_count=1)
    log.add(6, KIND_CODES["move"], None, 9, src=4, dst=9)
    log.add(7, KIND_CODES["preempt"], "A", None)
    assert list(log) == [
        new_event(5, "alloc", "A", 3, None, None, 1),
        Event(6, "cow", "A", 4, src=3, dst=4, ref_count=1),
        Event(6, "move", None, 9, src=4, dst=9),
        Event(7, "preempt", "A", None),
    ]
    assert [e.to_json() for e in log][1] == {"step": 6, "kind": "cow", "request": "A",
                                             "block": 4, "src": 3, "dst": 4, "ref_count": 1}


def test_recording_keeps_no_object_per_event() -> None:
    log = EventLog()
    log.record(((1 << KIND_BITS) | ALLOC, "A", 1000, 1))
    requests = [f"r{i}" for i in range(100)]
    gc.collect()
    before = len(gc.get_objects())
    for i in range(20_000):
        log.record(((2 << KIND_BITS) | ALLOC, requests[i % 100], 1000 + i % 50, 1))
    assert len(log) == 20_001
    assert len(gc.get_objects()) - before < 10


def test_the_manager_log_is_a_sequence_of_events_and_can_be_replaced() -> None:
    m = BlockManager(8, 2)
    m.step = 1
    m.allocate("A", [1, 2, 3])
    m.step = 2
    m.fork("A", "B")
    m.append("B", [4])
    m.free("A", preempted=True)
    want = [
        Event(1, "alloc", "A", 0, ref_count=1), Event(1, "alloc", "A", 1, ref_count=1),
        Event(2, "fork", "B", None),
        Event(2, "share", "B", 0, ref_count=2), Event(2, "share", "B", 1, ref_count=2),
        Event(2, "cow", "B", 2, src=1, dst=2, ref_count=1),
        Event(2, "preempt", "A", None),
        Event(2, "free", "A", 1, ref_count=0), Event(2, "free", "A", 0, ref_count=1),
    ]
    assert list(m.events) == want
    assert m.events[2:4] == want[2:4]
    m.events = want[:3]
    assert isinstance(m.events, EventLog) and list(m.events) == want[:3]
    m.step = 3
    m.free("B")
    assert [(e.step, e.kind, e.block) for e in m.events[3:]] == [(3, "free", 2), (3, "free", 0)]
    off = BlockManager(8, 2, record_events=False)
    off.allocate("A", [1, 2, 3])
    assert len(off.events) == 0


def test_a_prefix_hit_says_whether_the_block_was_shared_or_taken_back() -> None:
    # Ref count 2: another request holds the block too. Ref count 1: it was free and
    # cached, and the hit takes it back; nothing shares it.
    shared = Event(3, "prefix_hit", "B", 4, ref_count=2)
    revived = Event(5, "prefix_hit", "D", 8, ref_count=1)
    assert describe(shared) == ("request B found its prompt prefix in block 4 (prefix-cache "
                                "hit) and shares it (ref count now 2)")
    assert describe(revived) == ("request D found its prompt prefix in block 8 (prefix-cache "
                                 "hit) and takes it back from the free queue, nothing "
                                 "recomputed (ref count now 1)")
