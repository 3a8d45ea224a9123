"""Seeded sampling: the same (seed, request, position) always draws the same token.

Each token is drawn by the Gumbel-max trick from the logits of the previous
model step, with noise from a generator seeded by (scenario seed, request id,
position). The draw depends on nothing else, so a run replays exactly, a
preempted request regenerates the same tokens after recomputation, a moved
block changes nothing, and a forked child (another id) diverges from its
parent.

`temperature` divides the logits (0, or under GREEDY_BELOW as in vLLM: greedy,
the largest logit, ties to the lowest token id, no noise drawn); `top_p` keeps
the most probable tokens whose probabilities, taken in order (ties by token id), first reach p. For
tiny-byte samples are restricted to printable ASCII so generated text can be
read on screen (prompts may hold any byte); with neither setting given its
draw is exactly the one it always was.
"""

from __future__ import annotations

import hashlib

import torch

from backend.core.config import GREEDY_BELOW
from backend.core.words import visible_byte

PRINTABLE_LO, PRINTABLE_HI = 32, 126
_PROMPT_ALPHABET = b"abcdefghijklmnopqrstuvwxyz     "


def _seed_of(*parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


_NOT_PRINTABLE = torch.ones(256, dtype=torch.bool)
_NOT_PRINTABLE[PRINTABLE_LO:PRINTABLE_HI + 1] = False


def sample_token(logits: torch.Tensor, seed: int, request_id: str, position: int, *,
                 temperature: float | None = None, top_p: float | None = None,
                 printable_only: bool = True) -> int:
    """The token at `position` of request `request_id`, from float32 logits [vocab].

    `printable_only` (tiny-byte) needs a vocabulary of 256 bytes.
    """
    scores = logits.detach().to("cpu", torch.float64)
    banned = _NOT_PRINTABLE if printable_only else None
    if banned is not None:
        assert scores.numel() == 256, "printable_only is for byte vocabularies"
    if temperature is not None and temperature < GREEDY_BELOW:
        if banned is not None:
            scores = scores.masked_fill(banned, float("-inf"))
        return int(torch.argmax(scores))  # the first of equal maxima: the lowest id
    if temperature is not None:
        scores = scores / temperature
    if banned is not None:
        scores = scores.masked_fill(banned, float("-inf"))
    if top_p is not None and top_p < 1:
        scores = _nucleus(scores, top_p)
    g = torch.Generator().manual_seed(_seed_of("sample", seed, request_id, position))
    u = torch.rand(scores.numel(), generator=g, dtype=torch.float64).clamp_(1e-300, 1.0)
    scores = scores - torch.log(-torch.log(u))
    return int(torch.argmax(scores))


# The nucleus is looked for among this many most likely tokens first; only where they hold
# less than top-p is the whole vocabulary sorted. A model's distribution puts most of its
# mass in a few dozen tokens, and sorting SmolLM2's 49,152 took 5-6 ms a token on a CPU.
NUCLEUS_CANDIDATES = 256
# Where the candidates hold at least top-p plus this, every other token's mass before it
# is past top-p whatever the rounding (float64 sums of probabilities err by ~1e-16).
_NUCLEUS_MARGIN = 1e-9


def _nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scores` with every token outside the top-p set at -inf (the first token always stays).

    The set is the full stable sort's: tokens by probability, ties by lowest id, kept while
    the mass before them is under `top_p`. It is found among the tokens at least as likely
    as the NUCLEUS_CANDIDATES-th (all of its ties included, so their order is the sort's
    prefix) where those hold the nucleus, and by sorting everything where they do not.
    """
    probs = torch.softmax(scores, dim=0)
    kept = None
    if probs.numel() > NUCLEUS_CANDIDATES:
        floor = torch.topk(probs, NUCLEUS_CANDIDATES, sorted=False).values.min()
        ids = torch.nonzero(probs >= floor).flatten()   # in id order
        among, mass = _kept(probs[ids], top_p)
        if mass >= top_p + _NUCLEUS_MARGIN:
            kept = ids[among]
    if kept is None:
        kept, _ = _kept(probs, top_p)
    return _only(scores, kept)


def _only(scores: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`scores` with every token but those at indices `kept` at -inf."""
    keep = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    keep.index_fill_(0, kept, True)
    return scores.masked_fill(~keep, float("-inf"))


def _kept(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, float]:
    """Indices into `probs` of the tokens kept, and the mass of all of `probs`. Kept:
    stable-sorted by probability (ties keep index order, so go to the lowest ids), while
    the mass before them is under `top_p`."""
    order = torch.sort(probs, descending=True, stable=True).indices
    ordered = probs[order]
    cum = torch.cumsum(ordered, dim=0)
    before = cum - ordered
    return order[before < top_p], float(cum[-1])


def random_prompt(length: int, seed: int, request_id: str) -> list[int]:
    """`length` tokens of lowercase letters and spaces, seeded by (seed, request id)."""
    g = torch.Generator().manual_seed(_seed_of("prompt", seed, request_id))
    idx = torch.randint(len(_PROMPT_ALPHABET), (length,), generator=g)
    return [_PROMPT_ALPHABET[i] for i in idx.tolist()]


def render_tokens(tokens: list[int]) -> str:
    """Bytes as text for display (`words.visible_byte`): printable ASCII as is, a line
    break or tab as "\\n" or "\\t", any other byte as \\xNN."""
    return "".join(map(visible_byte, tokens))
