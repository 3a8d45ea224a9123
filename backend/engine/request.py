"""Per-request state: token ids, status, lineage and the pending logits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

# "swapped": preempted to the host pool (preemption "swap"), K/V and logits kept there.
Status = Literal["waiting", "running", "swapped", "finished"]
# "eos": it sampled its model's end-of-sequence token; "dropped": a beam none of whose
# extensions was among its group's best in a round of beam search.
# "context": it reached its model's context length (a real model's; vLLM's "length" at
# max_model_len).
FinishReason = Literal["finished", "max_new_tokens", "capacity", "eos", "dropped", "context"]
FINISH_REASONS = ("finished", "max_new_tokens", "capacity", "eos", "dropped", "context")


@dataclass(slots=True, eq=False)
class Request:
    """One request. Its block table lives in the BlockManager while it runs.

    Invariant while running: every token in `tokens` has a slot (num_tokens ==
    slots in its table); the first num_computed of them have their K/V in the
    cache; once all have (uncomputed == 0), `logits` holds the model's output at
    the last token, from which the next token will be sampled.
    """

    id: str
    prompt_len: int
    tokens: list[int]
    max_new_tokens: int | None
    arrival: int
    parent: str | None = None
    status: Status = "waiting"
    num_preemptions: int = 0
    # Order of admission among running requests; the largest is preempted first.
    admitted: int | None = None
    finish_reason: FinishReason | None = None
    logits: torch.Tensor | None = None
    # Set when it samples the end-of-sequence token; it finishes after that token's step.
    stopped: bool = False
    # Trailing tokens whose K/V is not written yet: a token budget
    # (max_num_batched_tokens) prefills a long prompt, or a preempted request's
    # whole history when it is recomputed, in chunks over several steps.
    # Nonzero only while running (or swapped mid-prefill); no logits until 0.
    uncomputed: int = 0
    # Parallel sampling: the `add` it came from (requests ID.0 .. ID.{n-1}), and, on
    # ID.0 until its prompt is prefilled, how many samples are still to be forked from it.
    group: str | None = None
    pending_samples: int = 0
    # Beam search (`add` with beam_width): the group's width, on every beam, and the
    # beam's cumulative log-probability over its generated tokens (backend/engine/beams.py).
    beam_width: int | None = None
    cum_logprob: float | None = None
    # `add`'s cache_salt: its blocks are keyed under this salt and share only with
    # blocks cached under the same one (hashing.SaltRoot). Forks, samples and beams
    # inherit it. None: unsalted.
    cache_salt: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_computed(self) -> int:
        """Leading tokens whose K/V is in the cache."""
        return len(self.tokens) - self.uncomputed

    @property
    def prefilling(self) -> bool:
        """Running with part of its prompt still to prefill (no logits to sample yet)."""
        return self.uncomputed > 0

    @property
    def forks_to_come(self) -> int:
        """Sequences still to be forked from this one: its parallel samples not yet
        forked, or, for a beam group's first beam before its first round, W - 1."""
        if self.beam_width is not None and self.num_generated == 0:
            return self.beam_width - 1
        return self.pending_samples

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int | None:
        """Tokens it may still generate (None: no limit)."""
        if self.max_new_tokens is None:
            return None
        return max(0, self.max_new_tokens - self.num_generated)

    @property
    def reached_limit(self) -> bool:
        return self.remaining == 0


def numbered(rid: str) -> tuple[str, int] | None:
    """("A", 3) for "A.3": an id's group and number, as samples and beams are named
    (plain ASCII digits without a leading zero: "A.01" and "A.¹" are no such id),
    or None."""
    group, dot, k = rid.rpartition(".")
    # Short enough for int() (n and beam numbers stay far below a billion).
    if not dot or not (k.isascii() and k.isdigit()) or len(k) > 9 or k != str(int(k)):
        return None
    return group, int(k)


def kept_for_sample(requests: Mapping[str, Request], rid: str) -> Request | None:
    """The first sample (GROUP.0) whose pending fork will name a sample `rid`, if any.

    `add` with n makes GROUP.0 at once and forks GROUP.1 .. GROUP.{n-1} from it when its
    prompt is computed, which may be many operations later: until then those ids are
    kept for the samples, and an `add` or `fork` naming one is refused.
    """
    named = numbered(rid)
    if named is None:
        return None
    group, k = named
    first = requests.get(f"{group}.0")
    if first is None or first.group != group or not 1 <= k <= first.pending_samples:
        return None
    return first
