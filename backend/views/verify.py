"""The Playground's "Verify against a full recomputation" verdict, in words.

See backend/engine/checks.verify_recomputation for what is compared and
backend/engine/results.Verification.bounds for what float rounding explains.
"""

from __future__ import annotations

import math

from backend.core.words import counted
from backend.engine.results import Verification


def _differ(what: str, where: str, err: float, scale: float, bound: float) -> str:
    if math.isinf(err):
        return f"{what} hold a value that is not a number (NaN or infinite)"
    return (f"{what} differ by {err:.2g} {where} {scale:.2g}, past the {bound:.2g} float "
            "rounding explains there")


def verdict(v: Verification, tolerance: float, dtype: str) -> tuple[bool, str]:
    """Whether the paged state agrees with the recomputation, and the sentence saying so
    with its numbers."""
    said = (f"{counted(v.num_requests, 'request')}, {counted(v.num_tokens, 'token')} "
            "recomputed without paging: max |K/V in the blocks − recomputed| = "
            f"{v.max_kv_err:.2g}, max |logits − recomputed| = {v.max_logit_err:.2g}. ")
    if v.agrees(tolerance):
        return True, (said + f"They agree: each layer's keys and values, and the logits, "
                             f"within {tolerance:g} of their largest value (of 1 where "
                             f"values are smaller): float rounding of {dtype}.")
    kv_bound, logit_bound = v.bounds(tolerance)
    wrong = []
    if v.kv_worst[0] > kv_bound:
        wrong.append(_differ("the K/V", "in a layer whose values reach", *v.kv_worst,
                             kv_bound))
    if v.logit_worst[0] > logit_bound:
        wrong.append(_differ("the logits", "where they reach", *v.logit_worst, logit_bound))
    return False, (said + "They disagree: " + "; ".join(wrong) + ". The paged state is not "
                   "what the model computes, a bug in the paging.")
