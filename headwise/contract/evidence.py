"""How many verification examples an enforced run draws: sized from its enforcement set.

A clause measured a little past its bound needs more examples to be certified than one measured
far past it, and how many depends on the trained model, which the spec's author cannot know.
An enforced run already measures its contract on the enforcement set at the kept evaluation
point; ``pilot_examples`` reads that measurement as the pilot of a two-stage design (Stein
1945): for each clause that holds there, ``Bound.needed`` is about how many of its examples
would certify it at the measured margin and spread, and the verification set is drawn large
enough that, were the clause's true value the one measured, it would be certified with
probability ``POWER``: ``needed x ((z_a + z_b) / z_a)^2``, ``z_a`` the normal quantile of the
clause's own level and ``z_b`` that of ``POWER`` (the usual sample-size formula for a
one-sided test; 80% is its conventional power, Cohen 1988). The clause's examples are its
task's share of the set, so the set grows by the set's size over the clause's examples.

The verdict stays valid at the stated level: the verification set is drawn after the size is
chosen, from its own seed and split, independent of everything the size was chosen from, so
every bound is computed on a sample the choice never saw. The set never shrinks below the
spec's size and grows to at most ``GROWTH`` times it (the verification's cost grows with it);
a spec that sets ``data.verify_examples`` gets exactly that many. Clauses measured on a probe
with its own size (``on:`` a declared or built-in probe) do not size the set.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from statistics import NormalDist

from headwise.contract.certify import any_of_heads
from headwise.contract.results import ContractResult

POWER = 0.8
"""The chance of certifying a clause whose true value is the one the pilot measured."""
GROWTH = 4
"""The verification set is at most this many times the spec's size."""


def powered(needed: int, level: float, power: float = POWER) -> int:
    """Examples at which a one-sided test at ``level`` that just clears its threshold with
    ``needed`` examples rejects with probability ``power`` at the same true value."""
    z_a, z_b = NormalDist().inv_cdf(1.0 - level), NormalDist().inv_cdf(power)
    return math.ceil(needed * ((z_a + z_b) / z_a) ** 2)


def pilot_examples(pilot: ContractResult, size: int, pilot_size: int,
                   tasks: Collection[str]) -> int:
    """The verification set's size after the pilot measurement ``pilot``.

    Args:
        pilot: the contract measured on the enforcement set (bounds included).
        size: the spec's verification size (``data.verify_examples``): the least returned.
        pilot_size: the examples of the set ``pilot`` was measured on.
        tasks: the spec's task names (a clause ``on`` one of them reads that task's rows).
    """
    want = size
    for r in pilot.results:
        b, c = r.bound, r.clause
        if (not r.passed or b is None or b.needed is None or not b.examples
                or (c.on is not None and c.on not in tasks)):
            continue
        level = (1.0 - b.confidence) / any_of_heads(c)
        want = max(want, math.ceil(powered(b.needed, level) * pilot_size / b.examples))
    return min(want, GROWTH * size)
