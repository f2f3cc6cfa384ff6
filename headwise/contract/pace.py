"""The pace: a factor on the learning rate for a clause its multiplier cannot move faster.

Under AdamW a parameter moves by about the learning rate per step however large its loss's
weight, so once a clause's multiplier is at ``lambda_max`` a larger weight cannot move the
clause any faster. The pace (``EnforceConfig.pace_max``) is the one lever left: while a levered
clause fails with its multiplier at ``lambda_max`` (*capped*), the pace doubles, up to
``pace_max``; where a capped clause's violation *rose* while the pace was above 1 (too fast a
rate overshoots), it halves instead and never again exceeds the halved value (the
*ceiling*). While it is above 1 the learning rate is the pace times the peak rate
``train.lr``, the schedule suspended (``headwise.training.LR_SCALE``).

Two places decide, with the one rule (``Pace.decide``):

- every ``WINDOW`` training batches, for clauses measured on every batch
  (``headwise.contract.between``): capped means the multiplier at ``lambda_max`` and the
  window's mean violation above 0; *rose* means the mean rose since the previous window by
  more than twice the standard error of the difference (a batch's value is noisy: a spurious
  rise would set a ceiling for good). So the pace does not wait for the first evaluation
  point: with evaluation every 50 steps it can reach 8 by step 30;
- at evaluation points, on the enforcement set: doubling for capped clauses not measured on
  batches, halving (with the ceiling) for any capped clause whose violation aimed past its
  guard rose since the previous point; and once the contract holds or while a task floor
  fails (a task that has not learned is not helped by a faster rate) the pace halves, down
  to 1, and the batches leave it alone until the next point (*blocked*).

The state is JSON in ``TrainState.extra["enforce:pace"]`` beside ``LR_SCALE``, so checkpoints
carry it and ``--resume`` continues exactly; ``changes`` lists every step at which the pace
changed, for ``enforcement.json`` and the enforcement table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from headwise.training import LR_SCALE

ENTRY = "enforce:pace"
WINDOW = 10  # training batches per decision on batch values: AdamW's momentum horizon


@dataclass
class Window:
    """Sums of each batch-measured clause's violation (in its own units) over the batches of
    the window in progress, and the previous window's mean and standard error."""

    n: int = 0
    sums: list[float] = field(default_factory=list)
    squares: list[float] = field(default_factory=list)
    previous: list[list[float] | None] = field(default_factory=list)

    def add(self, violations: list[float]) -> None:
        if not self.sums:
            k = len(violations)
            self.sums, self.squares, self.previous = [0.0] * k, [0.0] * k, [None] * k
        self.n += 1
        for i, v in enumerate(violations):
            self.sums[i] += v
            self.squares[i] += v * v

    def close(self) -> list[tuple[float, float, list[float] | None]]:
        """Each clause's (mean, standard error of the mean, previous window's [mean, se]);
        starts the next window."""
        n, out = self.n, []
        for i, (s, q) in enumerate(zip(self.sums, self.squares, strict=True)):
            mean = s / n
            var = max(q / n - mean * mean, 0.0) * n / max(n - 1, 1)
            out.append((mean, math.sqrt(var / n), self.previous[i]))
            self.previous[i] = [mean, math.sqrt(var / n)]
        self.n = 0
        self.sums, self.squares = [0.0] * len(self.sums), [0.0] * len(self.squares)
        return out


@dataclass
class Pace:
    """The pace and what decides it (module docstring)."""

    pace: float = 1.0
    ceiling: float | None = None
    blocked: bool = False
    changes: list[list[float]] = field(default_factory=list)  # [step, pace] at each change
    window: Window = field(default_factory=Window)

    @classmethod
    def of(cls, extra: dict[str, Any]) -> Pace:
        """The pace kept in a trainer's callback state (a fresh one when none is)."""
        d = extra.get(ENTRY)
        if not d:
            return cls()
        w = d.get("window", {})
        return cls(float(d["pace"]), d.get("ceiling"), bool(d.get("blocked", False)),
                   [list(c) for c in d.get("changes", [])],
                   Window(int(w.get("n", 0)), list(w.get("sums", [])),
                          list(w.get("squares", [])), list(w.get("previous", []))))

    def save(self, extra: dict[str, Any]) -> None:
        """Write the state and the factor the training loop reads (``LR_SCALE``)."""
        w = self.window
        extra[ENTRY] = {"pace": self.pace, "ceiling": self.ceiling, "blocked": self.blocked,
                        "changes": self.changes,
                        "window": {"n": w.n, "sums": w.sums, "squares": w.squares,
                                   "previous": w.previous}}
        extra[LR_SCALE] = self.pace

    def decide(self, step: int, capped: bool, rose: bool, pace_max: float) -> None:
        """The rule: ``rose`` (a capped clause's violation rose while paced) halves the pace
        and sets the ceiling; else ``capped`` doubles it up to the ceiling (or ``pace_max``)."""
        if rose and self.pace > 1.0:
            self.ceiling = max(self.pace / 2.0, 1.0)
            self._set(step, self.ceiling)
        elif capped:
            top = pace_max if self.ceiling is None else min(self.ceiling, pace_max)
            self._set(step, min(2.0 * self.pace, top))

    def ease(self, step: int) -> None:
        """Halve the pace, down to 1 (the contract holds, or a task floor fails)."""
        self._set(step, max(self.pace / 2.0, 1.0))

    def on_batches(self, step: int, violations: list[float], capped: list[bool],
                   pace_max: float) -> None:
        """One training batch's violations of the batch-measured clauses (their own units)
        and whether each one's multiplier is at ``lambda_max``; decides at each window's
        end (module docstring)."""
        self.window.add(violations)
        if self.window.n < WINDOW:
            return
        windows = self.window.close()
        if self.blocked:
            return
        at_cap = [(mean, se, before) for (mean, se, before), c in zip(windows, capped,
                                                                      strict=True)
                  if c and mean > 0.0]
        rose = any(before is not None
                   and mean - before[0] > 2.0 * math.hypot(se, before[1])
                   for mean, se, before in at_cap)
        self.decide(step, bool(at_cap), rose, pace_max)

    def _set(self, step: int, value: float) -> None:
        if value != self.pace:
            self.pace = value
            self.changes.append([step, value])
