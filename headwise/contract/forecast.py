"""What a role forecast says about a contract, and a training callback that warns early.

A forecast predicts each head's final *top role* (``headwise.forecast.roles``), so it speaks
to score clauses whose role is a top-role candidate: ``at_least`` on role R fails when the head
is forecast another role (for ``any_of``: when no listed head is forecast R; for ``all_of``:
when some head is not), and ``at_most`` on R fails when the head is forecast R. A forecast of
R does not promise a score above an ``at_least`` bound, so "pass" means "not forecast to fail".
Ablation, exclusivity and task clauses, and roles such as ``local`` or ``entropy``, are not
forecast (``verdict = "not forecast"``).

``ForecastWatch`` is a ``train()`` callback: at evaluation points it scores the model with the
role-table function, and every ``every`` steps forecasts final roles from the trajectory so far
and warns about each clause forecast to fail, naming the clause and the head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from headwise.analysis.role_table import RoleTable
from headwise.analysis.trajectories import Trajectory
from headwise.contract.clause import Clause, Contract
from headwise.forecast.role_scores import RoleRun, RoleScoreForecaster
from headwise.forecast.roles import CLASSES, Forecaster, HeadForecast, forecast_heads, n_early
from headwise.heads import Head
from headwise.model.eval_mode import eval_mode


@dataclass(frozen=True)
class ClauseForecast:
    """A clause's forecast: ``"fail"``, ``"pass"`` or ``"not forecast"``, and the heads why."""

    clause: Clause
    verdict: str
    heads: tuple[HeadForecast, ...] = ()

    def message(self) -> str:
        """One line naming the clause and the heads behind the verdict."""
        c = self.clause
        why = ", ".join(f"{h.head} forecast {h.role} ({h.confidence:.0%})" for h in self.heads)
        name = f" '{c.name}'" if c.name else ""
        return (f"{c.path}{name} ({c.describe()} {c.threshold_text()}): forecast to "
                f"{self.verdict}" + (f": {why}" if why else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"clause": self.clause.path, "description": self.clause.describe(),
                "verdict": self.verdict, "heads": [h.to_dict() for h in self.heads]}


def forecast_clauses(contract: Contract, forecasts: list[HeadForecast]) -> list[ClauseForecast]:
    """The verdict the forecast implies for every clause (see module)."""
    by_head: dict[Head, HeadForecast] = {f.head: f for f in forecasts}
    out = []
    for c in contract.clauses:
        if c.score not in CLASSES or c.score == "none" or c.on not in (  # score clauses only
                None, "default", "repeated"):
            out.append(ClauseForecast(c, "not forecast"))
            continue
        fs = [by_head[h] for h in c.heads if h in by_head]
        if not fs:
            out.append(ClauseForecast(c, "not forecast"))
            continue
        is_r = [f.role == c.score for f in fs]
        fails = []
        if c.at_least is not None:
            if c.quantifier == "any_of":
                fails = [] if any(is_r) else fs
            else:  # head, all_of, set: every head must be R
                fails = [f for f, ok in zip(fs, is_r, strict=True) if not ok]
        if c.at_most is not None:
            if c.quantifier == "any_of":
                fails += fs if all(is_r) else []
            else:
                fails += [f for f, ok in zip(fs, is_r, strict=True) if ok]
        out.append(ClauseForecast(c, "fail" if fails else "pass",
                                  tuple(fails) if fails else tuple(fs)))
    return out


class ForecastWatch:
    """``train()`` callback: forecast final roles every ``every`` steps and warn on clauses.

    Args:
        score: the role-table function (model -> RoleTable), e.g. ``run_role_table`` bound to
            the run's verification data.
        total_steps: the run's planned steps (forecasts extrapolate to it).
        every: forecast at the first evaluation point at or after each multiple of ``every``.
        contract: the clauses to check (``None``: forecast roles only).
        forecaster: the fitted forecaster.
        warn: called with each warning line (e.g. a console print); ``None``: the clauses
            forecast to fail are only kept (``failing``: the latest point's, for the clause
            watch's own line).
    """

    def __init__(self, score: Callable[[nn.Module], RoleTable], total_steps: int, every: int,
                 contract: Contract | None, forecaster: Forecaster,
                 warn: Callable[[str], None] | None) -> None:
        self.score, self.total_steps, self.every = score, total_steps, every
        self.contract, self.forecaster, self.warn = contract, forecaster, warn
        self.tables: list[tuple[int, RoleTable]] = []
        self.next_at = every
        self.warned: list[tuple[int, str, str]] = []  # (step, clause path, head)
        self.failing: dict[int, str] = {}  # the latest point's failing clauses: why, by index

    def __call__(self, state: Any) -> None:
        if state.rank != 0:
            return
        with eval_mode(state.model):
            self.tables.append((int(state.step), self.score(state.model)))
        if state.step < self.next_at or len(self.tables) < 2:
            return
        while self.next_at <= state.step:
            self.next_at += self.every
        heads = forecast_heads(Trajectory(self.tables), self.forecaster,
                               total_steps=self.total_steps)
        if self.contract is None:
            return
        self.failing = {}
        for cf in forecast_clauses(self.contract, heads):
            if cf.verdict == "fail":
                self.failing[cf.clause.index] = ", ".join(
                    f"{h.head} forecast {h.role} ({h.confidence:.0%})" for h in cf.heads)
                if self.warn is not None:
                    self.warn(f"forecast at step {state.step} (forecaster "
                              f"v{self.forecaster.version}): {cf.message()}")
                self.warned += [(int(state.step), cf.clause.path, str(h.head))
                                for h in cf.heads]


def forecast_summary(traj: Trajectory, forecaster: Forecaster, fraction: float = 0.2,
                     total_steps: int | None = None, contract: Contract | None = None,
                     scores: RoleScoreForecaster | None = None,
                     run: dict[str, Any] | None = None) -> dict[str, Any]:
    """JSON-ready forecast from the first ``fraction`` of ``traj``'s checkpoints, as reports
    and ``headwise analyze --forecast`` show it (``total_steps`` ``None``: a finished run, whose
    last checkpoint is its end, as in the benchmark): per head the predicted role, confidence,
    commitment so far and actual final role; with ``scores``, each role's final score with its
    interval and whether that decides the head's role (``score_forecast``; ``run``: the run's
    ``enforced`` and ``context``, read against the forecaster's fitted range); per clause the
    forecast verdict; and the accuracy the benchmark measured for each forecaster (never one
    graded on this run)."""
    n = n_early(len(traj.steps), fraction)
    heads = forecast_heads(traj, forecaster, n, total_steps)
    out: dict[str, Any] = {
        "forecaster_version": forecaster.version, "fraction": fraction,
        "from_steps": traj.steps[:n], "measured": forecaster.measured,
        "heads": [{**f.to_dict(), "final_role": traj.final_role(f.head)} for f in heads]}
    if scores is not None and n >= 2:  # a score forecast reads a change
        role_run = RoleRun(traj.upto(n), total_steps if total_steps is not None
                           else traj.steps[-1], **(run or {}))
        for h, f in zip(out["heads"], scores.forecast(role_run, n), strict=True):
            h["score_forecast"] = f.to_dict()
            h["score_forecast"]["text"] = f.text()
        out["score_forecaster_measured"] = scores.measured
    if contract is not None:
        out["clauses"] = [c.to_dict() for c in forecast_clauses(contract, heads)]
    return out
