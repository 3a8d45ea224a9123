"""What a snapshot with only the contract's fields leaves out, derived from what it holds.

CONTRACT.md's snapshot lists the config, blocks, requests, events and totals. An
exact restore needs four things more, which PagedLab's own snapshots add
(backend/io/snapshot.py): the free queue's order, the tokens behind each
prefix-cache key, the scheduler's queues and the random allocator's pick count.
A file written by another tool, or by hand, lacks them. `derive_missing` builds
each one the file lacks from the fields it has; restore.py then checks the
completed file exactly as it checks one of PagedLab's own.

- `prefix_cache`: every key a block holds, and the keys it chains through,
  hashed again from the tokens of the requests. Finished requests keep their
  tokens, so a cached block's tokens are found there.
- `free_queue`: the allocator's queue replayed through the event log, as
  BlockPool runs it. A block leaves the queue when an event hands it out, and
  joins the back when its last reference is freed. Blocks no event touched
  keep their place from the start, in id order, ahead of every freed block.
- `scheduler`: the running requests in the order they were last admitted. A
  beam admitted while others of its group run goes beside them, where
  Scheduler.insert_fork puts a new one. The preempted requests come first
  among the waiting, the most recent first, since the scheduler requeues them
  at the front; the others follow in arrival order. Swapped requests are
  ordered likewise, by their last `swap_out`.
- `allocator.random_picks`: under `allocation: "random"`, one pick per block
  handed out that no eviction freed.

The log does not fix everything. A `shuffle` relabels the never-filled free
blocks without an event. One that gave no seed (the Playground's) is planned
again from the seed it used, and kept if the plan repeats every logged move;
after one with a seed of its own, those blocks take the ids left to them in
ascending order, each in a place such a block held; one that moved no data
logged nothing, so the replay cannot see it at all. Under random allocation, a
pinned `add`, or a pick whose probes met no never-filled block, is not told
apart in the log from the other kind. Events a file leaves out cannot be
replayed.
None of this changes the blocks, tables, tokens or totals: those are the
file's own and are checked as such. It changes only the order in which later
steps take blocks and admit requests.

Malformed input raises nothing here: a part it cannot read is skipped, and the
strict restore names the problem in the file's own terms. Only work past a bound
a real engine's file stays far below (MAX_HASHED_BLOCKS, MAX_SHUFFLE_WORK) is
refused, naming the field whose presence would have spared it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import joined
from backend.engine.operations import default_shuffle_seed
from backend.io.snapshot import hash_node_json
from backend.paging.hashing import hash_prompt_blocks
from backend.paging.remap import remap_permutation

# The fields derive_missing can build, in the order its note names them.
DERIVABLE = ("free_queue", "prefix_cache", "scheduler", "allocator")

# Blocks of the requests' tokens hashed to find the cached blocks' tokens (about 3 us
# each): a few seconds at most, on a file the size limit allows.
MAX_HASHED_BLOCKS = 500_000
# Block ids visited replaying shuffles: each one relabels the whole pool.
MAX_SHUFFLE_WORK = 5_000_000

# Events that put their request in the running list if it is not there yet: every
# admission allocates (or shares, or revives) at least one block, and a fork names
# the new request first.
_ADMITTING = frozenset({"alloc", "prefix_hit", "share", "cow", "evict", "fork", "swap_in"})


@dataclass(frozen=True, slots=True)
class Derived:
    """What `derive_missing` built: the fields, as PagedLab's snapshots write them, and
    what of them the log could not fix, in words (sentences without a full stop)."""

    fields: dict[str, Any] = field(default_factory=dict)
    caveats: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The derived fields, in DERIVABLE's order."""
        return tuple(key for key in DERIVABLE if key in self.fields)


def derive_missing(data: dict[str, Any], config: EngineConfig) -> Derived:
    """The DERIVABLE fields `data` lacks, derived from its other fields (none if it lacks
    none). `config` is the snapshot's own, already checked; `data` is not changed.
    Raises PagedLabError only for work past MAX_HASHED_BLOCKS or MAX_SHUFFLE_WORK."""
    missing = [key for key in DERIVABLE if key not in data]
    if not missing:
        return Derived()
    blocks = _objects(data, "blocks")
    requests = _objects(data, "requests")
    # An event whose kind is no string is the strict reader's to refuse, by name.
    events = [e for e in _objects(data, "events") if isinstance(e.get("kind"), str)]
    out: dict[str, Any] = {}
    caveats: list[str] = []
    if "free_queue" in missing:
        out["free_queue"], blind = _free_queue(blocks, events, config)
        if blind:
            which = (f"the shuffle of step {blind[0]}" if len(blind) == 1
                     else f"the shuffles of steps {joined(blind)}")
            caveats.append(f"the log does not say where {which} put the never-filled "
                           "blocks, so their order in the derived free_queue is a guess")
    if "prefix_cache" in missing:
        out["prefix_cache"] = _prefix_cache(blocks, requests, config)
    if "scheduler" in missing:
        out["scheduler"] = _scheduler(requests, events, swap=config.num_cpu_blocks > 0)
    if "allocator" in missing:
        random = config.allocation == "random"
        out["allocator"] = {"random_picks": _random_picks(events) if random else 0}
        if random:
            caveats.append("under random allocation the log does not tell a pinned add's "
                           "blocks from picked ones, so the derived random_picks, and the "
                           "allocator's next picks, may differ from the run that wrote the "
                           "file")
    return Derived(out, tuple(caveats))


def contract_only(snapshot: dict[str, Any]) -> dict[str, Any]:
    """`snapshot` as a tool that knows only CONTRACT.md would write it: without the
    DERIVABLE fields and without each event's `ref_count`. Copies what it changes."""
    out = {k: v for k, v in snapshot.items() if k not in DERIVABLE}
    if isinstance(out.get("events"), list):
        out["events"] = [{k: v for k, v in e.items() if k != "ref_count"}
                         if isinstance(e, dict) else e for e in out["events"]]
    return out


def derived_note(names: Sequence[str], caveats: Sequence[str] = ()) -> list[str]:
    """The notes for a restore that derived the fields `names` (in DERIVABLE's order),
    with what the log could not fix: sentences without their full stop, as
    restore_notes gives them."""
    if not names:
        return []
    one = len(names) == 1
    return [f"{joined(names)}, {'a field' if one else 'fields'} PagedLab's own snapshots "
            f"add beyond the contract, {'was' if one else 'were'} not in the file: "
            f"{'it was' if one else 'they were'} derived from its events, blocks and "
            "requests (README, Snapshots)", *caveats]


# ---- lenient readers: what cannot be read is skipped, and refused later by name ----

def _objects(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _block(value: Any, num_blocks: int) -> int | None:
    """`value` if it is a block id of the pool, else None."""
    b = _int(value)
    return b if b is not None and 0 <= b < num_blocks else None


# ---- the four fields -------------------------------------------------------

def _prefix_cache(blocks: list[dict[str, Any]], requests: list[dict[str, Any]],
                  config: EngineConfig) -> list[dict[str, Any]]:
    """Every key a block holds and each key it chains through, parents first."""
    wanted = {b["hash"] for b in blocks if isinstance(b.get("hash"), str)}
    if not wanted:
        return []
    bs = config.block_size
    salt = config.cache_salt()
    top_id = config.vocab_size - 1
    nodes: dict[str, dict[str, Any]] = {}
    hashed = 0
    for r in requests:
        tokens = r.get("tokens")
        if not isinstance(tokens, list) or not all(
                _int(t) is not None and 0 <= t <= top_id for t in tokens):
            continue
        # No request holds more blocks than the pool, so no key lies deeper.
        tokens = tokens[:config.num_blocks * bs]
        hashed += len(tokens) // bs
        if hashed > MAX_HASHED_BLOCKS:
            raise PagedLabError(
                f"snapshot: without prefix_cache, its requests' tokens are hashed block by "
                f"block to find the cached blocks' tokens, and this file's are more than "
                f"{MAX_HASHED_BLOCKS:,} blocks; give its prefix_cache (PagedLab's snapshots "
                "carry it)")
        chain = hash_prompt_blocks(tokens, bs, salt)
        deepest = max((i for i, key in enumerate(chain) if key.digest in wanted), default=-1)
        for key in chain[:deepest + 1]:
            if key.digest not in nodes:
                nodes[key.digest] = hash_node_json(key)
    return list(nodes.values())


def _free_queue(blocks: list[dict[str, Any]], events: list[dict[str, Any]],
                config: EngineConfig) -> tuple[list[int], list[int]]:
    """The ids of the ref-count-0 blocks in the order the allocator hands them out, and
    the steps of the shuffles after which the never-filled blocks' order is a guess."""
    n = config.num_blocks
    replay = _QueueReplay(n)
    blind: list[int] = []
    i = 0
    while i < len(events):
        e = events[i]
        if e.get("kind") == "move":
            # One shuffle: the moves of one step, side by side in the log.
            moves: dict[int, int] = {}
            while (i < len(events) and events[i].get("kind") == "move"
                   and events[i].get("step") == e.get("step")):
                src, dst = _block(events[i].get("src"), n), _block(events[i].get("dst"), n)
                if src is not None and dst is not None:
                    moves[src] = dst
                i += 1
            replay.work += n
            if replay.work > MAX_SHUFFLE_WORK:
                raise PagedLabError(
                    "snapshot: without free_queue, its order is replayed through the "
                    f"events, and this file's shuffles of a pool of {n:,} blocks are too "
                    f"many to replay (more than {MAX_SHUFFLE_WORK:,} block moves); give its "
                    "free_queue (PagedLab's snapshots carry it)")
            step = _int(e.get("step"))
            plan = _plan(moves, replay.refs, n,
                         None if step is None else default_shuffle_seed(config, step))
            if plan is None and step is not None:
                blind.append(step)
            replay.relabel(moves, plan)
            continue
        replay.event(i, e)
        i += 1
    zero = {b for b in (_block(x.get("id"), n) for x in blocks if _int(x.get("ref_count")) == 0)
            if b is not None}
    return replay.order(zero), blind


class _QueueReplay:
    """BlockPool's free queue, followed event by event.

    `queue` maps each queued block to its place: the index of the event that
    appended it (blocks never handed out: id - num_blocks, so in id order ahead of
    every freed one). Appends take ever larger indices, so the dict's order is the
    queue's, and a relabel keeps each place. `refs` counts the references the log
    shows; `last_free` keeps each block's last `free`, which places a block the
    counts never brought to 0 (a log that writes a `free` only when a block is
    free at last, not one per reference as PagedLab's does)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.queue: dict[int, int] = {b: b - num_blocks for b in range(num_blocks)}
        self.refs: dict[int, int] = {}
        self.last_free: dict[int, int] = {}
        self.work = 0

    def event(self, index: int, e: dict[str, Any]) -> None:
        kind = e.get("kind")
        block = _block(e.get("block"), self.num_blocks)
        if block is None:
            return
        refs = self.refs
        logged = _int(e.get("ref_count"))   # PagedLab writes it; the contract does not
        if kind == "evict":
            self.queue.pop(block, None)
        elif kind in ("alloc", "cow", "prefix_hit", "share"):
            fresh = kind in ("alloc", "cow")
            refs[block] = logged if logged is not None else 1 if fresh else refs.get(block, 0) + 1
            self.queue.pop(block, None)
            src = _block(e.get("src"), self.num_blocks)
            if kind == "cow" and src is not None:
                # The shared source gives up one reference, with no event of its own.
                refs[src] = max(refs.get(src, 0) - 1, 0)
        elif kind == "free":
            refs[block] = left = logged if logged is not None else max(refs.get(block, 0) - 1, 0)
            self.last_free[block] = index
            if left == 0:
                self.queue.pop(block, None)
                self.queue[block] = index

    def relabel(self, moves: dict[int, int], plan: dict[int, int] | None) -> None:
        """After a shuffle whose used and cached blocks moved by `moves` (by `plan`, the
        whole permutation, when it is known).

        A never-filled block moves without an event. Its place in the queue is kept,
        as BlockPool.relabel keeps it; without `plan` its new id is unknown, and such
        places take the ids no used or moved block took: a block whose id is still
        left keeps it, the other places take the rest in ascending order."""
        held = {b for b, count in self.refs.items() if count > 0}
        # Held blocks always move with an event; so do cached ones, which are queued.
        self.refs = {moves.get(b, b): self.refs[b] for b in held}
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

    def order(self, zero: set[int]) -> list[int]:
        """The blocks of `zero` (ref count 0 in the file) in queue order."""
        placed = [(place, b) for b, place in self.queue.items() if b in zero]
        late = [(self.last_free[b], b) for b in zero.difference(self.queue)
                if b in self.last_free]
        ordered = [b for _, b in sorted(placed + late)]
        # Blocks the log leaves free but never frees (a file without those events):
        # after the others, by id.
        return ordered + sorted(zero.difference(ordered))


def _plan(moves: dict[int, int], refs: dict[int, int], num_blocks: int,
          seed: int | None) -> dict[int, int] | None:
    """The whole permutation of a shuffle that gave no seed of its own (the Playground's),
    if the seed such a shuffle uses at its step repeats every logged move; else None.

    The log names only the blocks whose data moved; the plan also says where each
    never-filled block went, which decides the free queue's ids after it."""
    if seed is None:
        return None
    used = {b for b, count in refs.items() if count > 0}
    # Every used block moves with an event: without one, no plan can agree.
    if not used.issubset(moves) and num_blocks > 1:
        return None
    plan = remap_permutation(num_blocks, used, seed)
    # The moves are exactly the plan's for the blocks that hold data (used, or
    # cached: a cached block is a logged move's source).
    agrees = (all(plan[src] == dst for src, dst in moves.items())
              and all(b in moves for b in used if plan[b] != b))
    return plan if agrees else None


def _scheduler(requests: list[dict[str, Any]], events: list[dict[str, Any]], *,
               swap: bool) -> dict[str, Any]:
    """The scheduler's queues and admissions count, replayed from the events."""
    status = {r["id"]: r.get("status") for r in requests if isinstance(r.get("id"), str)}
    beam_group = {r["id"]: r["group"] for r in requests if isinstance(r.get("id"), str)
                  and r.get("beam_width") is not None and isinstance(r.get("group"), str)}
    # Each running request's place as a sort key: (its admission's index in the log, 0),
    # and for a beam admitted while beams of its group run, the group's last beam's key
    # with the second part one more, so that it sorts right after that beam and before
    # anything admitted later. That is where the scheduler puts a new beam (insert_fork),
    # and a group readmitted beam by beam ends up the same way; the log need not hold
    # the `fork` events. Only the group's beams share a first part, so no one else's
    # key falls in between. Keys and dicts keep every event O(1) (a group's beams are
    # few), whatever the file holds.
    running: dict[str, tuple[int, int]] = {}
    group_running: dict[str, dict[str, tuple[int, int]]] = {}
    last_preempt: dict[str, int] = {}
    last_swap_out: dict[str, int] = {}
    admissions = 0
    for i, e in enumerate(events):
        rid = e.get("request")
        kind = e.get("kind")
        if not isinstance(rid, str) or rid not in status:
            continue
        group = beam_group.get(rid)
        if kind in ("preempt", "swap_out", "free"):
            if kind == "preempt":
                last_preempt[rid] = i
            elif kind == "swap_out":
                last_swap_out[rid] = i
            running.pop(rid, None)
            if group is not None:
                group_running.get(group, {}).pop(rid, None)
        elif kind in _ADMITTING and rid not in running:
            admissions += 1
            beside = group_running.get(group, {}) if group is not None else {}
            if beside:
                last = max(beside.values())
                key = (last[0], last[1] + 1)
            else:
                key = (i, 0)
            running[rid] = key
            if group is not None:
                group_running.setdefault(group, {})[rid] = key

    preempted = {r["id"] for r in requests if isinstance(r.get("id"), str)
                 and (_int(r.get("num_preemptions")) or 0) > 0}

    def queue(state: str, last: dict[str, int]) -> list[str]:
        ids = [rid for rid, s in status.items() if s == state]
        requeued = sorted((rid for rid in ids if rid in last), key=lambda rid: -last[rid])
        # Preempted by its own count though the log holds no event of it: requeued at
        # the front all the same, after those the log orders.
        unlogged = [rid for rid in ids if rid not in last and rid in preempted]
        return requeued + unlogged + [rid for rid in ids
                                      if rid not in last and rid not in preempted]

    # A running request no event admitted (a file without its events) comes after the
    # others, in arrival order.
    live = [rid for rid, s in status.items() if s == "running"]
    live.sort(key=lambda rid: running.get(rid, (len(events), 0)))
    out: dict[str, Any] = {"waiting": queue("waiting", last_preempt), "running": live,
                           "admissions": max(admissions, len(live))}
    if swap:
        out["swapped"] = queue("swapped", last_swap_out)
    return out


def _random_picks(events: list[dict[str, Any]]) -> int:
    """Blocks handed out (alloc, cow) less those an eviction freed, which random
    allocation takes from the queue's front instead of picking."""
    handed = sum(1 for e in events if e.get("kind") in ("alloc", "cow"))
    evicted = sum(1 for e in events if e.get("kind") == "evict")
    return max(handed - evicted, 0)
