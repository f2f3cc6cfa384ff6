"""Another attempt for an enforced run whose kept model is not certified.

The step a run's circuit forms at, and whether its tasks learn at all in the budget, depend on
the learning rate: some contracts certify at the spec's rate and fail at half of it (their
budget is too short for the slower rate), others plateau at the spec's rate and certify at half
of it from the first step (docs/benchmarks.md, "A second attempt at half the rate"). No signal
in the first steps tells the two apart, and halving the rate partway through a run does not do
what starting at half of it does. So an enforced run whose kept model is not certified on the
enforcement set at its end trains again from its initial weights (the same seed, the same data
stream) at ``RETRY_LR_FACTOR`` times the rate, up to ``EnforceConfig.retries`` times, and the
run keeps the attempt whose kept model reached the highest tier on the enforcement set
(certified, past every clause's guard, held, never held), the earliest on a tie. A run under
``torchrun`` trains once (a second attempt would need the process group set up again). The choice
reads the enforcement set only: the verification set, which no attempt read, is measured once,
on the model kept, so trying twice does not spend the verdict's level.
"""

from __future__ import annotations

from collections.abc import Sequence

from headwise.contract.lever import EnforceConfig
from headwise.contract.record import KEPT_TIERS, EnforcementRecord

RETRY_LR_FACTOR = 0.5  # each attempt's learning rate, per unit of the previous attempt's
TIERS = (None, *KEPT_TIERS)  # an attempt's kept model, weakest first (None: never held)


def attempt_tier_name(record: EnforcementRecord) -> str | None:
    """The tier of an attempt's kept model on the enforcement set (``None``: the contract
    never held there; a run that stopped at its first hold (``enforce.stop: first_hold``)
    kept a held model)."""
    if record.kept_as is not None:
        return record.kept_as
    return "held" if record.held_at is not None else None


def retry_due(records: Sequence[EnforcementRecord], config: EnforceConfig) -> bool:
    """Whether the run trains again after the attempts of ``records``: fewer than
    ``config.retries`` retries were made and the last one's kept model falls short of what
    the run aims at on the enforcement set: certified, or with ``enforce.stop: first_hold``
    (which stops at the first point that held) held."""
    aim = "held" if config.stop == "first_hold" else "certified"
    return (len(records) <= config.retries
            and TIERS.index(attempt_tier_name(records[-1])) < TIERS.index(aim))


def best_attempt(records: Sequence[EnforcementRecord]) -> int:
    """The index of the attempt the run keeps: the highest tier on the enforcement set, the
    earliest on a tie."""
    tiers = [TIERS.index(attempt_tier_name(r)) for r in records]
    return tiers.index(max(tiers))


__all__ = ["RETRY_LR_FACTOR", "TIERS", "attempt_tier_name", "best_attempt", "retry_due"]
