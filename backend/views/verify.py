"""The Playground's "Verify against a full recomputation" verdict, in words.

See backend/engine/checks.verify_recomputation for what is compared and
backend/engine/results.Verification.bounds for what float rounding explains.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from backend.core.words import counted, sentence
from backend.engine.results import Verification


def _differ(what: str, where: str, err: float, scale: float, bound: float) -> str:
    if math.isinf(err):
        return (f"{what} differ from the recomputation by NaN or infinity: one side holds a "
                "number where the other does not")
    return (f"{what} differ by {err:.2g} {where} {scale:.2g}, past the {bound:.2g} float "
            "rounding explains there")


Verdict = Literal["agree", "overflow", "disagree"]


class _Part(NamedTuple):
    name: str                      # "the K/V", in a disagreement
    plain: str                     # "keys and values", elsewhere
    where: str                     # where the worst error is, before its scale
    worst: tuple[float, float]     # (error, scale) where it is worst
    bound: float
    values: int                    # values compared
    left_out: int                  # of them, recomputed as NaN or infinite


def _left_out(p: _Part) -> str:
    if p.left_out == p.values:
        return f"all {p.values:,} {p.plain}"
    return f"{p.left_out:,} of the {p.values:,} {p.plain}"


def _compared(err: float, values: int, left_out: int) -> str:
    return ": none compared" if left_out == values else f" = {err:.2g}"


def verdict(v: Verification, tolerance: float, dtype: str) -> tuple[Verdict, str]:
    """Whether the paged state agrees with the recomputation, and the sentence saying so
    with its numbers. "overflow": what could be judged agrees, but some of the
    recomputation's own values are NaN or infinite, and those were left out."""
    said = (f"{counted(v.num_requests, 'request')}, {counted(v.num_tokens, 'token')} "
            "recomputed without paging: max |K/V in the blocks − recomputed|"
            f"{_compared(v.max_kv_err, v.kv_values, v.kv_left_out)}, max |logits − "
            f"recomputed|{_compared(v.max_logit_err, v.logit_values, v.logits_left_out)}. ")
    kv_bound, logit_bound = v.bounds(tolerance)
    parts = [_Part("the K/V", "keys and values", "in a layer whose values reach", v.kv_worst,
                   kv_bound, v.kv_values, v.kv_left_out),
             _Part("the logits", "logits", "where they reach", v.logit_worst, logit_bound,
                   v.logit_values, v.logits_left_out)]
    wrong = [_differ(p.name, p.where, *p.worst, p.bound) for p in parts
             if p.worst[0] > p.bound]
    out = [p for p in parts if p.left_out]
    # An overflow is the model's, not the paging's: the recomputation, which reads no
    # block, overflows at the same values. Those are left out; the rest are judged.
    wider = " (float32 has the range to hold them)" if dtype == "float16" else ""
    one = len(out) == 1 and out[0].left_out == 1
    overflow = (sentence(" and ".join(_left_out(p) for p in out)) + f" {'is' if one else 'are'}"
                f" NaN or infinite in the recomputation itself, in {dtype}, and in the blocks "
                f"too: the model overflows there, paged or not{wider}, so "
                f"{'it is' if one else 'they are'} left out." if out else "")
    if wrong:
        return "disagree", " ".join(
            [said + "They disagree: " + "; ".join(wrong) + ". The paged state is not what "
             "the model computes, a bug in the paging."] + ([overflow] if overflow else []))
    rounding = (f"within {tolerance:g} of their largest value (of 1 where values are "
                f"smaller): float rounding of {dtype}.")
    if out:
        if all(p.left_out == p.values for p in parts):
            return "overflow", said + overflow + " Nothing else was compared."
        return "overflow", said + overflow + " The rest agree, " + rounding
    if not v.logit_values:
        # Every request is still prefilling: it has no next-token logits yet.
        return "agree", (said + "They agree: each layer's keys and values (no request has "
                         "logits yet, all still prefilling), " + rounding)
    return "agree", (said + "They agree: each layer's keys and values, and the logits, "
                     + rounding)
