"""Distillation to the starting model: the levers and the distances of ``preserve`` clauses.

The distances (one definition, read by the levers here and by the clauses' measurement in
``headwise.contract.preserve``), each per position (or per sequence) with its weights, and as
``(sum, count)`` so batches pool exactly (the levers' ``*_sums``; a clause sums each sequence
alone, ``per_sequence``, for its bound):

- ``kl_terms`` / ``kl_sums``: ``KL(base || trained) = sum_v p_base(v) (log p_base(v) -
  log p_trained(v))`` of the output distributions, per scored position (on the rows
  ``scored_rows`` keeps: only the scored positions are unembedded and normalised over the
  vocabulary);
- ``cosines`` / ``cosine_sums``: cosine of the final hidden states (B, T, D), per scored
  position, or, for a bidirectional encoder (``pooled``), of the embeddings mean-pooled over the
  real tokens as sentence-transformers pools them, per sequence;
- ``pattern_kl_sums``: ``KL(base row || trained row)`` of attention patterns, per head and
  real query row (of the clause's task's rows, where it names a task).

The levers (``headwise.control.Objective`` loss terms, weighted by a clause's multiplier):

- ``Distill(model, base, metric)``: ``weight x`` the mean KL (``metric="kl"``) or ``1 -`` the
  mean cosine (``"hidden_cosine"``) of the trained model's outputs on the training batch to the
  base's; at weight 0 no base forward runs.
- ``PatternDistill(model, base, heads)``: ``weight x`` the mean pattern KL of ``heads`` to the
  base's. The lever of a role-drift bound: every role score is a mean over rows of attention
  mass on a target set (or ``1 - TV`` to a target row), and ``|mass_P(S) - mass_Q(S)| <=
  TV(P, Q) <= sqrt(KL(P || Q) / 2)`` (Pinsker), so pulling each head's rows to the base's
  bounds the drift of every role at once; distilling the outputs would not (two heads may trade
  roles while the outputs stay put).

Every lever reads the start through ``BaseReference.forward``: one start forward without
gradient per training batch, shared by the levers on that batch (a contract with a cosine and
a role-drift clause runs one, not two).

Scored positions on a training batch: the positions with a target (``targets != -100``: the
next tokens, the completion, the masked tokens), of the clause's task's rows or, without a task,
of every row; on a batch without targets (a probe of tokens), every real (non-padding) token.
Nothing reads a value back to the host on an accelerator (``scored_rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.control._common import as_headset
from headwise.control.base_reference import BaseReference
from headwise.control.objective import Objective
from headwise.control.task_levers import IGNORE
from headwise.model.hook_point import Hook, HookContext
from headwise.patterns import ROLE_NAMES, real_tokens, role_target, row_scores

METRICS = ("kl", "hidden_cosine")
EPS = 1e-12
Sums = tuple[Tensor, Tensor]


def scored_rows(x: Tensor, valid: Tensor, gather: bool | None = None) -> tuple[Tensor, Tensor]:
    """``x`` (B, T, ...) as rows (N, ...) of the scored positions, and their weights (N,).

    By default, on the CPU only the ``valid`` positions are kept (reading their number costs
    nothing there), so what follows (an unembedding, a softmax over the vocabulary) runs on them
    alone; on an accelerator every position is kept, weighted 1 or 0, so that no step waits on
    the host. Weighted sums over the rows are the same either way.

    Args:
        x: (B, T, ...) per-position values.
        valid: (B, T) bool, the scored positions.
        gather: keep only the valid positions (``True``) or every one, weighted (``False``);
            ``None``: by the device, as above.
    """
    if x.device.type == "cpu" if gather is None else gather:
        rows = x[valid]  # (N, ...)
        return rows, torch.ones(rows.shape[0], device=x.device)
    return x.flatten(0, 1), valid.flatten().to(torch.float32)


def output_logits(model: nn.Module, hidden: Tensor) -> Tensor:
    """Logits (..., V) of final hidden states (..., D): the model's masked-LM head when it has
    one, else its unembedding (as ``Transformer.forward`` computes them)."""
    m: Any = model
    return m.unembed(hidden) if m.mlm_head is None else m.mlm_head(hidden, m.unembed)


def per_sequence(values: Tensor, valid: Tensor) -> Tensor:
    """(B,) each sequence's sum of ``values`` (N,), given at the rows ``scored_rows(x, valid)``
    kept (every position, weighted, or the valid ones alone): summed over the sequence's T
    positions with zeros at the others, so either way gives the same sums, bit for bit.

    Args:
        values: (N,) per-row values, already weighted.
        valid: (B, T) bool, the scored positions ``scored_rows`` was given.
    """
    if values.shape[0] != valid.numel():  # the valid positions alone: back to (B, T)
        values = values.new_zeros(valid.numel()).masked_scatter_(valid.flatten(), values)
    return values.view(valid.shape).sum(1)


def kl_terms(base_logits: Tensor, logits: Tensor) -> Tensor:
    """(N,) ``KL(base || trained)`` of each row of logits (in float32).

    Args:
        base_logits, logits: (N, V) logits of the base and the trained model at the same
            positions (``scored_rows``).
    """
    log_p = F.log_softmax(base_logits.float(), -1)  # (N, V)
    log_q = F.log_softmax(logits.float(), -1)
    return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)


def kl_sums(base_logits: Tensor, logits: Tensor, weights: Tensor) -> Sums:
    """``(sum of weight x KL(base || trained), sum of weights)`` over rows (N, V) of logits
    (``kl_terms``), ``weights`` (N,) the rows' weights."""
    return (kl_terms(base_logits, logits) * weights).sum(), weights.sum()


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """(B, D): ``hidden`` (B, T, D) averaged over ``mask`` (B, T) (sentence-transformers' mean
    pooling: ``sum(h * m) / max(sum(m), 1e-9)``)."""
    m = mask.to(hidden.dtype)[..., None]  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def cosines(base_hidden: Tensor, hidden: Tensor, valid: Tensor,
            pooled: bool) -> tuple[Tensor, Tensor]:
    """Cosines of final hidden states (B, T, D) and their weights: (B, T) per position,
    weighted by ``valid``, or with ``pooled`` (B,) per sequence of the mean-pooled states
    (``valid``: the pooled tokens; a sequence without one weighs 0)."""
    if pooled:
        cos = F.cosine_similarity(mean_pool(base_hidden.float(), valid),
                                  mean_pool(hidden.float(), valid), dim=-1)  # (B,)
        return cos, valid.any(1).to(cos.dtype)
    cos = F.cosine_similarity(base_hidden.float(), hidden.float(), dim=-1)  # (B, T)
    return cos, valid.to(cos.dtype)


def cosine_sums(base_hidden: Tensor, hidden: Tensor, valid: Tensor, pooled: bool) -> Sums:
    """``(sum of cosines, count)`` of final hidden states (B, T, D) (``cosines``)."""
    cos, w = cosines(base_hidden, hidden, valid, pooled)
    return (cos * w).sum(), w.sum()


def pattern_kl_sums(base_patterns: Tensor, patterns: Tensor, rows: Tensor) -> Sums:
    """``(sum of KL(base row || trained row), count)`` over heads and valid query rows.

    Args:
        base_patterns, patterns: (B, h, T, T) attention patterns (rows over keys).
        rows: (B, T) bool, the query rows to count (real tokens).
    """
    p, q = base_patterns.float(), patterns.float()
    kl = (torch.xlogy(p, p) - p * q.clamp_min(EPS).log()).sum(-1)  # (B, h, T)
    w = rows.to(kl.dtype)[:, None, :].expand_as(kl)
    return (kl * w).sum(), w.sum()


def final_hidden_point(model: nn.Module) -> tuple[str, Callable[[Tensor], Tensor]]:
    """The hook point whose value gives ``model.hidden(...)``, and the map from it (the final
    norm of a pre-norm model; the identity for a post-norm one, whose last block ends normed)."""
    m: Any = model
    last = f"blocks.{m.config.n_layers - 1}"
    name = f"{last}.hook_normalized_resid_post"
    if name not in m.hook_points():
        name = f"{last}.hook_resid_post"
    norm = m.ln_final
    return name, (norm if norm is not None else (lambda x: x))


def scored(batch: Any, task_id: int | None, use_targets: bool) -> Tensor:
    """(B, T) bool: the positions a training batch scores (see the module docstring);
    ``use_targets=False`` keeps every real token of the rows (pooled embeddings)."""
    targets = getattr(batch, "targets", None)
    valid = (targets != IGNORE if use_targets and targets is not None
             else real_tokens(batch.tokens, batch.attention_mask))
    if task_id is None:
        return valid
    return valid & (batch.task_ids == task_id)[:, None]


class _ProbeBatch:
    """A batch read from a probe-like forward (``OnProbeData``): tokens and mask only."""

    def __init__(self, tokens: Tensor, attention_mask: Tensor | None) -> None:
        self.tokens, self.attention_mask = tokens, attention_mask
        self.task_ids: Tensor | None = None


class _ToBase(Objective):
    """Shared by the distillation levers: the batch, the weight, the base forward."""

    def __init__(self, model: nn.Module, base: BaseReference, task_id: int | None,
                 weight: float, name: str) -> None:
        self.model = model
        self.base = base
        self.task_id = None if task_id is None else int(task_id)
        self.weight = float(weight)
        self.name = name
        self.measured = False
        self._batch: Any = None
        self._value: Tensor | None = None
        self._estimate: Tensor | None = None

    def batch_values(self) -> Tensor | None:
        """The distance on the last training batch (1,), detached (the clause's statistic:
        ``Distill``'s cosine or KL, ``PatternDistill``'s largest role-score change); ``None``
        unless ``measured`` or weighted, and after the step's ``reset``."""
        return self._estimate

    def prepare(self, batch: Any, step: int = 0) -> None:
        self._batch = batch

    def _taken(self, tokens: Tensor, attention_mask: Tensor | None) -> Any:
        """The batch of this step: the training batch ``prepare`` saw, else the probe-like
        one ``OnProbeData`` ran the forward on (scored on its real tokens)."""
        batch, self._batch = self._batch, None
        return batch if batch is not None else _ProbeBatch(tokens, attention_mask)

    def _task_of(self, batch: Any) -> int | None:
        """The task whose rows the lever reads on ``batch``: ``task_id`` on a training batch,
        none on a probe-like one (every row is the probe's)."""
        return None if isinstance(batch, _ProbeBatch) else self.task_id

    def _term(self, distance: Tensor) -> Tensor:
        """``weight x distance``; a detached 0 at weight 0 (measured only)."""
        if self.weight <= 0.0:
            return torch.zeros((), device=distance.device)
        return self.weight * distance

    def _idle(self, tokens: Tensor, key: str) -> tuple[Tensor, dict[str, Tensor]]:
        zero = torch.zeros((), device=tokens.device)
        return zero, {f"{self.name}/{key}": zero}

    def _kwargs(self, batch: Any) -> dict[str, Any]:
        return {"attention_mask": batch.attention_mask, "task_ids": batch.task_ids}


class Distill(_ToBase):
    """``weight x`` the distance of the outputs to the base model's on the training batch.

    Args:
        model: a headwise Transformer being trained.
        base: its starting model (``capture_base``).
        metric: ``"kl"`` (mean ``KL(base || trained)`` of the output distributions) or
            ``"hidden_cosine"`` (``1 -`` the mean cosine of the final hidden states;
            mean-pooled for a bidirectional model).
        task_id: score only this task's rows; ``None``: every row (the scored positions:
            the module docstring).
        weight: the term's weight (0: no base forward).
        name: the lever's name.

    Raises:
        ValueError: an unknown metric.
    """

    def __init__(self, model: nn.Module, base: BaseReference, metric: str = "kl",
                 task_id: int | None = None, weight: float = 0.0,
                 name: str = "distill") -> None:
        if metric not in METRICS:
            raise ValueError(f"Distill: metric got {metric!r}, expected one of {list(METRICS)}")
        super().__init__(model, base, task_id, weight, name)
        self.metric = metric
        self.pooled = metric == "hidden_cosine" and not model.config.causal  # type: ignore[union-attr]
        self._point: str = "hook_logits"
        self._post: Callable[[Tensor], Tensor] = lambda x: x
        if metric == "hidden_cosine":
            self._point, self._post = final_hidden_point(model)

    def hooks(self) -> list[Hook]:
        def grab(x: Tensor, ctx: HookContext) -> None:
            self._value = x
        return [Hook(self._point, grab, read_only=True)]

    def reset(self) -> None:
        self._value = self._batch = self._estimate = None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weight x`` the mean distance; logs it (the KL, or the cosine). At weight 0 it
        returns 0, after measuring the distance (detached) when ``measured``."""
        value, self._value = self._value, None
        batch = self._taken(tokens, attention_mask)
        if self.weight <= 0.0 and not self.measured:
            return self._idle(tokens, self.metric)
        if value is None:
            raise RuntimeError(f"{self.name}: run the forward inside "
                               "`with model.hooks(*lever.hooks())` first")
        if self.weight <= 0.0:  # measured only: no graph through the distance
            value = value.detach()
        task_id = self._task_of(batch)
        kw = self._kwargs(batch)
        if self.metric == "kl":
            valid = scored(batch, task_id, True)
            hidden, w = scored_rows(self.base.forward(batch.tokens, **kw)[0], valid)  # (N, D)
            with self.base.model() as m:  # the start's logits at the scored positions only
                ref = output_logits(m, hidden)  # (N, V)
            total, n = kl_sums(ref, scored_rows(value, valid)[0], w)
            d = total / n.clamp_min(1.0)
            self._estimate = d.detach()[None]
            return self._term(d), {f"{self.name}/kl": d.detach()}
        ref = self.base.forward(batch.tokens, **kw)[0]  # (B, T, D)
        valid = scored(batch, task_id, not self.pooled)
        total, n = cosine_sums(ref, self._post(value), valid, self.pooled)
        cos = total / n.clamp_min(1.0)
        self._estimate = cos.detach()[None]
        return self._term(1.0 - cos), {f"{self.name}/hidden_cosine": cos.detach()}


class PatternDistill(_ToBase):
    """``weight x`` the mean ``KL(base row || trained row)`` of ``heads``' attention patterns
    over real query rows, those of task ``task_id`` only where it is set (the lever of a
    role-drift bound; see the module docstring; ``PlanContext.on_task`` sets it).

    Args:
        model: a headwise Transformer being trained.
        base: its starting model (``capture_base``).
        heads: the heads whose patterns are kept (selector / HeadSet).
        weight: the term's weight (0: no base forward).
        name: the lever's name.
    """

    def __init__(self, model: nn.Module, base: BaseReference, heads: Any, weight: float = 0.0,
                 name: str = "distill-patterns") -> None:
        super().__init__(model, base, None, weight, name)
        self.heads = as_headset(model, heads, "heads")
        if not len(self.heads):
            raise ValueError("PatternDistill: got an empty head set, expected at least one head")
        self._want = {l: tuple(self.heads.in_layer(l)) for l in self.heads.layers}
        self.causal = bool(model.config.causal)  # type: ignore[union-attr]
        self._trained: dict[int, Tensor] = {}
        for layer, hs in self._want.items():
            base.want_patterns(layer, hs)

    def _capture(self, into: dict[int, Tensor]) -> list[Hook]:
        def grab(layer: int) -> Callable[[Tensor, HookContext], None]:
            def fn(x: Tensor, ctx: HookContext) -> None:
                into[layer] = x  # (B, h, T, T), the requested heads in order
            return fn
        return [Hook(f"blocks.{l}.attn.hook_pattern", grab(l), hs, read_only=True)
                for l, hs in self._want.items()]

    def hooks(self) -> list[Hook]:
        return self._capture(self._trained)

    def reset(self) -> None:
        self._trained.clear()  # in place: the trainer makes the hooks once per run
        self._batch = self._estimate = None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weight x`` the mean pattern KL; logs it. At weight 0 it returns 0, after
        measuring the largest role-score change (``role_drift``) when ``measured``."""
        trained = dict(self._trained)
        self._trained.clear()
        batch = self._taken(tokens, attention_mask)
        if self.weight <= 0.0 and not self.measured:
            return self._idle(tokens, "pattern_kl")
        if set(trained) != set(self._want):
            raise RuntimeError(f"{self.name}: run the forward inside "
                               "`with model.hooks(*lever.hooks())` first")
        ref = self.base.forward(batch.tokens, **self._kwargs(batch))[1]
        task_id = self._task_of(batch)
        rows = scored(batch, task_id, False)
        total = torch.zeros((), device=tokens.device)
        count = torch.zeros((), device=tokens.device)
        starts = {}
        for layer, hs in self._want.items():
            held = self.base.pattern_heads(layer)
            starts[layer] = ref[layer] if held == hs else ref[layer][:, [held.index(h)
                                                                         for h in hs]]
            s, n = pattern_kl_sums(starts[layer], trained[layer], rows)
            total, count = total + s, count + n
        if self.measured:
            self._estimate = role_drift(
                torch.cat([starts[l] for l in self._want], 1).detach(),
                torch.cat([trained[l] for l in self._want], 1).detach(),
                batch.tokens, batch.attention_mask if task_id is None else rows.long(),
                self.causal)[None]  # another task's rows: no real token, no defined row
        d = total / count.clamp_min(1.0)
        return self._term(d), {f"{self.name}/pattern_kl": d.detach()}


def role_drift(base_patterns: Tensor, patterns: Tensor, tokens: Tensor,
               attention_mask: Tensor | None, causal: bool) -> Tensor:
    """The largest ``|trained - base|`` role score (``headwise.patterns.ROLE_NAMES``) of any
    head on one batch (0-d): what a ``role_drift`` clause measures, on that batch.

    Args:
        base_patterns, patterns: (B, h, T, T) the heads' patterns in the base and the trained
            model.
        tokens: (B, T); attention_mask: (B, T) or ``None``.
        causal: whether the model is causal (the roles' targets read it).
    """
    worst = torch.zeros((), device=patterns.device)
    for role in ROLE_NAMES:
        target = role_target(role, tokens, attention_mask, causal)
        den = target.rows.sum()
        change = (row_scores(patterns.float(), target).sum((0, 2))
                  - row_scores(base_patterns.float(), target).sum((0, 2))).abs()  # (h,)
        worst = torch.maximum(worst, torch.where(den > 0, change / den.clamp_min(1), 0.0).amax())
    return worst
