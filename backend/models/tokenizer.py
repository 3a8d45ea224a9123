"""Tokenizers: the byte-level BPE of a GGUF file, and the tiny model's bytes.

Both implement `TextCodec`: text to token ids, ids back to text, one display
piece per token, and chat messages to a prompt.

`BPETokenizer` is built with Hugging Face `tokenizers` from the vocabulary and
merges stored in the GGUF file. The file names its pre-tokenizer in
`tokenizer.ggml.pre`: "smollm" is llama.cpp's name for SmolLM2's own, which
splits every number character off on its own and then applies GPT-2's
byte-level regex; in `tokenizers` that is `Digits(individual_digits=True)`
before `ByteLevel`. (transformers' GGUF conversion ignores the name and uses
ByteLevel alone; the two differ only where whitespace meets a number
character, as in "a  1": see tests/test_model_tokenizer.py.) Control tokens (`<|im_start|>`,
`<|im_end|>`, ...) are special added tokens: matched whole in text, as
transformers and llama.cpp do. The chat template is the file's own Jinja
template, rendered in Jinja's sandbox like transformers' `apply_chat_template`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from backend.core.errors import PagedLabError
from backend.core.words import visible, visible_byte
from backend.models.gguf_loader import INSTALL_RUNTIME, GGUFVocab

CONTROL = 3
ROLES = ("system", "user", "assistant")
# ChatML's turn markers, as SmolLM2's template writes them (`chatml`).
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
Message = dict[str, str]


class TextCodec(Protocol):
    """Text <-> token ids for one model. Pure functions of their arguments."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def pieces(self, ids: Sequence[int]) -> list[str]: ...

    def render_chat(self, messages: Sequence[Message]) -> str: ...

    def split_characters(self, ids: Sequence[int]) -> list[str | None]: ...


def _utf8_runs(data: bytes) -> Iterator[tuple[int, int, str | None]]:
    """`data` walked as UTF-8: (start, length, character) for each character, and
    (start, 1, None) for a byte that begins none."""
    at = 0
    while at < len(data):
        for n in (1, 2, 3, 4):
            try:
                ch = data[at:at + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            yield at, n, ch
            at += n
            break
        else:
            yield at, 1, None
            at += 1


def split_characters(parts: Sequence[bytes]) -> list[str | None]:
    """For each token's bytes, the characters it shares with a neighbouring token (a
    multi-byte UTF-8 character split across tokens, as byte-level BPE and tiny-byte's
    one-byte tokens do with "☕" or "é"), else None.

    A token's piece shows the bytes it holds (`show_bytes`: "\\xe2"); this names the
    character they belong to, for a tooltip.
    """
    owner = [i for i, part in enumerate(parts) for _ in part]
    shared: list[list[str]] = [[] for _ in parts]
    for at, n, ch in _utf8_runs(b"".join(parts)):
        holders = sorted(set(owner[at:at + n]))
        if ch is not None and len(holders) > 1:
            for i in holders:
                shared[i].append(ch)
    return ["".join(chars) or None for chars in shared]


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves,
    the others are shifted to 256 + n so every token is a printable string."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def show_bytes(data: bytes) -> str:
    """Bytes as readable text: valid UTF-8 as `words.visible` shows it (a line break as
    "\\n"), any other byte as \\xNN.

    A token that holds part of a multi-byte character (emoji, an accent split
    off a letter) shows the bytes it holds instead of a replacement mark.
    """
    return "".join(f"\\x{data[at]:02x}" if ch is None else visible(ch)
                   for at, _, ch in _utf8_runs(data))


def chatml(messages: Sequence[Message]) -> str:
    """The ChatML text SmolLM2's template writes (without its default system prompt):
    what models without a template of their own render messages as."""
    turns = "".join(f"{TURN_START}{m['role']}\n{m['content']}{TURN_END}\n" for m in messages)
    return turns + f"{TURN_START}assistant\n"


class BPETokenizer:
    """Byte-level BPE from a GGUF vocabulary. Immutable after construction; thread-safe."""

    def __init__(self, vocab: GGUFVocab) -> None:
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError:
            raise PagedLabError("the smollm2-135m tokenizer needs the tokenizers package; "
                                f"install it with `{INSTALL_RUNTIME}`") from None
        if vocab.model != "gpt2":
            raise PagedLabError(f"tokenizer model {vocab.model!r} is not byte-level BPE")
        if vocab.pre != "smollm":
            raise PagedLabError(f"pre-tokenizer {vocab.pre!r} is not supported (only smollm)")
        ids = {tok: i for i, tok in enumerate(vocab.tokens)}
        merges = [_pair(m) for m in vocab.merges]
        bpe = models.BPE(ids, merges, fuse_unk=False, byte_fallback=False)
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        self._specials = {i: t for i, (t, kind) in enumerate(zip(vocab.tokens, vocab.token_types,
                                                                  strict=True))
                          if kind == CONTROL}
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in self._specials.values()])
        self._tok = tok
        self._tokens = vocab.tokens
        self._alphabet = _byte_alphabet()
        self._vocab_size = len(vocab.tokens)
        self._eos = vocab.eos_token_id
        self._bos = vocab.bos_token_id
        self._template = _compile(vocab.chat_template) if vocab.chat_template else None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._specials)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its name in UTF-8)."""
        if token_id in self._specials:
            return self._specials[token_id].encode("utf-8")
        return bytes(self._alphabet[c] for c in self._tokens[token_id])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens written out; invalid UTF-8 as U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text (see `show_bytes`), so token boundaries can be shown."""
        return [show_bytes(self.token_bytes(i)) for i in ids]

    def split_characters(self, ids: Sequence[int]) -> list[str | None]:
        """See the module's `split_characters`."""
        return split_characters([self.token_bytes(i) for i in ids])

    def render_chat(self, messages: Sequence[Message]) -> str:
        """The file's chat template over `messages`, ending with the assistant's turn open."""
        if self._template is None:
            return chatml(messages)
        special = {"bos_token": self._tokens[self._bos] if self._bos is not None else "",
                   "eos_token": self._tokens[self._eos] if self._eos is not None else ""}
        try:
            return str(self._template.render(messages=list(messages),
                                             add_generation_prompt=True, **special))
        except Exception as exc:  # a template error is the file's, reported as one line
            raise PagedLabError(f"the chat template failed: {exc}") from None


def _pair(merge: str) -> tuple[str, str]:
    # Byte-level tokens never hold a space (it is spelled "Ġ"), so one space separates.
    left, _, right = merge.partition(" ")
    return left, right


def _compile(source: str) -> Any:
    """The template compiled as transformers does: sandboxed, trim_blocks, lstrip_blocks."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source)


class ByteCodec:
    """tiny-byte's tokenizer: one token per UTF-8 byte, vocabulary 256."""

    vocab_size = 256
    eos_token_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])

    def decode(self, ids: Sequence[int]) -> str:
        """Each byte as `words.visible_byte` shows it (as engine.sampling.render_tokens)."""
        return "".join(map(visible_byte, ids))

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.decode([t]) for t in ids]

    def split_characters(self, ids: Sequence[int]) -> list[str | None]:
        """See the module's `split_characters`: every non-ASCII character spans bytes."""
        return split_characters([bytes([t]) for t in ids])

    def render_chat(self, messages: Sequence[Message]) -> str:
        return chatml(messages)
