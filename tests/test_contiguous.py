"""The contiguous arena: placement, Figure 2 breakdown, the seed's example, errors."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backend.core.errors import OutOfBlocksError, PagedLabError
from backend.lab.contiguous import ContiguousArena, next_pow2
from backend.lab.contiguous_types import FitAnswer, Hole, Region, Segment
from backend.paging.block_manager import BlockManager


def seed_example() -> ContiguousArena:
    """The seed text's A=6, B=3, C=5 in a 16-slot arena, after B finished."""
    arena = ContiguousArena(16, "oracle")
    arena.reserve("A", 6, tokens=6)
    arena.reserve("B", 3, tokens=3)
    arena.reserve("C", 5, tokens=5)
    arena.release("B")
    return arena


def test_seed_example_external_fragmentation() -> None:
    arena = seed_example()
    assert arena.regions() == [Region("A", 0, 6, 6, 6), Region("C", 9, 5, 5, 5)]
    assert arena.holes() == [Hole(6, 3), Hole(14, 2)]
    # D needs 4 slots: 5 are free in total, but the largest hole has 3.
    answer = arena.fits(4)
    assert answer == FitAnswer(final_len=4, size=4, fits=False, start=None, free_total=5,
                               largest_hole=3, reason="external_fragmentation")
    assert "5 slots are free in total but the largest hole is 3" in answer.message
    with pytest.raises(OutOfBlocksError, match="external fragmentation"):
        arena.reserve("D", 4, tokens=4)
    # Every free slot lies in a hole too small for D.
    b = arena.breakdown(required=4)
    assert b.as_dict() == {"token_states": 11, "reservation": 0, "internal_fragmentation": 0,
                           "external_fragmentation": 5, "free": 0}
    assert b.capacity == 16
    # A request of 3 still fits, in the hole B left.
    assert arena.fits(3).start == 6


@pytest.mark.parametrize(("block_size", "free_slots", "d_table"), [
    # 16 blocks of 1: B's slots 6-8 and the untouched 14-15 are free; the queue hands
    # out 14, 15, then B's blocks tail first.
    (1, 5, [14, 15, 8, 7]),
    # 8 blocks of 2: A, B, C fill them all (0-2, 3-4, 5-7); D gets B's two blocks.
    (2, 4, [4, 3]),
])
def test_seed_example_paged_places_it(block_size: int, free_slots: int,
                                      d_table: list[int]) -> None:
    # The same 16 slots as blocks: D's 4 tokens go wherever blocks are free.
    m = BlockManager(16 // block_size, block_size, prefix_caching=False, record_events=False)
    for rid, n in (("A", 6), ("B", 3), ("C", 5)):
        m.allocate(rid, [0] * n)
    m.free("B")
    assert m.num_free_blocks * block_size == free_slots
    assert list(m.allocate("D", [0] * 4).block_table) == d_table
    m.check_integrity()


def test_first_fit_takes_the_lowest_hole_that_fits() -> None:
    arena = ContiguousArena(20, "oracle")
    for rid, n in (("A", 2), ("B", 3), ("C", 2), ("D", 5), ("E", 2)):
        arena.reserve(rid, n)
    arena.release("B")   # hole 2..4 (3 slots)
    arena.release("D")   # hole 7..11 (5 slots)
    assert arena.holes() == [Hole(2, 3), Hole(7, 5), Hole(14, 6)]
    assert arena.reserve("F", 4).start == 7   # skips the 3-slot hole
    assert arena.reserve("G", 3).start == 2   # the lowest hole that fits
    assert arena.reserve("H", 6).start == 14
    assert arena.holes() == [Hole(11, 1)]
    arena.check_integrity()


def test_reservation_sizes_by_policy() -> None:
    assert ContiguousArena(4096, "max").reservation_size(5) == 2048
    assert ContiguousArena(4096, "max", max_len=100).reservation_size(100) == 100
    assert ContiguousArena(4096, "pow2").reservation_size(5) == 8
    assert ContiguousArena(4096, "pow2").reservation_size(1024) == 1024
    assert ContiguousArena(4096, "pow2").reservation_size(1025) == 2048
    assert ContiguousArena(4096, "oracle").reservation_size(5) == 5
    # A policy never reserves more than the arena holds.
    assert ContiguousArena(1000, "max").reservation_size(700) == 1000
    assert ContiguousArena(1000, "pow2").reservation_size(700) == 1000
    assert [next_pow2(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]


def test_breakdown_of_a_max_arena_by_hand() -> None:
    arena = ContiguousArena(20, "max", max_len=8)
    arena.reserve("A", 6, tokens=2)   # 0..7: 2 tokens, 4 reservation, 2 internal
    arena.reserve("B", 3, tokens=3)   # 8..15: 3 tokens, 0 reservation, 5 internal
    b = arena.breakdown()
    assert b.as_dict() == {"token_states": 5, "reservation": 4, "internal_fragmentation": 7,
                           "external_fragmentation": 0, "free": 4}
    # A waiting request needs 8 slots; the 4 free ones could not hold it even in one
    # piece: too little memory, not fragmentation.
    assert arena.breakdown(required=8).as_dict()["external_fragmentation"] == 0
    assert arena.breakdown(required=8).free == 4
    # 3 slots need no more than the one hole.
    assert arena.breakdown(required=3).external_fragmentation == 0
    assert arena.fits(1).reason == "not_enough_free"
    arena.grow("A", 3)
    b = arena.breakdown(required=8)
    assert (b.token_states, b.reservation) == (8, 1)
    assert b.fractions()["token_states"] == 8 / 20
    assert sum(b.fractions().values()) == pytest.approx(1.0)


def test_render_and_segments_match_the_docstring_diagram() -> None:
    arena = ContiguousArena(24, "pow2")
    arena.reserve("A", 6, tokens=4)
    arena.reserve("X", 2)
    arena.reserve("Y", 1)
    arena.reserve("B", 4, tokens=3)
    arena.reserve("Z", 4)
    arena.reserve("W", 1)
    arena.reserve("C", 4, tokens=4)
    for rid in "XYZW":
        arena.release(rid)
    # Required 6: 8 slots are free in all but the largest hole is 5, so every free slot
    # is external fragmentation.
    lines = arena.render(required=6).splitlines()
    assert lines[0] == "kind   ####++~~xxx###+xxxxx####"
    assert lines[1] == "owner  AAAAAAAA   BBBB     CCCC"
    assert lines[2:] == ["# token  + reservation  ~ internal frag.",
                         "x external frag.  . free",
                         "one character = 1 slot"]
    assert arena.segments(required=6) == [
        Segment(0, 4, "A", "token_states"), Segment(4, 2, "A", "reservation"),
        Segment(6, 2, "A", "internal_fragmentation"),
        Segment(8, 3, None, "external_fragmentation"),
        Segment(11, 3, "B", "token_states"), Segment(14, 1, "B", "reservation"),
        Segment(15, 5, None, "external_fragmentation"), Segment(20, 4, "C", "token_states"),
    ]
    assert arena.breakdown(required=6).as_dict() == {
        "token_states": 11, "reservation": 3, "internal_fragmentation": 2,
        "external_fragmentation": 8, "free": 0}
    # Required 4: the 5-slot hole holds it, so nothing is fragmented; required 9: more
    # than the 8 free in all, so the request waits for memory, and they are free.
    for required in (4, 9):
        b = arena.breakdown(required=required)
        assert (b.external_fragmentation, b.free) == (0, 8)
        assert {s.kind for s in arena.segments(required=required) if s.owner is None} == {
            "free"}
    # Scaled down: each character stands for 3 slots.
    scaled = arena.render(required=6, width=8).splitlines()
    assert scaled[0] == "kind   #+~x#xx#" and scaled[-1] == "one character = 3 slots"


def test_mistakes_raise_and_leave_the_arena_unchanged() -> None:
    arena = ContiguousArena(10, "oracle")
    arena.reserve("A", 4, tokens=1)
    before = copy.deepcopy(arena.__dict__)
    cases: list[tuple[object, str]] = [
        (lambda: arena.reserve("A", 2), "already holds a region"),
        (lambda: arena.reserve("", 2), "non-empty string"),
        (lambda: arena.reserve("B", 0), "final_len must be an integer >= 1"),
        (lambda: arena.reserve("B", 11), "can never fit"),
        (lambda: arena.reserve("B", 3, tokens=4), "final length is 3"),
        (lambda: arena.reserve("B", 3, tokens=-1), "tokens must be"),
        (lambda: arena.grow("A", 4), "would pass its final length"),
        (lambda: arena.grow("A", 0), "n must be"),
        (lambda: arena.grow("nobody"), "holds no region"),
        (lambda: arena.release("nobody"), "holds no region"),
        (lambda: arena.breakdown(required=0), "required must be"),
    ]
    for call, message in cases:
        with pytest.raises(PagedLabError, match=message):
            call()  # type: ignore[operator]
        assert arena.__dict__ == before
    with pytest.raises(OutOfBlocksError, match="only 6 slots are free"):
        arena.reserve("B", 7)
    assert arena.__dict__ == before
    with pytest.raises(PagedLabError, match="longer than the maximum sequence length 8"):
        ContiguousArena(100, "max", max_len=8).reserve("A", 9)
    assert ContiguousArena(10, "oracle").fits(11).reason == "never"
    with pytest.raises(PagedLabError, match="policy must be one of"):
        ContiguousArena(10, "lru")  # type: ignore[arg-type]


class ArenaMachine(RuleBasedStateMachine):
    """Random reserve / grow / release against a slot-by-slot model of the arena."""

    def __init__(self) -> None:
        super().__init__()
        self.arena = ContiguousArena(64, "pow2")
        self.owner: list[str | None] = [None] * 64
        self.next_id = 0

    def model_first_fit(self, size: int) -> int | None:
        run = 0
        for i, o in enumerate(self.owner):
            run = run + 1 if o is None else 0
            if run == size:
                return i - size + 1
        return None

    @rule(final_len=st.integers(1, 40), filled=st.floats(0, 1))
    def reserve(self, final_len: int, filled: float) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        size = self.arena.reservation_size(final_len)
        want = self.model_first_fit(size)
        tokens = int(final_len * filled)
        if want is None:
            with pytest.raises(OutOfBlocksError):
                self.arena.reserve(rid, final_len, tokens=tokens)
            return
        region = self.arena.reserve(rid, final_len, tokens=tokens)
        assert region.start == want
        self.owner[want:want + size] = [rid] * size

    @precondition(lambda self: len(self.arena) > 0)
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.arena.regions()))
        if r.tokens < r.final_len:
            n = data.draw(st.integers(1, r.final_len - r.tokens))
            assert self.arena.grow(r.request_id, n).tokens == r.tokens + n

    @precondition(lambda self: len(self.arena) > 0)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(self.arena.regions()))
        self.arena.release(r.request_id)
        self.owner = [None if o == r.request_id else o for o in self.owner]

    @invariant()
    def consistent(self) -> None:
        self.arena.check_integrity()
        free = [i for i, o in enumerate(self.owner) if o is None]
        assert self.arena.free_total == len(free)
        for required in (None, 1, 8, 33):
            b = self.arena.breakdown(required)
            assert b.capacity == 64
            segs = self.arena.segments(required)
            assert sum(s.length for s in segs) == 64
            for kind, count in b.as_dict().items():
                assert sum(s.length for s in segs if s.kind == kind) == count
            # External fragmentation, from the slot-by-slot model: every free slot when
            # they would hold the allocation together but no run of them does.
            split = (required is not None and len(free) >= required
                     and self.model_first_fit(required) is None)
            assert b.external_fragmentation == (len(free) if split else 0)


TestArenaMachine = ArenaMachine.TestCase
TestArenaMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
