"""Counts, verb agreement and sentence starts in messages (backend/core/words.py)."""

from __future__ import annotations

import pytest

from backend.core.words import agrees, counted, percent, percent_of, sentence, tenths


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
    assert [percent(x) for x in (0, 1, 0.2044, 2 / 3, 0.99949)] == [
        "0.0%", "100.0%", "20.4%", "66.7%", "99.9%"]


def test_a_share_short_of_the_whole_never_reads_100_percent() -> None:
    # 1,999 of 2,000 blocks used, beside "Free blocks 1": "100.0%" said the pool was full.
    assert [percent(x) for x in (0.9995, 0.99999, 1999 / 2000)] == ["99.9%"] * 3
    assert [percent_of(p, 2000) for p in (1999, 2000)] == ["99.9%", "100.0%"]
    assert percent_of(1, 2000) == "0.1%" and percent(1.5) == "150.0%"


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


def test_a_tables_percent_column_never_reads_100_for_a_share_short_of_it() -> None:
    import pandas as pd

    from ui.compare import in_percent
    shown, _ = in_percent(pd.DataFrame({"s": [0.9996, 1.0, 0.5, 0.99949]}), "s")
    assert [f"{v:.1f}%" for v in shown["s"]] == ["99.9%", "100.0%", "50.0%", "99.9%"]


def test_sizes_and_counts_are_rounded_before_their_unit_is_chosen() -> None:
    from backend.views.model import format_bytes
    from backend.views.settings import format_count
    # 1,048,575 B read "1024 KiB", 102,359 B "100.0 KiB", 999,950 "1000.0k".
    assert [format_bytes(n) for n in (1023, 1024, 1536, 102_359, 102_400, 1_048_575,
                                      1_073_614_848)] == [
        "1023 B", "1.0 KiB", "1.5 KiB", "100 KiB", "100 KiB", "1.0 MiB", "1.0 GiB"]
    assert [format_count(n) for n in (999, 61_504, 999_949, 999_950, 134_515_008)] == [
        "999", "61.5k", "999.9k", "1.0M", "134.5M"]


def test_a_budget_refusal_never_reads_a_holding_as_its_limit_or_as_nothing() -> None:
    from backend.sessions.budget import MIB, _held, _mib
    assert _mib(2048) == "2.0 KiB" and _mib(MIB // 2) == "0.5 MiB" and _mib(0) == "0.0 MiB"
    assert _held(512 * MIB - 40_000, 512 * MIB) == "511.9 MiB"
    assert _held(300 * MIB, 512 * MIB) == "300.0 MiB"
