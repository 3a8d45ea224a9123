"""Counts, verb agreement and sentence starts in messages (backend/core/words.py)."""

from __future__ import annotations

import pytest

from backend.core.words import agrees, counted, percent, sentence, tenths


def test_counted_and_agrees() -> None:
    assert counted(1, "slot") == "1 slot"
    assert counted(0, "slot") == "0 slots"
    assert counted(1_024, "block") == "1,024 blocks"
    assert counted(2, "child", "children") == "2 children"
    assert f"{counted(1, 'table')} {agrees(1, 'holds', 'hold')} it" == "1 table holds it"
    assert f"{counted(3, 'table')} {agrees(3, 'holds', 'hold')} it" == "3 tables hold it"


def test_percent_rounds_halves_up_as_a_reader_does() -> None:
    # Exact binary halves: Python's "{:.1f}" gives 81.2 for 81.25 but 18.8 for 18.75.
    assert [percent(x) for x in (13 / 16, 9 / 48, 1 / 16)] == ["81.3%", "18.8%", "6.3%"]
    assert [percent(x) for x in (0, 1, 0.2044, 2 / 3, 0.9999)] == [
        "0.0%", "100.0%", "20.4%", "66.7%", "100.0%"]


def test_tenths_round_halves_up_with_thousands_separators() -> None:
    assert [tenths(x) for x in (1.25, 2.25, -1.25, 1.15, 0.04, 3.0)] == [
        "1.3", "2.3", "-1.3", "1.2", "0.0", "3.0"]
    assert tenths(12_345.65) == "12,345.7"
    # Not finite, or past where a float has halves to round: Python's formatting, never
    # an error from Decimal's 28 digits; a percentage alike.
    assert [tenths(x) for x in (float("inf"), float("nan"))] == ["inf", "nan"]
    assert tenths(1e27) == f"{1e27:,.1f}" and percent(1e27) == f"{100 * 1e27:,.1f}%"
    assert percent(float("nan")) == "nan%"


@pytest.mark.parametrize(("message", "shown"), [
    ("policy must be one of max, pow2", "Policy must be one of max, pow2"),
    ("trace: line 3", "Trace: line 3"),
    ("the longest request cannot run", "The longest request cannot run"),
    ("ok", "Ok"),
    # Names keep their spelling: a file, a field, a quoted id, a word with digits.
    ("trace.csv: row 2 (line 3): bad", "trace.csv: row 2 (line 3): bad"),
    ("num_blocks must be in 1..65536", "num_blocks must be in 1..65536"),
    ("'a' does not exist", "'a' does not exist"),
    ("fp8 is not supported", "fp8 is not supported"),
    ("Already a sentence.", "Already a sentence."),
    ("", ""),
])
def test_sentence_capitalises_a_plain_first_word_only(message: str, shown: str) -> None:
    assert sentence(message) == shown
