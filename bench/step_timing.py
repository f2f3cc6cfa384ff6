"""Side-by-side timing of training steps, shared by the step benchmarks.

``interleaved`` runs every system's step once per repetition, in turn, so load changes hit them
alike; ``paired`` is the median over repetitions of the ratio measured within one repetition;
``status_kib`` reads a field of ``/proc/self/status`` (peak resident memory: ``VmHWM``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def interleaved(steps: Mapping[str, Callable[[], object]], reps: int,
                warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each step, ``reps`` interleaved repetitions after ``warmup``."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    times: dict[str, list[float]] = {s: [] for s in steps}
    for _ in range(reps):
        for s, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[s].append(time.perf_counter() - t0)
    return times


def paired(times: Mapping[str, list[float]], a: str, b: str) -> float:
    """Median over repetitions of ``a / b`` measured in the same repetition."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
