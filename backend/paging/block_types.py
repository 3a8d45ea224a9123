"""Typed values the block manager takes and returns (no sentinels, no -1s)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.core.errors import PagedLabError
from backend.paging.block_pool import Block
from backend.paging.hashing import BlockHash, SaltRoot


@dataclass(slots=True)
class SeqBlocks:
    """A sequence's view of the pool."""

    seq_id: str
    block_table: list[int]
    num_tokens: int
    # Tokens of the last block while it is partial: hashed when it fills.
    tail_tokens: list[int] = field(default_factory=list)
    # Key of the last full block: the parent of the next block's key.
    last_hash: BlockHash | None = None
    # The Block of block_table[-1], so a decode token reaches it without two
    # lookups. Kept by the block manager (a relabel keeps Block objects, so a
    # remap leaves it right); None where a table was written directly (a
    # restore), until `recount` sets it.
    tail_block: Block | None = None
    # The root of the sequence's chain when its request has a cache salt
    # (hashing.SaltRoot): the parent of its first block's key, and its
    # last_hash until a block fills. None for an unsalted sequence.
    root: SaltRoot | None = None


# PromptPlan and Allocation are built on every admission (and a plan on every
# admission check): immutable by contract, with a plain __init__, because a
# frozen dataclass's sets each field through object.__setattr__ and costs three
# times as much. Equality and hashing are by fields, as frozen ones had.


@dataclass(slots=True, init=False, unsafe_hash=True)
class PromptPlan:
    """What `allocate` would do for a prompt. Computing it changes nothing. Immutable."""

    num_blocks: int            # blocks the prompt occupies
    hit_blocks: tuple[int, ...]  # physical ids reused from the prefix cache, in order
    num_new_blocks: int        # blocks to take from the free queue
    num_available: int         # free blocks the new ones can come from right now
    keys: tuple[BlockHash, ...]  # keys of the prompt's full blocks (empty if caching is off)

    def __init__(self, num_blocks: int, hit_blocks: tuple[int, ...], num_new_blocks: int,
                 num_available: int, keys: tuple[BlockHash, ...]) -> None:
        self.num_blocks = num_blocks
        self.hit_blocks = hit_blocks
        self.num_new_blocks = num_new_blocks
        self.num_available = num_available
        self.keys = keys

    @property
    def fits_now(self) -> bool:
        return self.num_new_blocks <= self.num_available


@dataclass(slots=True, init=False, unsafe_hash=True)
class Allocation:
    """Result of admitting a prompt. Immutable."""

    block_table: tuple[int, ...]
    num_cached_tokens: int     # leading prompt tokens whose K/V came from the cache
    hit_blocks: tuple[int, ...]
    new_blocks: tuple[int, ...]

    def __init__(self, block_table: tuple[int, ...], num_cached_tokens: int,
                 hit_blocks: tuple[int, ...], new_blocks: tuple[int, ...]) -> None:
        self.block_table = block_table
        self.num_cached_tokens = num_cached_tokens
        self.hit_blocks = hit_blocks
        self.new_blocks = new_blocks


@dataclass(frozen=True, slots=True)
class CowCopy:
    """A copy-on-write: the writer's last block was `src` (shared); it is now `dst`."""

    src: int
    dst: int
    num_filled: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Result of appending tokens: the slot of each new token, in order."""

    slots: tuple[int, ...]
    new_blocks: tuple[int, ...]
    cow: CowCopy | None


@dataclass(frozen=True, slots=True)
class Address:
    """Where one token position of a sequence lives."""

    position: int
    logical_block: int
    offset: int
    physical_block: int
    slot: int


@dataclass(frozen=True, slots=True)
class Move:
    """Block data that must move from `src` to `dst` (used or cached blocks)."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class AllocatorMetrics:
    """Counts over the pool right now, and totals so far.

    The first nine fields are CONTRACT.md's snapshot `metrics`. Counts over
    used blocks count each physical block once, however many tables hold it.
    """

    used_blocks: int
    free_blocks: int           # empty: ref_count 0 and no cached prefix
    cached_blocks: int         # ref_count 0 but reusable by a prefix hit
    filled_slots: int          # token slots written, over used blocks
    internal_waste_slots: int  # empty slots inside used blocks
    shared_blocks: int         # used blocks with ref_count >= 2
    cow_copies: int
    prefix_hit_blocks: int
    preemptions: int
    # Beyond the contract: what serving engines rarely show.
    num_blocks: int
    block_size: int
    logical_tokens: int        # sum of num_tokens over sequences holding blocks
    blocks_saved_by_sharing: int  # table entries minus distinct used blocks
    prefix_queries: int        # prompts looked up in the prefix cache
    prefix_query_tokens: int   # tokens in those prompts
    prefix_hit_tokens: int     # tokens served from the cache
    prefix_floor_tokens: int   # tokens a block-granular cache could never serve

    @property
    def slot_occupancy(self) -> float:
        """Filled slots over slots in used blocks: 1.0 means no tail waste."""
        total = self.used_blocks * self.block_size
        return self.filled_slots / total if total else 0.0

    def contract_dict(self) -> dict[str, int]:
        return {
            "used_blocks": self.used_blocks, "free_blocks": self.free_blocks,
            "cached_blocks": self.cached_blocks, "filled_slots": self.filled_slots,
            "internal_waste_slots": self.internal_waste_slots,
            "shared_blocks": self.shared_blocks, "cow_copies": self.cow_copies,
            "prefix_hit_blocks": self.prefix_hit_blocks, "preemptions": self.preemptions,
        }


def exact_ints(tokens: Sequence[int]) -> list[int] | None:
    """`tokens` as a new list if every one is exactly an int, else None (ranges unchecked)."""
    out = list(tokens)
    return out if all_exact_ints(out) else None


def all_exact_ints(values: list[int]) -> bool:
    """Whether every value is exactly an int (not a bool, not an int subclass).

    Runs in C: `list.count` compares identity first, so counting `int` among
    the types is about twice as fast as building a set of them.
    """
    return list(map(type, values)).count(int) == len(values)


def validate_tokens(tokens: Sequence[int], what: str = "prompt",
                    vocab_size: int = 256) -> list[int]:
    """Token ids must be ints in 0..vocab_size - 1 (default: bytes); returns them as a list."""
    out = list(tokens)
    top = vocab_size - 1
    # Fast path in C (set/map/min/max); the loop below only runs to name a bad token.
    if not out or (all_exact_ints(out) and min(out) >= 0 and max(out) <= top):
        return out
    kind = "bytes, ints" if vocab_size == 256 else "token ids, ints"
    for i, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= top:
            raise PagedLabError(f"{what} token {i} is {t!r}; tokens are {kind} in 0..{top:,}")
    return out
