"""Restoring a snapshot's requests and its scheduler's queues, every field checked.

restore.py reads the rest (the prefix cache, the blocks, the free queue,
metrics and events) and cross-checks the tables read here against the blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from backend.core.checks import MAX_JSON_INT, check_int
from backend.core.config import MAX_NEW_TOKENS
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import MAX_SAMPLES, check_request_id
from backend.engine.request import FINISH_REASONS, Request, kept_for_sample
from backend.io.json_input import FieldReader
from backend.io.restore_beams import beam_fields, check_beam_groups
from backend.paging.hashing import check_cache_salt

Tables = dict[str, list[int]]   # request id -> its block table, as the snapshot lists it


@dataclass(frozen=True, slots=True)
class Queues:
    """The scheduler's queues as a snapshot lists them, and its admissions count."""

    waiting: list[str]
    running: list[str]
    swapped: list[str]
    admissions: int


def read_requests(top: FieldReader, engine: Engine) -> tuple[dict[str, Request], Tables]:
    """`snapshot.requests` as Requests in arrival order, and each one's block table.

    Every field is checked on its own and against the others of its request (a table
    that fits its computed tokens, a finish that its tokens or its limit imply) and
    against the engine's config and model; how tables share blocks is the blocks'
    check, in restore.py. Raises PagedLabError naming the request and field."""
    c = engine.config
    bs = c.block_size
    top_id = c.vocab_size - 1
    eos = engine.model.eos_token_id
    host = engine.host
    requests: dict[str, Request] = {}
    tables: dict[str, list[int]] = {}
    # Each group's first request listed: its samples and beams share its cache salt.
    group_first: dict[str, Request] = {}
    for r in top.objects("requests"):
        raw = r.data
        rid = check_request_id(r.get("id", str), f"{r.where}.id")
        if rid in requests:
            raise PagedLabError(f"{r.where}.id {rid!r} is repeated")
        status = r.get("status", str)
        if status not in ("waiting", "running", "finished", "swapped"):
            raise PagedLabError(f"{r.where}.status must be waiting, running, swapped or "
                                "finished")
        if status == "swapped" and host is None:
            raise PagedLabError(f"{r.where}: a swapped request needs preemption \"swap\" "
                                "and a host pool (config.num_cpu_blocks)")
        tokens = r.int_list("tokens", 0, top_id)
        prompt_len = r.get("prompt_len", int)
        if r.get("num_tokens", int) != len(tokens):
            raise PagedLabError(f"{r.where}: num_tokens is {raw['num_tokens']} but it lists "
                                f"{len(tokens)} tokens")
        if not 1 <= prompt_len <= len(tokens):
            raise PagedLabError(f"{r.where}: prompt_len {prompt_len} does not fit its "
                                f"{len(tokens)} tokens")
        # A swapped request's table names host blocks.
        table = r.int_list("block_table", 0, (c.num_cpu_blocks if status == "swapped"
                                              else c.num_blocks) - 1)
        if len(set(table)) != len(table):
            # Refused here with the block named, before the integrity check
            # would quote the whole (possibly huge) table in its message.
            twice = next(b for b, n in Counter(table).items() if n > 1)
            raise PagedLabError(f"{r.where}: its block_table holds block {twice} twice")
        # A prompt that a token budget spreads over steps has K/V (and blocks) for
        # its leading num_computed_tokens only; absent, all of them.
        computed = r.get("num_computed_tokens", int, optional=True)
        if computed is not None and (status not in ("running", "swapped")
                                     or not 1 <= computed < len(tokens)):
            raise PagedLabError(f"{r.where}.num_computed_tokens belongs to a running or "
                                "swapped request whose tokens are partly prefilled: "
                                "1 <= it < num_tokens")
        held = len(tokens) if computed is None else computed
        if status in ("running", "swapped"):
            if len(table) != -(-held // bs):
                raise PagedLabError(
                    f"{r.where}: {held} tokens do not fit its table of {len(table)} "
                    f"blocks of {bs}")
        elif table:
            raise PagedLabError(f"{r.where}: a {status} request holds no blocks")
        parent = r.get("parent", str, nullable=True)
        if parent is not None and parent not in requests:
            raise PagedLabError(f"{r.where}.parent {parent!r} is not an earlier request")
        max_new = r.get("max_new_tokens", int, optional=True)
        if max_new is not None:
            check_int(max_new, f"{r.where}.max_new_tokens", 1, MAX_NEW_TOKENS)
        if max_new is not None and len(tokens) - prompt_len > max_new:
            # No grow or step passes a request's limit, finished or not.
            raise PagedLabError(f"{r.where}: it generated {len(tokens) - prompt_len:,} "
                                f"tokens, more than its max_new_tokens {max_new:,}")
        if (max_new is not None and status != "finished"
                and len(tokens) - prompt_len >= max_new):
            raise PagedLabError(f"{r.where}: it has generated its {max_new} tokens, so it "
                                f"would have finished, but it is {status}")
        context = c.context_length
        if context is not None and (len(tokens) > context
                                    or (status != "finished" and len(tokens) >= context)):
            raise PagedLabError(f"{r.where}: {len(tokens):,} tokens "
                                f"{'pass' if len(tokens) > context else 'fill'} {c.model}'s "
                                f"context of {context:,}, so it "
                                + ("could not hold them" if len(tokens) > context else
                                   f"would have finished, but it is {status}"))
        if status != "finished" and eos is not None and eos in tokens[prompt_len:]:
            raise PagedLabError(f"{r.where}: it generated the end-of-sequence token, so it "
                                f"would have finished, but it is {status}")
        text = r.get("text", str, optional=True)
        if text is not None and text != engine.model.codec.decode(tokens):
            raise PagedLabError(f"{r.where}.text does not match its tokens")
        reason = r.get("finish_reason", str, optional=True)
        if status == "finished" and reason not in (None, *FINISH_REASONS):
            raise PagedLabError(f"{r.where}.finish_reason {reason!r} is not known")
        if status != "finished" and reason is not None:
            raise PagedLabError(f"{r.where}: a {status} request has no finish_reason")
        if status == "finished":
            _check_reason(r.where, reason, tokens, prompt_len, max_new, eos, context, c.model)
        preemptions = check_int(r.get("num_preemptions", int), f"{r.where}.num_preemptions",
                                0, MAX_JSON_INT)
        group = r.get("group", str, optional=True)
        if group is not None and not rid.startswith(f"{group}."):
            raise PagedLabError(f"{r.where}: a sample of group {group!r} is named "
                                f"{group}.<k>, not {rid!r}")
        pending = r.get("pending_samples", int, optional=True) or 0
        if pending >= MAX_SAMPLES:
            # An add asks for at most MAX_SAMPLES samples, the first of them this one:
            # a larger count would fork that many requests at its first step.
            raise PagedLabError(f"{r.where}.pending_samples must be in 0..{MAX_SAMPLES - 1} "
                                f"(an add takes at most {MAX_SAMPLES} parallel samples)")
        if pending and (group is None or rid != f"{group}.0" or status == "finished"
                        or (status != "waiting" and computed is None) or pending < 0):
            raise PagedLabError(f"{r.where}.pending_samples belongs to the first sample of a "
                                "group whose prompt is not computed yet")
        width, cum = beam_fields(r, group, max_new, reason)
        salt = r.get("cache_salt", str, optional=True)
        if salt is not None:
            check_cache_salt(salt, f"{r.where}.cache_salt")
        kin = requests[parent] if parent is not None else (
            None if group is None else group_first.get(group))
        if kin is not None and kin.cache_salt != salt:
            raise PagedLabError(
                f"{r.where}: its cache salt is {_salt_words(salt)}, but that of "
                f"{kin.id!r}, which it came from, is {_salt_words(kin.cache_salt)}: a "
                "fork, sample or beam keeps the salt of the request it came from")
        # A copy: the engine appends to its requests' tokens, and `data` may be
        # a History frame or a saved session's row that must stay as it was.
        requests[rid] = Request(rid, prompt_len, list(tokens), max_new, arrival=len(requests),
                                parent=parent, status=status, num_preemptions=preemptions,
                                finish_reason=reason if status == "finished" else None,
                                uncomputed=len(tokens) - held, group=group,
                                pending_samples=pending, beam_width=width, cum_logprob=cum,
                                cache_salt=salt)
        tables[rid] = table
        if group is not None:
            group_first.setdefault(group, requests[rid])
    for i, rid in enumerate(requests):
        first = kept_for_sample(requests, rid)
        if first is not None:
            # The engine refuses such an id (the fork would find it taken); a snapshot
            # holding one would break at the step that forks the samples.
            raise PagedLabError(f"snapshot.requests[{i}].id {rid!r} is kept for a pending "
                                f"sample of {first.id!r}")
    return requests, tables


def _check_reason(where: str, reason: str | None, tokens: Sequence[int], prompt_len: int,
                  max_new: int | None, eos: int | None, context: int | None,
                  model: str) -> None:
    """A finished request's reason must be one its tokens and limits allow: the engine
    finishes a request with "eos" when it generated the end-of-sequence token (its last
    token), "max_new_tokens" when it generated its limit, "context" when its tokens fill
    the model's context. Raises PagedLabError naming what rules the reason out."""
    generated = len(tokens) - prompt_len
    if reason == "eos" and eos is None:
        raise PagedLabError(f"{where}.finish_reason is 'eos', but {model} has no "
                            "end-of-sequence token: it never stops by itself")
    if reason == "eos" and (generated < 1 or tokens[-1] != eos):
        raise PagedLabError(f"{where}.finish_reason is 'eos', but its last token is not the "
                            f"end-of-sequence token ({eos})")
    if reason == "max_new_tokens" and (max_new is None or generated < max_new):
        raise PagedLabError(
            f"{where}.finish_reason is 'max_new_tokens', but it generated {generated:,} "
            + ("tokens and has no limit" if max_new is None else
               f"of its max_new_tokens {max_new:,}"))
    if reason == "context" and (context is None or len(tokens) < context):
        raise PagedLabError(
            f"{where}.finish_reason is 'context', but "
            + (f"{model} has no context of its own" if context is None else
               f"its {len(tokens):,} tokens do not fill {model}'s context of {context:,}"))


def read_scheduler(top: FieldReader, requests: dict[str, Request]) -> Queues:
    """`snapshot.scheduler`: its queues, each listing exactly the requests of its status,
    beam groups whole, and the admissions count. Raises PagedLabError."""
    sched = top.object("scheduler")
    waiting = sched.get("waiting", list)
    running = sched.get("running", list)
    if not all(isinstance(x, str) for x in (*waiting, *running)):
        raise PagedLabError("snapshot.scheduler lists request ids, which are strings")
    if sorted(waiting) != sorted(r.id for r in requests.values() if r.status == "waiting"):
        raise PagedLabError("snapshot.scheduler.waiting does not list exactly the waiting "
                            "requests")
    if sorted(running) != sorted(r.id for r in requests.values() if r.status == "running"):
        raise PagedLabError("snapshot.scheduler.running does not list exactly the running "
                            "requests")
    swapped = sched.get("swapped", list, optional=True) or []
    if not all(isinstance(x, str) for x in swapped):
        raise PagedLabError("snapshot.scheduler lists request ids, which are strings")
    if sorted(swapped) != sorted(r.id for r in requests.values() if r.status == "swapped"):
        raise PagedLabError("snapshot.scheduler.swapped does not list exactly the swapped "
                            "requests")
    if (len(set(waiting)) != len(waiting) or len(set(running)) != len(running)
            or len(set(swapped)) != len(swapped)):
        raise PagedLabError("snapshot.scheduler lists a request twice")
    check_beam_groups(requests, {"waiting": waiting, "running": running, "swapped": swapped})
    admissions = check_int(sched.get("admissions", int), "snapshot.scheduler.admissions", 0,
                           MAX_JSON_INT)
    if admissions < len(running):
        raise PagedLabError("snapshot.scheduler.admissions is smaller than the running count")
    return Queues(waiting, running, swapped, admissions)


def _salt_words(salt: str | None) -> str:
    return "none" if salt is None else repr(salt)
