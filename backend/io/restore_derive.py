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
- `free_queue`: the allocator's queue replayed through the event log
  (restore_queue.py).
- `scheduler`: the running requests in the order they were last admitted. A
  beam admitted while others of its group run goes beside them, where
  Scheduler.insert_fork puts a new one. The preempted requests come first
  among the waiting, the most recent first, since the scheduler requeues them
  at the front; the others follow in arrival order. Swapped requests are
  ordered likewise, by their last `swap_out`.
- `allocator.random_picks`: under `allocation: "random"`, one pick per block
  handed out that no eviction freed.

The log does not fix everything. After a `shuffle` that gave a seed of its own
or moved no data, the order of the free blocks that hold no cached data is a
guess (restore_queue.py says which). Under random allocation, a pinned `add`,
or a pick whose probes met no empty block, is not told apart in the log from
the other kind. Events a file leaves out cannot be replayed. The restore's note
says what of this applies (`Derived.caveats`).
None of this changes the blocks, tables, tokens or totals: those are the
file's own and are checked as such. It changes only the order in which later
steps take blocks and admit requests.

Malformed input raises nothing here: a part it cannot read is skipped, and the
strict restore names the problem in the file's own terms. Only work past a bound
a real engine's file stays far below (MAX_HASHED_BLOCKS here, MAX_SHUFFLE_WORK in
restore_queue.py) is refused, naming the field whose presence would have spared
it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.core.words import joined
from backend.io.restore_queue import (
    as_int,
    objects,
    replay_free_queue,
)
from backend.io.snapshot import hash_node_json
from backend.paging.hashing import hash_prompt_blocks, salt_root

# The fields derive_missing can build, in the order its note names them.
DERIVABLE = ("free_queue", "prefix_cache", "scheduler", "allocator")

# Blocks of the requests' tokens hashed to find the cached blocks' tokens (about 3 us
# each): a few seconds at most, on a file the size limit allows.
MAX_HASHED_BLOCKS = 500_000

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

    def brief(self) -> Derived:
        """The same names and caveats without the fields' data (which can be large),
        for what is kept once the restore has read them."""
        return Derived(dict.fromkeys(self.names), self.caveats)


def derive_missing(data: dict[str, Any], config: EngineConfig) -> Derived:
    """The DERIVABLE fields `data` lacks, derived from its other fields (none if it lacks
    none). `config` is the snapshot's own, already checked; `data` is not changed.
    Raises PagedLabError only for work past MAX_HASHED_BLOCKS or MAX_SHUFFLE_WORK."""
    missing = [key for key in DERIVABLE if key not in data]
    if not missing:
        return Derived()
    blocks = objects(data, "blocks")
    requests = objects(data, "requests")
    # An event whose kind is no string is the strict reader's to refuse, by name.
    events = [e for e in objects(data, "events") if isinstance(e.get("kind"), str)]
    out: dict[str, Any] = {}
    caveats: list[str] = []
    if "free_queue" in missing:
        replayed = replay_free_queue(blocks, events, config)
        out["free_queue"] = replayed.free_queue
        if blind := replayed.blind:
            which = (f"the shuffle of step {blind[0]}" if len(blind) == 1
                     else f"the shuffles of steps {joined(blind)}")
            caveats.append(f"the log does not say where {which} put the free blocks that "
                           "hold no cached data, so their order in the derived free_queue "
                           "is a guess")
        if replayed.first_doubt is not None:
            more = (f"; {replayed.doubts:,} such contradictions in all" if replayed.doubts > 1
                    else "")
            caveats.append(f"the event log contradicts itself ({replayed.first_doubt}{more}): "
                           "it may be cut short at its start or written by hand, so the "
                           "derived free_queue's order is a guess around those blocks")
    if "prefix_cache" in missing:
        out["prefix_cache"] = _prefix_cache(blocks, requests, config)
    if "scheduler" in missing:
        out["scheduler"] = _scheduler(requests, events, swap=config.num_cpu_blocks > 0)
    if "allocator" in missing:
        picked = config.allocation == "random"
        out["allocator"] = {"random_picks": _random_picks(events) if picked else 0}
        if picked:
            caveats.append("under random allocation the log does not tell a pinned add's "
                           "blocks from picked ones, so the derived random_picks, and the "
                           "allocator's next picks, may differ from the run that wrote the "
                           "file")
    return Derived(out, tuple(caveats))


# The queues a file's own fields give that its log also fixes, checked by `order_problem`.
_QUEUES = ("running", "waiting", "swapped")
# How many ids a refusal quotes of each order.
_SHOWN_IDS = 12


def order_problem(data: dict[str, Any], config: EngineConfig) -> str | None:
    """Where a file that gives every field (PagedLab's own) gives a scheduler queue or an
    admissions count other than its log leaves, in words; or None.

    Restore takes these as given, and they decide the next steps (which request a step
    serves first, which one a preemption picks): an edited order made the restored
    engine run otherwise than the run that wrote the file, with nothing said. The
    free_queue is not held to the log: a shuffle relabels free blocks without an event
    (one that moved no used block leaves no trace at all), so the log cannot fix it.
    Call only for a complete log (restore_log)."""
    derived = derive_missing({k: v for k, v in data.items() if k != "scheduler"}, config)
    sched, had = derived.fields["scheduler"], data.get("scheduler") or {}
    for name in _QUEUES:
        want, got = sched.get(name, []), had.get(name, [])
        if got != want:
            return (f"snapshot.scheduler.{name} is {_ids(got)}, but its events leave the "
                    f"{name} requests in the order {_ids(want)}, the order the scheduler "
                    "serves and preempts them in")
    if had.get("admissions") != sched["admissions"]:
        return (f"snapshot.scheduler.admissions is {had.get('admissions')!r}, but its events "
                f"hold {sched['admissions']:,} admissions")
    return None


def _ids(value: Any) -> str:
    if not isinstance(value, list):
        return repr(value)
    head = ", ".join(repr(x) if isinstance(x, str) else str(x) for x in value[:_SHOWN_IDS])
    return f"[{head}{', …' if len(value) > _SHOWN_IDS else ''}]"


def contract_only(snapshot: dict[str, Any]) -> dict[str, Any]:
    """`snapshot` as a tool that knows only CONTRACT.md would write it: without the
    DERIVABLE fields and without each event's `ref_count`. Copies what it changes."""
    out = {k: v for k, v in snapshot.items() if k not in DERIVABLE}
    if isinstance(out.get("events"), list):
        out["events"] = [{k: v for k, v in e.items() if k != "ref_count"}
                         if isinstance(e, dict) else e for e in out["events"]]
    return out


# What each DERIVABLE field holds, in words for the note.
_MEANING = {"free_queue": "the order free blocks are handed out in",
            "prefix_cache": "the tokens behind each cached block",
            "scheduler": "the order of the request queues",
            "allocator": "the random allocator's pick count"}


def derived_note(names: Sequence[str], caveats: Sequence[str] = ()) -> list[str]:
    """The notes for a restore that derived the fields `names` (in DERIVABLE's order),
    with what the log could not fix: sentences without their full stop, as
    restore_notes gives them."""
    if not names:
        return []
    one = len(names) == 1
    told = joined([f"{name} ({_MEANING[name]})" for name in names])
    # Without a caveat the rebuilt state is the writer's (tests/test_snapshot_contract_only
    # checks it on every shipped scenario's every step); a caveat says what may differ.
    same = "" if caveats else (", so the next steps run as they would have in the run "
                               "that wrote it")
    return [f"the file lacks {told}, {'a field' if one else 'fields'} PagedLab's own "
            f"snapshots add beyond the contract; {'it was' if one else 'they were'} "
            f"rebuilt from its events, blocks and requests{same} (README, Snapshots)",
            *caveats]


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
    hashed = found = 0
    for r in requests:
        if found == len(wanted):
            break       # every block's key is found: the other requests need no hashing
        tokens = r.get("tokens")
        if not isinstance(tokens, list) or not all(
                as_int(t) is not None and 0 <= t <= top_id for t in tokens):
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
        # A salted request's chain starts from its salt's root (listed before its
        # first key); a malformed salt is named when the request is read.
        cache_salt = r.get("cache_salt")
        root = (salt_root(salt, cache_salt) if isinstance(cache_salt, str) and cache_salt
                else None)
        chain = hash_prompt_blocks(tokens, bs, salt, root)
        deepest = max((i for i, key in enumerate(chain) if key.digest in wanted), default=-1)
        if root is not None and deepest >= 0:
            chain.insert(0, root)
            deepest += 1
        for key in chain[:deepest + 1]:
            if key.digest not in nodes:
                nodes[key.digest] = hash_node_json(key)
                found += key.digest in wanted
    return list(nodes.values())


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
    # key falls in between. A group's last key is kept while any of its beams runs
    # (one that left still sorts after those running, and before anything later), so
    # every event is O(1), whatever the file holds.
    running: dict[str, tuple[int, int]] = {}
    group_last: dict[str, tuple[int, int]] = {}
    group_count: dict[str, int] = {}
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
            if running.pop(rid, None) is not None and group is not None:
                group_count[group] -= 1
                if not group_count[group]:
                    del group_count[group], group_last[group]
        elif kind in _ADMITTING and rid not in running:
            admissions += 1
            last = group_last.get(group) if group is not None else None
            key = (i, 0) if last is None else (last[0], last[1] + 1)
            running[rid] = key
            if group is not None:
                group_last[group] = key
                group_count[group] = group_count.get(group, 0) + 1

    preempted = {r["id"] for r in requests if isinstance(r.get("id"), str)
                 and (as_int(r.get("num_preemptions")) or 0) > 0}

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
