"""Preserve clauses: the trained model stays close to its starting checkpoint on held-out data.

``{preserve: base, on: TASK_OR_PROBE, metric: M, at_most | at_least: X}``, measured against the
starting model (``VerifyData.base``: the adapters switched off, or a frozen copy; see
``headwise.control.base_reference``) with the distances of ``headwise.control.distill``:

- ``kl`` (``at_most``, nats): mean over scored positions of ``KL(base || trained)`` of the
  output distributions;
- ``hidden_cosine`` (``at_least``, in [-1, 1]): mean cosine of the final hidden states, per
  scored position for a causal model, per sequence of the mean-pooled embeddings (over the
  attention mask, as sentence-transformers pools) for a bidirectional encoder;
- ``loss_increase`` (``at_most``, nats; ``on`` must be a task): the task's token-weighted loss
  of the trained model minus the base's on the task's held-out batch;
- ``role_drift`` (``at_most``, in [0, 1]): the largest ``|trained - base|`` of any pattern role
  score (``headwise.patterns.ROLE_NAMES``) of any head no other clause names, on the probe.

Scored positions: the targets (``targets != -100``) of a task's held-out batch, or of a probe
that has targets (the default probe, the held-out mixture: every task's); on a probe of tokens
alone, every real token. ``on`` defaults to the default probe (the held-out mixture). Lever:
distillation to the base on data drawn like the clause's (``Distill``: KL, or ``1 - cosine``
for ``hidden_cosine``; ``PatternDistill`` on the free heads for ``role_drift``), on the
model's base reference (captured by planning if the caller has not captured it: planning
precedes training).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.importance import example_stats
from headwise.analysis.importance_matrix import STDERR_GROUPS, ratio_skewness, ratio_stderr
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import role_scores
from headwise.contract import fields
from headwise.contract.certify import drift_bound, grouped_bound
from headwise.contract.clause import Clause, holds, number_or_none
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, LeverKind, PlanContext, names
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.base_reference import BaseReference, base_of, capture_base
from headwise.control.distill import (
    Distill,
    PatternDistill,
    cosines,
    kl_terms,
    per_sequence,
    scored_rows,
)
from headwise.control.task_levers import IGNORE
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet
from headwise.patterns import ROLE_NAMES, real_tokens

Pair = tuple[Tensor, Tensor]  # per row (B,): the distance summed over its positions, their count
Sums = Callable[[Tensor, Tensor, "_Rows", bool], Pair]


@dataclass(frozen=True)
class PreserveMetric:
    """One ``preserve`` metric: the one bound it admits, the range of its value, its unit in
    words, and how the distance is measured and levered.

    Attributes:
        bound: ``"at_most"`` or ``"at_least"``.
        low, high: the range of the measured value.
        unit: the value's unit, in words.
        on_task: whether ``on`` must name a task (``loss_increase``).
        sums: each row's ``(distance summed, count)`` (two (B,) tensors) of a chunk of rows,
            from the base's and the model's outputs (``_distance`` pools them), or ``None``
            for a role-score change (``role_drift``, measured by ``_role_drift``).
        reads_hidden: whether ``sums`` reads the final hidden states (else the logits).
        lever: what its ``Distill`` lever matches (``"kl"`` or ``"hidden_cosine"``), or
            ``None``: attention-pattern distillation on the free heads (``PatternDistill``).
        lever_words: what that lever minimises, in words.
    """

    bound: str
    low: float
    high: float
    unit: str
    on_task: bool = False
    sums: Sums | None = None
    reads_hidden: bool = False
    lever: str | None = None
    lever_words: str = ""


MAX_PRESERVE = 32  # preserve clauses per contract
CHUNK_ELEMENTS = 1 << 24  # logits per forward chunk when measuring (64 MiB in float32)
# Logits (or hidden values) per call of a metric's sums: a few small rows at a time (one call
# per row cost its Python overhead on each), a large vocabulary's one at a time (its temporaries
# stay in cache; a whole chunk at once ran slower) (bench/bench_preserve_rows.py).
SUMS_ELEMENTS = 1 << 18


class PreserveKind(ClauseKind):
    """The ``preserve`` kind; ``chunk_elements``: logits (or hidden values) per forward chunk
    when measuring (the result does not depend on it, only the peak memory does)."""

    name = "preserve"
    keys = frozenset({"preserve", "on", "metric", "at_least", "at_most", "name"})

    def __init__(self, chunk_elements: int = CHUNK_ELEMENTS) -> None:
        self.chunk_elements = chunk_elements

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "preserve" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        fields.choice(path, raw, "preserve", ("base",), "base")
        if "metric" not in raw:
            raise SpecError(f"{path}.metric: missing; expected one of {list(METRICS)}")
        metric = fields.choice(path, raw, "metric", tuple(METRICS), "")
        spec = METRICS[metric]
        bound, low, high, unit = spec.bound, spec.low, spec.high, spec.unit
        other = "at_least" if bound == "at_most" else "at_most"
        if other in raw:
            raise SpecError(f"{path}.{other}: not allowed for metric {metric}; expected "
                            f"{bound} (a preserve clause bounds how far the model may drift)")
        value = fields.number(path, raw, bound)
        if value is None:
            raise SpecError(f"{path}: missing bound; expected {bound!r} ({unit}), e.g. "
                            f"{{preserve: base, metric: {metric}, {bound}: ...}}")
        fields.in_range(path, {bound: value}, low, high,
                        f"a number in [{low:g}, {high:g}] ({unit})")
        on = raw.get("on")
        if spec.on_task:
            on = fields.task(path, "on", on, ctx.tasks)
        elif on is not None and not isinstance(on, str):
            raise SpecError(f"{path}.on: got {on!r}, expected the name of a task or probe")
        return Clause(index, self, "model", HeadSet([], ctx.n_layers, ctx.n_heads), on=on,
                      metric=metric, at_least=value if bound == "at_least" else None,
                      at_most=value if bound == "at_most" else None,
                      name=fields.name(path, raw), source=dict(raw))

    def describe(self, clause: Clause) -> str:
        return f"preserve base: {clause.metric} on {clause.on or '(default probe)'}"

    def value_range(self, clause: Clause) -> tuple[float, float]:
        spec = METRICS[clause.metric]
        return (spec.low, spec.high)

    def prepare(self, model: nn.Module, clauses: Sequence[Clause]) -> None:
        """Capture the starting model the clauses compare with (before training, before any
        trained weights load)."""
        if base_of(model) is None:
            capture_base(model)

    def measured_on(self, clause: Clause) -> str:
        where = f"held-out {clause.on} examples" if clause.on else "the default probe"
        return f"{where}, against the starting model"

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        base = data.base_reference(clause.path)
        metric = METRICS[clause.metric]
        if metric.sums is None:
            return _role_drift(model, base, clause, data)
        probe, batch = _rows(clause, data)
        with torch.no_grad():
            value, stderr, skew = _distance(model, base, metric, batch, self.chunk_elements)
        return ClauseResult(clause, holds(value, clause.at_least, clause.at_most),
                            number_or_none(value), clause.threshold_text(), "the model",
                            details={"probe": probe, "examples": int(batch.tokens.shape[0]),
                                     "skew": number_or_none(skew)},
                            stderr=number_or_none(stderr))

    def check_together(self, clauses: Sequence[Clause]) -> None:
        """At most ``MAX_PRESERVE`` clauses: each one runs the starting model and the trained
        one over its data at every evaluation point."""
        if len(clauses) > MAX_PRESERVE:
            raise SpecError(f"contract: got {len(clauses)} preserve clauses, expected at most "
                            f"{MAX_PRESERVE} (each measures the starting and the trained model "
                            "on its data at every evaluation point)")

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        """A ``role_drift`` clause needs a head no other clause names (else it measures
        nothing)."""
        if METRICS[clause.metric].sums is None:
            _check_free(clause, _free(ctx.named, ctx.n_layers, ctx.n_heads))

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        if METRICS[result.clause.metric].sums is None:  # role_drift: every head and role
            _, _, trained, start = _drift_scores(model, data.base_reference(result.clause.path),
                                                 result.clause, data)
            n = int(trained.info["n_sequences"])
            return drift_bound(result, trained.values - start.values,
                               trained.stderr + start.stderr, min(STDERR_GROUPS, n), n,
                               confidence)
        return grouped_bound(result, data, confidence, on_task=True)

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        model = ctx.model
        base = base_of(model)
        if base is None:
            raise ValueError(f"plan: {clause.path} compares with the starting model, which was "
                             "not captured; call contract.prepare(model) before training")
        where = ctx.data_words(clause)
        name = f"enforce:preserve:{clause.metric}[{clause.path}]"
        spec = METRICS[clause.metric]
        bound = clause.at_least if clause.at_least is not None else clause.at_most
        assert bound is not None  # parse requires the metric's one bound
        room = spec.high - bound if spec.bound == "at_least" else bound - spec.low
        # What the lever measures on each batch is the clause's own value (not for
        # loss_increase, levered by the KL), so its multiplier can move on every batch.
        measured = ctx.config.eta_batch > 0 and clause.metric != "loss_increase"
        if spec.lever is None:
            free = _free(ctx.named, ctx.n_layers, ctx.n_heads)
            _check_free(clause, free)
            pattern = PatternDistill(model, base, free)
            pattern.measured = measured
            obj = ctx.add(ctx.on_probe(pattern, name, clause), name)
            heads = names(free) if len(free) <= 4 else f"the {len(free)} heads no clause names"
            return ClauseLever(LeverKind.DISTILL, f"attention-pattern KL to the starting model "
                               f"on {heads}{where}", [obj], scale=_scale(2.0 * room * room))
        distill = Distill(model, base, spec.lever, None)  # on_probe sets a task's rows
        distill.measured = measured
        obj = ctx.add(ctx.on_probe(distill, name, clause), name)
        unit = room if clause.metric != "loss_increase" else 1.0
        return ClauseLever(LeverKind.DISTILL, f"distillation to the starting model "
                           f"({spec.lever_words}){where}", [obj], scale=_scale(unit))


def _scale(at_bound: float) -> float:
    """A distillation lever's scale: ``1 / at_bound``, the lever's loss where its clause is on
    its bound (``1 - cosine`` = the room for ``hidden_cosine``, the KL = the bound for ``kl``;
    for ``role_drift`` the pattern KL of a row whose role mass moved by the bound ``b`` is at
    least ``2 b^2``, by Pinsker), so that a multiplier of 1 weighs a clause on its bound as
    one unit of the task's loss, whatever its metric; 1 where that loss is 0."""
    return 1.0 / at_bound if at_bound > 0 and math.isfinite(at_bound) else 1.0


def _free(named: frozenset[Head], n_layers: int, n_heads: int) -> HeadSet:
    return HeadSet([Head(l, h) for l in range(n_layers) for h in range(n_heads)
                    if Head(l, h) not in named], n_layers, n_heads)


def _check_free(clause: Clause, free: HeadSet) -> None:
    """Refuse a ``role_drift`` clause with no head to measure.

    Raises:
        SpecError: every head of the model is named by another clause.
    """
    if not len(free):
        raise SpecError(f"{clause.path}.metric: role_drift measures the heads no other clause "
                        "names, and every head of the model is named; expected a head left "
                        "free, or drop the clause")


class _Rows:
    """What a clause is measured on: tokens, mask, task ids, and the scored positions."""

    def __init__(self, tokens: Tensor, attention_mask: Tensor | None, task_ids: Tensor | None,
                 targets: Tensor | None) -> None:
        self.tokens, self.attention_mask = tokens, attention_mask
        self.task_ids, self.targets = task_ids, targets

    def valid(self, use_targets: bool) -> Tensor:
        """(B, T) bool: the targets (when asked for and there are some), or every real token."""
        if use_targets and self.targets is not None:
            return self.targets != IGNORE
        return real_tokens(self.tokens, self.attention_mask)

    def chunks(self, size: int) -> Iterable[tuple[slice, _Rows]]:
        """Consecutive groups of ``size`` rows: each one's slice of the rows, and its rows."""
        def cut(x: Tensor | None, s: slice) -> Tensor | None:
            return None if x is None else x[s]
        for start in range(0, self.tokens.shape[0], size):
            s = slice(start, start + size)
            yield s, _Rows(self.tokens[s], cut(self.attention_mask, s), cut(self.task_ids, s),
                           cut(self.targets, s))


def _rows(clause: Clause, data: VerifyData) -> tuple[str, _Rows]:
    """The probe name and rows of a clause: a task's held-out batch, else the probe's (both with
    their targets when they have them; without, every real token is scored)."""
    if clause.on is not None and clause.on in data.tasks:
        b = data.tasks[clause.on]
        return clause.on, _Rows(b.tokens, b.attention_mask, b.task_ids, b.targets)
    if METRICS[clause.metric].on_task:
        raise SpecError(f"{clause.path}.on: got {clause.on!r}, expected one of the data's tasks "
                        f"{sorted(data.tasks)}")
    probe = data.probe_name(clause.on, clause.path)
    tokens, mask, kw = data.probe(probe, clause.path)
    return probe, _Rows(tokens, mask, kw.get("task_ids"),
                        getattr(data.probes[probe], "targets", None))


def _distance(model: nn.Module, base: BaseReference, metric: PreserveMetric,
              rows: _Rows, chunk_elements: int) -> tuple[float, float, float]:
    """``metric``'s distance of ``model`` to ``base`` on ``rows``, pooled exactly over
    memory-sized chunks of rows (each forwarded once; its rows' sums computed a group of
    ``SUMS_ELEMENTS`` at a time, each row's its own); its standard error over
    ``STDERR_GROUPS`` contiguous groups of rows (``ratio_stderr``) and the skewness of the
    rows' own linearised values (``ratio_skewness``), which its bound corrects for."""
    m: Any = model
    assert metric.sums is not None
    pooled = metric.reads_hidden and not m.config.causal
    per_row = rows.tokens.shape[1] * (m.config.d_model if metric.reads_hidden
                                      else m.config.vocab_size)
    n = rows.tokens.shape[0]
    size = max(1, chunk_elements // per_row)
    per_call = max(1, SUMS_ELEMENTS // per_row)
    each: list[Tensor] = []  # per call (rows, 2): each row's distance summed, its count
    for _, part in rows.chunks(size):
        kw = {"attention_mask": part.attention_mask, "task_ids": part.task_ids}
        with base.model() as b:
            ref = b.hidden(part.tokens, **kw) if metric.reads_hidden else b(part.tokens, **kw)
        out = m.hidden(part.tokens, **kw) if metric.reads_hidden else model(part.tokens, **kw)
        for s, few in part.chunks(per_call):
            each.append(torch.stack([x.double()
                                     for x in metric.sums(ref[s], out[s], few, pooled)], 1))
    sums = torch.cat(each).cpu()  # (n, 2): read to the host once
    num, den = sums.unbind(1)
    if float(den.sum()) == 0:
        return math.nan, math.nan, math.nan
    n_groups = max(1, min(STDERR_GROUPS, n))
    group_of = torch.arange(n) * n_groups // n  # contiguous groups of rows
    grouped = torch.zeros(n_groups, 2, dtype=torch.float64).index_add_(0, group_of, sums)
    return (float(num.sum() / den.sum()), ratio_stderr(grouped[:, 0], grouped[:, 1]),
            ratio_skewness(num, den))


def _cosine_sums(ref: Tensor, out: Tensor, part: _Rows, pooled: bool) -> Pair:
    """Cosine of the final hidden states: per scored position, or per sequence when pooled."""
    cos, w = cosines(ref, out, part.valid(not pooled), pooled)  # (B, T), or (B,) pooled
    return (cos * w).reshape(len(w), -1).sum(1), w.reshape(len(w), -1).sum(1)


def _kl_sums(ref: Tensor, out: Tensor, part: _Rows, pooled: bool) -> Pair:
    """``KL(base || trained)`` of the output distributions at the scored positions."""
    valid = part.valid(True)  # (B, T)
    (p, w), (q, _) = scored_rows(ref, valid), scored_rows(out, valid)
    return per_sequence(kl_terms(p, q) * w, valid), valid.sum(1)


def _loss_increase_sums(ref: Tensor, out: Tensor, part: _Rows, pooled: bool) -> Pair:
    """The task's loss of the trained model minus the base's, summed over target tokens."""
    assert part.targets is not None  # measured on a task's batch, which has targets
    trained, count = example_stats(out, part.targets)["loss"]  # (B,) each
    return trained - example_stats(ref, part.targets)["loss"][0], count


def _drift_scores(model: nn.Module, base: BaseReference, clause: Clause,
                  data: VerifyData) -> tuple[HeadSet, str, RoleTable, RoleTable]:
    """The heads no clause names, the probe, and their role scores (``ROLE_NAMES``, with
    standard errors) in the trained and the starting model."""
    if data.named is None:
        raise SpecError(f"{clause.path}.metric: role_drift needs the heads the contract names "
                        "(VerifyData.named = contract.named_heads)")
    m: Any = model
    free = _free(data.named, m.config.n_layers, m.config.n_heads)
    probe = data.probe_name(clause.on, clause.path)
    _check_free(clause, free)
    tokens, mask, kw = data.probe(probe, clause.path)
    roles = list(ROLE_NAMES)
    with torch.no_grad():
        trained = role_scores(model, tokens, mask, heads=free, roles=roles, **kw)
        with base.model() as b:
            start = role_scores(b, tokens, mask, heads=free, roles=roles, **kw)
    return free, probe, trained, start


def _role_drift(model: nn.Module, base: BaseReference, clause: Clause,
                data: VerifyData) -> ClauseResult:
    """The largest role-score change among the heads no clause names (per head: its largest)."""
    free, probe, trained, start = _drift_scores(model, base, clause, data)
    roles = list(ROLE_NAMES)
    change = (trained.values - start.values).abs()  # (heads, roles); NaN: undefined here
    change = torch.where(change.isnan(), torch.full_like(change, -math.inf), change)
    per_head = change.max(1)
    per = {str(h): (float(v) if math.isfinite(float(v)) else None)
           for h, v in zip(free, per_head.values, strict=True)}
    worst = int(per_head.values.argmax())
    value = float(per_head.values[worst])
    value = value if math.isfinite(value) else 0.0
    head = list(free)[worst]
    return ClauseResult(clause, holds(value, clause.at_least, clause.at_most), value,
                        clause.threshold_text(), str(head), per,
                        details={"probe": probe, "heads": len(free),
                                 "role": roles[int(per_head.indices[worst])]})


METRICS: dict[str, PreserveMetric] = {
    "kl": PreserveMetric("at_most", 0.0, math.inf, "nats", sums=_kl_sums, lever="kl",
                         lever_words="KL(base || trained) of the outputs"),
    "hidden_cosine": PreserveMetric("at_least", -1.0, 1.0, "a cosine", sums=_cosine_sums,
                                    reads_hidden=True, lever="hidden_cosine",
                                    lever_words="1 - cosine of the final hidden states"),
    "loss_increase": PreserveMetric("at_most", -math.inf, math.inf, "nats", on_task=True,
                                    sums=_loss_increase_sums, lever="kl",
                                    lever_words="KL(base || trained) of the outputs"),
    "role_drift": PreserveMetric("at_most", 0.0, 1.0, "a role-score change"),
}
"""Each ``preserve`` metric's record (docs/contracts.md, "Preserve clauses")."""

KIND = PreserveKind()
