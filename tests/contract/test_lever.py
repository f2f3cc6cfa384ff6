"""The default dual update against its formula, and a strategy set by code reaching the
enforcer (specs cannot set one)."""

from __future__ import annotations

import pytest

from headwise.contract import ClauseLever, DualContext, EnforceConfig, LeverKind, ProjectedAscent
from headwise.errors import SpecError
from headwise.runspec.parse import parse_enforce


def _ctx(failing: frozenset[str | None] = frozenset()) -> DualContext:
    levers = {0: ClauseLever(LeverKind.ABLATION, "ablate L0.H1", perturbs=frozenset({"copy"})),
              1: ClauseLever(LeverKind.PATTERN, "pattern objective"), 2: None}
    return DualContext(levers, failing, frozenset({3}), eta=4.0, lambda_max=16.0)


def test_projected_ascent_is_clip_of_lambda_plus_eta_v() -> None:
    lambdas = {0: 1.0, 1: 15.0}
    ProjectedAscent().update(lambdas, {0: 0.25, 1: 0.5}, _ctx())
    assert lambdas == {0: pytest.approx(1.0 + 4.0 * 0.25), 1: 16.0}  # capped at lambda_max
    ProjectedAscent().update(lambdas, {0: -1.0}, _ctx())
    assert lambdas[0] == 0.0  # projected onto lambda >= 0


def test_a_failing_floor_halves_only_the_levers_that_degrade_its_task() -> None:
    lambdas = {0: 8.0, 1: 8.0}
    ProjectedAscent().update(lambdas, {0: 0.0, 1: 0.0}, _ctx(frozenset({"copy"})))
    assert lambdas == {0: 4.0, 1: 8.0}  # the ablation on copy's examples backs off


def test_the_dual_update_is_set_by_code_not_by_a_spec() -> None:
    class Frozen:
        keeps_held_model = False

        def update(self, lambdas: dict[int, float], violations: object,
                   ctx: DualContext) -> None:
            return None

    config = EnforceConfig(dual=Frozen())
    assert not config.dual.keeps_held_model and EnforceConfig().dual == ProjectedAscent()
    with pytest.raises(SpecError, match=r"^enforce\.dual: unknown key"):
        parse_enforce({"dual": "halving"})
