"""A restored beam's `cum_logprob`, recomputed from the model's logits over its tokens.

A beam's cumulative log-probability is the sum, over its generated tokens, of each
token's log-probability given the tokens before it (`beams.run_round` adds one per
round). A snapshot holds the sum, not the rounds, so restore recomputes it from the
contiguous forwards that rebuild the K/V (backend/io/recompute.py), and refuses a
value further from it than rounding explains: a hand-edited score would otherwise
rank the beams, on the page and in the next round, by a number the model never gave.

The row for position i of a forward over tokens T serves any beam whose tokens up
to i + 1 are T's: a dropped beam or a complete hypothesis is scored from a forward
another beam of its group needed anyway. The beams no such forward covers share one
forward of their prompt, and the longest sequences among them go on from its keys and
values, several to a pass: a finished search costs its generated tokens in a few
passes, not a prompt per beam.
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
# Tokens of one pass over beams' suffixes: on a CPU a pass of a few tokens costs about
# what one of hundreds does (each reads every weight), and its logits are 192 KiB a
# token for SmolLM2 (48 MiB here).
PASS_TOKENS = 256


class BeamScores:
    """The beams of a restored engine, each scored once a forward covers its tokens.

    A beam needs the logits over its tokens but the last (row i predicts token i + 1);
    `offer` gives it them from any forward over a sequence that begins with those. A
    beam is found by a key of that prefix, so a forward costs its length plus the
    beams it serves, not a comparison with every beam.
    """

    def __init__(self, engine: Engine | None) -> None:
        """The beams of `engine` (None: none, so every method is a no-op)."""
        self._wanted: dict[str, tuple[list[int], int]] = {}
        self._needs: dict[tuple[int, int], list[str]] = {}   # (length, key) -> beams
        self._lengths: set[int] = set()
        self.found: dict[str, float] = {}
        self._byte_model = engine is not None and engine.model.vocab_size == 256
        if engine is None:
            return
        for req in engine.requests.values():
            if req.beam_width is None:
                continue
            if req.num_tokens == req.prompt_len:
                self.found[req.id] = 0.0     # before its first round: nothing generated
                continue
            self._wanted[req.id] = (req.tokens, req.prompt_len)
            need = req.num_tokens - 1
            [(_, key)] = _prefix_keys(req.tokens, {need})
            self._needs.setdefault((need, key), []).append(req.id)
        self._lengths.update(length for length, _ in self._needs)

    def _served(self, tokens: list[int], first: int) -> list[str]:
        """The unscored beams a forward over `tokens` scores, its logits' rows starting
        at position `first`: each beam's tokens but its last begin `tokens`, and its
        first generated token's row (position prompt_len - 1) is among the rows."""
        out = []
        for length, key in _prefix_keys(tokens, self._lengths):
            for rid in self._needs.get((length, key), ()):
                if rid not in self._wanted:
                    continue
                beam, prompt_len = self._wanted[rid]
                if first <= prompt_len - 1 and tokens[:length] == beam[:length]:
                    out.append(rid)
        return out

    def offer(self, tokens: list[int], logits: torch.Tensor, first: int = 0) -> None:
        """Score every unscored beam that a forward over `tokens` covers; `logits` holds
        its rows for positions `first` onwards (a forward that went on from a past).

        Each beam's score is the sum of its generated tokens' log-probabilities, in
        float64 as a round adds them. The beams one forward serves share their rows
        (a dropped beam's are its parent's), so each row's log-softmax is taken once,
        a chunk of rows at a time (a row of SmolLM2's is 49,152 wide)."""
        if not self._wanted:
            return
        served = [(rid, *self._wanted.pop(rid)) for rid in self._served(tokens, first)]
        if not served:
            return
        # Row r (position first + r) predicts the token at first + r + 1: a beam needs
        # the rows from its prompt's last token to its own last token but one.
        need = {rid: (prompt_len - 1 - first, len(beam) - 1 - first)
                for rid, beam, prompt_len in served}
        totals = dict.fromkeys(need, 0.0)
        lo = min(a for a, _ in need.values())
        hi = max(b for _, b in need.values())
        for start in range(lo, hi, _ROWS):
            stop = min(start + _ROWS, hi)
            rows = log_probs(logits[start:stop], self._byte_model)
            for rid, beam, _ in served:
                a, b = max(need[rid][0], start), min(need[rid][1], stop)
                if a < b:
                    picked = torch.tensor(beam[first + a + 1:first + b + 1])[:, None]
                    totals[rid] += float(rows[a - start:b - start].gather(-1, picked).sum())
        self.found.update(totals)

    def extra_forwards(self, planned: list[list[int]]
                       ) -> list[tuple[list[int], list[list[list[int]]]]]:
        """The forwards to make for the beams that none of `planned` covers, as
        (prefix, passes): the prompt but its last token, computed once, then passes of
        suffixes after it (`forward_contiguous`'s past and branches), one suffix per
        longest sequence, up to PASS_TOKENS in a pass."""
        covered: set[str] = set()
        for seq in planned:
            covered.update(self._served(seq, 0))
        by_prefix: dict[tuple[int, ...], list[list[int]]] = {}
        for rid, (beam, prompt_len) in self._wanted.items():
            if rid not in covered:
                by_prefix.setdefault(tuple(beam[:prompt_len - 1]), []).append(beam[:-1])
        return [(list(prefix), _passes([seq[len(prefix):] for seq in longest(seqs)]))
                for prefix, seqs in by_prefix.items()]


def _passes(suffixes: list[list[int]]) -> list[list[list[int]]]:
    """`suffixes` in runs of at most PASS_TOKENS tokens (a longer one alone)."""
    out: list[list[list[int]]] = []
    size = PASS_TOKENS
    for suffix in suffixes:
        if size + len(suffix) > PASS_TOKENS:
            out.append([])
            size = 0
        out[-1].append(suffix)
        size += len(suffix)
    return out


def longest(seqs: list[list[int]]) -> list[list[int]]:
    """The fewest of `seqs` that hold every one as a prefix: in descending order a
    sequence comes just after those that extend it, so it is a prefix of the one
    kept before it, or is the longest of its kind and is kept."""
    out: list[list[int]] = []
    for seq in sorted(seqs, reverse=True):
        if not out or out[-1][:len(seq)] != seq:
            out.append(seq)
    return out


def _prefix_keys(tokens: list[int], lengths: set[int]) -> list[tuple[int, int]]:
    """(length, key) of each prefix of `tokens` whose length is in `lengths`: a rolling
    hash, equal for equal prefixes (a match is then compared token by token)."""
    out = []
    key = 0
    for i, token in enumerate(tokens[:max(lengths, default=0)]):
        key = hash((key, token))
        if i + 1 in lengths:
            out.append((i + 1, key))
    return out


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
