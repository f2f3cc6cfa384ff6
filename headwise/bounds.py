"""The one signed margin of a measured value to its bounds, which contract clauses hold and
clause forecasts predict."""

from __future__ import annotations

import math


def margin(value: float, at_least: float | None, at_most: float | None) -> float:
    """Signed distance of ``value`` inside its bounds: ``min(value - at_least, at_most -
    value)`` over the bounds that are set (``> 0``/``= 0``: holds with that margin; ``< 0``:
    fails by that much; NaN: ``-inf``). The violation a multiplier reads is ``-margin``."""
    if math.isnan(value):
        return -math.inf
    m = math.inf
    if at_least is not None:
        m = min(m, value - at_least)
    if at_most is not None:
        m = min(m, at_most - value)
    return m
