"""Deprecated alias: ``headwise.train`` is now ``headwise.training``.

Renamed in 0.2 (``headwise.train.train`` named a package and a function alike). Its public names
resolve to ``headwise.training`` with a ``DeprecationWarning``;
submodules exist only under the new name.
"""

from __future__ import annotations

import warnings
from typing import Any

import headwise.training as _new


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(f"headwise.train.{name} is deprecated; use headwise.training.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(_new, name)
