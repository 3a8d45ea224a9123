"""The status line: one line saying what an applied operation did.

The Playground shows it after every action and the Scenarios page beside every
step, so it tells what the engine did that the event log alone does not: the
requests admitted (or, just added, left waiting, and why), swapped in, preempted
(swapped out) and finished, the prompt tokens each prefill chunk computed, the
parallel samples forked on their own, and the host blocks a finished swapped-out
request gave back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from backend.core.config import TINY_BYTE
from backend.core.words import counted, joined
from backend.engine.ops import Add, Fork, Grow, describe_op
from backend.engine.request import numbered
from backend.engine.results import OpResult, Prefill

# Past this many prefill chunks, forked, finished or dropped requests in one operation,
# the line counts them instead of naming each (a step that admits a whole queue, a beam
# round).
NAMED_AT_MOST = 4


def summarize(result: OpResult, snapshot: dict[str, Any],
              why: Callable[[str], str] = str) -> str:
    """One line saying what an applied operation did, for the page's status line.

    `snapshot` is the state it left: a beam search's finished beams are told apart
    by their finish reason, those it dropped from those that finished, and a
    forked request by its parent. `why` rewords the reason an added request waits
    (a page names the config fields as its settings do).
    """
    parts = [f"Step {result.step}: {describe_op(result.op)}"]
    # Swap preemption: a request whose K/V came back from the host pool was swapped in,
    # not admitted afresh (nothing recomputed); one preempted to it was swapped out. A
    # request first admitted, then swapped out and in within one Step N, is both.
    swaps = Counter(result.swapped_in)
    admitted = []
    for rid in result.admitted:
        if swaps[rid]:
            swaps[rid] -= 1
        else:
            admitted.append(rid)
    if admitted:
        parts.append("admitted " + ", ".join(dict.fromkeys(admitted)))
    if result.swapped_in:
        parts.append("swapped in " + ", ".join(dict.fromkeys(result.swapped_in)))
    # An added request that did not start: why, or the line would only say it was added.
    parts += [f"{rid} waits: {why(reason)}" for rid, reason in result.waits]
    swapped_out = {e.request for e in result.events if e.kind == "swap_out"}
    prefills = _prefills(result)
    if prefills:
        parts.append(prefills)
    forks = _forks(result, snapshot)
    if forks:
        parts.append(forks)
    if result.generated:
        parts.append(f"generated {counted(len(result.generated), 'token')}")
    status = {r["id"]: r["status"] for r in snapshot["requests"]}
    if result.preempted:
        # The parts go by kind, not by time: one preempted and admitted again within the
        # same step is said to be, or "admitted B · preempted B" reads as if it ended
        # preempted.
        swap_mode = snapshot["config"].get("preemption") == "swap"
        parts.append("preempted " + ", ".join(
            _preempted(rid, rid in swapped_out, status.get(rid) == "running", swap_mode)
            for rid in dict.fromkeys(result.preempted)))
    reasons = {r["id"]: r["finish_reason"] for r in snapshot["requests"]}
    # A round drops beams in score order; listed by number they read as a set
    # ("B.7, B.11", not "B.11, B.7").
    dropped = sorted((rid for rid in result.finished if reasons.get(rid) == "dropped"),
                     key=_numbered)
    # A request the pool could not hold, or that filled its model's context, says so here,
    # not only in the block tables: the others finished as asked (by hand, at their limit,
    # at end of sequence).
    finished = [_finished(rid, result, reasons, snapshot["config"])
                for rid in result.finished if reasons.get(rid) != "dropped"]
    if finished:
        parts.append("finished " + _listed(finished, result.finished))
    if dropped:
        parts.append("dropped " + _listed(dropped, dropped))
    for rid, n in result.host_released:
        parts.append(f"{counted(n, 'host block')} of {rid} released")
    kinds: dict[str, int] = {}
    for e in result.events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    if kinds:
        parts.append("events: " + ", ".join(f"{n} {k}{_free_split(result) if k == 'free' else ''}"
                                            for k, n in kinds.items()))
    return " · ".join(parts)


def _listed(said: Sequence[str], ids: Iterable[str]) -> str:
    """Requests as the line names them (`said`, some with a reason after their id from
    `ids`), each one up to NAMED_AT_MOST, else counted: a beam round of width 64 ends 64
    beams. Past that count the ones with a reason are still named (a request the pool
    could not hold is news; one more beam at its limit is not)."""
    if len(said) <= NAMED_AT_MOST:
        return ", ".join(said)
    plain = set(ids)
    noted = [s for s in said if s not in plain]
    if not noted:
        return counted(len(said), "request")
    more = (f" and {len(noted) - NAMED_AT_MOST:,} more with a reason of their own"
            if len(noted) > NAMED_AT_MOST else "")
    return (f"{counted(len(said), 'request')}, among them "
            f"{', '.join(noted[:NAMED_AT_MOST])}{more}")


# A finish that ends a Grow before the tokens it asked for, in the block tables' words.
_ENDED_BY = {"max_new_tokens": "max new tokens reached", "eos": "end of sequence",
             "context": "the model's context reached"}


def _finished(rid: str, result: OpResult, reasons: dict[str, Any],
              config: dict[str, Any]) -> str:
    """A finished request as the line names it, with why where it was not asked for."""
    reason = reasons.get(rid)
    if reason == "capacity":
        return f"{rid} (capacity: too long for the pool)"
    cut = _cut_short(result, rid, reasons)
    if reason == "context" and not cut:
        model = config.get("model", TINY_BYTE)
        return f"{rid} (context full: {model} has no position left for a token)"
    return rid + cut


def _cut_short(result: OpResult, rid: str, reasons: dict[str, Any]) -> str:
    """' (max new tokens reached after 4 of the 200 asked)' when `rid`'s finish ended the
    Grow of it before its count: the line said it grew +200 and generated 4, not why."""
    op = result.op
    ended = _ENDED_BY.get(reasons.get(rid) or "")
    if not isinstance(op, Grow) or op.request != rid or ended is None:
        return ""
    made = sum(1 for who, _ in result.generated if who == rid)
    return f" ({ended} after {made:,} of the {op.tokens:,} asked)" if made < op.tokens else ""


def _preempted(rid: str, swapped: bool, running: bool, swap_mode: bool = False) -> str:
    """A preempted request as the status line names it: 'C', 'C (swapped out)', and
    'C (then readmitted)' or 'C (swapped out, then back in)' when it ends running. With
    swap preemption, one that was not swapped out (the host pool had no room) is said
    to be recomputed: a bare 'C' read as a swap."""
    if swapped:
        return f"{rid} (swapped out, then back in)" if running else f"{rid} (swapped out)"
    if swap_mode:
        return (f"{rid} (recomputed: no room in the host pool; then readmitted)" if running
                else f"{rid} (recomputed: no room in the host pool)")
    return f"{rid} (then readmitted)" if running else rid


def _prefills(result: OpResult) -> str:
    """'prefilled A: 2 tokens (4 of 10 now have K/V)', for the chunks worth telling
    (past NAMED_AT_MOST of them, their tokens and requests counted).

    An `add` that prefills its whole prompt at once says "admitted" and no more, as
    it always has; its chunk is told when a token budget (max_num_batched_tokens)
    leaves part of the prompt for later steps. A step tells every chunk it ran: the
    prompts it admitted, and the rest of those cut into chunks.
    """
    told = [p for p in result.prefilled
            if not isinstance(result.op, Add) or p.computed < p.total]
    if not told:
        return ""
    if len(told) > NAMED_AT_MOST:
        return (f"prefilled {counted(sum(p.tokens for p in told), 'token')} of "
                f"{counted(len({p.request for p in told}), 'request')}")
    return "prefilled " + "; ".join(_chunk(p) for p in told)


def _chunk(p: Prefill) -> str:
    """'A: 10 tokens' for a whole prompt at once, else with how many of its tokens have
    their K/V now: this chunk's, earlier chunks' and prefix-cache hits ("in the cache"
    read as prefix-cache hits)."""
    said = f"{p.request}: {counted(p.tokens, 'token')}"
    return (said if p.tokens == p.total
            else f"{said} ({p.computed:,} of {p.total:,} now have K/V)")


def _forks(result: OpResult, snapshot: dict[str, Any]) -> str:
    """'forked N.1 and N.2 from N.0': the requests an operation forked on its own (a
    parallel sampling's samples, a beam search's beams). A `fork` says its child in
    its own words."""
    if isinstance(result.op, Fork):
        return ""
    children = [e.request for e in result.events if e.kind == "fork" and e.request]
    if not children:
        return ""
    if len(children) > NAMED_AT_MOST:
        return f"forked {counted(len(children), 'request')}"
    parent = {r["id"]: r["parent"] for r in snapshot["requests"]}
    by_parent: dict[str, list[str]] = {}
    for child in children:
        # Every forked request has a parent, and is in the snapshot taken after its fork.
        by_parent.setdefault(parent[child], []).append(child)
    return "forked " + "; ".join(f"{joined(kids)} from {p}" for p, kids in by_parent.items())


def _numbered(rid: str) -> tuple[str, int, str]:
    """Sort key of an id by its trailing number where it has one: B.7 before B.11."""
    named = numbered(rid)
    return (rid, -1, rid) if named is None else (*named, rid)


def _free_split(result: OpResult) -> str:
    """What a count of `free` events means. A free of a block another holder has only
    lowers its reference count; that holder may free it later in the same operation
    (a finished beam search, a whole batch), so "still held" counts only the blocks
    whose last free here left a holder. The first two counts are frees, the last is
    blocks (several frees may lower one block's count), and the words say which: "12
    free (2 back to the free queue, 10 only lowered a count, leaving 5 blocks held)"."""
    frees = [e for e in result.events if e.kind == "free"]
    back = sum(1 for e in frees if not e.ref_count)
    lowered = len(frees) - back
    if not lowered:
        return ""
    last = {e.block: e.ref_count for e in frees}
    held = sum(1 for count in last.values() if count)
    if not back:
        return f" (each only lowered a count, leaving {counted(held, 'block')} held)"
    return (f" ({back} back to the free queue, {lowered} only lowered a count"
            + (f", leaving {counted(held, 'block')} held)" if held else ")"))
