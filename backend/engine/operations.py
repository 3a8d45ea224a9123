"""The engine's operations other than `step`: add, grow, fork, finish, shuffle.

Each validates fully before it changes anything (a refusal leaves the engine
exactly as it was), then changes the tables through the scheduler and the
block manager and has the engine run the model work (`Engine.prefill`,
`Engine.decode`, `Engine.take_next_token`). `Engine.apply` calls them under the
engine's lock; nothing else should.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from backend.core.errors import PagedLabError
from backend.core.words import agrees, counted
from backend.engine.admission import seqs_taken
from backend.engine.ops import INHERIT, Add, Finish, Fork, Grow, Shuffle, check_request_id
from backend.engine.prompts import prompt_ids
from backend.engine.request import Request, kept_for_sample

if TYPE_CHECKING:
    from backend.core.config import EngineConfig
    from backend.engine.engine import Engine


def first_id(op: Add) -> str:
    """The request an `add` creates first, the one that waits when it cannot start:
    ID, or ID.0 for parallel samples and beams (the others are forked from it)."""
    return op.request if op.n is None and op.beam_width is None else f"{op.request}.0"


def add(engine: Engine, op: Add) -> None:
    """Mutates: a new request, admitted at once (and prefilled) if nothing waits ahead.

    With `n` parallel samples, ID.0 is admitted and prefilled like any request,
    and the others are forked from it once its prompt is computed (`spawn_samples`).
    """
    group = check_request_id(op.request)
    width = op.beam_width
    ids = ([group] if op.n is None and width is None
           else [f"{group}.{k}" for k in range(op.n or width or 1)])
    for rid in ids:
        if rid in engine.requests:
            raise PagedLabError(f"request {rid!r} already exists; pick another id")
        _not_kept_for_a_sample(engine, rid, "id")
    if width is not None and any(r.group == group for r in engine.requests.values()):
        raise PagedLabError(f"group {group!r} already exists; pick another id")
    rid = ids[0]
    assert rid == first_id(op)
    # The prompt of `add ID` whatever n is (a random prompt is seeded by the id).
    tokens = prompt_ids(op, engine.model, engine.config.seed, group)
    max_new = engine.config.max_new_tokens if op.max_new_tokens == INHERIT else op.max_new_tokens
    assert max_new != INHERIT
    context = engine.config.context_length
    if context is not None and len(tokens) >= context:
        raise PagedLabError(
            f"a prompt of {len(tokens):,} tokens leaves no room in {engine.config.model}'s "
            f"context of {context:,} tokens for a generated token; it may hold "
            f"{context - 1:,} at most")
    # Raises for a prompt that can never fit and for bad pins.
    engine.manager.plan_prompt(tokens, pinned=op.blocks, cache_salt=op.cache_salt)
    if engine.scheduler.never_admissible(len(tokens), watermark=False):
        raise PagedLabError(
            f"a prompt of {counted(len(tokens), 'token')} fills "
            f"{_all_blocks(engine.config.num_blocks)}, leaving no block for its first "
            "generated token; it could never run")
    if op.blocks is None and engine.scheduler.never_admissible(len(tokens)):
        # Pinned blocks are taken at once, without the admission test.
        need = engine.manager.blocks_for(len(tokens) + 1)
        keep = engine.config.watermark_blocks or 0
        raise PagedLabError(
            f"a prompt of {len(tokens):,} tokens needs {counted(need, 'block')} with its "
            f"first generated token, and admission keeps the watermark's {keep:,} of the "
            f"pool's {engine.config.num_blocks:,} free: it could never be admitted")
    if op.blocks is not None:
        check_seq_slot(engine, f"add {rid!r} on pinned blocks (admitted at once)")
    what = "beams" if width is not None else "parallel samples"
    limit = engine.config.max_num_seqs
    if limit is not None and len(ids) > limit:
        raise PagedLabError(f"{len(ids)} {what} run as {len(ids)} sequences, but "
                            f"max_num_seqs is {limit}: they could never start")
    if width is not None:
        _check_beam_search(engine, width, len(tokens), max_new)
        if context is not None and max_new is not None and len(tokens) + max_new > context:
            # A beam's round is its group's: none may end alone at the context.
            raise PagedLabError(
                f"a beam search of max_new_tokens {max_new:,} from a prompt of "
                f"{len(tokens):,} tokens would pass {engine.config.model}'s context of "
                f"{context:,} tokens; ask for at most {context - len(tokens):,}")
    if len(ids) > 1:
        _check_first_round(engine, len(ids), len(tokens), what)
    req = Request(rid, len(tokens), tokens, max_new, arrival=len(engine.requests),
                  group=None if op.n is None and width is None else group,
                  pending_samples=len(ids) - 1 if width is None else 0,
                  beam_width=width, cum_logprob=None if width is None else 0.0,
                  cache_salt=op.cache_salt)
    engine.requests[rid] = req
    engine.timeline.arrived(rid)
    if op.blocks is not None:
        start = engine.scheduler.allocate(req, list(op.blocks))
        engine.runner.prefill([(req, start, req.num_tokens)], engine.manager)
    else:
        engine.waiting.append(rid)
        # First come, first served: a newcomer never overtakes a waiting request.
        if len(engine.waiting) == 1:
            engine.prefill(engine.scheduler.admit())


def _all_blocks(n: int) -> str:
    """All `n` blocks in words: "all 8 blocks", or "the pool's one block"."""
    return "the pool's one block" if n == 1 else f"all {n:,} blocks"


def _not_kept_for_a_sample(engine: Engine, rid: str, what: str) -> None:
    """Refuse a new request named like a parallel sample still to be forked: the fork
    would find its id taken, half-way through a step."""
    first = kept_for_sample(engine.requests, rid)
    if first is not None:
        raise PagedLabError(
            f"request id {rid!r} is kept for a parallel sample of {first.group!r}, forked "
            f"from {first.id!r} when its prompt is computed; pick another {what}")


def _check_beam_search(engine: Engine, width: int, prompt_len: int,
                       max_new: int | None) -> None:
    """Refuse a beam search that could never run its first round."""
    if max_new is None:
        raise PagedLabError("beam search needs a max_new_tokens limit: its beams all grow "
                            "until they end or reach it")
    tokens = engine.config.max_num_batched_tokens
    if tokens is not None and width > tokens:
        raise PagedLabError(f"a beam width of {width} decodes {width} tokens in one step, but "
                            f"max_num_batched_tokens is {tokens}: it could never run a round")


def _check_first_round(engine: Engine, seqs: int, prompt_len: int, what: str) -> None:
    """Refuse parallel samples or beams whose first tokens could never all be written:
    admission takes the group only with the blocks for them (see Scheduler.admit), so it
    would wait for ever, holding up every request behind it."""
    # The prompt's blocks, then for the first tokens: a copy of the shared last block
    # for every writer but the last, or, if it is full, a new block for each.
    prompt = engine.manager.blocks_for(prompt_len + 1)
    first = prompt + seqs - 1
    keep = engine.config.watermark_blocks or 0
    if first + keep > engine.config.num_blocks:
        kept = f" and admission keeps the watermark's {keep:,} free" if keep else ""
        most = engine.config.num_blocks - keep - prompt + 1
        fewer = f"at most {most:,} fit, or " if most >= 2 else ""
        raise PagedLabError(
            f"{seqs} {what} of a {prompt_len:,}-token prompt need {first:,} blocks for "
            f"their first tokens, but the pool has {engine.config.num_blocks:,}{kept}: "
            f"they could never start ({fewer}a pool of at least {first + keep:,} blocks "
            "holds them)")


def spawn_samples(engine: Engine, first: Request) -> None:
    """Mutates: fork samples 1 .. n-1 of `first`'s group from it, sharing every block.

    Their logits are `first`'s, and each samples its own tokens (sampling is seeded
    by the request id), so the samples diverge from their first token on.
    """
    assert first.group is not None and first.logits is not None
    for k in range(1, first.pending_samples + 1):
        child_id = f"{first.group}.{k}"
        engine.manager.fork(first.id, child_id)
        child = Request(child_id, first.prompt_len, list(first.tokens),
                        first.max_new_tokens, arrival=len(engine.requests), parent=first.id,
                        status="running", admitted=engine.scheduler.next_admission(),
                        logits=first.logits.clone(), group=first.group,
                        cache_salt=first.cache_salt)
        engine.requests[child_id] = child
        engine.running.append(child_id)
        engine.timeline.forked(first.id, child_id)
    first.pending_samples = 0


def grow(engine: Engine, op: Grow,
         progress: Callable[[int, int], bool] | None = None) -> int | None:
    """Mutates: decode `op.tokens` tokens of one running request now (no preemption:
    refused unless the free blocks suffice).

    `progress(done, total)` is asked after each token but the last; False stops the
    grow there, and the count decoded is returned (None when it was not stopped).
    """
    req = running_request(engine, op.request, "grow")
    _not_a_beam(req, "grow")
    n = op.tokens if req.remaining is None else min(op.tokens, req.remaining)
    context = engine.config.context_length
    room = None if context is None else context - req.num_tokens
    # A refusal counts the tokens the grow would decode: the ones asked, unless its max
    # new tokens (or its model's context, which ends it as a step would) leave fewer,
    # which it then says, since the number differs from the one asked for.
    capped = "" if n == op.tokens else (
        f" (its max new tokens leave {n:,} of the {op.tokens:,} asked)")
    if room is not None and room < n:
        n = room
        capped = (f" ({engine.config.model}'s context of {context:,} tokens leaves {n:,} "
                  f"of the {op.tokens:,} asked)")
    total = engine.manager.blocks_for(req.num_tokens + n)
    if total > engine.config.num_blocks:
        raise PagedLabError(
            f"request {req.id!r} would need {total:,} blocks for {req.num_tokens + n:,} "
            f"tokens{capped} but the pool has only {engine.config.num_blocks:,}")
    needed = engine.manager.blocks_needed_to_append(req.id, n)
    free = engine.manager.num_free_blocks
    if needed > free:
        # Said as the metrics count them: a cached block is not "free" there, though
        # growing may take it (evicting its prefix).
        pool = engine.manager.pool
        have = (f"{free:,} {agrees(free, 'is', 'are')} free" if not pool.num_cached_free else
                f"{free:,} can be taken ({pool.num_empty:,} free, {pool.num_cached_free:,} "
                "cached)")
        raise PagedLabError(
            f"request {req.id!r} needs {counted(needed, 'free block')} to grow by "
            f"{counted(n, 'token')}{capped} but only {have}; finish a request, or use step, "
            "which preempts")
    stopped_at = None
    for done in range(1, n + 1):
        engine.decode([(req, engine.take_next_token(req))])
        if req.stopped:
            break
        if progress is not None and done < n and not progress(done, n):
            stopped_at = done
            break
    engine.scheduler.finish_if_done([req.id])
    return stopped_at


def fork(engine: Engine, op: Fork) -> None:
    """Mutates: a child sharing every block of a running request, its logits copied."""
    parent = running_request(engine, op.request, "fork")
    _not_a_beam(parent, "fork")
    child_id = check_request_id(op.child, "child")
    if child_id in engine.requests:
        raise PagedLabError(f"request {child_id!r} already exists; pick another child id")
    _not_kept_for_a_sample(engine, child_id, "child id")
    check_seq_slot(engine, f"fork {parent.id!r}")
    assert parent.logits is not None
    engine.manager.fork(parent.id, child_id)
    child = Request(child_id, parent.prompt_len, list(parent.tokens), parent.max_new_tokens,
                    arrival=len(engine.requests), parent=parent.id, status="running",
                    admitted=engine.scheduler.next_admission(), logits=parent.logits.clone(),
                    cache_salt=parent.cache_salt)
    engine.requests[child_id] = child
    engine.running.append(child_id)
    engine.timeline.arrived(child_id)


def finish(engine: Engine, op: Finish) -> None:
    """Mutates: retire a request in any state but finished, releasing what it holds."""
    req = engine.request(op.request)
    if req.status == "finished":
        raise PagedLabError(f"request {req.id!r} has already finished")
    engine.scheduler.finish(req, "finished")


def shuffle(engine: Engine, op: Shuffle) -> None:
    """Mutates: move every used block to another physical block, tables rewritten."""
    # engine.step counts the operations done; this one's events carry the next number.
    seed = (op.seed if op.seed is not None
            else default_shuffle_seed(engine.config, engine.step + 1))
    moves = engine.manager.apply_remap(engine.manager.plan_remap(seed))
    engine.runner.move_blocks([m.src for m in moves], [m.dst for m in moves])


def default_shuffle_seed(config: EngineConfig, step: int) -> int:
    """The seed of a `shuffle` that gives none, as operation `step` (the step its events
    carry): the config's seed and the step, so that each such shuffle moves blocks
    differently."""
    return config.seed * 1_000_003 + step - 1


def running_request(engine: Engine, request_id: str, action: str) -> Request:
    """The request `action` may act on now, or a refusal saying why it may not."""
    req = engine.request(request_id)
    if req.status == "waiting":
        state = ("it was preempted and waits to be recomputed" if req.num_preemptions
                 else "it has not started")
        raise PagedLabError(f"cannot {action} request {req.id!r}: {state}: "
                            f"{engine.scheduler.why_waiting(req.id)}")
    if req.status == "finished":
        raise PagedLabError(f"cannot {action} request {req.id!r}: it has finished")
    if req.status == "swapped":
        raise PagedLabError(f"cannot {action} request {req.id!r}: it is swapped out to the "
                            "host pool (step the batch to bring it back)")
    if req.prefilling:
        raise PagedLabError(
            f"cannot {action} request {req.id!r}: it is still being prefilled "
            f"({req.num_computed} of {req.num_tokens} tokens computed; the token budget "
            f"max_num_batched_tokens={engine.config.max_num_batched_tokens} spreads it over "
            "steps); step the batch first")
    return req


def _not_a_beam(req: Request, action: str) -> None:
    if req.beam_width is not None:
        raise PagedLabError(f"cannot {action} request {req.id!r}: it is a beam of group "
                            f"{req.group!r}, which the beam search extends and forks itself; "
                            "step the batch to run its next round")


def check_seq_slot(engine: Engine, action: str) -> None:
    """Refuse a request that would run beside max_num_seqs others."""
    limit = engine.config.max_num_seqs
    # The samples and beams a running request will fork hold their slots already, as
    # admission counts them.
    seqs = engine.scheduler.running_seqs()
    if limit is not None and seqs >= limit:
        n = len(engine.running)
        held = (f"{counted(n, 'request')} {agrees(n, 'is', 'are')} running" if seqs == n else
                f"{seqs_taken(seqs)} take their slots")
        raise PagedLabError(f"cannot {action}: {held} and max_num_seqs is {limit}; "
                            "finish one first")
