"""Forecast each clause's verdict during training, and warn about those forecast to fail.

``ClauseWatch`` is a ``train()`` callback (``headwise train --forecast-every N``). At every
evaluation point it has the contract's values on the enforcement set: an enforced run's enforcer
measures them anyway (its history is read), a plain run's watch measures them itself. Every
``every`` steps before the end of the budget (at the end there is nothing left to forecast) it
forecasts, per clause with a measured value, the probability that the clause holds at the end of
the budget and its final value with an interval (``headwise.forecast.clauses``, the model fit at
the largest fraction of the budget seen), and warns, one line per clause, about each clause
whose probability is below one half or whose heads the role forecast says will take another
role: the clause, the forecast (the probability and the final value of one predictive
distribution: the value holds exactly when the probability is at least one half), the role
forecast's reason, why the forecaster is outside the runs it was fit on (if it is) and what
``--enforce`` would add (in a plain run); the first warning from each of the forecaster's models
also says what that model was measured to do on runs it was not fit on. Every forecast is kept
in the callback state (``clause_watch``: saved with checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headwise.contract.clause import Clause, Contract
from headwise.contract.results import ContractResult
from headwise.forecast.clauses import ClauseForecast, ClauseForecasters, ClauseTrajectory


class ClauseWatch:
    """``train()`` callback (see the module docstring).

    Args:
        contract: the clauses to forecast.
        measure: the contract on the enforcement set (``None`` in an enforced run, whose
            enforcer's history is read instead).
        total_steps: the run's budget (forecasts are of its end).
        every: forecast at the first evaluation point at or after each multiple of ``every``.
        forecasters: the fitted forecasters.
        context: the run's ``n_layers``, ``n_heads`` and ``tasks`` (read against the range the
            forecasters were fit on).
        advice: clause index -> what ``--enforce`` would add for it (called once, at the first
            warning of a plain run; ``None``: no advice).
        warn: called with each warning line.
        roles: the clauses the role forecast says fail at the same point, and why (the heads
            forecast another role), by clause index (``None``: no role forecast); such a clause
            gets its line even when its verdict forecast holds.
    """

    def __init__(self, contract: Contract, measure: Callable[[Any], ContractResult] | None,
                 total_steps: int, every: int, forecasters: ClauseForecasters,
                 context: dict[str, Any],
                 advice: Callable[[], dict[int, str]] | None,
                 warn: Callable[[str], None],
                 roles: Callable[[], dict[int, str]] | None = None) -> None:
        self.contract, self.measure, self.total_steps = contract, measure, total_steps
        self.every, self.forecasters, self.context = every, forecasters, context
        self.advice, self.warn, self.roles = advice, warn, roles
        self._advice: dict[int, str] | None = None
        self._quoted: float | None = None  # the fraction whose measured accuracy was quoted
        self.next_at = every

    def __call__(self, state: Any) -> None:
        if state.rank != 0:
            return
        record = state.extra.setdefault("clause_watch", {"history": [], "forecasts": []})
        if self.measure is not None:
            result = self.measure(state.model)
            record["history"].append({"step": int(state.step), "clauses": {
                str(r.clause.index): {"measured": r.measured, "stderr": r.stderr}
                for r in result.results}})
            history = record["history"]
        else:
            history = state.extra.get("enforce", {}).get("history", [])
        if state.step < self.next_at or not history or state.step >= self.total_steps:
            return
        while self.next_at <= state.step:
            self.next_at += self.every
        seen = state.step / self.total_steps
        model = self.forecasters.at(seen)
        by_role = {} if self.roles is None else self.roles()
        for clause in self.contract:
            traj = self.trajectory(clause, history)
            if traj is None:
                continue
            f = model.forecast(traj)
            record["forecasts"].append({
                "step": int(state.step), "clause": clause.path, "model_fraction": model.fraction,
                "probability": f.probability, "value": f.value, "interval": list(f.interval),
                "outside": list(f.outside)})
            if not f.holds or clause.index in by_role:
                self.warn(self.message(int(state.step), clause, f, model.fraction,
                                       by_role.get(clause.index)))

    def trajectory(self, clause: Clause, history: list[dict[str, Any]]
                   ) -> ClauseTrajectory | None:
        """The clause's measured points so far (``None``: it has no measured value)."""
        key = str(clause.index)
        points = [(int(p["step"]), p["clauses"][key]["measured"], p["clauses"][key]["stderr"])
                  for p in history if key in p["clauses"]]
        if not any(v is not None for _, v, _ in points):
            return None
        low, high = clause.entry.value_range(clause)
        return ClauseTrajectory(
            tuple(p[0] for p in points), tuple(p[1] for p in points),
            tuple(p[2] for p in points), clause.at_least, clause.at_most, self.total_steps,
            self.measure is None, low, high,
            context={**self.context, "kind": clause.entry.forecast_kind(clause)})

    def message(self, step: int, clause: Clause, f: ClauseForecast, fraction: float,
                role: str | None = None) -> str:
        """The warning line about ``clause`` (see the module docstring)."""
        name = f" '{clause.name}'" if clause.name else ""
        text = (f"clause forecast at step {step}: {clause.path}{name} ({clause.describe()} "
                f"{clause.threshold_text()}): P(holds at the end) {f.probability:.2f}, final "
                f"value {f.value_text()}")
        if role:
            text += f"; the role forecast says it fails: {role}"
        if f.outside:
            text += f"; outside the runs the forecaster was fit on ({'; '.join(f.outside)})"
        if self.measure is not None and self.advice is not None:
            if self._advice is None:
                self._advice = self.advice()
            lever = self._advice.get(clause.index)
            text += (f"; --enforce would add: {lever}" if lever else
                     "; no lever of --enforce moves it (see `headwise plan`)")
        fresh = self.forecasters.measured.get("fresh", {}).get(str(fraction))
        configs = self.forecasters.measured.get("configs", {}).get(str(fraction))
        if fresh and self._quoted != fraction:
            self._quoted = fraction
            text += (f" [the forecaster from {fraction:.0%} of the budget was right on "
                     f"{fresh['accuracy']:.0%} of clause verdicts of suite runs it was not fit "
                     f"on" + (f", {configs['accuracy']:.0%} of the role-forecast benchmark's "
                              f"runs it was not fit on" if configs else "") + "]")
        return text
