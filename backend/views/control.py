"""A control run's comparison as the pages show it: one sentence and a row per request.

See backend/engine/control.py for what the control leaves out and how the
two runs are compared.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from backend.core.words import agrees, counted
from backend.engine.control import ControlReport

CONTROL_COLUMNS = ["request", "tokens compared", "same tokens", "first difference",
                   "logits compared", "largest |Δ logit|", "text", "control's text"]

WITHOUT = "no shuffle, no preemption (a pool with room for everything) and no prefix cache"
# The same, short, where a title or a bar names the control run.
NOT_PERTURBED = "with no block moves, preemption or prefix hits"


# Why a control run may compare no logits, and what that leaves unproven: identical
# tokens show no K/V difference large enough to change a token, where the logits would
# show a small one too.
NO_LOGITS = ("The next-token logits were compared at no position: they are compared "
             "after each operation, for the requests then running with their prompt "
             "computed, so a request admitted and finished within one operation (a step "
             "of several iterations) is never compared. Identical tokens alone can miss a "
             "K/V difference too small to change a token.")


def control_sentence(report: ControlReport) -> str:
    """What the comparison found, with its numbers."""
    tokens = sum(r.compared_tokens for r in report.requests)
    diff = f"{report.max_logit_diff:.1e}"
    where = (f"compared at {counted(report.positions_compared, 'position')}" if
             report.positions_compared else "compared at no position")
    if report.agrees:
        same = (f"Same: all {tokens:,} tokens that both runs reached are identical in a "
                f"control run with {WITHOUT}.")
        if not report.positions_compared:
            return f"{same} {NO_LOGITS}"
        if report.max_logit_diff == 0:
            return f"{same} The next-token logits, {where}, are exactly equal."
        return (f"{same} The next-token logits, {where}, differ by at most {diff}: float "
                f"arithmetic in another order (tolerance {report.tolerance:.0e}).")
    bad = [r for r in report.requests if not r.same]
    if bad:
        first, n = bad[0], len(bad)
        return (f"Different: request {first.request}'s token {first.first_mismatch} is not "
                f"the control's ({counted(n, 'request')} {agrees(n, 'differs', 'differ')}), "
                f"and the next-token logits differ by up to {diff}. Something in this run "
                "read K/V the control did not.")
    return (f"Different: every token is the same, but the next-token logits, {where}, "
            f"differ by up to {diff}, beyond the {report.tolerance:.0e} that arithmetic in "
            "another order explains: this run read K/V the control did not.")


def control_frame(report: ControlReport,
                  decode: Callable[[list[int]], str] = str) -> pd.DataFrame:
    """One row per request: what was compared, the largest difference, and both runs' text
    over the tokens compared (`decode`: the model's tokens to text)."""
    return pd.DataFrame([{
        "request": r.request,
        "tokens compared": r.compared_tokens,
        "same tokens": "yes" if r.same else "no",
        "first difference": "" if r.first_mismatch is None else r.first_mismatch,
        "logits compared": r.positions_compared,
        "largest |Δ logit|": f"{r.max_logit_diff:.1e}" if r.positions_compared else "",
        "text": decode(r.tokens[:r.compared_tokens]),
        "control's text": decode(r.control_tokens[:r.compared_tokens]),
    } for r in report.requests], columns=CONTROL_COLUMNS)
