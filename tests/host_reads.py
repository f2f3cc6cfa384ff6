"""Making every tensor-to-host conversion raise, for tests of code that must never sync."""

from __future__ import annotations

import pytest
import torch

CONVERSIONS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")


def forbid_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until ``monkeypatch.undo()``, each way of reading a tensor's value on the host raises."""
    def host(*args: object, **kwargs: object) -> None:
        raise AssertionError("a lever read a tensor back to the host")
    for name in CONVERSIONS:
        monkeypatch.setattr(torch.Tensor, name, host)
