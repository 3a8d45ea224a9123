"""What a person types on the Playground, as operations and configs.

Everything typed is turned into CONTRACT.md's operation JSON and parsed by
`backend.engine.ops.parse_op`, so the app accepts exactly what a scenario file
accepts, with the same messages; what only the form has (a blank id, pinned
blocks as text, samples beside beams) is refused here in the form's words. The
sidebar's fields become an `EngineConfig` within one browser session's limit.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from backend.core.config import (
    DIM_FIELDS,
    MAX_KV_BYTES,
    MAX_NUM_BLOCKS,
    REAL_MODELS,
    TINY_BYTE,
    EngineConfig,
    check_field,
)
from backend.core.errors import PagedLabError
from backend.engine.ops import Add, Op, parse_op
from backend.engine.request import Request, kept_for_sample
from backend.paging.hashing import check_cache_salt
from backend.sessions.budget import SERVER_BUDGET, KVBudget


def next_request_id(existing: set[str] | dict[str, Any]) -> str:
    """The first free id of A, B, ..., Z, then R27, R28, ...; an id whose samples or
    forks (ID.0, ID.1, ...) exist is not free."""
    taken = set(existing) | {rid.split(".", 1)[0] for rid in existing}
    for letter in string.ascii_uppercase:
        if letter not in taken:
            return letter
    n = 27
    while f"R{n}" in taken:
        n += 1
    return f"R{n}"


def next_child_id(parent: str, requests: Mapping[str, Request]) -> str:
    """'A.1', 'A.2', ...: the first free fork name under `parent`, skipping an id kept
    for a parallel sample still to be forked (`add A` with n waiting keeps A.1 ...),
    which the engine would refuse."""
    n = 1
    while f"{parent}.{n}" in requests or kept_for_sample(requests, f"{parent}.{n}"):
        n += 1
    return f"{parent}.{n}"


def parse_blocks(text: str | None) -> list[int] | None:
    """'9, 2, 14' (or '9 2;14') -> [9, 2, 14]; blank -> None. Raises PagedLabError naming
    the bad entry: one that is no block id, an empty one between two separators ('9,,2'
    would otherwise read as [9, 2] with nothing said), or one past any pool's last id."""
    if text is None or not text.strip():
        return None
    out = []
    for part in re.split(r"\s*[,;]\s*|\s+", text.strip()):
        if not part:
            raise PagedLabError(f"pinned blocks must be block ids like '9, 2, 14'; "
                                f"{text.strip()!r} has an empty entry between two "
                                "separators")
        if not (part.isascii() and part.isdigit()):
            raise PagedLabError(f"pinned blocks must be block ids like '9, 2, 14'; "
                                f"{part!r} is not a block id")
        # By length first: int() refuses more than 4,300 digits with a ValueError.
        if len(part) > len(str(MAX_NUM_BLOCKS)) or int(part) >= MAX_NUM_BLOCKS:
            shown = f"{int(part):,}" if len(part) <= 30 else f"{part[:12]}… ({len(part):,} digits)"
            raise PagedLabError(f"pinned block {shown} does not exist: no pool has "
                                f"more than {MAX_NUM_BLOCKS:,} blocks")
        out.append(int(part))
    return out


def add_op(*, request: str | None, prompt: str | None, prompt_len: int | None,
           max_new_tokens: int | None, blocks: str | None,
           existing: set[str] | dict[str, Any], vocab_size: int,
           prompt_tokens: Sequence[int] | None = None, n: int | None = None,
           beam_width: int | None = None, default_max_new: int | None = None,
           chat: bool = False, cache_salt: str | None = None) -> Add:
    """The `add` operation for the Add form. Raises PagedLabError for a bad combination,
    named by the form's labels (the scenario parser would name its own fields).

    `default_max_new` is the engine's limit for a request that gives none (the
    sidebar's "Default max new tokens"); a beam search needs one of the two.
    `chat` sends the text as one user message through the model's chat template
    (as a scenario's `messages`), so the prompt ends with the assistant's turn open.
    `cache_salt`, stripped, salts the request's prefix-cache keys (blank: none).

    `vocab_size` is the engine's model's (256 for tiny-byte's bytes, 49,152 for
    SmolLM2): the op is parsed as a scenario on that model would be, so
    `prompt_tokens` ids outside its vocabulary are refused with the same message.

    A length given wins over the text: the form keeps its prompt text after every
    add (adding it again shows prefix sharing), so text beside a length is almost
    always left over, and a length is only ever typed on purpose. Token ids win
    over the text for the same reason.
    """
    rid = (request or "").strip() or next_request_id(existing)
    data: dict[str, Any] = {"op": "add", "request": rid}
    text = prompt or ""
    if prompt_len is not None:
        data["prompt_len"] = int(prompt_len)
    elif prompt_tokens is not None:
        data["prompt_tokens"] = list(prompt_tokens)
    elif text and chat:
        data["messages"] = [{"role": "user", "content": text}]
    elif text:
        data["prompt"] = text
    else:
        raise PagedLabError("type a prompt, or give a prompt length")
    if max_new_tokens is not None:
        data["max_new_tokens"] = int(max_new_tokens)
    pins = parse_blocks(blocks)
    if pins is not None:
        data["blocks"] = pins
    _check_group(n, beam_width, pins, max_new_tokens, default_max_new)
    if n is not None and n > 1:
        data["n"] = int(n)
    if beam_width is not None:
        data["beam_width"] = int(beam_width)
    salt = (cache_salt or "").strip()
    if salt:
        data["cache_salt"] = check_cache_salt(salt, "Cache salt")
    op = parse_op(data, vocab_size=vocab_size)
    assert isinstance(op, Add)
    return op


def _check_group(n: int | None, width: int | None, pins: list[int] | None,
                 max_new: int | None, default_max_new: int | None) -> None:
    """The Add form's samples, beams and pins, refused in the form's words."""
    samples = n is not None and n > 1
    if samples and width is not None:
        raise PagedLabError("Parallel samples (n) and Beam width do not go together: give "
                            "one of them (samples draw independently; beams keep the most "
                            "likely)")
    if pins is not None and (samples or width is not None):
        field = "Beam width" if width is not None else "Parallel samples (n)"
        raise PagedLabError(f"Pin to blocks is for one request; leave it blank to use {field}")
    if width is not None and max_new is None and default_max_new is None:
        raise PagedLabError("Beam width needs a limit on new tokens: give Max new tokens, or "
                            "set the sidebar's Default max new tokens (the beams all grow "
                            "until they end or reach it)")


def op_from(data: dict[str, Any]) -> Op:
    """Any other control's operation, through the same parser as scenario files."""
    return parse_op(data)


# The fields whose None means "no limit" and whose 0 would mean nothing else.
NO_LIMIT_AT_0 = frozenset({"max_new_tokens", "max_num_seqs", "max_num_batched_tokens",
                           "watermark_blocks"})


def config_from_fields(fields: dict[str, Any], base: EngineConfig,
                       budget: KVBudget = SERVER_BUDGET) -> EngineConfig:
    """`base` with the sidebar's fields applied, validated, and within what one browser
    session's engine may hold (`budget`). Raises PagedLabError.

    A limit's 0 (`NO_LIMIT_AT_0`) reads as blank: no limit. The four dimension
    fields describe tiny-byte only: a real model's dimensions
    come from its weights (EngineConfig refuses others), so for one they are
    left out, and a switch back to tiny-byte from a real model takes the
    fields' dimensions, or tiny-byte's defaults without them, never the real
    model's.
    """
    model = fields.get("model", base.model)
    # A limit's 0 is no limit: a browser's number field, once it holds a number, cannot
    # be blanked again (it keeps the number), so 0 is how a person removes a limit.
    fields = {k: None if k in NO_LIMIT_AT_0 and v == 0 and not isinstance(v, bool) else v
              for k, v in fields.items()}
    data = {**base.to_json(), **fields}
    if model in REAL_MODELS:
        data = {k: v for k, v in data.items() if k not in DIM_FIELDS}
    elif model == TINY_BYTE and base.model != TINY_BYTE:
        data = {k: v for k, v in data.items() if k not in DIM_FIELDS or k in fields}
    _check_each(data, fields)
    _check_past_range(data, budget)
    config = EngineConfig.from_json(data, where="settings")
    budget.check_size(config)
    return config


def field_problem(key: str, value: Any, *, swap: bool = False) -> str | None:
    """Why the sidebar's config field `key` cannot hold `value` on its own (its type and
    range, a limit's 0 read as blank; `swap`: preemption "swap" is picked, see
    `check_field`), or None. The config's checks across fields come later, from
    `config_from_fields`."""
    if key in NO_LIMIT_AT_0 and value == 0 and not isinstance(value, bool):
        value = None
    try:
        check_field(key, value, "settings", swap=swap)
    except PagedLabError as exc:
        return str(exc)
    return None


def _check_each(data: dict[str, Any], given: dict[str, Any]) -> None:
    """Every field given checked on its own: where two or more are refused, each is
    named, one line apiece (a person fixing two sees both; the config's own check stops
    at the first). One alone is left to that check, which words some better (a pool
    past the session's limit)."""
    problems = [p for key in given if key in data
                if (p := field_problem(key, data[key], swap=data.get("preemption") == "swap"))
                is not None]
    if len(problems) > 1:
        raise PagedLabError("\n".join(problems))


def _check_past_range(data: dict[str, Any], budget: KVBudget) -> None:
    """A pool (or swap's host pool) past the session's limit is refused by that limit
    first when it is the tighter bound (a real model's blocks are large): "2,912 blocks
    fit" helps more than "must be in 1..65,536", and more than the 2 GiB any one pool
    may take, which a person would meet first and then, a few blocks fewer, the
    session's limit. Otherwise the config's own checks name it."""
    wanted = data.get("num_blocks")
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        return
    swap = data.get("preemption") == "swap"
    cpu = data.get("num_cpu_blocks") if swap else 0
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
        return
    # The probe has one block, no watermark (which must stay under the pool) and at most
    # one host block (a host pool past 2 GiB would refuse it): it gives the block's size.
    try:
        probe = EngineConfig.from_json({**data, "num_blocks": 1, "watermark_blocks": None,
                                        "num_cpu_blocks": min(cpu, 1)}, where="settings")
    except PagedLabError:
        return   # no block size to count with: the full check names the range
    # A session limit past the 2 GiB any one pool may take would name a count no config
    # may hold, as would one that fits more blocks than the range: there the config's
    # checks say it.
    if budget.per_session > MAX_KV_BYTES:
        return
    per = probe.bytes_per_block
    room = budget.per_session // per
    if wanted > MAX_NUM_BLOCKS and room - cpu >= MAX_NUM_BLOCKS:
        return
    if cpu > MAX_NUM_BLOCKS and room >= MAX_NUM_BLOCKS:
        return
    budget.check_size(probe, wanted, cpu)
