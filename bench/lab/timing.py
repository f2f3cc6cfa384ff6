"""Side-by-side timing, shared by the benchmarks that compare systems in one process.

``interleaved`` runs every system once per repetition, in turn, so load changes hit them alike;
``paired`` is the median over repetitions of the ratio measured within one repetition (robust
to load drift between repetitions); ``status_kib`` reads a field of ``/proc/self/status``
(peak resident memory: ``VmHWM``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

# What a timing reads: wall-clock seconds, or this process's CPU seconds (user + system, every
# thread), which a loaded shared machine inflates far less: a process waiting for a core
# accrues none. A benchmark's ``--clock`` chooses; its figures say which.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(systems: Mapping[str, Callable[[], object]], reps: int, warmup: int,
                clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per call of each system, ``reps`` interleaved repetitions after ``warmup``."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        for fn in systems.values():
            fn()
    times: dict[str, list[float]] = {s: [] for s in systems}
    for _ in range(reps):
        for s, fn in systems.items():
            t0 = now()
            fn()
            times[s].append(now() - t0)
    return times


def medians(times: Mapping[str, list[float]]) -> dict[str, float]:
    """Each system's median seconds."""
    return {k: statistics.median(v) for k, v in times.items()}


def paired(times: Mapping[str, list[float]], a: str, b: str) -> float:
    """Median over repetitions of ``a / b`` measured in the same repetition."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
