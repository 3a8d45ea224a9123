"""Engine configuration: pool, model and device settings, validated once.

The field names and defaults are those of a scenario file's `config` object
(CONTRACT.md). `EngineConfig.from_json` is the one place user-supplied
settings are checked; everything downstream may trust a config.

`model` names the network: "tiny-byte" (seeded random weights over bytes;
its dimensions are settings) or a pretrained model from `REAL_MODELS`, whose
dimensions are fixed by its weights. They are listed here, below the models
package, so a scenario is validated without loading any weights; the loader
checks the file against them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from backend.core.budgets import MAX_BUDGET, SchedulerBudgets
from backend.core.checks import check_int, json_kind, shown, written_as_float
from backend.core.errors import PagedLabError

# A temperature under this is greedy (vLLM's _SAMPLING_EPS): logits divided by 1e-320
# overflow to infinities, whose argmax is the lowest id among them, not the largest logit.
GREEDY_BELOW = 1e-5

Dtype = Literal["float32", "float16", "bfloat16"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

MAX_NUM_BLOCKS = 65_536
MAX_NEW_TOKENS = 1_000_000   # a request's max_new_tokens (the config's default, a restore)
MAX_BLOCK_SIZE = 256
# Refuse pools whose K/V tensors would not fit comfortably in a laptop's memory.
MAX_KV_BYTES = 2 << 30
MAX_WEIGHT_BYTES = 1 << 30

TINY_BYTE = "tiny-byte"
SMOLLM2 = "smollm2-135m"
MODELS = (TINY_BYTE, SMOLLM2)
DIM_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim")


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The shape of a pretrained llama-style model (what its weight file must hold)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    # The positions it was trained on (llama.context_length): a request holds at most
    # this many tokens, as vLLM's max_model_len bounds a sequence.
    context_length: int

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        """Embedding (tied with the output head), per-layer projections and norms, final norm."""
        d, hd, ff = self.hidden_size, self.head_dim, self.intermediate_size
        attn = 2 * d * self.num_heads * hd + 2 * d * self.num_kv_heads * hd
        return self.vocab_size * d + self.num_layers * (attn + 3 * d * ff + 2 * d) + d


# SmolLM2-135M-Instruct: 30 layers, 9 query and 3 KV heads of 64, FFN 1536, 49,152 tokens,
# a context of 8,192.
REAL_MODELS: dict[str, ModelDims] = {SMOLLM2: ModelDims(30, 9, 3, 64, 1536, 49_152, 8192)}


def vocab_size_of(model: str) -> int:
    """Token ids of `model` are 0..vocab_size_of(model) - 1."""
    dims = REAL_MODELS.get(model)
    return 256 if dims is None else dims.vocab_size


# The tiny model's settings its cache key names, with the label each is written under
# ("seed=0|L=2|..."): its K/V depend on them. Fixed: every snapshot's keys depend on it.
_TINY_SALT = (("seed", "seed"), ("num_layers", "L"), ("num_heads", "H"),
              ("num_kv_heads", "KVH"), ("head_dim", "D"))


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything that fixes an engine's behaviour (device choice aside)."""

    num_blocks: int = 32
    block_size: int = 4
    prefix_caching: bool = True
    allocation: Literal["fifo", "random"] = "fifo"
    seed: int = 0
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    dtype: Dtype = "float32"
    max_new_tokens: int | None = None
    model: str = TINY_BYTE
    # None: the model's default sampling (tiny-byte: today's, exactly).
    temperature: float | None = None
    top_p: float | None = None
    # vLLM's scheduler knobs (backend.core.budgets); None: no limit (watermark: 0 blocks).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    watermark_blocks: int | None = None
    # How a preempted request gives its blocks back: "recompute" frees them (its
    # K/V is recomputed on readmission); "swap" copies them to a host pool of
    # num_cpu_blocks blocks and back when it resumes.
    preemption: Literal["recompute", "swap"] = "recompute"
    num_cpu_blocks: int = 0

    def __post_init__(self) -> None:
        # Direct construction cannot bypass what from_json guarantees about the model.
        if self.model not in MODELS:
            raise PagedLabError(f"unknown model {self.model!r}; choose one of "
                                f"{', '.join(MODELS)}")
        dims = REAL_MODELS.get(self.model)
        if dims is not None:
            for key in DIM_FIELDS:
                if getattr(self, key) != getattr(dims, key):
                    raise PagedLabError(
                        f"{self.model} has {key} {getattr(dims, key)}, not "
                        f"{getattr(self, key)}; use EngineConfig.from_json or "
                        "EngineConfig.for_model")

    @staticmethod
    def for_model(model: str, **settings: Any) -> EngineConfig:
        """A validated config for `model` with its own dimensions and these settings."""
        return EngineConfig.from_json({**settings, "model": model})

    @property
    def dims(self) -> ModelDims | None:
        """The pretrained model's shape, or None for tiny-byte."""
        return REAL_MODELS.get(self.model)

    @property
    def context_length(self) -> int | None:
        """The most tokens a request may hold: a real model's context, or None (tiny-byte,
        whose random weights were trained on no positions, has no limit of its own)."""
        dims = self.dims
        return None if dims is None else dims.context_length

    def within_context(self, num_tokens: int) -> int:
        """`num_tokens`, or the model's context where it passes that: the most a request
        that would grow to `num_tokens` holds (it finishes there, finish_reason
        "context")."""
        context = self.context_length
        return num_tokens if context is None else min(num_tokens, context)

    @property
    def vocab_size(self) -> int:
        return vocab_size_of(self.model)

    @property
    def budgets(self) -> SchedulerBudgets:
        """The scheduler's per-iteration limits, as the simulator takes them too."""
        return SchedulerBudgets(self.max_num_seqs, self.max_num_batched_tokens,
                                self.watermark_blocks)

    @property
    def hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_block(self) -> int:
        """2 (K and V) x layers x kv heads x head_dim x block_size x bytes per element."""
        return (2 * self.num_layers * self.num_kv_heads * self.head_dim * self.block_size
                * self.dtype_bytes)

    @property
    def num_parameters(self) -> int:
        """Weights of the model: a real one's own count, else TinyByteLM's with these settings."""
        if self.dims is not None:
            return self.dims.num_parameters
        d, hd = self.hidden_size, self.head_dim
        attn = d * self.num_heads * hd * 2 + d * self.num_kv_heads * hd * 2
        mlp = 3 * d * (2 * d)
        return 2 * 256 * d + self.num_layers * (attn + mlp + 2 * d) + d

    @property
    def weight_bytes(self) -> int:
        return self.num_parameters * self.dtype_bytes

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def host_kv_bytes(self) -> int:
        """The host pool's K/V (swap preemption's; none with recompute)."""
        return self.num_cpu_blocks * self.bytes_per_block if self.preemption == "swap" else 0

    def cache_salt(self) -> str:
        """Names everything a block's K/V depend on besides its tokens.

        The weights are seeded by `seed`, so the seed is part of the key: a
        block computed by another model must never be a prefix hit. A real
        model's weights do not depend on the seed; its name is the key. (The
        tiny model's key is unchanged so old snapshots keep their hashes.)
        """
        if self.dims is not None:
            return f"pagedlab-1|model={self.model}|{self.dtype}"
        named = "".join(f"{label}={getattr(self, name)}|" for name, label in _TINY_SALT)
        return f"pagedlab-1|{named}{self.dtype}"

    def cache_salt_fields(self) -> tuple[str, ...]:
        """The config fields `cache_salt` names, for a message about a key they change."""
        if self.dims is not None:
            return ("model", "dtype")
        return (*(name for name, _ in _TINY_SALT), "dtype")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> EngineConfig:
        """These settings with `changes`, validated. Changing `model` drops the old model's
        dimensions (a real model brings its own; tiny-byte goes back to its defaults)
        unless `changes` sets them."""
        base = self.to_json()
        if changes.get("model", self.model) != self.model:
            base = {k: v for k, v in base.items() if k not in DIM_FIELDS}
        return EngineConfig.from_json({**base, **changes})

    @staticmethod
    def from_json(data: Any, *, where: str = "config",
                  ignore: frozenset[str] = frozenset()) -> EngineConfig:
        """Validate a scenario's `config` object. Unknown keys are refused (typos)."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PagedLabError(f"{where} must be an object, got {json_kind(data)}")
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(data) - known - ignore)
        if unknown:
            raise PagedLabError(f"{where}: unknown field {unknown[0]!r}; known fields are "
                                f"{', '.join(sorted(known))}")
        cfg = EngineConfig()
        model = _check_field("model", data.get("model", TINY_BYTE), where)
        dims = REAL_MODELS.get(model)
        values: dict[str, Any] = {}
        # In the fields' declared order, so a config with two bad fields is always refused
        # for the same one (a set's order changes with the process's hash seed).
        for key in (f.name for f in fields(EngineConfig) if f.name in data):
            if dims is not None and key in DIM_FIELDS:
                # The weights fix these: an equal value is harmless (snapshots carry
                # them), any other is a config meant for another model.
                have = getattr(dims, key)
                v = data[key]
                if isinstance(v, bool) or not isinstance(v, int):
                    # 30.0 equals 30, but a count written as a float is refused everywhere.
                    raise PagedLabError(f"{where}: {key} must be an integer, got {shown(v)}"
                                        + written_as_float(v))
                if v != have:
                    raise PagedLabError(f"{where}: {key} is {v!r} but {model} has {key} "
                                        f"{have}; a real model's dimensions come from its "
                                        "weights (leave it out)")
                continue
            values[key] = _check_field(key, data[key], where,
                                       swap=data.get("preemption") == "swap")
        if dims is not None:
            values.update({key: getattr(dims, key) for key in DIM_FIELDS})
        cfg = replace(cfg, **values)
        if cfg.num_heads % cfg.num_kv_heads:
            raise PagedLabError(
                f"{where}: num_heads ({cfg.num_heads}) must be a multiple of num_kv_heads "
                f"({cfg.num_kv_heads}) for grouped-query attention")
        if cfg.watermark_blocks is not None and cfg.watermark_blocks >= cfg.num_blocks:
            raise PagedLabError(
                f"{where}: watermark_blocks ({cfg.watermark_blocks:,}) must be less than "
                f"num_blocks ({cfg.num_blocks:,}): admission keeps that many blocks free, so no "
                "request could ever start")
        if cfg.preemption == "swap" and cfg.num_cpu_blocks < 1:
            raise PagedLabError(f"{where}: preemption \"swap\" needs a host pool: set "
                                "num_cpu_blocks to 1 or more")
        if cfg.num_cpu_blocks * cfg.bytes_per_block > MAX_KV_BYTES:
            raise PagedLabError(
                f"{where}: the host pool would take "
                f"{cfg.num_cpu_blocks * cfg.bytes_per_block / 2**20:,.0f} MiB "
                f"({cfg.num_cpu_blocks:,} blocks x {cfg.bytes_per_block:,} bytes); the limit is "
                f"{MAX_KV_BYTES >> 20:,} MiB")
        if cfg.weight_bytes > MAX_WEIGHT_BYTES:
            raise PagedLabError(
                f"{where}: the model's weights would take {cfg.weight_bytes / 2**20:,.0f} MiB; "
                f"the limit is {MAX_WEIGHT_BYTES >> 20:,} MiB (use fewer layers, heads or a "
                "smaller head_dim)")
        if cfg.kv_bytes > MAX_KV_BYTES:
            raise PagedLabError(
                f"{where}: the K/V pool would take {cfg.kv_bytes / 2**20:,.0f} MiB "
                f"({cfg.num_blocks:,} blocks x {cfg.bytes_per_block:,} bytes); the limit is "
                f"{MAX_KV_BYTES >> 20:,} MiB")
        return cfg


def _int_in(key: str, v: Any, lo: int, hi: int, where: str) -> int:
    return check_int(v, f"{where}: {key}", lo, hi)


def check_field(key: str, value: Any, where: str = "config", *, swap: bool = False) -> Any:
    """One config field's value checked on its own (its type and range), as `from_json`
    checks it; the value as the config keeps it. Raises PagedLabError. The checks that
    tie fields together (heads and KV heads, the watermark and the pool) are
    `from_json`'s, but for `swap`: preemption "swap", under which the host pool's range
    starts at 1."""
    return _check_field(key, value, where, swap=swap)


def _check_field(key: str, v: Any, where: str, *, swap: bool = False) -> Any:
    match key:
        case "num_blocks":
            return _int_in(key, v, 1, MAX_NUM_BLOCKS, where)
        case "block_size":
            return _int_in(key, v, 1, MAX_BLOCK_SIZE, where)
        case "prefix_caching":
            if not isinstance(v, bool):
                raise PagedLabError(f"{where}: prefix_caching must be true or false, "
                                    f"got {shown(v)}")
            return v
        case "allocation":
            if not isinstance(v, str) or v not in ("fifo", "random"):
                raise PagedLabError(f"{where}: allocation must be \"fifo\" or \"random\", "
                                    f"got {shown(v)}")
            return v
        case "seed":
            return _int_in(key, v, 0, 2**63 - 1, where)
        case "num_layers":
            return _int_in(key, v, 1, 8, where)
        case "num_heads":
            return _int_in(key, v, 1, 32, where)
        case "num_kv_heads":
            return _int_in(key, v, 1, 32, where)
        case "head_dim":
            d = _int_in(key, v, 16, 256, where)
            if d % 2:
                raise PagedLabError(f"{where}: head_dim must be even (RoPE rotates pairs), "
                                    f"got {d}")
            return d
        case "dtype":
            if not isinstance(v, str) or v not in DTYPE_BYTES:
                raise PagedLabError(f"{where}: dtype must be one of "
                                    f"{', '.join(DTYPE_BYTES)}, got {shown(v)}")
            return v
        case "max_new_tokens":
            return None if v is None else _int_in(key, v, 1, MAX_NEW_TOKENS, where)
        case "model":
            if not isinstance(v, str) or v not in MODELS:
                raise PagedLabError(f"{where}: model must be one of "
                                    f"{', '.join(repr(m) for m in MODELS)}, got {shown(v)}")
            return v
        case "temperature":
            t = _number(key, v, where)
            if t is not None and t < 0:
                raise PagedLabError(f"{where}: temperature must be >= 0 (0, or anything under "
                                    f"{GREEDY_BELOW:g}, is greedy), got {t}")
            # + 0.0 reads -0.0 (which passes the check) as 0.0, so it is written back as 0.
            return None if t is None else t + 0.0
        case "top_p":
            p = _number(key, v, where)
            if p is not None and not 0 < p <= 1:
                raise PagedLabError(f"{where}: top_p must be in (0, 1], got {p}")
            return p
        case "max_num_seqs" | "max_num_batched_tokens":
            return None if v is None else _int_in(key, v, 1, MAX_BUDGET, where)
        case "watermark_blocks":
            return None if v is None else _int_in(key, v, 0, MAX_NUM_BLOCKS, where)
        case "preemption":
            if not isinstance(v, str) or v not in ("recompute", "swap"):
                raise PagedLabError(f"{where}: preemption must be \"recompute\" or \"swap\", "
                                    f"got {shown(v)}")
            return v
        case "num_cpu_blocks":
            # (A 0.0 is refused as a float below, as any other count written so.)
            if swap and type(v) is int and v == 0:
                raise PagedLabError(f"{where}: preemption \"swap\" needs a host pool: set "
                                    "num_cpu_blocks to 1 or more")
            # Under swap, 0 is no host pool, so the range a refusal names starts at 1.
            return _int_in(key, v, 1 if swap else 0, MAX_NUM_BLOCKS, where)
    raise AssertionError(key)


def _number(key: str, v: Any, where: str) -> float | None:
    """A finite JSON number as a float, or None for null (the model's default)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PagedLabError(f"{where}: {key} must be a number or null, got {shown(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise PagedLabError(f"{where}: {key} is out of range, got {shown(v)}") from None
    if not math.isfinite(f):
        raise PagedLabError(f"{where}: {key} must be finite, got {shown(v)}")
    return f
