"""Engine configuration: pool, model and device settings, validated once.

The field names and defaults are those of a scenario file's `config` object
(CONTRACT.md). `EngineConfig.from_json` is the one place user-supplied
settings are checked; everything downstream may trust a config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from backend.core.errors import PagedLabError

Dtype = Literal["float32", "float16", "bfloat16"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

MAX_NUM_BLOCKS = 65_536
MAX_BLOCK_SIZE = 256
# Refuse pools whose K/V tensors would not fit comfortably in a laptop's memory.
MAX_KV_BYTES = 2 << 30
MAX_WEIGHT_BYTES = 1 << 30


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
        """Weights of backend.models.tiny_byte.TinyByteLM with these settings."""
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

    def cache_salt(self) -> str:
        """Names everything a block's K/V depend on besides its tokens.

        The weights are seeded by `seed`, so the seed is part of the key: a
        block computed by another model must never be a prefix hit.
        """
        return (f"pagedlab-1|seed={self.seed}|L={self.num_layers}|H={self.num_heads}|"
                f"KVH={self.num_kv_heads}|D={self.head_dim}|{self.dtype}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> EngineConfig:
        return EngineConfig.from_json({**self.to_json(), **changes})

    @staticmethod
    def from_json(data: Any, *, where: str = "config",
                  ignore: frozenset[str] = frozenset()) -> EngineConfig:
        """Validate a scenario's `config` object. Unknown keys are refused (typos)."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PagedLabError(f"{where} must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(data) - known - ignore)
        if unknown:
            raise PagedLabError(f"{where}: unknown field {unknown[0]!r}; known fields are "
                                f"{', '.join(sorted(known))}")
        cfg = EngineConfig()
        values: dict[str, Any] = {}
        for key in known & set(data):
            values[key] = _check_field(key, data[key], where)
        cfg = replace(cfg, **values)
        if cfg.num_heads % cfg.num_kv_heads:
            raise PagedLabError(
                f"{where}: num_heads ({cfg.num_heads}) must be a multiple of num_kv_heads "
                f"({cfg.num_kv_heads}) for grouped-query attention")
        if cfg.weight_bytes > MAX_WEIGHT_BYTES:
            raise PagedLabError(
                f"{where}: the model's weights would take {cfg.weight_bytes / 2**20:.0f} MiB; "
                f"the limit is {MAX_WEIGHT_BYTES >> 20} MiB (use fewer layers, heads or a "
                "smaller head_dim)")
        if cfg.kv_bytes > MAX_KV_BYTES:
            raise PagedLabError(
                f"{where}: the K/V pool would take {cfg.kv_bytes / 2**20:.0f} MiB "
                f"({cfg.num_blocks} blocks x {cfg.bytes_per_block} bytes); the limit is "
                f"{MAX_KV_BYTES >> 20} MiB")
        return cfg


def _int_in(key: str, v: Any, lo: int, hi: int, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise PagedLabError(f"{where}: {key} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise PagedLabError(f"{where}: {key} must be in {lo}..{hi}, got {v}")
    return v


def _check_field(key: str, v: Any, where: str) -> Any:
    match key:
        case "num_blocks":
            return _int_in(key, v, 1, MAX_NUM_BLOCKS, where)
        case "block_size":
            return _int_in(key, v, 1, MAX_BLOCK_SIZE, where)
        case "prefix_caching":
            if not isinstance(v, bool):
                raise PagedLabError(f"{where}: prefix_caching must be true or false, got {v!r}")
            return v
        case "allocation":
            if not isinstance(v, str) or v not in ("fifo", "random"):
                raise PagedLabError(f"{where}: allocation must be \"fifo\" or \"random\", "
                                    f"got {v!r}")
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
                                    f"{', '.join(DTYPE_BYTES)}, got {v!r}")
            return v
        case "max_new_tokens":
            return None if v is None else _int_in(key, v, 1, 1_000_000, where)
    raise AssertionError(key)
