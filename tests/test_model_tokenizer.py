"""SmolLM2's BPE tokenizer against transformers' tokenizer built from the same GGUF file.

transformers (the oracle) turns the file's vocabulary and merges into a
GPT2Tokenizer. The file also names its pre-tokenizer, "smollm" (llama.cpp's
name for SmolLM2's own): every number character split off alone before GPT-2's
byte-level regex, Digits + ByteLevel in `tokenizers`. transformers has no entry
for that name and uses ByteLevel alone, which can differ only where whitespace
meets a number character (Unicode category N: "a  1", " ½"). So our ids must
equal the oracle's with the file's pre-tokenizer given to it, on every string,
and the unchanged oracle's everywhere but there.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest

from backend.core.config import SMOLLM2
from backend.models.gguf_loader import find_gguf
from backend.models.registry import codec_for
from backend.models.tokenizer import BPETokenizer

pytestmark = pytest.mark.slow

HAND = [
    "The capital of France is", "Hello, world!", "hello   world", "  leading", "trailing  ",
    "tab\tand\nnewline\r\n", "\n\n\n", " ", "", "a  1", "x 2024", "v1.2.3-rc4", "3.14159",
    "1,000,000 and 10\u00a0000", "phone: +33 1 23 45 67 89", "caf\u00e9", "cafe\u0301",
    "na\u00efve r\u00e9sum\u00e9", "Stra\u00dfe", "\u0130stanbul", "\u00c5ngstr\u00f6m",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u5b57\u7b26",
    "\ud55c\uad6d\uc5b4", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\U0001f1eb\U0001f1f7 flag", "I \u2764\ufe0f NY", "emoji\U0001f680rocket", "\u2603\u2601",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] += 1; }",
    "SELECT * FROM t WHERE id = 42;", "<div class=\"a\">&amp;</div>", "{\"k\": [1, 2.5, null]}",
    "x = lambda a, b: a if a > b else b", "#include <stdio.h>", "    indented\n\tcode",
    "it's they're we've I'm you'll he'd", "IT'S SHOUTING", "don't", "O'Neil",
    "<|im_start|>user\nhi<|im_end|>", "text <|endoftext|> more", "<|im_start|><|im_end|>",
    "<jupyter_code>print(1)", "<|im_start", "im_end|>", "\u200b zero width", "\ufeffBOM",
    "a\u0000b", "\x7f\x01\x1b[31mred", "\u2028line sep", "   \t  \n  ", "!!!???...",
    "\u2014 em dash \u2013 en dash \u2026", "\u201cquoted\u201d \u2018single\u2019",
    "\u00bd \u00b2 \u2153",
]

FRAGMENTS = [
    "the", " cat", " sat", " on", " mat", "Paged", "Attention", " block", " table", "KV",
    " cache", "  ", "   ", "\t", "\n", "\n\n", "0", "7", "42", " 1999", "3.5", "-", "_",
    "caf\u00e9", "cafe\u0301", "\u00fc", "\u00f1", "\U0001f600", "\U0001f44b", "\u4e2d",
    "\u3042", "(", ")", "[", "]", "{", "}", ";", ":", "==", "->", "//", "#", "'s", "'ll",
    "<|im_end|>", "def ", "return ", "x", "Y", " z", "\u00e9t\u00e9", " \u00c9cole", "\u0301",
]


def corpus() -> list[str]:
    """Hand-written cases plus 300 seeded mixes of fragments (a few hundred strings)."""
    rng = random.Random(0)
    mixes = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
             for _ in range(300)]
    return HAND + mixes


@pytest.fixture(scope="module")
def ours() -> BPETokenizer:
    codec = codec_for(SMOLLM2)
    assert isinstance(codec, BPETokenizer)
    return codec


@pytest.fixture(scope="module")
def oracle() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = find_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def oracle_smollm(oracle: Any) -> Any:
    """The oracle's tokenizer with the pre-tokenizer the file names (digits first)."""
    from tokenizers import Tokenizer, pre_tokenizers

    tok = Tokenizer.from_str(oracle.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok


def whitespace_meets_a_number(s: str) -> bool:
    return any(a.isspace() and b.isnumeric() for a, b in itertools.pairwise(s))


def test_ids_agree_with_transformers_on_a_few_hundred_strings(ours: BPETokenizer, oracle: Any,
                                                               oracle_smollm: Any) -> None:
    strings = corpus()
    assert len(strings) >= 300
    differ = []
    for s in strings:
        ids = ours.encode(s)
        assert ids == oracle_smollm.encode(s, add_special_tokens=False).ids, repr(s)
        plain = oracle.encode(s, add_special_tokens=False)
        if ids != plain:
            differ.append(s)
            assert whitespace_meets_a_number(s), repr(s)
    # The one known difference, spelled out: the file's pre-tokenizer keeps "  " whole.
    assert ours.pieces(ours.encode("a  1")) == ["a", "  ", "1"]
    assert [oracle.decode([i]) for i in oracle.encode("a  1")] == ["a", " ", " ", "1"]
    assert "a  1" in differ


def test_decoding_agrees_and_round_trips(ours: BPETokenizer, oracle: Any) -> None:
    for s in corpus():
        ids = ours.encode(s)
        assert ours.decode(ids) == s, repr(s)
        assert ours.decode(ids) == oracle.decode(ids, skip_special_tokens=False), repr(s)
        # Pieces are each token's own bytes: joined, they are the text's bytes.
        assert b"".join(ours.token_bytes(i) for i in ids) == s.encode("utf-8")


def test_special_tokens_are_matched_whole(ours: BPETokenizer) -> None:
    assert ours.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert ours.eos_token_id == 2
    assert ours.special_ids == frozenset(range(17))
    assert ours.vocab_size == 49_152


def test_accents_that_look_alike_tokenize_differently(ours: BPETokenizer) -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert composed != decomposed and ours.decode(ours.encode(decomposed)) == decomposed
    assert ours.pieces(ours.encode(" " + composed)) == [" caf\u00e9"]
    assert ours.pieces(ours.encode(" " + decomposed)) == [" ca", "fe", "\\xcc", "\\x81"]


CHATS = [
    [{"role": "user", "content": "What is a block table?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "caf\u00e9 \U0001f600"}],
    [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "  spaced  "}],
]


@pytest.mark.parametrize("messages", CHATS)
def test_the_chat_template_renders_as_transformers_does(ours: BPETokenizer, oracle: Any,
                                                         messages: list[dict[str, str]]) -> None:
    want = oracle.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.render_chat(messages) == want
    assert ours.encode(want) == oracle.encode(want, add_special_tokens=False)
