"""Shared test set-up: a fixed seed for every test, one thread, and no network."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# Two threads on a loaded 2-core machine are often slower than one; tests need no parallelism.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` run only where CUDA is available (skipped, with a reason, else)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (none available here)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
