"""Attention-pattern objectives: per-head pattern targets (KL / CE / MSE) and entropy bounds.

Every objective follows the ``Objective`` protocol the trainer uses::

    with model.hooks(*obj.hooks()):          # capture what the loss needs, with gradient
        logits = model(tokens, attention_mask)
    term, logs = obj.loss(tokens, attention_mask)   # weight * loss, per-head values

``logs`` maps names to detached 0-d tensors (the same keys on every call), so a training step
never synchronises with the host; the trainer sums them on the device and reads them once per
log step.

Pattern losses attach a ``Hook`` on ``blocks.{l}.attn.hook_pattern`` restricted to the
supervised heads, so only those heads leave the fused (SDPA) path.

Notation for one supervised head: ``P[b, i, :]`` is the model's attention row of query ``i``
(a distribution over keys, zero on masked keys), ``Q[b, i, :]`` the target row. The *valid
rows* are those where (1) the target is defined (for a role: the role's defined rows in
``headwise.patterns``; index >= 0 with the key allowed by the model's causal and padding masks;
or a row with positive mass), (2) the query is a real token (``attention_mask``), and (3) the
model row has at least one allowed key. Per-row losses (natural log; ``tiny``: the smallest
normal number of ``P``'s dtype, 1.2e-38 in float32, so a target key with almost no mass still
gets a gradient: a larger floor would cut it off below the floor)::

    kl:  sum_j Q_ij (log Q_ij - log max(P_ij, tiny))      (0 log 0 = 0)
    ce:  - sum_j Q_ij log max(P_ij, tiny)
    mse: sum_j (P_ij - Q_ij)^2

A head's loss is the mean of its per-row losses over valid rows (0 if none); the objective's
loss is the mean over its heads, times ``weight``. See ``docs/levers.md``.

Cost per step: one tensor program for all supervised heads (their patterns stacked
(B, h, T, T)); a target that depends on positions only (a position role without padding, a
fixed matrix) is built once per batch shape and reused. A *function* target is validated on
every call (index range, non-negative weights), which reads its output on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control._common import as_headset, masked_mean, masked_means, model_shape
from headwise.control.objective import Objective
from headwise.control.regularizers import FFNPenalty, HeadDiversity
from headwise.data.batch import IGNORE
from headwise.model.eval_mode import eval_mode
from headwise.model.hook_point import Hook, HookContext
from headwise.patterns import (
    DEFAULT_WINDOW,
    POSITION_ROLES,
    ROLE_NAMES,
    TARGET_ROLES,
    RoleTarget,
    allowed_keys,
    real_tokens,
    role_target,
    row_scores,
)

EPS = 1e-12
LOSS_KINDS = ("kl", "ce", "mse")
TARGETS = TARGET_ROLES
TargetFn = Callable[[Tensor], Tensor]
# Roles whose target (without padding) depends on positions only; "entropy" reads allowed keys.
_POSITION_ONLY = (*POSITION_ROLES, "entropy")


class _PatternCapture:
    """Captures, with gradient, the patterns (B, h, T, T) of chosen heads during a forward."""

    def __init__(self, model: nn.Module, heads: Any, what: str) -> None:
        self.model = model
        self.heads = as_headset(model, heads, what)
        if not len(self.heads):
            raise ValueError(f"{what}: got an empty head set, expected at least one head")
        self.causal = bool(model.config.causal)  # type: ignore[union-attr]
        self._want = {l: tuple(self.heads.in_layer(l)) for l in self.heads.layers}
        self.names = [f"L{l}.H{h}" for l, hs in self._want.items() for h in hs]
        self.log_names: dict[str, list[str]] = {}
        self._captured: dict[int, tuple[tuple[int, ...], Tensor]] = {}

    def hooks(self) -> list[Hook]:
        def grab(layer: int) -> Callable[[Tensor, HookContext], None]:
            def fn(x: Tensor, ctx: HookContext) -> None:
                assert ctx.heads is not None
                self._captured[layer] = (ctx.heads, x)
            return fn
        return [Hook(f"blocks.{l}.attn.hook_pattern", grab(l), hs, read_only=True)
                for l, hs in self._want.items()]

    def clear(self) -> None:
        """Forget what the last forward captured."""
        self._captured.clear()

    def patterns(self) -> Tensor:
        """The patterns (B, h, T, T) of the last forward, heads in ``names`` order; clears them.

        One tensor per layer as the hook received it (its heads are the supervised ones, in
        order), concatenated over layers: the loss then runs once for every head.

        Raises:
            RuntimeError: nothing was captured (the forward ran without ``hooks()``).
        """
        parts = []
        for layer, want in self._want.items():
            if layer not in self._captured:
                raise RuntimeError(f"no attention pattern captured for layer {layer}: run the "
                                   "forward inside `with model.hooks(*objective.hooks())`")
            held, x = self._captured[layer]
            assert held == want, (held, want)  # a read-only hook gets exactly its heads
            parts.append(x)
        self._captured.clear()
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class _OnCapturedPatterns(Objective):
    """An objective on the patterns its ``_capture`` takes in the forward: the capture's hooks
    (read-only, restricted to the objective's heads), cleared at the step's reset. Its loss
    keeps each head's score on the batch (``_scores``) for ``batch_values``.

    ``task_id``: when set, the loss reads only the rows of the batch whose task is that one
    (``prepare`` takes them from ``Batch.task_ids``, on the device): a contract lever for a
    clause measured on one task's examples (``PlanContext.on_task``). ``None``: every row.
    """

    _capture: _PatternCapture
    _scores: Tensor | None = None
    task_id: int | None = None
    _task_rows: Tensor | None = None

    def prepare(self, batch: Any, step: int = 0) -> None:
        """Keep the rows of ``task_id``'s examples (B,) for the loss (nothing without one)."""
        self._task_rows = None if self.task_id is None else batch.task_ids == self.task_id

    def _rows(self, rows: Tensor) -> Tensor:
        """The defined rows (B, T) restricted to ``task_id``'s examples."""
        if self._task_rows is None:
            return rows
        return rows & self._task_rows.to(rows.device)[:, None]

    def hooks(self) -> list[Hook]:
        """Hooks on ``hook_pattern`` restricted to the supervised heads."""
        return self._capture.hooks()

    def batch_values(self) -> Tensor | None:
        """Each head's score on the last batch (h,), detached: the mean, over the rows where
        the head attends, of its per-row score (a pattern target's: the mass on the target's
        keys; a role bound's: the role's row score, e.g. the normalised entropy), so for a
        role its role score on that batch; NaN for a head with no such row (nothing
        measured); ``None`` before a loss or after the step's ``reset``. A contract's
        enforcement steps its clause's multiplier on it (``headwise.contract.between``)."""
        return self._scores

    def reset(self) -> None:
        self._capture.clear()
        self._scores = None
        self._task_rows = None


def _row_means(values: Tensor, valid: Tensor) -> Tensor:
    """Per head (h,): the mean of ``values`` (B, h, T) over the ``valid`` rows; NaN for a head
    with none (no host read)."""
    mean = masked_means(values, valid, (0, 2))
    return torch.where(valid.any(2).any(0), mean, torch.full_like(mean, float("nan")))


class _ShapeMemo:
    """The last value made for a batch shape and device.

    A target that depends on positions only (a position role without padding, a fixed matrix)
    is the same for every batch of one shape: it is made once and reused, not made per step.
    """

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: Any = None

    def get(self, tokens: Tensor, make: Callable[[], Any]) -> Any:
        key = (tuple(tokens.shape), tokens.device)
        if self._key != key:
            self._value, self._key = make(), key
        return self._value


def _head_logs(name: str, capture: _PatternCapture, values: Tensor) -> dict[str, Tensor]:
    """``{"name/L0.H1": value}`` per supervised head from one (h,) tensor (detached views)."""
    keys = capture.log_names.get(name)
    if keys is None:  # once per objective name, not per step
        keys = capture.log_names[name] = [f"{name}/{head}" for head in capture.names]
    return dict(zip(keys, values.detach().unbind(), strict=True))


def pattern_target(target: Any, tokens: Tensor, attention_mask: Tensor | None,
                   causal: bool, window: int = DEFAULT_WINDOW) -> tuple[Tensor, Tensor]:
    """The target distribution ``Q`` (B, T, T) and its defined rows (B, T) bool.

    A role name takes its target from ``headwise.patterns.role_target`` (the one definition
    role scores use too); see ``PatternObjective`` for tensors and functions.

    Raises:
        ValueError: unknown target name, or a tensor/function output of the wrong shape.
    """
    B, T = tokens.shape
    dev = tokens.device
    if isinstance(target, str):
        if target not in TARGETS:
            raise ValueError(f"target: got {target!r}, expected one of {list(TARGETS)}, a "
                             "(T, T) tensor or a function of the tokens")
        role = role_target(target, tokens, attention_mask, causal, window)
        return role.weights, role.rows
    allowed = allowed_keys(tokens, attention_mask, causal)
    out = target(tokens) if callable(target) else target
    if not isinstance(out, Tensor):
        raise ValueError(f"target: got {type(out).__name__}, expected a tensor")
    if out.dtype == torch.long and out.shape == (B, T):
        out = out.to(dev)
        if out.numel() and int(out.max()) >= T:
            raise ValueError(f"target: index {int(out.max())} out of range for T={T} positions")
        has = out >= 0
        Q = torch.nn.functional.one_hot(out.clamp_min(0), T).to(torch.float32)
        key_ok = allowed.gather(-1, out.clamp_min(0)[..., None]).squeeze(-1)
        return Q, has & key_ok
    if out.dim() == 2 and out.shape[0] == out.shape[1] and not callable(target):
        if out.shape[0] < T:
            raise ValueError(f"target: matrix is {tuple(out.shape)}, the input has T={T}")
        out = out[:T, :T].expand(B, T, T)
    if out.shape != (B, T, T) or not out.is_floating_point():
        raise ValueError(f"target: got {tuple(out.shape)} {out.dtype}, expected a float (T, T) "
                         f"or ({B}, {T}, {T}) distribution, or ({B}, {T}) long key indices")
    if bool((out < 0).any()):
        raise ValueError("target: has negative entries, expected non-negative row weights")
    out = out.to(dev, torch.float32)
    mass = out.sum(-1, keepdim=True)
    return out / mass.clamp_min(EPS), mass.squeeze(-1) > 0


def row_loss(P: Tensor, Q: Tensor, kind: str) -> Tensor:
    """Per-row loss (..., T) of model rows ``P`` against target rows ``Q`` (module docstring)."""
    logp = torch.log(P.clamp_min(torch.finfo(P.dtype).tiny))
    if kind == "kl":
        return (torch.special.xlogy(Q, Q) - Q * logp).sum(-1)
    if kind == "ce":
        return -(Q * logp).sum(-1)
    if kind == "mse":
        return (P - Q).pow(2).sum(-1)
    raise ValueError(f"kind: got {kind!r}, expected one of {list(LOSS_KINDS)}")


class PatternObjective(_OnCapturedPatterns):
    """Pull chosen heads' attention patterns towards a target.

    Targets (``Q`` rows, see module docstring for valid rows and the loss maths): a role name
    from ``headwise.patterns`` (``previous_token``, ``next_token``, ``self``, ``first_token``,
    ``duplicate_token``, ``induction``, ``local``, ``uniform``): the role's target distribution
    and defined rows, the same definition the role scores measure, so a loss near 0 means a
    role score near 1; a fixed float (N, N) matrix (its top-left (T, T), rows normalised to
    sum 1, zero rows excluded); or a function ``fn(tokens (B, T)) -> (B, T, T)`` float row
    weights (normalised likewise) or ``(B, T)`` long key indices (-1: no target), e.g.
    syntactic parents.

    Args:
        model: a headwise Transformer.
        heads: selector / ``Head`` / ``HeadSet`` of the supervised heads.
        target: see above.
        kind: ``"kl"``, ``"ce"`` or ``"mse"``.
        weight: multiplies the loss.
        window: half-width of the ``local`` target.

    Raises:
        ValueError: unknown ``target`` or ``kind``, or a fixed matrix that is not square.
        SelectorError: a head out of range.
    """

    def __init__(self, model: nn.Module, heads: Any, target: Any, kind: str = "kl",
                 weight: float = 1.0, window: int = DEFAULT_WINDOW) -> None:
        if kind not in LOSS_KINDS:
            raise ValueError(f"kind: got {kind!r}, expected one of {list(LOSS_KINDS)}")
        if isinstance(target, str) and target not in TARGETS:
            raise ValueError(f"target: got {target!r}, expected one of {list(TARGETS)}, a "
                             "(T, T) tensor or a function of the tokens")
        if isinstance(target, Tensor) and (target.dim() != 2
                                           or target.shape[0] != target.shape[1]):
            raise ValueError(f"target: tensor of shape {tuple(target.shape)}, expected (T, T)")
        if not isinstance(target, (str, Tensor)) and not callable(target):
            raise ValueError(f"target: got {type(target).__name__}, expected a name, a (T, T) "
                             "tensor or a function of the tokens")
        if isinstance(target, Tensor) and bool((target < 0).any()):  # checked once, here
            raise ValueError("target: has negative entries, expected non-negative row weights")
        model_shape(model)
        self.name = "pattern"
        self.weight = float(weight)
        self.kind = kind
        self.target = target
        self.window = window
        self._capture = _PatternCapture(model, heads, "heads")
        self.heads = self._capture.heads
        # Position-only targets (a fixed matrix; a position role without padding) are made once
        # per batch shape; token-dependent ones (induction, a function) once per step, for all
        # heads at once.
        self._fixed_matrix = isinstance(target, Tensor)
        self._memo = _ShapeMemo()

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weight * mean_heads(loss_head)`` and ``{"pattern/L0.H0": loss_head, ...}``."""
        Q, rows = self._target(tokens, attention_mask)  # (B, T, T), (B, T)
        P = self._capture.patterns()  # (B, h, T, T)
        valid = self._rows(rows)[:, None] & (P.detach().sum(-1) > 0.5)  # (B, h, T): attends
        per_head = masked_means(row_loss(P, Q[:, None].to(P.dtype), self.kind), valid,
                                (0, 2))  # (h,)
        on_target = (P.detach() * (Q[:, None] > 0).to(P.dtype)).sum(-1)  # (B, h, T)
        self._scores = _row_means(on_target, valid)  # (h,)
        return self.weight * per_head.mean(), _head_logs(self.name, self._capture, per_head)

    def _target(self, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """``Q`` (B, T, T) and the rows (B, T) where it is defined on a real query."""
        def make() -> tuple[Tensor, Tensor]:
            return pattern_target(self.target, tokens, attention_mask, self._capture.causal,
                                  self.window)
        if self._fixed_matrix:  # independent of tokens and padding (its rows: mass > 0)
            Q, defined = self._memo.get(tokens, make)
            if attention_mask is None:
                return Q, defined
            return Q, defined & real_tokens(tokens, attention_mask)
        if attention_mask is None and self.target in POSITION_ROLES:
            return self._memo.get(tokens, make)  # role rows are real queries already
        Q, defined = make()
        return Q, defined & real_tokens(tokens, attention_mask)


class RoleBound(_OnCapturedPatterns):
    """Keep chosen heads' score for ``role`` within ``[min, max]``, row by row.

    The role's per-row score is the one ``headwise.patterns`` defines (attention mass on the
    role's target; ``uniform``: overlap with the uniform row; ``entropy``: normalised entropy).
    Per head ``mean_rows [relu(min - s_q) + relu(s_q - max)]`` over the role's defined rows where
    the head attends; loss = mean over heads x ``weight``. An upper bound is the lever of a
    contract's ``score ... at_most`` clause (a penalty on the role's mass above the bound).

    Raises:
        ValueError: unknown role, no bound, a bound outside [0, 1], or ``min > max``.
    """

    def __init__(self, model: nn.Module, heads: Any, role: str, min: float | None = None,
                 max: float | None = None, weight: float = 1.0,
                 window: int = DEFAULT_WINDOW) -> None:
        if role not in ROLE_NAMES:
            raise ValueError(f"role: got {role!r}, expected one of {list(ROLE_NAMES)}")
        if min is None and max is None:
            raise ValueError("RoleBound: got min=None and max=None, expected at least one")
        for key, v in (("min", min), ("max", max)):
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"RoleBound: {key} got {v}, expected a number in [0, 1]")
        if min is not None and max is not None and min > max:
            raise ValueError(f"RoleBound: min={min} > max={max}")
        self.name = f"bound:{role}"
        self.weight = float(weight)
        self.role, self.min, self.max, self.window = role, min, max, window
        self._capture = _PatternCapture(model, heads, "heads")
        self.heads = self._capture.heads
        self._memo = _ShapeMemo()

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weight * mean_heads(hinge)``; logs each head's mean row score."""
        def make() -> RoleTarget:
            return role_target(self.role, tokens, attention_mask, self._capture.causal,
                               self.window)
        static = attention_mask is None and self.role in _POSITION_ONLY
        target = self._memo.get(tokens, make) if static else make()
        P = self._capture.patterns()  # (B, h, T, T)
        valid = self._rows(target.rows)[:, None] & (P.detach().sum(-1) > 0.5)  # (B, h, T)
        score = row_scores(P, target)  # (B, h, T)
        parts = ([torch.relu(self.min - score)] if self.min is not None else []) + (
            [torch.relu(score - self.max)] if self.max is not None else [])
        hinge = parts[0] if len(parts) == 1 else parts[0] + parts[1]  # (B, h, T)
        loss = masked_means(hinge, valid, (0, 2)).mean()
        self._scores = _row_means(score.detach(), valid)  # (h,)
        logs = self._scores.nan_to_num(0.0)  # a head with no row logs 0
        return self.weight * loss, _head_logs(self.name, self._capture, logs)


class EntropyBound(RoleBound):
    """Keep chosen heads' attention entropy within ``[min, max]``, in normalised units.

    ``RoleBound`` on the ``entropy`` role: the unit is the role score's (``headwise.patterns``),
    a row's entropy divided by ``log(n_allowed)``, in [0, 1] (0 = one key, 1 = uniform over the
    allowed keys), so a bound here means the same number as a contract's ``score: entropy``
    bound. Logs each head's mean normalised entropy as ``entropy/L0.H0``.

    Raises:
        ValueError: neither bound given, a bound outside [0, 1], or ``min > max``.
    """

    def __init__(self, model: nn.Module, heads: Any, min: float | None = None,
                 max: float | None = None, weight: float = 1.0) -> None:
        super().__init__(model, heads, "entropy", min=min, max=max, weight=weight)
        self.name = "entropy"


class IdleAtZero:
    """Left out of every step while its weight is 0 (``idle``, read by
    ``headwise.control.objective.sits_out``): a lever the contract enforcer switches on and
    off attaches no hooks and adds no term while off. Idleness follows the weight, which
    checkpoints store, so a resumed run leaves out the same objectives."""

    weight: float

    @property
    def idle(self) -> bool:
        """Whether the step leaves it out."""
        return self.weight == 0.0


class StandbyPattern(IdleAtZero, PatternObjective):
    """A pattern objective idle at weight 0: one of several candidate heads for a role of
    which the contract enforcer pulls one (a circuit assist on the heads an ``any_of`` clause
    chooses among, ``headwise.contract.lever.Follows``); the candidates it does not pull cost
    no step."""


class Desaturation(IdleAtZero, EntropyBound):
    """An entropy floor on a task's rows, left out of every step at weight 0 (``idle``): the
    contract enforcer's way off a saddle of saturated attention.

    When the heads put all their attention on one key where the answer is read (all four heads
    of a one-layer modular-addition model on ``=`` itself, a score 5 to 15 above any other
    key's), the softmax passes no gradient to the queries and keys, the output there is the
    same for every input and training stalls at the input-blind answers (docs/contracts.md,
    "A task that learns nothing"). Holding the rows' normalised entropy above ``min`` keeps the
    gradient flowing. ``lowest`` measures the symptom: its heads' entropy on the rows where the
    answers are read. Idle, the lever attaches no pattern hooks, so a run in which it never
    switches on computes exactly what it would without it.
    """

    _scored: Tensor | None = None  # (B, T) rows ``lowest`` reads: where the answers are read

    def __init__(self, model: nn.Module, heads: Any, min: float,
                 weight: float = 1.0) -> None:
        super().__init__(model, heads, min=min, weight=weight)
        self.name = "desaturation"

    def _rows(self, rows: Tensor) -> Tensor:
        rows = super()._rows(rows)
        return rows if self._scored is None else rows & self._scored.to(rows.device)

    @torch.no_grad()
    def lowest(self, model: nn.Module, batch: Any) -> float:
        """The lowest of its heads' mean normalised entropies over the rows of ``batch`` (one
        task's examples) where the answers are read (``targets != IGNORE``), in eval mode:
        below ``min``, some head is saturated there. 1.0 when no head attends on such a
        row."""
        self.prepare(batch)
        self._task_rows = None  # the batch is the task's own
        self._scored = batch.targets != IGNORE
        try:
            with eval_mode(model), model.hooks(*self.hooks()):  # type: ignore[operator]
                model(batch.tokens, attention_mask=batch.attention_mask,
                      task_ids=batch.task_ids)
            self.loss(batch.tokens, batch.attention_mask)
            assert self._scores is not None
            return float(self._scores.nan_to_num(1.0).min())
        finally:
            self._scored = None
            self.reset()

    def saturated(self, model: nn.Module, batch: Any) -> bool:
        """Whether some head's mean normalised entropy where ``batch``'s answers are read is
        below the floor (``lowest``)."""
        assert self.min is not None  # the floor __init__ requires
        return self.lowest(model, batch) < self.min


__all__ = ["EPS", "LOSS_KINDS", "TARGETS", "Desaturation", "EntropyBound", "FFNPenalty",
           "HeadDiversity", "IdleAtZero", "Objective", "PatternObjective", "RoleBound",
           "StandbyPattern", "masked_mean", "pattern_target", "row_loss"]

