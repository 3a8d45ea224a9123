"""vLLM's scheduler budgets for one iteration: max_num_seqs, max_num_batched_tokens, watermark.

The rules, as vLLM's scheduler applies them (v0 with chunked prefill; v1 alike):

    max_num_seqs            at most this many requests run in one iteration
                            (decoding and prefilling together)
    max_num_batched_tokens  at most this many tokens are processed in one
                            iteration, prefill and decode together. Running
                            requests go first, decodes before prefills: every
                            decode takes one token, then each request still
                            prefilling takes what is left, up to its remaining
                            prompt, and a waiting request is admitted only while
                            tokens are left, with a first chunk of at most that
                            many. A long prompt is therefore prefilled in chunks
                            over several iterations.
    watermark_blocks        a waiting request is admitted only if this many
                            blocks stay free after its blocks are taken
                            (vLLM v0's BlockSpaceManager.can_allocate), so the
                            running requests keep room to grow

None means no limit (0 blocks for the watermark). Admission also stops at the
first waiting request that does not fit (first come, first served).

Why decodes always fit: a request is admitted only while tokens are left after
every running request got its share, so there are never more running requests
than max_num_batched_tokens, and the decodes (one token each) go first.

This module decides and mutates nothing outside itself and imports nothing of
the backend but its errors (no torch, no allocator), so the live engine's
scheduler (backend/engine/scheduler.py) and the paged simulator
(backend/lab/sim/replay.py) apply the same rules from the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.checks import check_int
from backend.core.errors import PagedLabError

MAX_BUDGET = 1 << 30


def _limit(value: object, what: str, low: int) -> None:
    if value is None:  # no limit
        return
    try:
        check_int(value, what, low, MAX_BUDGET)
    except PagedLabError as exc:
        raise PagedLabError(f"{exc} (or None: no limit)") from None


@dataclass(frozen=True, slots=True)
class SchedulerBudgets:
    """The three knobs; None is no limit."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    watermark_blocks: int | None = None

    def check(self) -> None:
        """Raise PagedLabError naming the first bad field."""
        _limit(self.max_num_seqs, "max_num_seqs", 1)
        _limit(self.max_num_batched_tokens, "max_num_batched_tokens", 1)
        _limit(self.watermark_blocks, "watermark_blocks", 0)

    @property
    def chunked(self) -> bool:
        """Whether prompts may be split over iterations (a token budget is set)."""
        return self.max_num_batched_tokens is not None


class IterationBudget:
    """What is left of one iteration's budgets, spent in vLLM's order.

    Call `decode` once per decoding request, then `prefill_chunk` for each
    request still prefilling (admission order), then, for each waiting request
    in turn while `may_start` (and its blocks fit), `admitted` and `prefill_chunk`.
    """

    __slots__ = ("_seqs", "_tokens", "decode_tokens", "prefill_tokens")

    def __init__(self, budgets: SchedulerBudgets, running: int) -> None:
        self._seqs = None if budgets.max_num_seqs is None else budgets.max_num_seqs - running
        self._tokens = budgets.max_num_batched_tokens
        self.prefill_tokens = 0
        self.decode_tokens = 0

    @property
    def tokens_left(self) -> int | None:
        """Tokens still unspent this iteration (None: no budget)."""
        return self._tokens

    def decode(self, count: int = 1) -> None:
        """Spend one token for each of `count` decoding requests."""
        self.decode_tokens += count
        if self._tokens is not None:
            # Cannot go below zero while running <= max_num_batched_tokens holds.
            assert count <= self._tokens, "more decodes than the token budget"
            self._tokens -= count

    def prefill_chunk(self, remaining: int) -> int:
        """Tokens of a prompt with `remaining` uncomputed tokens processed now (0: none)."""
        take = remaining if self._tokens is None else min(remaining, self._tokens)
        if self._tokens is not None:
            self._tokens -= take
        self.prefill_tokens += take
        return take

    def may_start(self, seqs: int = 1) -> bool:
        """Whether the waiting head may start now as far as the budgets go: `seqs`
        sequence slots (a request with n parallel samples needs n, as in vLLM) and at
        least one token left. (Its blocks: `fits_with_watermark`.)"""
        if self._seqs is not None and self._seqs < seqs:
            return False
        return self._tokens is None or self._tokens > 0

    def admitted(self, seqs: int = 1) -> None:
        """Count one admission of `seqs` sequences against max_num_seqs."""
        if self._seqs is not None:
            self._seqs -= seqs


def fits_with_watermark(free_blocks: int, need_blocks: int, watermark_blocks: int) -> bool:
    """vLLM v0's admission test: the request's new blocks fit and `watermark_blocks` stay free."""
    return need_blocks + watermark_blocks <= free_blocks
