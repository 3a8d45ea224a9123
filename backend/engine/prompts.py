"""An `add`'s prompt as the model's token ids, and the next token of a running request.

    prompt_ids   text through the model's tokenizer, messages through its chat
                 template, ids checked against its vocabulary, or seeded random
                 tokens for `prompt_len`
    next_token   the seeded draw (engine.sampling) with the config's temperature
                 and top_p, or the model's defaults where the config sets none

Both are pure functions of their arguments, so a recomputed or restored
request reproduces its tokens exactly.
"""

from __future__ import annotations

import torch

from backend.core.checks import check_int
from backend.core.config import EngineConfig
from backend.core.errors import PagedLabError
from backend.engine.ops import MAX_PROMPT_TOKENS, Add, check_messages
from backend.engine.sampling import random_prompt, sample_token
from backend.models.base import LanguageModel


def prompt_ids(op: Add, model: LanguageModel, seed: int, request_id: str) -> list[int]:
    """The prompt's token ids. Raises PagedLabError for ids outside the vocabulary."""
    codec = model.codec
    if op.prompt is not None:
        tokens = codec.encode(op.prompt)
    elif op.messages is not None:
        messages = [{"role": role, "content": content}
                    for role, content in check_messages(op.messages)]
        tokens = codec.encode(codec.render_chat(messages))
    elif op.prompt_tokens is not None:
        tokens = list(op.prompt_tokens)
        top = model.vocab_size - 1
        for i, t in enumerate(tokens):
            check_int(t, f"prompt_tokens[{i}]", 0, top)
    else:
        assert op.prompt_len is not None
        tokens = random_ids(op.prompt_len, seed, request_id, model)
    if not tokens:
        raise PagedLabError("the prompt encodes to no tokens")
    if len(tokens) > MAX_PROMPT_TOKENS:
        raise PagedLabError(f"the prompt is {len(tokens):,} tokens; the limit is "
                            f"{MAX_PROMPT_TOKENS:,}")
    return tokens


def random_ids(length: int, seed: int, request_id: str, model: LanguageModel) -> list[int]:
    """`length` seeded tokens: letters and spaces, as bytes or as the model's tokens of them."""
    if model.vocab_size == 256:
        return random_prompt(length, seed, request_id)
    chars = 4 * length
    while True:
        # Random letters tokenize to at most one token per character, usually fewer.
        ids = model.codec.encode(bytes(random_prompt(chars, seed, request_id)).decode())
        if len(ids) >= length:
            return ids[:length]
        chars *= 2


def sampling_of(config: EngineConfig, model: LanguageModel) -> tuple[float | None,
                                                                      float | None]:
    """The (temperature, top_p) the engine samples with: the config's, else the model's
    defaults (None: plain softmax, no nucleus)."""
    temperature, top_p = model.default_sampling
    if config.temperature is not None:
        temperature = config.temperature
    if config.top_p is not None:
        top_p = config.top_p
    return temperature, top_p


def next_token(logits: torch.Tensor, config: EngineConfig, model: LanguageModel,
               request_id: str, position: int) -> int:
    """The token at `position`, drawn from the logits of the position before it."""
    temperature, top_p = sampling_of(config, model)
    return sample_token(logits, config.seed, request_id, position, temperature=temperature,
                        top_p=top_p, printable_only=model.vocab_size == 256)
