"""Fixed-point formatting for tables: ``fixed(-0.0001) == "0.000"``, never ``-0.000``.

A value that rounds to zero prints as zero whatever its sign; ``sign=True`` prints ``+0.000``
for it and an explicit sign otherwise (for drops and effects).
"""

from __future__ import annotations


def fixed(value: float, digits: int = 3, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals, without a negative zero."""
    text = f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
    if text.lstrip("+-").strip("0.") == "" and "nan" not in text:
        return ("+" if sign else "") + text.lstrip("+-")
    return text
