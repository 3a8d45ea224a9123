"""Seeded sampling: the same (seed, request, position) always draws the same token.

Each token is drawn by the Gumbel-max trick from the logits of the previous
model step, with noise from a generator seeded by (scenario seed, request id,
position). The draw depends on nothing else, so a run replays exactly, a
preempted request regenerates the same tokens after recomputation, a moved
block changes nothing, and a forked child (another id) diverges from its
parent. Samples are restricted to printable ASCII so generated text can be
read on screen; prompts may hold any byte.
"""

from __future__ import annotations

import hashlib

import torch

PRINTABLE_LO, PRINTABLE_HI = 32, 126
_PROMPT_ALPHABET = b"abcdefghijklmnopqrstuvwxyz     "


def _seed_of(*parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


_NOT_PRINTABLE = torch.ones(256, dtype=torch.bool)
_NOT_PRINTABLE[PRINTABLE_LO:PRINTABLE_HI + 1] = False


def sample_token(logits: torch.Tensor, seed: int, request_id: str, position: int) -> int:
    """The token at `position` of request `request_id`, from float32 logits [256]."""
    g = torch.Generator().manual_seed(_seed_of("sample", seed, request_id, position))
    u = torch.rand(256, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0)
    scores = logits.detach().to("cpu", torch.float64) - torch.log(-torch.log(u))
    scores[_NOT_PRINTABLE] = float("-inf")
    return int(torch.argmax(scores))


def random_prompt(length: int, seed: int, request_id: str) -> list[int]:
    """`length` tokens of lowercase letters and spaces, seeded by (seed, request id)."""
    g = torch.Generator().manual_seed(_seed_of("prompt", seed, request_id))
    idx = torch.randint(len(_PROMPT_ALPHABET), (length,), generator=g)
    return [_PROMPT_ALPHABET[i] for i in idx.tolist()]


def render_tokens(tokens: list[int]) -> str:
    """Bytes as text for display: printable ASCII as is, anything else as \\xNN."""
    return "".join(chr(t) if PRINTABLE_LO <= t <= PRINTABLE_HI else f"\\x{t:02x}"
                   for t in tokens)
