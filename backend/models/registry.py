"""Which model a config names, and the process-wide cache of pretrained weights.

    build_model(config, device)  the engine's model: TinyByteLM (seeded, built
                                 per engine, fast) or SmolLM2 over shared weights
    codec_for(model)             text <-> token ids for a model name (no weights)
    preload(model, ...)          load a real model's weights now, with progress
    is_loaded(model, ...)        whether that load has happened in this process
    model_card(model)            what a model is and what it costs, for pickers

A real model's weights are read and dequantized once per process for each
(device, dtype) and then shared read-only by every engine (every browser
session): engines only read them, under torch.inference_mode. Each load is
guarded by a lock of its own, so concurrent first uses of the same weights wait
for one load instead of racing to do several, and weights already loaded are
handed out at once, also while another dtype or device loads. A missing
package is a PagedLabError of one line that names the install command.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from backend.core.config import DTYPE_BYTES, REAL_MODELS, SMOLLM2, TINY_BYTE, EngineConfig
from backend.core.errors import PagedLabError
from backend.kernels import KernelBackend
from backend.kernels.validate import TORCH_DTYPES
from backend.models.base import LanguageModel
from backend.models.batch import ContiguousOutput, ForwardBatch, ForwardOutput, PagedKV
from backend.models.gguf_loader import Progress, find_gguf, read_gguf, read_vocab
from backend.models.smollm2 import LlamaWeights, SmolLM2
from backend.models.tiny_byte import TinyByteLM
from backend.models.tokenizer import BPETokenizer, ByteCodec, TextCodec

_lock = threading.Lock()
_weights: dict[tuple[str, str, str], LlamaWeights] = {}
# One lock per (model, dtype, device) load, so that a load (seconds) holds up only the
# sessions waiting for those weights, not one asking for weights already loaded.
_load_locks: dict[tuple[str, str, str], threading.Lock] = {}
_codecs: dict[str, TextCodec] = {TINY_BYTE: ByteCodec()}


def _key(model: str, dtype: str, device: torch.device | str) -> tuple[str, str, str]:
    return (model, dtype, str(torch.device(device)))


def default_sampling(model: str) -> tuple[float | None, float | None]:
    """`model`'s (temperature, top_p) for a config that sets neither (None: plain softmax,
    no nucleus), without loading it."""
    return (SmolLM2 if model in REAL_MODELS else TinyByteLM).default_sampling


def codec_for(model: str) -> TextCodec:
    """The tokenizer of `model` (for a real model: read from its file once per process)."""
    codec = _codecs.get(model)
    if codec is not None:
        return codec
    if model not in REAL_MODELS:
        raise PagedLabError(f"unknown model {model!r}")
    with _lock:
        if model not in _codecs:
            _codecs[model] = BPETokenizer(read_vocab(find_gguf()))
        return _codecs[model]


def preload(model: str, dtype: str = "float32", device: torch.device | str = "cpu",
            progress: Progress | None = None) -> LlamaWeights:
    """A real model's weights on `device` in `dtype`, loading them if this process has not.

    `progress(fraction, message)` is called while a load runs (not when the
    weights are already there). Raises PagedLabError for tiny-byte (it has no
    weights to share) and when the model's package is missing.
    """
    dims = REAL_MODELS.get(model)
    if dims is None:
        raise PagedLabError(f"{model!r} has no pretrained weights to load")
    key = _key(model, dtype, device)
    weights = _weights.get(key)
    if weights is not None:
        return weights
    with _lock:
        load_lock = _load_locks.setdefault(key, threading.Lock())
    with load_lock:
        weights = _weights.get(key)
        if weights is None:
            contents = read_gguf(find_gguf(), dims, progress)
            weights = LlamaWeights.from_gguf(contents, TORCH_DTYPES[dtype], torch.device(device))
            if model not in _codecs:
                # Built outside `_lock`; should codec_for build one meanwhile, its stays.
                codec = BPETokenizer(contents.vocab)
                with _lock:
                    _codecs.setdefault(model, codec)
            _weights[key] = weights
            if progress:
                progress(1.0, "loaded")
        return weights


def is_loaded(model: str, dtype: str = "float32", device: torch.device | str = "cpu") -> bool:
    """Whether `build_model` for this model, dtype and device would start at once."""
    return model == TINY_BYTE or _key(model, dtype, device) in _weights


def build_model(config: EngineConfig, device: torch.device,
                progress: Progress | None = None) -> LanguageModel:
    """The model `config.model` names, on `device` (loading shared weights on first use)."""
    if config.model == TINY_BYTE:
        return TinyByteLM(config, device)
    weights = preload(config.model, config.dtype, device, progress)
    return SmolLM2(config, weights, codec_for(config.model))


class Unloaded:
    """A model without its weights: its vocabulary and tokenizer, all that checking a
    snapshot reads (the end-of-sequence token, decoded text). An engine built on it
    keeps the books and never runs a forward: a saved session's past step is checked
    with it, with no weights loaded on any device for it."""

    def __init__(self, config: EngineConfig) -> None:
        self.codec = codec_for(config.model)
        self.vocab_size = config.vocab_size
        self.eos_token_id = self.codec.eos_token_id
        self.device = torch.device("meta")
        self.default_sampling: tuple[float | None, float | None] = (None, None)

    def forward(self, batch: ForwardBatch, cache: PagedKV, kernels: KernelBackend, *,
                check: bool = True, all_positions: bool = False) -> ForwardOutput:
        raise _no_weights()

    def forward_contiguous(self, tokens: list[int], past: ContiguousOutput | None = None,
                           branches: list[int] | None = None) -> ContiguousOutput:
        raise _no_weights()


def _no_weights() -> PagedLabError:
    return PagedLabError("this engine checks a snapshot's bookkeeping; it has no weights to "
                         "compute with")


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What a model is and what it costs, for a model picker."""

    name: str
    label: str
    description: str
    num_parameters: int
    vocab_size: int
    num_layers: int
    kv_bytes_per_token: int      # K and V over all layers, in the given dtype
    weight_bytes: int            # shared by every engine in the process (real models)
    shared_weights: bool


# A label fits the sidebar's select box beside a 1366 px window (about 28 characters:
# "SmolLM2-135M-Instruct (real model)" was cut to "(real mo").
DESCRIPTIONS = {
    TINY_BYTE: ("tiny-byte (random weights)",
                "A 2-layer transformer with seeded random weights over bytes: nonsense text, "
                "real K/V, milliseconds per step on a CPU."),
    SMOLLM2: ("SmolLM2-135M-Instruct",
              "A pretrained 30-layer llama with a 49,152-token BPE vocabulary: real text and "
              "real token boundaries; loaded once per process, then shared."),
}


def model_card(model: str, dtype: str = "float32",
               config: EngineConfig | None = None) -> ModelCard:
    """The card of `model`; tiny-byte's sizes follow `config` (default settings if None)."""
    cfg = config if config is not None and config.model == model else \
        EngineConfig.from_json({"model": model, "dtype": dtype})
    label, text = DESCRIPTIONS[model]
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * DTYPE_BYTES[dtype]
    return ModelCard(model, label, text, cfg.num_parameters, cfg.vocab_size, cfg.num_layers,
                     per_token, cfg.num_parameters * DTYPE_BYTES[dtype], model != TINY_BYTE)
