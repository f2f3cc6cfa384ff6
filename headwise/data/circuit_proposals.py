"""Circuits proposed from a task's own examples: the known circuit that would produce its targets.

A task floor that fails and stops improving gets its task's circuit as assists: role objectives
on heads the contract leaves free (docs/contracts.md, "Circuit assists"). A built-in generator
may declare that circuit (``headwise.data.Task.circuit``); for every other task, the user's
files included, it is proposed here from training examples alone, before any model exists.
Each known circuit is read as a rule that predicts the target at a scored position from the
tokens the model reads, and the rule that reproduces the largest share of the scored targets
is proposed, if it explains a clear majority of them.

Circuits measured (``x`` a row's tokens, ``t`` a scored position; roles as ``headwise.patterns``
defines them, layers counted from the bottom):

===============  =============================  ==============================================
circuit          roles, ``(role, layer)``       target predicted at ``t``
===============  =============================  ==============================================
``induction``    previous_token 0, induction 1  ``x[j + 1]`` for the latest ``j < t`` with
                                                ``x[j] == x[t]``: the key the induction role
                                                attends to (``patterns.induction_keys``)
``offset_k``     previous_token 0 .. k - 1      ``x[t - k]``, ``k = 1 .. MAX_OFFSET``: k = 1 is
                                                previous-token copying; for k > 1 each
                                                previous-token head moves the token one more
                                                position on
``first_token``  first_token 0                  the row's first real token (``t`` after it)
===============  =============================  ==============================================

Left out: copying the current token (``self``, ``duplicate_token``): the residual stream
carries it to the logits without any head, so an assist has nothing to build; ``next_token``:
defined only in bidirectional models, and every task here that predicts the next token is
causal; ``local`` and ``uniform``: they average several keys and predict no single token.

Per circuit, over the scored targets (``targets != IGNORE``):

- ``share``: the fraction whose target equals the circuit's prediction (a position where the
  rule predicts nothing, such as a token with no earlier occurrence, counts as unexplained);
- ``chance``: the share the rule would explain if its predictions were independent of the
  targets, ``sum_t p(pred_t) / n`` with ``p`` the scored targets' empirical distribution
  (Cohen's expected agreement);
- ``kappa = (share - chance) / (1 - chance)``: the part of what chance leaves that it explains.

A circuit is *clear* when ``share >= MIN_SHARE`` (0.6) and ``kappa >= MIN_KAPPA`` (0.5). An
assist pulls its heads towards the roles on every position of the task's examples, and a
weight-1.0 role objective holds a task near chance for 100 steps or more before it helps
(docs/benchmarks.md, "Circuit assists"): a circuit must be right for most targets to repay
that, and 0.6 is a majority by more than four standard errors at 256 examples. The kappa
bound refuses a rule that only agrees with nearly constant targets (a task whose answer is
always the same token needs no circuit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headwise.data.batch import IGNORE, Batch
from headwise.patterns import induction_keys, real_tokens

MIN_SHARE = 0.6
MIN_KAPPA = 0.5
MAX_OFFSET = 4
# Rows per pass of the induction rule, which builds (rows, T, T) booleans: at most ~16M.
_PAIR_BUDGET = 1 << 24

Circuit = tuple[tuple[str, int], ...]
NAMES = ("induction", *(f"offset_{k}" for k in range(1, MAX_OFFSET + 1)), "first_token")


@dataclass(frozen=True)
class CircuitShare:
    """How much of a task's targets one known circuit explains.

    Attributes:
        name: ``induction``, ``offset_1`` .. ``offset_4``, or ``first_token``.
        roles: ``(role, layer)`` pairs, the form of ``headwise.data.Task.circuit``.
        share: fraction of the scored targets the circuit's prediction equals.
        chance: the share its predictions would get if independent of the targets.
        targets: number of scored targets measured.
    """

    name: str
    roles: Circuit
    share: float
    chance: float
    targets: int

    @property
    def kappa(self) -> float:
        """``(share - chance) / (1 - chance)``; 0 when chance is 1."""
        return 0.0 if self.chance >= 1.0 else (self.share - self.chance) / (1.0 - self.chance)

    @property
    def layers(self) -> int:
        """The number of layers the circuit needs (its top layer + 1)."""
        return max(layer for _, layer in self.roles) + 1

    @property
    def clear(self) -> bool:
        """Whether it explains a clear majority: ``share >= MIN_SHARE``, ``kappa >=
        MIN_KAPPA``."""
        return self.share >= MIN_SHARE and self.kappa >= MIN_KAPPA

    def describe(self) -> str:
        """``induction (previous_token L0 -> induction L1)``."""
        return f"{self.name} ({circuit_text(self.roles)})"


def circuit_text(roles: Circuit) -> str:
    """``previous_token L0 -> induction L1``: a circuit's roles bottom up."""
    return " -> ".join(f"{role} L{layer}" for role, layer in roles)


def circuit_roles(name: str) -> Circuit:
    """The ``(role, layer)`` pairs of a circuit measured here, by name."""
    if name == "induction":
        return (("previous_token", 0), ("induction", 1))
    if name == "first_token":
        return (("first_token", 0),)
    k = int(name.removeprefix("offset_"))
    return tuple(("previous_token", layer) for layer in range(k))


def rank_circuits(batch: Batch) -> list[CircuitShare]:
    """Every circuit's share of ``batch``'s scored targets, best first (ties: fewer layers,
    then the order of the module's table).

    Args:
        batch: a task's training examples, tokens and targets (B, T) (targets ``IGNORE``
            where unscored), attention mask (B, T) or ``None``.

    Raises:
        ValueError: ``batch`` has no scored target.
    """
    scored = batch.targets != IGNORE  # (B, T)
    n = int(scored.sum())
    if n == 0:
        raise ValueError("batch: no scored target (every target is IGNORE), expected at least "
                         "one to measure circuits against")
    real = real_tokens(batch.tokens, batch.attention_mask)
    goal = batch.targets[scored]  # (n,)
    values, counts = goal.unique(return_counts=True)
    out = []
    for name in NAMES:
        pred = _predictions(name, batch.tokens, real)[scored]  # (n,), -1: no prediction
        share = float((pred == goal).sum()) / n
        # p(pred_t) under the targets' distribution: look each prediction up in values.
        where = torch.searchsorted(values, pred).clamp(max=values.numel() - 1)
        hit = values[where] == pred
        chance = float(torch.where(hit, counts[where], 0).sum()) / (n * n)
        out.append(CircuitShare(name, circuit_roles(name), share, chance, n))
    order = {name: i for i, name in enumerate(NAMES)}
    return sorted(out, key=lambda c: (-c.share, c.layers, order[c.name]))


def propose(ranked: list[CircuitShare], n_layers: int | None = None) -> CircuitShare | None:
    """The best clear circuit of ``ranked`` (``rank_circuits``) that fits a model of
    ``n_layers`` layers (any depth when ``None``); ``None`` when there is none."""
    for c in ranked:
        if c.clear and (n_layers is None or c.layers <= n_layers):
            return c
    return None


def _predictions(name: str, tokens: Tensor, real: Tensor) -> Tensor:
    """(B, T) long: the token circuit ``name`` predicts at each position, -1 where none."""
    B, T = tokens.shape
    if name == "induction":
        step = max(1, _PAIR_BUDGET // (T * T))
        keys = torch.cat([induction_keys(tokens[i:i + step], real[i:i + step])
                          for i in range(0, B, step)]) if B else tokens.new_empty(0, T)
        src = keys  # (B, T): j + 1, or -1
    elif name == "first_token":
        first = real.to(torch.int8).argmax(1, keepdim=True)  # (B, 1)
        pos = torch.arange(T, device=tokens.device)
        src = torch.where(pos > first, first, -1)
    else:
        k = int(name.removeprefix("offset_"))
        src = torch.arange(T, device=tokens.device).expand(B, T) - k
    ok = (src >= 0) & real
    ok = ok & real.gather(1, src.clamp(min=0))  # the predicted token is a real one
    return torch.where(ok, tokens.gather(1, src.clamp(min=0)), -1)
