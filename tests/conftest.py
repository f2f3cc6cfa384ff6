"""Shared test set-up: a fixed seed for every test, one thread, no network, and MKL's AVX2
code path on every x86 CPU that has it.

MKL picks its kernels by CPU: on a CPU with AVX-512 its float32 matrix products round
differently from those of an AVX2 CPU, and a training run whose trajectory turns on a close
call (an enforced run's multipliers, the step at which a task starts to learn) then ends
elsewhere: the tutorial's enforced run measures 0.561 at step 80 on AVX-512 where the page
quotes 0.389. ``MKL_CBWR=AVX2`` (MKL's conditional numerical reproducibility, read when MKL
first runs, so set before torch is imported) makes both kinds of CPU compute the same digits,
so the numbers docs quote and tests compare are the machine's no longer.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "AVX2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402  (after MKL's setting, which torch's first product reads)
import torch  # noqa: E402

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
