"""Deprecated alias: ``headwise.spec`` is now ``headwise.runspec``.

Renamed in 0.2 (a folder called ``spec`` reads as a test folder to common tools and blurred with
"contract"). Its public names resolve to ``headwise.runspec`` with a
``DeprecationWarning``; submodules exist only under the new name.
"""

from __future__ import annotations

import warnings
from typing import Any

import headwise.runspec as _new


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(f"headwise.spec.{name} is deprecated; use headwise.runspec.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(_new, name)
