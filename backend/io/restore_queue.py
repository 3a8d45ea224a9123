"""The free queue's order, replayed through a snapshot's event log.

A snapshot with only CONTRACT.md's fields has no `free_queue` (restore_derive.py
derives what such a file lacks). BlockPool hands out blocks from the front of
its queue and puts each block whose last reference is freed at the back, so
the log of `alloc`, `free`, `evict`, `cow`, `prefix_hit` and `share` events
gives the order back; `move` events (a shuffle) relabel it in place.

A shuffle also relabels the free blocks that hold no cached data, without an
event. One that gave no seed (the Playground's) is planned again from the seed
it used (operations.default_shuffle_seed), and kept if the plan repeats every
logged move. After one with a seed of its own those blocks' new ids are
unknown: each keeps its place, a block whose id no moved block took keeps that
id, and the other places take the ids left, in ascending order. One that moved
no data logged nothing, and the replay cannot see it at all.

Malformed events raise nothing here (restore's strict reader names them); only
shuffles past MAX_SHUFFLE_WORK are refused, naming the field to give instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.operations import default_shuffle_seed
from backend.paging.remap import remap_permutation

# Block ids relabelled replaying shuffles: each one relabels the whole pool.
MAX_SHUFFLE_WORK = 5_000_000


# Lenient readers: what cannot be read is skipped, and refused later by name.

def objects(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The objects of the list `data[key]` (none if it is no list)."""
    value = data.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def as_int(value: Any) -> int | None:
    """`value` if it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_block(value: Any, num_blocks: int) -> int | None:
    """`value` if it is a block id of the pool, else None."""
    b = as_int(value)
    return b if b is not None and 0 <= b < num_blocks else None


@dataclass(frozen=True, slots=True)
class QueueReplay:
    """What replay_free_queue found: the order, and what in it is a guess."""

    free_queue: list[int]
    # The steps of the shuffles after which the order of the free blocks holding no
    # cached data is a guess.
    blind: list[int]
    # Where the log contradicts itself (see _QueueReplay.doubt): the first such place
    # in words, and how many there are; the order around those blocks is a guess too.
    first_doubt: str | None
    doubts: int


def replay_free_queue(blocks: list[dict[str, Any]], events: list[dict[str, Any]],
                      config: EngineConfig) -> QueueReplay:
    """The ids of the ref-count-0 blocks in the order the allocator hands them out, with
    what the log leaves uncertain."""
    n = config.num_blocks
    replay = _QueueReplay(n)
    blind: list[int] = []
    i = 0
    while i < len(events):
        e = events[i]
        if e.get("kind") == "move":
            # One shuffle: the moves of one step, side by side in the log.
            moves: dict[int, int] = {}
            targets: set[int] = set()    # moves' values, for an O(1) look-up per move
            while (i < len(events) and events[i].get("kind") == "move"
                   and events[i].get("step") == e.get("step")):
                src, dst = as_block(events[i].get("src"), n), as_block(events[i].get("dst"), n)
                if src is not None and dst is not None:
                    if src in moves or dst in targets:
                        replay.doubt(f"the shuffle of step {e.get('step')} moves "
                                     + (f"block {src} twice" if src in moves
                                        else f"two blocks to block {dst}"))
                    moves[src] = dst
                    targets.add(dst)
                i += 1
            replay.work += n
            if replay.work > MAX_SHUFFLE_WORK:
                raise PagedLabError(
                    "snapshot: without free_queue, its order is replayed through the "
                    f"events, and this file's shuffles of a pool of {n:,} blocks are too "
                    f"many to replay (more than {MAX_SHUFFLE_WORK:,} blocks relabelled); give its "
                    "free_queue (PagedLab's snapshots carry it)")
            step = as_int(e.get("step"))
            plan = _plan(moves, replay.refs, n,
                         None if step is None else default_shuffle_seed(config, step))
            if plan is None and step is not None:
                blind.append(step)
            replay.relabel(moves, plan)
            continue
        replay.event(i, e)
        i += 1
    zero = {b for b in (as_block(x.get("id"), n) for x in blocks if as_int(x.get("ref_count")) == 0)
            if b is not None}
    # After a shuffle the log cannot follow, the ids are a guess: a block it misses
    # may be one the guess gave another id, not one the log never gave back.
    order = replay.order(zero, guessed=bool(blind))
    return QueueReplay(order, blind, replay.first_doubt, replay.doubts)


class _QueueReplay:
    """BlockPool's free queue, followed event by event.

    `queue` maps each queued block to its place: the index of the event that
    appended it (blocks never handed out: id - num_blocks, so in id order ahead of
    every freed one). Appends take ever larger indices, so the dict's order is the
    queue's, and a relabel keeps each place. `refs` counts the references the log
    shows; `last_free` keeps each block's last `free`, which places a block the
    counts never brought to 0 (a log that writes a `free` only when a block is
    free at last, not one per reference as PagedLab's does).

    `doubt` counts where the log cannot be what any allocator wrote (a `free` of a
    block it shows no reference to, an `alloc` of a block it shows held, two
    blocks moved to one, a free block it never gave back): a log cut short at its
    start, or written by hand. The replay goes on, and the order it gives is a
    guess around those blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.queue: dict[int, int] = {b: b - num_blocks for b in range(num_blocks)}
        self.refs: dict[int, int] = {}
        self.last_free: dict[int, int] = {}
        self.work = 0
        self.first_doubt: str | None = None
        self.doubts = 0
        # Blocks whose last event was a `free`: in a log that frees a block only when it
        # is free at last, the counts may leave it held though it is free.
        self.freed_last: set[int] = set()

    def doubt(self, what: str) -> None:
        # Only the first is kept in words: a hostile log may hold millions.
        if self.first_doubt is None:
            self.first_doubt = what
        self.doubts += 1

    def event(self, index: int, e: dict[str, Any]) -> None:
        kind = e.get("kind")
        block = as_block(e.get("block"), self.num_blocks)
        if block is None:
            return
        refs = self.refs
        logged = as_int(e.get("ref_count"))   # PagedLab writes it; the contract does not
        if kind == "evict":
            self.queue.pop(block, None)
        elif kind in ("alloc", "cow", "prefix_hit", "share"):
            fresh = kind in ("alloc", "cow")
            if fresh and refs.get(block, 0) > 0 and block not in self.freed_last:
                self.doubt(f"events[{index}] allocates block {block}, which the log shows held")
            self.freed_last.discard(block)
            refs[block] = logged if logged is not None else 1 if fresh else refs.get(block, 0) + 1
            self.queue.pop(block, None)
            src = as_block(e.get("src"), self.num_blocks)
            if kind == "cow" and src is not None:
                # The shared source gives up one reference, with no event of its own.
                refs[src] = max(refs.get(src, 0) - 1, 0)
        elif kind == "free":
            if refs.get(block, 0) == 0:
                self.doubt(f"events[{index}] frees block {block}, which the log shows no "
                           "reference to")
            refs[block] = left = logged if logged is not None else max(refs.get(block, 0) - 1, 0)
            self.last_free[block] = index
            if logged is None:
                # A logged count is the writer's word: a block it leaves held is held.
                self.freed_last.add(block)
            if left == 0:
                self.queue.pop(block, None)
                self.queue[block] = index

    def relabel(self, moves: dict[int, int], plan: dict[int, int] | None) -> None:
        """After a shuffle whose used and cached blocks moved by `moves` (by `plan`, the
        whole permutation, when it is known).

        A free block holding no cached data moves without an event. Its place in the
        queue is kept, as BlockPool.relabel keeps it; without `plan` its new id is
        unknown, and such places take the ids no used or moved block took: a block
        whose id is still left keeps it, the other places take the rest in ascending
        order."""
        held = {b for b, count in self.refs.items() if count > 0}
        # A held block always moves with an event (remap moves every used block).
        self.refs = {moves.get(b, b): self.refs[b] for b in held}
        self.freed_last = {moves.get(b, b) for b in self.freed_last if b in held}
        self.last_free = {moves.get(b, b): self.last_free[b] for b in held
                          if b in self.last_free}
        if plan is not None:
            self.queue = {plan[b]: place for b, place in self.queue.items()}
            return
        taken = set(self.refs) | {moves[b] for b in self.queue if b in moves}
        left = [b for b in range(self.num_blocks) if b not in taken]
        kept = {b for b in self.queue if b not in moves}.intersection(left)
        spare = iter(b for b in left if b not in kept)
        out: dict[int, int] = {}
        for b, place in self.queue.items():
            new = moves.get(b, b if b in kept else next(spare, None))
            if new is not None:
                out[new] = place
        self.queue = out

    def order(self, zero: set[int], guessed: bool = False) -> list[int]:
        """The blocks of `zero` (ref count 0 in the file) in queue order (its ids a
        guess after a shuffle the log cannot follow: `guessed`)."""
        placed = [(place, b) for b, place in self.queue.items() if b in zero]
        late = [(self.last_free[b], b) for b in zero.difference(self.queue)
                if b in self.last_free]
        ordered = [b for _, b in sorted(placed + late)]
        # Blocks the file lists free that the log took and never gave back: after
        # the others, by id.
        never = sorted(zero.difference(ordered))
        for b in [] if guessed else never:
            self.doubt(f"block {b} is free in the file, but the log never gives it back")
        return ordered + never


def _plan(moves: dict[int, int], refs: dict[int, int], num_blocks: int,
          seed: int | None) -> dict[int, int] | None:
    """The whole permutation of a shuffle that gave no seed of its own (the Playground's),
    if the seed such a shuffle uses at its step repeats every logged move; else None.

    The log names only the blocks whose data moved; the plan also says where each
    free block holding no cached data went, which decides the free queue's ids after
    it."""
    if seed is None:
        return None
    used = {b for b, count in refs.items() if count > 0}
    # Every used block moves with an event: without one, no plan can agree.
    if not used.issubset(moves) and num_blocks > 1:
        return None
    plan = remap_permutation(num_blocks, used, seed)
    # The logged moves must be the plan's: every used block's, and each cached block's
    # that the plan moves (one it maps to itself logs nothing, and is not checked).
    agrees = (all(plan[src] == dst for src, dst in moves.items())
              and all(b in moves for b in used if plan[b] != b))
    return plan if agrees else None


