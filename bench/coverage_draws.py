"""The certified bounds' coverage simulations (``tests/contract/test_coverage.py``) at more draws.

Run from the repository root::

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.coverage_draws [--draws 20000] [--sample-skewness]

Each simulation of the test file (score clauses of one head, ``any_of``, ``all_of``, two-sided,
skewed; ``preserve`` cosine and KL caps) is run as the test runs it, with its true value on the
clause's threshold, but over ``--draws`` probes instead of 2000, so its rate of wrong
certifications is measured to a Monte-Carlo standard error of ``sqrt(0.05 0.95 / draws)``
(0.15 points at 20000) rather than tested within 3 of them. ``--sample-skewness`` bounds with
the plain sample skewness instead of the jackknifed one (``ratio_skewness``), for comparison.
Printed: each simulation's name and its rate.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable
from pathlib import Path

import torch

import headwise.analysis.importance_matrix as importance_matrix

TESTS = Path(__file__).resolve().parent.parent / "tests" / "contract" / "test_coverage.py"


def simulations(draws: int) -> tuple[types.ModuleType, list[float]]:
    """The test module with every simulation's 2000 draws replaced by ``draws``, and the list
    its two verdict counters append each simulation's measured rate to."""
    source = TESTS.read_text(encoding="utf-8")
    needle = "draws, sequences = 2000, 64"
    assert needle in source, "test_coverage.py no longer sizes its simulations this way"
    module = types.ModuleType("coverage_draws_simulations")
    exec(compile(source.replace(needle, f"draws, sequences = {draws}, 64"), str(TESTS), "exec"),
         module.__dict__)
    rates: list[float] = []
    for name in ("_score_wrong", "_distance_wrong"):
        inner = getattr(module, name)

        def counted(*args: object, inner: Callable[..., float] = inner) -> float:
            rates.append(inner(*args))
            return rates[-1]

        setattr(module, name, counted)
    return module, rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--sample-skewness", action="store_true",
                        help="bound with the plain sample skewness, not the jackknifed one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.sample_skewness:
        importance_matrix._left_out_skewness = lambda *a: None  # the jackknife falls back
    module, rates = simulations(args.draws)
    for name in sorted(n for n in vars(module) if n.startswith("test_")
                       and "exact_match" not in n):  # exact-match draws 20000 already
        try:
            getattr(module, name)()
        except AssertionError:
            pass  # the rate is what is reported, whatever the test's tolerance says
        print(f"{name}: {100 * rates[-1]:.2f}% of {args.draws}", flush=True)


if __name__ == "__main__":
    main()
