"""Telling a sharded parameter (a ``DTensor``) apart without importing its module.

``torch.distributed.tensor`` takes a large share of ``import headwise`` (every command and every
subprocess pays it), and only sharded training (``train.parallel: fsdp``) makes DTensors, after
importing that module itself. So a tensor can be a ``DTensor`` only once the module is loaded:
``is_dtensor`` checks for it in ``sys.modules`` first, and code that needs the module's
functions imports it where it is used.
"""

from __future__ import annotations

import sys
from typing import Any


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.distributed.tensor.DTensor``."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)
