"""Another attempt for an enforced run whose kept model is not certified: when it is due and
which attempt the run keeps (``headwise.contract.retry``), against the rule written out."""

from __future__ import annotations

import pytest

from headwise.contract import EnforceConfig, EnforcementRecord
from headwise.contract.retry import attempt_tier_name, best_attempt, retry_due
from headwise.errors import ConfigError


def _record(kept_as: str | None = None, held_at: int | None = None) -> EnforcementRecord:
    return EnforcementRecord(held_at=held_at, kept_as=kept_as)


def test_an_attempts_tier_is_its_kept_models_on_the_enforcement_set() -> None:
    assert attempt_tier_name(_record()) is None  # never held
    for tier in ("held", "past every guard", "certified"):
        assert attempt_tier_name(_record(tier, held_at=10)) == tier
    # enforce.stop: first_hold stops at the first hold and records no tier: that model held
    assert attempt_tier_name(_record(None, held_at=30)) == "held"


@pytest.mark.parametrize(("tiers", "retries", "due"), [
    ([None], 1, True),
    (["held"], 1, True),
    (["past every guard"], 1, True),
    (["certified"], 1, False),  # certified at the spec's rate: the run is as it was
    ([None], 0, False),  # enforce.retries: 0
    ([None, None], 1, False),  # one retry made, none left
    ([None, "held"], 2, True),
    ([None, "certified"], 2, False),
])
def test_a_retry_is_due_while_not_certified_and_retries_are_left(
        tiers: list[str | None], retries: int, due: bool) -> None:
    records = [_record(t, held_at=None if t is None else 10) for t in tiers]
    assert retry_due(records, EnforceConfig(retries=retries)) is due


@pytest.mark.parametrize(("tier", "due"), [(None, True), ("held", False)])
def test_a_run_that_stops_at_its_first_hold_retries_only_if_it_never_held(
        tier: str | None, due: bool) -> None:
    config = EnforceConfig(stop="first_hold")
    assert retry_due([_record(None, held_at=None if tier is None else 40)], config) is due


@pytest.mark.parametrize(("tiers", "kept"), [
    ([None, None], 0),  # a tie keeps the earlier attempt (the spec's own rate)
    (["held", "held"], 0),
    ([None, "held"], 1),
    (["held", "certified"], 1),
    (["past every guard", "held"], 0),
    (["held", None, "past every guard"], 2),
    ([None, "certified", "certified"], 1),
])
def test_the_run_keeps_the_highest_tier_the_earliest_on_a_tie(
        tiers: list[str | None], kept: int) -> None:
    assert best_attempt([_record(t, held_at=None if t is None else 10) for t in tiers]) == kept


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_retries_must_be_a_count(bad: object) -> None:
    with pytest.raises(ConfigError, match="retries"):
        EnforceConfig(retries=bad)  # type: ignore[arg-type]
