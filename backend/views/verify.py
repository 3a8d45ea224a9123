"""The Playground's "Verify against a full recomputation" verdict, in words.

See backend/engine/checks.verify_recomputation for what is compared and
backend/engine/results.Verification.bounds for what float rounding explains.
"""

from __future__ import annotations

import math
from typing import Literal

from backend.core.words import counted
from backend.engine.results import Verification


def _differ(what: str, where: str, err: float, scale: float, bound: float) -> str:
    if math.isinf(err):
        return f"{what} hold a value that is not a number (NaN or infinite)"
    return (f"{what} differ by {err:.2g} {where} {scale:.2g}, past the {bound:.2g} float "
            "rounding explains there")


Verdict = Literal["agree", "overflow", "disagree"]


def verdict(v: Verification, tolerance: float, dtype: str) -> tuple[Verdict, str]:
    """Whether the paged state agrees with the recomputation, and the sentence saying so
    with its numbers. "overflow": what could be judged agrees, but the recomputation's
    own K/V or logits are not finite, so they cannot be judged."""
    said = (f"{counted(v.num_requests, 'request')}, {counted(v.num_tokens, 'token')} "
            "recomputed without paging: max |K/V in the blocks − recomputed| = "
            f"{v.max_kv_err:.2g}, max |logits − recomputed| = {v.max_logit_err:.2g}. ")
    kv_bound, logit_bound = v.bounds(tolerance)
    parts = [("the K/V", "keys and values", v.kv_finite, v.kv_worst, kv_bound,
              "in a layer whose values reach"),
             ("the logits", "logits", v.logits_finite, v.logit_worst, logit_bound,
              "where they reach")]
    wrong = [_differ(name, where, *worst, bound)
             for name, _, finite, worst, bound, where in parts
             if finite and worst[0] > bound]
    # An overflow is the model's, not the paging's: the recomputation, which reads no
    # block, overflows too, and inf against inf compares as NaN.
    unjudged = [plain for _, plain, finite, *_ in parts if not finite]
    overflow = (f"The recomputation's own {' and '.join(unjudged)} hold values {dtype} "
                "cannot represent (NaN or infinite): the model overflows this dtype on these "
                "tokens, paged or not, so they cannot be judged; a wider type (bfloat16 or "
                "float32) can be checked." if unjudged else "")
    if wrong:
        return "disagree", " ".join(
            [said + "They disagree: " + "; ".join(wrong) + ". The paged state is not what "
             "the model computes, a bug in the paging."] + ([overflow] if overflow else []))
    if len(unjudged) == len(parts):
        return "overflow", said + overflow
    judged = " and ".join(plain for _, plain, finite, *_ in parts if finite)
    rounding = (f"within {tolerance:g} of their largest value (of 1 where values are "
                f"smaller): float rounding of {dtype}.")
    if unjudged:
        return "overflow", (said + f"The {judged} agree, {rounding} {overflow}")
    return "agree", (said + "They agree: each layer's keys and values, and the logits, "
                     + rounding)
