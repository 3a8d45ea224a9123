"""The Playground's logic that needs no Streamlit: settings, engines, status lines.

The Playground holds one engine per browser session. Its settings are an
`EngineConfig` (which fixes the pool and the model, so changing it means a new
engine) plus a device and a kernel (which do not: the same state can run on
another kernel). What a person types becomes an operation or a config in
backend/sessions/forms.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.core.config import (
    MODELS,
    REAL_MODELS,
    EngineConfig,
)
from backend.core.errors import PagedLabError
from backend.engine.engine import Engine
from backend.engine.ops import Op
from backend.engine.results import OpResult
from backend.io.recompute import Progress as RestoreProgress
from backend.io.restore import check_snapshot, restore_engine
from backend.io.snapshot import CONFIG_EXTRA, export_snapshot
from backend.kernels import KERNELS, available_devices, select_kernels
from backend.models.gguf_loader import Progress, find_gguf
from backend.models.registry import ModelCard, is_loaded, model_card, preload
from backend.sessions.budget import SERVER_BUDGET, KVBudget
from backend.sessions.history import Entry, History

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
                        progress: RestoreProgress | None = None,
                        check_scores: bool = True) -> Engine:
    """The state a snapshot describes, on the settings' device and kernel, within budget.

    The budget is checked on the snapshot's config before any tensor is
    allocated; a malformed config is left for `restore_engine` to name.
    `check_scores` as `restore_engine`'s.
    """
    config = snapshot_config(data)
    def make() -> Engine:
        return restore_engine(data, device=settings.device, kernel=settings.kernel,
                              progress=progress, check_scores=check_scores)

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
    restored = restore_engine(before, device=settings.device, kernel=settings.kernel,
                              check_scores=False)
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
        return restore_engine(snapshot, device=device, kernel=kernel, check_scores=False)

    if owner is None:
        return make()
    return budget.built(budget.claim(engine.config, owner, replacing=engine), make)


def kept_snapshot(history: History, step: int) -> dict[str, Any] | None:
    """The snapshot the history holds for the state after operation `step`, or None when
    it is no longer kept (the history keeps the newest operations only).

    A step read back from a saved session is checked as a restore would check it the
    first time it is asked for (`check_snapshot`: no K/V, tens of milliseconds). Raises
    PagedLabError, after dropping every step read back with it but the live state's
    (Mutates), where those checks refuse it: the views assume a state the engine could
    have been in.

    A binary search on the steps, which ascend: rebuilding a kept snapshot slices the
    shared event list, so each probe costs what the run's events do.
    """
    lo, hi = 0, len(history) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        entry, snap = history.entry(mid)
        if snap["step"] == step:
            _check_kept(history, entry, snap)
            return snap
        if snap["step"] < step:
            lo = mid + 1
        else:
            hi = mid - 1
    return None


@dataclass(frozen=True, slots=True)
class Known:
    """The states a history holds that passed their checks, oldest first, and why its
    steps read back from a saved session were dropped (None: none was refused)."""

    snapshots: list[dict[str, Any]]
    refused: str | None = None


def known_snapshots(history: History) -> Known:
    """Every state the history holds, oldest first, each read back from a saved session
    checked first (see `kept_snapshot`); where one is refused, the steps read back with
    it are dropped and the states that passed returned, with the reason: a scenario
    export's earlier `expect` values then come from the engine's own states alone, and
    its description says why some steps have none. The reason is the history's, so an
    export after the one (or the timeline's look) that found the damage says it too.
    Safe from a download callable's thread: it checks a copy of the entries, and marks
    the entry it checked."""
    entries = history.entries()
    for entry, snap in entries:
        try:
            _check_kept(history, entry, snap)
        except PagedLabError:
            break
    return Known([snap for entry, snap in entries if entry.checked], history.dropped_because)


def _check_kept(history: History, entry: Entry, snap: dict[str, Any]) -> None:
    """Check `entry` (whose snapshot is `snap`) once if it was read back from a saved
    session, and mark it: the entry, not its index, which a step recorded meanwhile
    moves. Raises PagedLabError, after dropping the steps read back (Mutates), where
    restore refuses it."""
    if entry.checked:
        return
    try:
        check_snapshot(snap)
    except PagedLabError as exc:
        why = (f"the saved state after step {snap['step']} could not be read back ({exc}), "
               "so the steps saved before this session was opened are left out of its "
               "history")
        history.drop_saved(why)
        raise PagedLabError(why) from None
    entry.checked = True


def kept_steps(history: History) -> tuple[int, int] | None:
    """The first and last step whose state the history holds, or None while it holds none."""
    if not len(history):
        return None
    return int(history[0]["step"]), int(history[-1]["step"])
