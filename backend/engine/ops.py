"""The six engine operations of CONTRACT.md, as typed values parsed from JSON.

Parsing checks the shape of each operation (fields, types, ranges); whether it
is allowed in the engine's current state (does the request exist? is it
running?) is the engine's check, made when the operation is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from backend.core.checks import check_int, json_kind, shown, unicode_text
from backend.core.config import MAX_NEW_TOKENS
from backend.core.errors import PagedLabError
from backend.core.words import counted, legible
from backend.paging.hashing import check_cache_salt

MAX_STEP_COUNT = 100_000
MAX_GROW_TOKENS = 65_536
MAX_PROMPT_TOKENS = 65_536
MAX_ID_CHARS = 64
MAX_MESSAGES = 256
MAX_SAMPLES = 64          # n: parallel samples of one add; beam_width likewise
MAX_BEAM_ID = 9_999_999   # beam ids (ID.k) a search may reach; ids must leave room for them
ROLES = ("system", "user", "assistant")
# Every token id any model has: 0..MAX_TOKEN_ID (a model's own vocabulary is checked
# when a scenario is parsed with it, and again by the engine).
MAX_TOKEN_ID = 2**31 - 1

# `max_new_tokens` omitted means "use the config's default"; null means "no limit".
Inherit = Literal["inherit"]
INHERIT: Inherit = "inherit"


@dataclass(frozen=True, slots=True)
class Add:
    request: str
    prompt: str | None = None
    prompt_tokens: tuple[int, ...] | None = None
    prompt_len: int | None = None
    max_new_tokens: int | Inherit | None = INHERIT
    blocks: tuple[int, ...] | None = None
    # (role, content) pairs, rendered with the model's chat template.
    messages: tuple[tuple[str, str], ...] | None = None
    # Parallel samples of one prompt (ids REQUEST.0 .. REQUEST.{n-1}); None: one request
    # named REQUEST, as before `n` existed.
    n: int | None = None
    # Beam search of this width (beams REQUEST.0, REQUEST.1, ...; backend/engine/beams.py).
    beam_width: int | None = None
    # The request's cache salt (vLLM's cache_salt): its blocks share only with blocks
    # cached under the same salt. None: unsalted.
    cache_salt: str | None = None
    op: Literal["add"] = "add"


@dataclass(frozen=True, slots=True)
class Grow:
    request: str
    tokens: int = 1
    op: Literal["grow"] = "grow"


@dataclass(frozen=True, slots=True)
class Fork:
    request: str
    child: str
    op: Literal["fork"] = "fork"


@dataclass(frozen=True, slots=True)
class Finish:
    request: str
    op: Literal["finish"] = "finish"


@dataclass(frozen=True, slots=True)
class Step:
    count: int = 1
    op: Literal["step"] = "step"


@dataclass(frozen=True, slots=True)
class Shuffle:
    seed: int | None = None
    op: Literal["shuffle"] = "shuffle"


Op = Add | Grow | Fork | Finish | Step | Shuffle
OP_NAMES = ("add", "grow", "fork", "finish", "step", "shuffle")

_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # op: (required, optional). "op" itself, "narration" and "expect" are always allowed.
    "add": ({"request"}, {"prompt", "prompt_tokens", "prompt_len", "messages", "max_new_tokens",
                          "blocks", "n", "beam_width", "cache_salt"}),
    "grow": ({"request"}, {"tokens"}),
    "fork": ({"request", "child"}, set()),
    "finish": ({"request"}, set()),
    "step": (set(), {"count"}),
    "shuffle": (set(), {"seed"}),
}
ANNOTATIONS = {"op", "narration", "expect"}


def check_request_id(value: Any, field: str = "request") -> str:
    if not isinstance(value, str) or not value.strip():
        raise PagedLabError(f"{field} must be a non-empty string, got {shown(value)}")
    if len(value) > MAX_ID_CHARS:
        raise PagedLabError(f"{field} must be at most {MAX_ID_CHARS} characters; got "
                            f"{len(value):,}")
    if not value.isprintable():
        raise PagedLabError(f"{field} {shown(value)} contains unprintable characters")
    return value


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    return check_int(value, field, lo, hi)


def _int_list(value: Any, field: str, lo: int, hi: int, max_len: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise PagedLabError(f"{field} must be an array of integers, got {json_kind(value)}")
    if len(value) > max_len:
        raise PagedLabError(f"{field} has {len(value):,} entries; the limit is {max_len:,}")
    return tuple(_int(v, f"{field}[{i}]", lo, hi) for i, v in enumerate(value))


def parse_op(data: Any, *, vocab_size: int | None = 256) -> Op:
    """One operation from its JSON object. Raises PagedLabError naming the problem.

    `prompt_tokens` must be ids of a vocabulary of `vocab_size` (256: tiny-byte's
    bytes); None defers that check to the engine, which knows its model.
    """
    if not isinstance(data, dict):
        raise PagedLabError(f"an operation must be an object, got {json_kind(data)}")
    if "op" not in data:
        raise PagedLabError(f"an operation needs an \"op\" field, one of {', '.join(OP_NAMES)}")
    name = data["op"]
    if not isinstance(name, str):
        raise PagedLabError(f"op must be the name of an operation, one of "
                            f"{', '.join(OP_NAMES)}; got {shown(name)}")
    if name not in _FIELDS:
        raise PagedLabError(f"unknown op {shown(name)}; expected one of {', '.join(OP_NAMES)}")
    required, optional = _FIELDS[name]
    missing = sorted(required - set(data))
    if missing:
        raise PagedLabError(f"missing field {shown(missing[0])}")
    extra = sorted(set(data) - required - optional - ANNOTATIONS)
    if extra:
        fields = ", ".join(sorted(required | optional | ANNOTATIONS))
        raise PagedLabError(f"unknown field {shown(extra[0])} for op {name!r} (its fields: "
                            f"{fields})")
    match name:
        case "add":
            return _parse_add(data, MAX_TOKEN_ID if vocab_size is None else vocab_size - 1)
        case "grow":
            return Grow(check_request_id(data["request"]),
                        _int(data.get("tokens", 1), "tokens", 1, MAX_GROW_TOKENS))
        case "fork":
            return Fork(check_request_id(data["request"]), check_request_id(data["child"], "child"))
        case "finish":
            return Finish(check_request_id(data["request"]))
        case "step":
            return Step(_int(data.get("count", 1), "count", 1, MAX_STEP_COUNT))
        case "shuffle":
            seed = data.get("seed")
            return Shuffle(None if seed is None else _int(seed, "seed", 0, 2**63 - 1))
    raise AssertionError(name)


def check_op(op: object) -> None:
    """Raises PagedLabError where `op`, built in Python rather than parsed, breaks a rule
    `parse_op` holds a file to: a type, a range, a field given with another it excludes.
    `Engine.apply` asks it first, so an operation a caller built wrong (Step(0), Grow of
    1.5 tokens, an Add with no prompt) is refused, leaving the engine as it was; it
    broke the engine half-way, or was applied as an empty operation and counted."""
    match op:
        case Add():
            data: dict[str, Any] = {"request": op.request}
            for key in ("prompt", "prompt_tokens", "prompt_len", "messages", "blocks", "n",
                        "beam_width", "cache_salt"):
                value = getattr(op, key)
                if value is None:
                    continue
                if key == "messages" and isinstance(value, (tuple, list)) and all(
                        isinstance(m, (tuple, list)) and len(m) == 2 for m in value):
                    value = [{"role": role, "content": content} for role, content in value]
                data[key] = list(value) if isinstance(value, tuple) else value
            if op.max_new_tokens != INHERIT:
                data["max_new_tokens"] = op.max_new_tokens
            _parse_add(data, MAX_TOKEN_ID)
        case Grow():
            check_request_id(op.request)
            _int(op.tokens, "tokens", 1, MAX_GROW_TOKENS)
        case Fork():
            check_request_id(op.request)
            check_request_id(op.child, "child")
        case Finish():
            check_request_id(op.request)
        case Step():
            _int(op.count, "count", 1, MAX_STEP_COUNT)
        case Shuffle():
            if op.seed is not None:
                _int(op.seed, "seed", 0, 2**63 - 1)
        case _:
            raise PagedLabError(f"not an operation: {type(op).__name__}; expected one of "
                                f"{', '.join(OP_NAMES)}")


def check_messages(messages: Any) -> tuple[tuple[str, str], ...]:
    """An `Add`'s messages, as (role, content) pairs, checked as a scenario's are: the
    engine's own callers may build an Add without parsing one."""
    if not isinstance(messages, (tuple, list)) or not all(
            isinstance(m, (tuple, list)) and len(m) == 2 for m in messages):
        raise PagedLabError("messages must be (role, content) pairs")
    return _parse_messages([{"role": role, "content": content} for role, content in messages])


def _parse_messages(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise PagedLabError("messages must be a non-empty list of {role, content} objects, "
                            f"got {'an empty array' if value == [] else json_kind(value)}")
    if len(value) > MAX_MESSAGES:
        raise PagedLabError(f"messages has {len(value):,} entries; the limit is {MAX_MESSAGES:,}")
    out: list[tuple[str, str]] = []
    size = 0
    for i, m in enumerate(value):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise PagedLabError(f"messages[{i}] must be an object with exactly role and content")
        role, content = m["role"], m["content"]
        if not isinstance(role, str) or role not in ROLES:
            raise PagedLabError(f"messages[{i}].role must be one of {', '.join(ROLES)}, "
                                f"got {shown(role)}")
        if not isinstance(content, str):
            raise PagedLabError(f"messages[{i}].content must be a string")
        size += unicode_text(content, f"messages[{i}].content")
        out.append((role, content))
    if size > MAX_PROMPT_TOKENS:
        raise PagedLabError(f"messages hold {size:,} bytes of content; the limit is "
                            f"{MAX_PROMPT_TOKENS:,}")
    return tuple(out)


def _parse_add(data: dict[str, Any], top_id: int) -> Add:
    request = check_request_id(data["request"])
    given = [k for k in ("prompt", "prompt_tokens", "prompt_len", "messages") if k in data]
    if len(given) != 1:
        raise PagedLabError("add needs exactly one of prompt, prompt_tokens, prompt_len, "
                            "messages" + (f" (got {', '.join(given)})" if given else ""))
    prompt = prompt_tokens = prompt_len = messages = None
    if "messages" in data:
        messages = _parse_messages(data["messages"])
    elif "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise PagedLabError("prompt must be a non-empty string, got "
                                + shown(data["prompt"]))
        prompt = data["prompt"]
        size = unicode_text(prompt, "prompt")
        if size > MAX_PROMPT_TOKENS:
            raise PagedLabError(f"prompt is {size:,} bytes; the limit is {MAX_PROMPT_TOKENS:,}")
    elif "prompt_tokens" in data:
        prompt_tokens = _int_list(data["prompt_tokens"], "prompt_tokens", 0, top_id,
                                  MAX_PROMPT_TOKENS)
        if not prompt_tokens:
            raise PagedLabError("prompt_tokens must hold at least one token")
    else:
        prompt_len = _int(data["prompt_len"], "prompt_len", 1, MAX_PROMPT_TOKENS)
    max_new: int | Inherit | None = INHERIT
    if "max_new_tokens" in data:
        v = data["max_new_tokens"]
        max_new = None if v is None else _int(v, "max_new_tokens", 1, MAX_NEW_TOKENS)
    blocks = None
    if "blocks" in data and data["blocks"] is not None:
        blocks = _int_list(data["blocks"], "blocks", 0, 2**31 - 1, MAX_PROMPT_TOKENS)
    n = width = None
    if "n" in data and "beam_width" in data:
        raise PagedLabError("give n (parallel samples) or beam_width (beam search), not both")
    if "n" in data:
        n = _int(data["n"], "n", 1, MAX_SAMPLES)
        if blocks is not None:
            raise PagedLabError("n and blocks do not go together: pinned blocks are for one "
                                "request")
        check_request_id(f"{request}.{n - 1}")
    if "beam_width" in data:
        width = _int(data["beam_width"], "beam_width", 1, MAX_SAMPLES)
        if blocks is not None:
            raise PagedLabError("beam_width and blocks do not go together: pinned blocks are "
                                "for one request")
        if max_new is None:
            raise PagedLabError("beam search needs a max_new_tokens limit: its beams all "
                                "grow until they end or reach it")
        # Beams forked later take the next numbers; the id must leave room for them.
        check_request_id(f"{request}.{MAX_BEAM_ID}")
    salt = data.get("cache_salt")
    if salt is not None:
        salt = check_cache_salt(salt)
    return Add(request, prompt, prompt_tokens, prompt_len, max_new, blocks, messages, n, width,
               salt)


def quoted(text: str, limit: int = 24) -> str:
    """`text` in single quotes as a line of text shows it (see `words.legible`), cut to
    its first `limit` - 3 characters and "..." when longer than `limit`."""
    cut = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"'{legible(cut)}'"


def label_narration(step: int, label: str) -> str:
    """The narration a Playground session's exported scenario gives a step: its operation
    label (`describe_op`) as a sentence, "Step 3: step ×4.", so the file reads on its own.
    The Scenarios page, which shows the label above it, leaves a narration that is only
    this unshown."""
    return f"Step {step}: {label}."


def describe_op(op: Op) -> str:
    """A short label for logs and the UI: 'add A (11 tokens)', 'step ×1,500'. Counts
    carry thousands separators and "×", as every count beside them does (a progress
    bar's "Step 2, step ×1,500: 91 iterations of 1,500 done")."""
    match op:
        case Add():
            if op.prompt is not None:
                what = quoted(op.prompt)
            elif op.prompt_tokens is not None:
                what = counted(len(op.prompt_tokens), "token")
            elif op.messages is not None and len(op.messages) == 1:
                what = "chat " + quoted(op.messages[0][1])
            elif op.messages is not None:
                what = counted(len(op.messages), "message")
            else:
                what = counted(op.prompt_len or 0, "random token")
            samples = "" if op.n is None else f" ×{counted(op.n, 'sample')}"
            if op.beam_width is not None:
                samples = f" beam width {op.beam_width}"
            salt = "" if op.cache_salt is None else f" salt {quoted(op.cache_salt)}"
            return f"add {op.request} ({what}){samples}{salt}"
        case Grow():
            return f"grow {op.request} +{op.tokens}"
        case Fork():
            return f"fork {op.request} -> {op.child}"
        case Finish():
            return f"finish {op.request}"
        case Step():
            return "step" if op.count == 1 else f"step ×{op.count:,}"
        case Shuffle():
            return "shuffle" if op.seed is None else f"shuffle (seed {op.seed})"
    raise AssertionError(op)
