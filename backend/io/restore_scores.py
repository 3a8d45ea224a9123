"""A restored beam's `cum_logprob`, recomputed from the model's logits over its tokens.

A beam's cumulative log-probability is the sum, over its generated tokens, of each
token's log-probability given the tokens before it (`beams.run_round` adds one per
round). A snapshot holds the sum, not the rounds, so restore recomputes it from the
contiguous forwards that rebuild the K/V (backend/io/recompute.py), and refuses a
value further from it than rounding explains: a hand-edited score would otherwise
rank the beams, on the page and in the next round, by a number the model never gave.

The row for position i of a forward over tokens T serves any beam whose tokens up
to i + 1 are T's: a dropped beam or a complete hypothesis is scored from a forward
another beam of its group needed anyway, and the beams no forward covers take one
forward per longest sequence among them.
"""

from __future__ import annotations

import torch

from backend.core.errors import PagedLabError
from backend.engine.beams import log_probs
from backend.engine.engine import Engine
from backend.engine.results import logit_tolerance

# Rows of log-probabilities held at once while a beam is scored (float64: 24 MiB for
# SmolLM2's vocabulary).
_ROWS = 64


class BeamScores:
    """The beams of a restored engine, each scored once a forward covers its tokens.

    A beam needs the logits over its tokens but the last (row i predicts token i + 1);
    `offer` gives it them from any forward over a sequence that begins with those.
    """

    def __init__(self, engine: Engine | None) -> None:
        """The beams of `engine` (None: none, so every method is a no-op)."""
        self._wanted: dict[str, tuple[list[int], int]] = {}
        self.found: dict[str, float] = {}
        self._byte_model = engine is not None and engine.model.vocab_size == 256
        if engine is None:
            return
        for req in engine.requests.values():
            if req.beam_width is None:
                continue
            if req.num_tokens == req.prompt_len:
                self.found[req.id] = 0.0     # before its first round: nothing generated
            else:
                self._wanted[req.id] = (req.tokens, req.prompt_len)

    def offer(self, tokens: list[int], logits: torch.Tensor) -> None:
        """Score every beam still unscored that `tokens` (with `logits`, one row per
        token) cover."""
        if not self._wanted:
            return
        for rid, (beam, prompt_len) in list(self._wanted.items()):
            if _covers(tokens, beam):
                self.found[rid] = self._score(logits, beam, prompt_len)
                del self._wanted[rid]

    def _score(self, logits: torch.Tensor, beam: list[int], prompt_len: int) -> float:
        """The sum of `beam`'s generated tokens' log-probabilities, in float64 as a round
        adds them, a chunk of rows at a time (a row of SmolLM2's is 49,152 wide)."""
        total = 0.0
        for start in range(prompt_len, len(beam), _ROWS):
            end = min(start + _ROWS, len(beam))
            rows = log_probs(logits[start - 1:end - 1], self._byte_model)
            total += float(rows.gather(-1, torch.tensor(beam[start:end])[:, None]).sum())
        return total

    def forwards_left(self, planned: list[list[int]]) -> list[list[int]]:
        """The sequences to compute for the beams still unscored once `planned` is."""
        return forwards_left([beam for beam, _ in self._wanted.values()], planned)


def forwards_left(beams: list[list[int]], planned: list[list[int]]) -> list[list[int]]:
    """The fewest sequences whose forwards, with `planned`'s, score every one of `beams`:
    one per longest among the beams no planned sequence covers. In descending order a
    sequence comes just after those that extend it, so it is covered by the one before
    or is the longest of its kind and needs its own forward."""
    left = sorted((beam[:-1] for beam in beams
                   if not any(_covers(seq, beam) for seq in planned)), reverse=True)
    out: list[list[int]] = []
    for seq in left:
        if not out or out[-1][:len(seq)] != seq:
            out.append(seq)
    return out


def _covers(seq: list[int], beam: list[int]) -> bool:
    """A forward over `seq` holds the logits that score every token of `beam`."""
    return len(seq) >= len(beam) - 1 and seq[:len(beam) - 1] == beam[:-1]


def check_beam_scores(engine: Engine, found: dict[str, float]) -> None:
    """Refuse a beam whose `cum_logprob` is further from `found` (its recomputed value)
    than the engine's dtype explains.

    Each token's log-probability is its logit less the log-sum-exp of its row, so it
    moves by at most twice the most a logit moves: `logit_tolerance`, how far two
    correct computations' logits may be apart (another kernel, batch or device). The
    bound is sound, not tight: measured drifts stayed under a sixth of it, so in
    float16 and bfloat16 (0.1 and 0.4 a token) an edit inside it passes.
    """
    tol = logit_tolerance(engine.config.dtype)
    for rid, value in found.items():
        req = engine.requests[rid]
        assert req.cum_logprob is not None
        generated = req.num_tokens - req.prompt_len
        allowed = tol * (2 * generated + 1)
        if abs(req.cum_logprob - value) > allowed:
            raise PagedLabError(
                f"inconsistent snapshot: beam {rid!r} has cum_logprob {req.cum_logprob:.6g}, "
                f"but the model gives its {generated} generated token"
                f"{'s' if generated != 1 else ''} a log-probability of {value:.6g} (more "
                f"than {allowed:.3g} apart, the most {engine.config.dtype} rounding explains)")
