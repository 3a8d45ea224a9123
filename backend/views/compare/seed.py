"""The seed's example on the "Contiguous vs paged" page: its tables and the sentences
that tell each memory's story, from backend.lab.compare.seed_example's run.

Pure functions (no Streamlit), as the rest of backend.views.compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from backend.core.words import agrees, counted, joined
from backend.lab.compare.seed_example import SEED_REQUESTS, SeedEvent, SeedExample
from backend.views.compare.frames import KIND_LABELS, POLICY_LABELS
from backend.views.describe import span


def seed_arena_slots(ex: SeedExample) -> pd.DataFrame:
    """One row per slot per stage of the arena: stage, slot, kind, owner ('' when free)."""
    rows: list[dict[str, object]] = []
    for stage in ex.arena:
        for seg in stage.segments:
            for slot in range(seg.start, seg.start + seg.length):
                rows.append({"stage": stage.label, "slot": slot, "kind": KIND_LABELS[seg.kind],
                             "owner": seg.owner or ""})
    return pd.DataFrame(rows)


def seed_pool_slots(ex: SeedExample) -> pd.DataFrame:
    """One row per slot per stage of the paged pool: stage, slot, block, kind, owner."""
    rows: list[dict[str, object]] = []
    bs = ex.block_size
    for stage in ex.pool:
        for blk in stage.blocks:
            for off in range(bs):
                if blk.owner is None:
                    kind = "free"
                elif off < blk.filled:
                    kind = "token_states"
                else:
                    kind = "internal_fragmentation"
                rows.append({"stage": stage.label, "slot": blk.block * bs + off,
                             "block": blk.block, "kind": KIND_LABELS[kind],
                             "owner": blk.owner or ""})
        # Slots past the last whole block belong to no block.
        for slot in range(len(stage.blocks) * bs, ex.capacity):
            rows.append({"stage": stage.label, "slot": slot, "block": -1,
                         "kind": KIND_LABELS["free"], "owner": ""})
    return pd.DataFrame(rows)


def seed_stage_table(ex: SeedExample) -> pd.DataFrame:
    """Per stage: the arena's free total, largest hole, holes and waiting requests."""
    return pd.DataFrame([{
        "stage": s.label, "free slots": s.free_total, "largest hole": s.largest_hole,
        "holes (start, length)": ", ".join(f"({a}, {n})" for a, n in s.holes) or "none",
        "waiting": ", ".join(s.waiting) or "none",
    } for s in ex.arena])


def seed_block_tables(ex: SeedExample) -> pd.DataFrame:
    """The pool's block tables after the last stage: request, tokens, table."""
    last = ex.pool[-1]
    return pd.DataFrame([{"request": rid, "tokens": last.tokens[rid],
                          "block table": str(list(table))}
                         for rid, table in last.tables.items()])


_ORDINALS = ("first", "second", "third", "fourth", "fifth")
# How the pool orders its free blocks, for the sentences about D's blocks.
_FREE_QUEUE = ("The pool hands out blocks from the front of its free queue, as vLLM's (v1) "
               "block pool does; a finished request's blocks join the back, behind every "
               "block never used")


def _span(start: int, size: int) -> str:
    """A region's slots as a range: '6–8', or '6' for one slot."""
    return span(start, start + size - 1)


def _slots(events: Sequence[SeedEvent]) -> str:
    """The regions of arena events: 'slots 0–5, 6–8 and 9–13'."""
    one = len(events) == 1 and events[0].size == 1
    return f"{'slot' if one else 'slots'} {joined([_span(e.start, e.size) for e in events])}"


def _blocks(blocks: Sequence[int]) -> str:
    return f"{'block' if len(blocks) == 1 else 'blocks'} {joined(blocks)}"


def _step_name(step: int) -> str:
    return _ORDINALS[step - 1] if step <= len(_ORDINALS) else f"{step}th"


def _waits(events: Sequence[SeedEvent], unit: str) -> list[str]:
    """Clauses for requests turned away at arrival, those with the same reason together.

    In the arena (`unit` "slot") a region must be one piece, so the largest hole is
    the reason when enough slots are free in total; in the pool only the count matters.
    """
    groups: dict[tuple[int, int, int], list[str]] = {}
    for e in events:
        groups.setdefault((e.size, e.free, e.largest), []).append(e.request)
    out = []
    for (size, free, largest), rids in groups.items():
        who = f"{joined(rids)} {agrees(len(rids), 'waits', 'wait')}"
        need = f"{'each needs' if len(rids) > 1 else 'it needs'} {counted(size, unit)}"
        only = f"only {free} {agrees(free, 'is', 'are')} free"
        if unit == "slot":
            room = ("no slot is free" if not free else
                    f"the largest hole is {largest}" if free >= size else only)
            out.append(f"{who}: {need} in one piece and {room}")
        else:
            out.append(f"{who}: {need} and {'none is free' if not free else only}")
    return out


def _steps(log: Sequence[SeedEvent], clause: Callable[[SeedEvent, int, int], str]
           ) -> list[str]:
    """A sentence per decode step in which a request finished or was placed, its clauses
    from `clause(event, prompt tokens, final length)`."""
    spec = {rid: (prompt, final) for rid, prompt, final in SEED_REQUESTS}
    out = []
    for step in sorted({e.step for e in log if e.step > 0}):
        clauses = [clause(e, *spec[e.request]) for e in log
                   if e.step == step and e.kind != "waits"]
        out.append(f"At the {_step_name(step)} decode step {', and '.join(clauses)}.")
    return out


def _arena_step(e: SeedEvent, prompt: int, final: int) -> str:
    if e.kind == "finishes":
        return f"{e.request} reaches its {final} tokens and finishes, freeing {_slots([e])}"
    return (f"{e.request}, waiting since it arrived, takes {_slots([e])} and starts from "
            f"its {counted(prompt, 'prompt token')}")


def _pool_step(e: SeedEvent, prompt: int, final: int) -> str:
    if e.kind == "finishes":
        return (f"{e.request} reaches its {final} tokens and finishes, freeing "
                f"{_blocks(sorted(e.blocks))}")
    return f"{e.request}, waiting since it arrived, takes {_blocks(e.blocks)}"


def seed_arena_story(ex: SeedExample) -> str:
    """What the arena did with A, B and C under the example's policy, in order: what each
    reserves, who fits and who waits (and why), who finishes or is placed in the decode
    steps, and who is still waiting when D arrives (under "max", B and C never run)."""
    final = {rid: f for rid, _, f in SEED_REQUESTS}
    rids = list(final)
    sizes = [ex.reservations[r] for r in rids]
    if ex.policy == "max":
        whole = ", the whole arena" if sizes[0] == ex.capacity else ""
        asks = (f"each request reserves the maximum sequence length, "
                f"{counted(sizes[0], 'slot')}{whole}")
    else:
        rule = ("exactly its final length" if ex.policy == "oracle" else
                "the next power of two of its final length")
        asks = f"each request reserves {rule}: {joined(rids)} ask for {joined(sizes)} slots"
    arrival = [e for e in ex.arena_log if e.step == 0]
    placed = [e for e in arrival if e.kind == "placed"]
    waiting = [e for e in arrival if e.kind == "waits"]
    if not waiting:
        fit = f"all three fit ({_slots(placed)})"
    else:
        fit = "; ".join(_waits(waiting, "slot"))
        if placed:
            fit = (f"{joined([e.request for e in placed])} "
                   f"{agrees(len(placed), 'fits', 'fit')} ({_slots(placed)}); {fit}")
    parts = [f"Under **{POLICY_LABELS[ex.policy]}** {asks}; {fit}."]
    parts += _steps(ex.arena_log, _arena_step)
    if not any(e.kind == "finishes" for e in ex.arena_log):
        held: dict[str, int] = {}
        for seg in ex.arena[1].segments:
            if seg.owner is not None and seg.kind == "token_states":
                held[seg.owner] = held.get(seg.owner, 0) + seg.length
        running = joined([f"{r} holds {held[r]} of its {final[r]} tokens"
                          for r in rids if r in held])
        parts.append(f"In the two decode steps no request finishes: {running}.")
    still = list(ex.arena[1].waiting)
    if still:
        them = agrees(len(still), "it has", "they have")
        parts.append(f"{joined(still)} {agrees(len(still), 'is', 'are')} still waiting when "
                     f"D arrives: under this policy {them} not run at all.")
    return " ".join(parts)


def seed_pool_story(ex: SeedExample) -> str:
    """The same timeline in the paged pool, which takes blocks only for tokens that exist."""
    arrival = [e for e in ex.pool_log if e.step == 0]
    placed = [e for e in arrival if e.kind == "placed"]
    waiting = [e for e in arrival if e.kind == "waits"]
    if not placed:
        start = "nothing starts at once"
    else:
        who = "all three" if not waiting else joined([e.request for e in placed])
        sizes = [e.size for e in placed]
        took = (f"{joined(sizes)} blocks of {ex.block_size}" if len(set(sizes)) > 1 else
                f"{counted(sizes[0], 'block')} of {ex.block_size}"
                + (" each" if len(sizes) > 1 else ""))
        start = f"{who} {agrees(len(placed), 'starts', 'start')} at once ({took})"
    if waiting:
        start += "; " + "; ".join(_waits(waiting, "block"))
    parts = [f"The paged pool takes blocks only for the tokens that exist, so {start}."]
    parts += _steps(ex.pool_log, _pool_step)
    still = list(ex.pool[1].waiting)
    if still:
        parts.append(f"{joined(still)} {agrees(len(still), 'is', 'are')} still waiting "
                     "when D arrives.")
    return " ".join(parts)


def seed_reuse_sentence(ex: SeedExample) -> str:
    """Which of D's blocks a finished request freed, why (the free queue's order), and,
    when D takes none of them, which final length of D reaches them: the pool's own
    order, as the block manager hands blocks out, not a story told over it."""
    if not ex.freed:
        return ("" if ex.d_table is None else
                f"D takes {_blocks(ex.d_table)}, never used before: no request has "
                f"finished in the pool yet. {_FREE_QUEUE}.")
    finishers = joined([e.request for e in ex.pool_log if e.kind == "finishes"])
    if ex.d_table is None:
        # Any free block would do (a table need not list neighbours), but too few are free.
        return (f"D waits even though {_blocks(sorted(ex.freed))} that {finishers} freed "
                f"{agrees(len(ex.freed), 'is', 'are')} free again: the pool has fewer free "
                "blocks than D needs.")
    freed = set(ex.freed)
    reused = [b for b in ex.d_table if b in freed]
    fresh = [b for b in ex.d_table if b not in freed]
    if reused:
        text = (f"D takes {_blocks(reused)} that {finishers} freed"
                + (f", and {joined(fresh)}, never used before" if fresh else "")
                + f". {_FREE_QUEUE}, so D reached {finishers}'s blocks once the never-used "
                "ones ran out (a block table need not list neighbours: any free block will "
                "do).")
        every = ex.reuse_length(every=True)
        if len(reused) < len(freed) and every is not None:
            text += f" A D of final length {every} takes all of them."
        return text
    text = (f"D takes {_blocks(ex.d_table)}, never used before; {_blocks(sorted(freed))} "
            f"that {finishers} freed {agrees(len(freed), 'stays', 'stay')} free. "
            f"{_FREE_QUEUE}, so D gets {finishers}'s blocks only after those. A block table "
            "need not list neighbours, so D could use them.")
    first, every = ex.reuse_length(), ex.reuse_length(every=True)
    if first is not None:
        # D of length `first` needs exactly one block past the never-used ones.
        nxt = ex.free_order[(first - 2) // ex.block_size]
        text += f" Set D's final length to {first} to see it take block {nxt}"
        text += f", or to {every} for all of them." if every not in (None, first) else "."
    return text
