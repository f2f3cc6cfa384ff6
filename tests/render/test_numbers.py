"""Table numbers: no negative zero."""

from __future__ import annotations

import pytest

from headwise.render.numbers import fixed


@pytest.mark.parametrize(("value", "plain", "signed"), [
    (-0.0001, "0.000", "+0.000"), (-0.0, "0.000", "+0.000"), (0.0004, "0.000", "+0.000"),
    (-0.0006, "-0.001", "-0.001"), (1.23456, "1.235", "+1.235"), (-2.5, "-2.500", "-2.500")])
def test_fixed_never_prints_negative_zero(value: float, plain: str, signed: str) -> None:
    assert fixed(value) == plain and fixed(value, sign=True) == signed
