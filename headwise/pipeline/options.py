"""How to run a spec: ``RunOptions``, what ``train_run`` takes besides the spec and the run
directory.

Five options shape what the run learns (``SHAPING``: ``--enforce``, ``--enforce-budget``,
``--allow-unenforced``, ``--steps`` and the ``--set`` / ``--seed`` overrides); a run records
them and ``--resume`` reuses and checks them (``headwise.pipeline.resume``): ``None`` there
means "not given" (the run's own on resume). The others say where the run trains and what it
prints: they may differ on resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headwise.contract import EnforceConfig
from headwise.runspec.overrides import overrides_of

SHAPING = ("enforce", "enforce_budget", "allow_unenforced", "steps", "overrides")
ENFORCE_BUDGET_MAX = 1.3  # ``--enforce-budget``: at most this factor on ``train.steps``


@dataclass(frozen=True)
class RunOptions:
    """The options of one ``train_run`` call.

    Attributes:
        enforce: ``--enforce``: constrained training with the contract's levers.
        enforce_budget: ``--enforce-budget``: a factor in [1, ``ENFORCE_BUDGET_MAX``] on the steps.
        allow_unenforced: ``--allow-unenforced``: enforce the clauses that have a lever.
        steps: ``--steps``: the steps trained (before the budget) instead of ``train.steps``.
        overrides: ``--set`` items (``path.to.key=value``).
        seed: ``--seed``: ``train.seed``, applied after ``overrides`` (it wins).
        resume: continue the run in the directory from its latest checkpoint.
        overwrite: replace a run already in the directory.
        progress: a line per evaluation point (and a bar on a terminal).
        device: overrides the spec's ``train.device``.
        forecast_every: every that many steps (at evaluation points), forecast each head's
            final role and each clause's verdict, warning about those forecast to fail.
        forecaster: a role forecaster file to warn from (default: the packaged one).
        enforce_config: the enforcement settings (default: the spec's ``enforce:`` section);
            code may set ``EnforceConfig.dual`` here.
        warn: where warning lines go.
    """

    enforce: bool | None = None
    enforce_budget: float | None = None
    allow_unenforced: bool | None = None
    steps: int | None = None
    overrides: tuple[str, ...] | None = None
    seed: int | None = None
    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    device: str | None = None
    forecast_every: int = 0
    forecaster: str | Path | None = None
    enforce_config: EnforceConfig | None = None
    warn: Callable[[str], None] = print

    def given(self) -> RunOptions:
        """These options with ``--seed`` folded into ``overrides`` as ``train.seed=N`` (the form
        a run records; ``overrides`` stays ``None`` when neither was given)."""
        if self.overrides is None and self.seed is None:
            return self
        return dataclasses.replace(self, overrides=overrides_of(self.overrides, self.seed),
                                   seed=None)

    def filled(self) -> RunOptions:
        """``given()`` with the defaults of a fresh run for the shaping options not given."""
        mine = self.given()
        return dataclasses.replace(
            mine, enforce=bool(mine.enforce),
            enforce_budget=1.0 if mine.enforce_budget is None else mine.enforce_budget,
            allow_unenforced=bool(mine.allow_unenforced), overrides=mine.overrides or ())
