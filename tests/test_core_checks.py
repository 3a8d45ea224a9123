"""The shared integer check: what passes, and how each refusal reads."""

from __future__ import annotations

import pytest

from backend.core.checks import check_int
from backend.core.errors import PagedLabError


@pytest.mark.parametrize(("value", "low", "high"), [
    (1, 1, 256), (256, 1, 256), (0, 0, None), (10**12, 1, None), (-3, -5, -1)])
def test_an_int_in_range_is_returned_as_given(value: int, low: int, high: int | None) -> None:
    assert check_int(value, "x", low, high) is value


@pytest.mark.parametrize(("value", "low", "high", "message"), [
    (0, 1, 256, "block_size must be an integer in 1..256, got 0"),
    (257, 1, 256, "block_size must be an integer in 1..256, got 257"),
    (10**9, 1, 65_536, "block_size must be an integer in 1..65,536, got 1,000,000,000"),
    (-1, 0, None, "block_size must be an integer >= 0, got -1"),
    (True, 0, 256, "block_size must be an integer in 0..256, got true"),   # a bool is no count
    # A whole number a file wrote as a float: how to write it.
    (1.0, 1, 256, "block_size must be an integer in 1..256, got 1.0 (write it as 1, without "
                  "a decimal point or exponent)"),
    (1e2, 1, 256, "block_size must be an integer in 1..256, got 100.0 (write it as 100, "
                  "without a decimal point or exponent)"),
    # Out of range written as an integer too: no advice that would be refused again.
    (1e3, 1, 256, "block_size must be an integer in 1..256, got 1000.0"),
    (-3.0, 1, None, "block_size must be an integer >= 1, got -3.0"),
    (2.5, 1, 256, "block_size must be an integer in 1..256, got 2.5"),
    (1e300, 1, 256, "block_size must be an integer in 1..256, got 1e+300"),
    ("12", 1, None, "block_size must be an integer >= 1, got '12'"),
    (None, 1, 256, "block_size must be an integer in 1..256, got null"),
])
def test_a_refusal_names_the_field_the_requirement_and_the_value(
        value: object, low: int, high: int | None, message: str) -> None:
    with pytest.raises(PagedLabError) as refused:
        check_int(value, "block_size", low, high)
    assert str(refused.value) == message
