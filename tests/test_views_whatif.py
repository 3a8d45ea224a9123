"""The what-if verdict's words for each case, from hand-built readings."""

from __future__ import annotations

import pytest
import torch

from backend.engine.whatif import OrderWhatIf, Reading
from backend.views.whatif import draw_note, outcome


def what_if(table: list[int], diff: float, *, same_token: bool = True) -> OrderWhatIf:
    out = [torch.zeros(2, 4)]
    first = Reading(table, 1e-7, 65, [(65, 0.5)], out)
    second = Reading(sorted(table), diff, 65 if same_token else 66, [(65, 0.5)],
                     [torch.full((2, 4), diff)])
    return OrderWhatIf("A", 8, list(range(9)), 4, first, second, 1e-3)


@pytest.mark.parametrize(("table", "diff", "same", "says", "not_says"), [
    # The last block has the highest id: same slots, whatever the size of the change.
    ([9, 2, 14], 2e-6, True, ["within float rounding (under 0.001)", "stays last"],
     ["another block"]),
    # Another block read last, yet the logits hardly moved: not called a change.
    ([14, 2, 9], 5e-4, True, ["within float rounding", "another block is read last",
                              "carried little of the attention"], ["stays last",
                                                                    "distribution"]),
    ([14, 2, 9], 1.4, True, ["another block is read last", "next-token distribution",
                             "happens to give the same token"], ["float rounding"]),
    ([14, 2, 9], 1.4, False, ["The seeded draw gives another token."], ["happens to"]),
    ([2, 9, 14], 0.0, True, ["and its logits by 0."], ["Sorted"]),
])
def test_the_verdict_names_the_cause_the_tables_show(table: list[int], diff: float,
                                                    same: bool, says: list[str],
                                                    not_says: list[str]) -> None:
    text = outcome(what_if(table, diff, same_token=same))
    for words in says:
        assert words in text, text
    for words in not_says:
        assert words not in text, text


def test_a_draw_from_past_the_table_says_it_is_one_and_with_what_settings() -> None:
    top = [(65, 0.3), (66, 0.2), (67, 0.1)]
    assert draw_note(Reading([0], 0.0, 66, top, []), 0.2, 0.9) == ""
    assert draw_note(Reading([0], 0.0, 90, top, []), 0.2, 0.9) == (
        " (a seeded draw at temperature 0.2, top-p 0.9: not among the 3 most likely below, "
        "the plain probabilities)")
    assert draw_note(Reading([0], 0.0, 90, top, []), None, None) == (
        " (a seeded draw at temperature 1: not among the 3 most likely below, the plain "
        "probabilities)")


def test_a_draw_that_is_the_tables_last_row_gets_no_note() -> None:
    """The drawn token in the table's last (least likely) row is in the table: a note
    saying it was "not among the 3 most likely below" contradicted the table beside it."""
    top = [(65, 0.3), (66, 0.2), (67, 0.1)]
    assert draw_note(Reading([0], 0.0, 67, top, []), 0.2, 0.9) == ""
    assert draw_note(Reading([0], 0.0, 67, top, []), None, None) == ""
    assert draw_note(Reading([0], 0.0, 65, top, []), None, None) == ""
