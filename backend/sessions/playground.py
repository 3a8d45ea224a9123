"""The Playground's logic that needs no Streamlit: settings, engines, op building.

The Playground holds one engine per browser session. Its settings are an
`EngineConfig` (which fixes the pool and the model, so changing it means a new
engine) plus a device and a kernel (which do not: the same state can run on
another kernel). Everything a person types is turned into CONTRACT.md's
operation JSON and parsed by `backend.engine.ops.parse_op`, so the app accepts
exactly what a scenario file accepts, with the same messages.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core.config import (
    DIM_FIELDS,
    MAX_KV_BYTES,
    MAX_NUM_BLOCKS,
    MODELS,
    REAL_MODELS,
    TINY_BYTE,
    EngineConfig,
)
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.engine.ops import Add, Op, describe_op, parse_op
from backend.engine.request import Request, kept_for_sample, numbered
from backend.engine.results import OpResult
from backend.io.recompute import Progress as RestoreProgress
from backend.io.restore import restore_engine
from backend.io.snapshot import CONFIG_EXTRA, export_snapshot
from backend.kernels import KERNELS, available_devices, select_kernels
from backend.models.gguf_loader import Progress, find_gguf
from backend.models.registry import ModelCard, is_loaded, model_card, preload
from backend.sessions.budget import SERVER_BUDGET, KVBudget
from backend.sessions.history import History

ALLOCATION_LABELS = {"fifo": "queue order", "random": "scattered"}
KERNEL_LABELS = {"auto": "auto (Triton)", "triton": "Triton", "torch": "torch"}

# Model sizes a person can pick without knowing the four numbers; "custom" keeps theirs.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16},
    "small": {"num_layers": 4, "num_heads": 8, "num_kv_heads": 2, "head_dim": 32},
    "medium": {"num_layers": 8, "num_heads": 16, "num_kv_heads": 4, "head_dim": 64},
}
MODEL_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim")


def preset_of(config: EngineConfig) -> str:
    """The preset whose dimensions `config` has, or "custom"."""
    dims = {f: getattr(config, f) for f in MODEL_FIELDS}
    for name, preset in MODEL_PRESETS.items():
        if preset == dims:
            return name
    return "custom"


def model_choices() -> list[str]:
    """The models the sidebar offers: tiny-byte first (the fast default), then real ones."""
    return list(MODELS)


def model_cards(config: EngineConfig) -> dict[str, ModelCard]:
    """Every model's card in `config`'s dtype; tiny-byte's sizes follow `config`'s dims
    when it is tiny-byte (its cost is what the fields say)."""
    return {m: model_card(m, config.dtype, config) for m in MODELS}


def model_problem(model: str) -> str | None:
    """Why `model` cannot load here (its package is missing), or None. Cheap: no weights
    are read, only the file is looked for."""
    if model not in REAL_MODELS:
        return None
    try:
        find_gguf()
    except PagedLabError as exc:
        return str(exc)
    return None


def model_loaded(settings: Settings) -> bool:
    """Whether an engine with `settings` starts at once: no weights to load first."""
    c = settings.config
    return is_loaded(c.model, c.dtype, _device_of(settings))


def load_model(settings: Settings, progress: Progress | None = None) -> None:
    """Load the weights an engine with `settings` needs, reporting `progress`; nothing for
    tiny-byte or weights this process has. Raises PagedLabError (a missing package, in
    one line) before any engine is built."""
    c = settings.config
    if c.model in REAL_MODELS:
        preload(c.model, c.dtype, _device_of(settings), progress)


def _device_of(settings: Settings) -> str:
    # The weights are cached per device; "auto" is whichever the kernels would pick.
    return str(select_kernels(settings.device, settings.kernel).device)


def device_choices() -> list[str]:
    """Devices offered: only those this machine has ("auto" picks the best)."""
    return ["auto", *available_devices()]


def kernel_choices() -> list[str]:
    return list(KERNELS)


@dataclass(frozen=True, slots=True)
class Settings:
    """What the sidebar sets: the engine's config, and where its kernels run."""

    config: EngineConfig = field(default_factory=EngineConfig)
    device: str = "auto"
    kernel: str = "auto"


def build_engine(settings: Settings, owner: str, *, replacing: Engine | None = None,
                 budget: KVBudget = SERVER_BUDGET, check: bool = True) -> Engine:
    """A fresh engine for the session `owner`, counted against the K/V budget.

    Raises PagedLabError for a device or kernel this machine lacks, or a pool
    the session's or the server's budget has no room for (nothing is built).
    `check=False` counts the engine without refusing it: a new session's
    default pool (64 KiB), which a full server must still give every visitor.
    """
    key = (budget.claim(settings.config, owner, replacing=replacing) if check
           else budget.claim_unchecked(settings.config, owner))
    return budget.built(key, lambda: Engine(settings.config, device=settings.device,
                                            kernel=settings.kernel))


def restore_for_session(data: dict[str, Any], settings: Settings, owner: str, *,
                        replacing: Engine | None = None, budget: KVBudget = SERVER_BUDGET,
                        progress: RestoreProgress | None = None) -> Engine:
    """The state a snapshot describes, on the settings' device and kernel, within budget.

    The budget is checked on the snapshot's config before any tensor is
    allocated; a malformed config is left for `restore_engine` to name.
    """
    config = snapshot_config(data)
    def make() -> Engine:
        return restore_engine(data, device=settings.device, kernel=settings.kernel,
                              progress=progress)

    if config is None:
        return budget.track(make(), owner)
    return budget.built(budget.claim(config, owner, replacing=replacing), make)


def snapshot_config(data: dict[str, Any]) -> EngineConfig | None:
    """The config a snapshot names, or None if it names none that is valid (then
    `restore_engine` says what is wrong with it)."""
    cfg = data.get("config")
    if not isinstance(cfg, dict):
        return None
    try:
        return EngineConfig.from_json(cfg, where="snapshot.config", ignore=CONFIG_EXTRA)
    except PagedLabError:
        return None


@dataclass(frozen=True, slots=True)
class Applied:
    """What `apply_or_recover` did."""

    engine: Engine            # the session's engine from now on (a new one after a recovery)
    result: OpResult | None   # None when the operation failed half-way
    failure: str | None       # what went wrong, when the engine had to be rebuilt


def apply_or_recover(engine: Engine, op: Op, before: dict[str, Any],
                     settings: Settings, owner: str,
                     progress: Callable[[int, int], bool] | None = None) -> Applied:
    """Apply `op`; if it fails half-way, a working engine in the state before it.

    `before` is the engine's snapshot now. A refusal (PagedLabError) changes
    nothing and is raised as it is. Any other failure leaves `engine` broken
    (see Engine.apply); the state is rebuilt from `before` (K/V recomputed
    from the tokens) on a new engine, which the caller installs. `progress` is
    the engine's (see Engine.apply).
    """
    try:
        return Applied(engine, engine.apply(op, progress=progress), None)
    except PagedLabError:
        raise
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    restored = restore_engine(before, device=settings.device, kernel=settings.kernel)
    return Applied(SERVER_BUDGET.track(restored, owner), None, failure)


def has_state(engine: Engine) -> bool:
    """Would replacing this engine throw away anything a person did?"""
    return engine.step > 0 or bool(engine.requests)


def switch_kernels(engine: Engine, device: str, kernel: str, owner: str | None = None, *,
                   budget: KVBudget = SERVER_BUDGET) -> Engine:
    """The same state, with its model steps run by another kernel (or on another device).

    On the same device only the kernel changes: the K/V tensors, tables and
    pending logits stay exactly as they are. On another device the state is
    carried over through a snapshot (K/V recomputed from the tokens there), on
    a new engine counted for `owner` (a browser session) in place of this one.
    Raises PagedLabError for a device or kernel this machine lacks.
    """
    if select_kernels(device, kernel).device == engine.device:
        with engine.lock:
            engine.set_kernels(device, kernel)
        return engine
    with engine.lock:
        snapshot = export_snapshot(engine)
    def make() -> Engine:
        return restore_engine(snapshot, device=device, kernel=kernel)

    if owner is None:
        return make()
    return budget.built(budget.claim(engine.config, owner, replacing=engine), make)


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
           chat: bool = False) -> Add:
    """The `add` operation for the Add form. Raises PagedLabError for a bad combination,
    named by the form's labels (the scenario parser would name its own fields).

    `default_max_new` is the engine's limit for a request that gives none (the
    sidebar's "Default max new tokens"); a beam search needs one of the two.
    `chat` sends the text as one user message through the model's chat template
    (as a scenario's `messages`), so the prompt ends with the assistant's turn open.

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


def _numbered(rid: str) -> tuple[str, int, str]:
    """Sort key of an id by its trailing number where it has one: B.7 before B.11."""
    named = numbered(rid)
    return (rid, -1, rid) if named is None else (*named, rid)


def summarize(result: OpResult, snapshot: dict[str, Any]) -> str:
    """One line saying what an applied operation did, for the page's status line.

    `snapshot` is the state it left: a beam search's finished beams are told apart
    by their finish reason, those it dropped from those that finished.
    """
    parts = [f"Step {result.step}: {describe_op(result.op)}"]
    if result.admitted:
        parts.append("admitted " + ", ".join(result.admitted))
    if result.generated:
        parts.append(f"generated {counted(len(result.generated), 'token')}")
    if result.preempted:
        parts.append("preempted " + ", ".join(result.preempted))
    reasons = {r["id"]: r["finish_reason"] for r in snapshot["requests"]}
    # A round drops beams in score order; listed by number they read as a set
    # ("B.7, B.11", not "B.11, B.7").
    dropped = sorted((rid for rid in result.finished if reasons.get(rid) == "dropped"),
                     key=_numbered)
    finished = [rid for rid in result.finished if reasons.get(rid) != "dropped"]
    if finished:
        parts.append("finished " + ", ".join(finished))
    if dropped:
        parts.append("dropped " + ", ".join(dropped))
    kinds: dict[str, int] = {}
    for e in result.events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    if kinds:
        parts.append("events: " + ", ".join(f"{n} {k}{_free_split(result) if k == 'free' else ''}"
                                            for k, n in kinds.items()))
    return " · ".join(parts)


def _free_split(result: OpResult) -> str:
    """What a count of `free` events means. A free of a block another holder has only
    lowers its reference count; that holder may free it later in the same operation
    (a finished beam search, a whole batch), so "still held" counts only the blocks
    whose last free here left a holder: "4 free (2 back to the free queue, 2 only
    lowered a count; 2 still held)"."""
    frees = [e for e in result.events if e.kind == "free"]
    back = sum(1 for e in frees if not e.ref_count)
    lowered = len(frees) - back
    if not lowered:
        return ""
    last = {e.block: e.ref_count for e in frees}
    held = sum(1 for count in last.values() if count)
    if not back:
        return f" (each only lowered a count; {held} still held)"
    return (f" ({back} back to the free queue, {lowered} only lowered a count"
            + (f"; {held} still held)" if held else ")"))


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
    _check_past_range(data, budget)
    config = EngineConfig.from_json(data, where="settings")
    budget.check_size(config)
    return config


def _check_past_range(data: dict[str, Any], budget: KVBudget) -> None:
    """A pool size past the config's range is refused by the session's limit when that
    is the tighter bound (a real model's blocks are large): "2,912 blocks fit" helps
    more than "must be in 1..65,536". Otherwise the range check names it."""
    wanted = data.get("num_blocks")
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted <= MAX_NUM_BLOCKS:
        return
    # The probe has one block and no watermark (which must stay under the pool).
    try:
        probe = EngineConfig.from_json({**data, "num_blocks": 1, "watermark_blocks": None},
                                       where="settings")
    except PagedLabError:
        return   # no block size to count with: the full check names the range
    # (A session limit past the 2 GiB any one pool may take would name a count no config
    # may hold: there the range says it.)
    if (budget.per_session <= MAX_KV_BYTES
            and budget.per_session // probe.bytes_per_block < MAX_NUM_BLOCKS):
        budget.check_size(probe, wanted)



def kept_snapshot(history: History, step: int) -> dict[str, Any] | None:
    """The snapshot the history holds for the state after operation `step`, or None when
    it is no longer kept (the history keeps the newest operations only).

    A binary search on the steps, which ascend: rebuilding a kept snapshot slices the
    shared event list, so each probe costs what the run's events do.
    """
    lo, hi = 0, len(history) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        snap = history[mid]
        if snap["step"] == step:
            return snap
        if snap["step"] < step:
            lo = mid + 1
        else:
            hi = mid - 1
    return None


def kept_steps(history: History) -> tuple[int, int] | None:
    """The first and last step whose state the history holds, or None while it holds none."""
    if not len(history):
        return None
    return int(history[0]["step"]), int(history[-1]["step"])
