"""Path clauses: how much a task needs one edge, one head reading what another wrote.

``{path: L0.H1 -> L1.H2, via: k, task: retrieval, metric: accuracy, drop_at_least: 0.3}``
(``via`` ``q``, ``k`` or ``v`` for a head receiver, or written into ``path``: ``L0.H1 -> L1.H2
via k``; receivers may also be ``L1.MLP`` or ``logits``, senders ``embed``, a head or an MLP;
``headwise.hooks.graph``). Measured by path patching on the task's held-out batch
(``headwise.analysis.circuit.edge_drop``: the receiver's input recomputed with only that
sender's contribution replaced, every other path clean), ``mode`` ``mean`` (default: the
sender's per-position mean over the batch) or ``zero``; the drop is clean - ablated for
accuracies, ablated - clean for the loss, with a paired-bootstrap interval over examples (its
standard error is the clause's, as for ablation clauses).

Refused before training (``drop_at_least``): a path whose sender or receiver head the fixed
task gates switch off on the task, and a query or key path into a head whose structural mask
leaves each query at most one key (its pattern cannot depend on what the path brings).

Levers (``path_lever``), on the task's training examples and in the clause's ``mode``: for
``drop_at_least`` the carrier stages of ``EnforceConfig`` applied to the edge ("others": the
other edges into the same receiver input stochastically ablated, so the named sender becomes
what the receiver reads; "margin": a hinge on the edge-ablated model's logits, so the task
needs the edge), with the role objectives the path implies as assists when the task's circuit
is known (a key path between two heads of a previous-token -> induction circuit: previous-token
on the sender, induction on the receiver); for ``drop_at_most`` the edge itself stochastically
ablated (``headwise.control.path_levers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headwise.analysis.circuit import edge_drop
from headwise.analysis.importance_matrix import ci_stderr
from headwise.contract import fields
from headwise.contract.ablation import drop_examples, drop_range
from headwise.contract.certify import path_bound
from headwise.contract.clause import (
    METRICS,
    Clause,
    bounds_text,
    holds,
    number_or_none,
)
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, LeverKind, PlanContext
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.objectives import PatternObjective
from headwise.control.path_levers import PathAblatedMargin, StochasticPathAblation
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet
from headwise.hooks.graph import Edge, Shape, edges_into, model_shape, parse_edge

PATH_MODES = ("mean", "zero")


def graph_shape(ctx: ParseContext) -> Shape:
    """The shape of the model's graph of paths, as a clause is parsed against it."""
    return Shape(ctx.n_layers, ctx.n_heads, ctx.n_kv_heads or ctx.n_heads, ctx.has_mlp,
                 ctx.post_norm)


def edge_heads(edges: tuple[Edge, ...], ctx: ParseContext) -> HeadSet:
    """The heads the edges' ends name (a k/v receiver: every query head of its group)."""
    group = ctx.n_heads // (ctx.n_kv_heads or ctx.n_heads)
    heads: set[Head] = set()
    for e in edges:
        for node, via in ((e.sender, None), (e.receiver, e.via)):
            if node.kind == "head":
                span = group if via in ("k", "v") else 1
                heads.update(Head(node.layer, node.head + j) for j in range(span))
    return HeadSet(sorted(heads), ctx.n_layers, ctx.n_heads)


def gated_heads(ctx: PlanContext, edges: tuple[Edge, ...], task: str) -> list[Head]:
    """The heads at an end of ``edges`` that fixed gates switch off on ``task``'s examples."""
    off = ctx.gated_off(task)
    ends = [n for e in edges for n in (e.sender, e.receiver) if n.kind == "head"]
    return sorted({Head(n.layer, n.head) for n in ends} & set(off))


def task_batch(data: VerifyData, clause: Clause) -> Any:
    """The held-out batch of the clause's task.

    Raises:
        SpecError: the data has no examples of that task.
    """
    task = clause.task or ""
    if task not in data.tasks:
        raise SpecError(f"{clause.path}.task: got {task!r}, expected one of the data's "
                        f"tasks {sorted(data.tasks)}")
    return data.tasks[task]


class PathKind(ClauseKind):
    name = "path"
    sharded = False  # path patching reads each head's output weights whole
    keys = frozenset({"path", "via", "task", "metric", "mode", "drop_at_least", "drop_at_most",
                      "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "path" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        text = raw.get("path")
        if not isinstance(text, str):
            raise SpecError(f"{path}.path: got {text!r}, expected an edge such as "
                            "'L0.H1 -> L1.H2' (with via: q, k or v for a head receiver)")
        via = raw.get("via")
        if via is not None and not isinstance(via, str):
            raise SpecError(f"{path}.via: got {via!r}, expected q, k or v")
        edge = parse_edge(text, graph_shape(ctx), via, what=f"{path}.path")
        metric = fields.choice(path, raw, "metric", METRICS, "accuracy")
        mode = fields.choice(path, raw, "mode", PATH_MODES, "mean")
        task = fields.task(path, "task", raw.get("task"), ctx.tasks)
        lo, hi = fields.drop_bounds(path, raw, metric, *drop_range(metric))
        return Clause(index, self, "set", edge_heads((edge,), ctx), task=task, metric=metric,
                      mode=mode, at_least=lo, at_most=hi, edges=(edge,),
                      name=fields.name(path, raw), source=dict(raw))

    def describe(self, clause: Clause) -> str:
        return f"path {clause.edges[0]}: {clause.task} {clause.metric} ({clause.mode})"

    def threshold_text(self, clause: Clause) -> str:
        return bounds_text(clause.at_least, clause.at_most, "drop ")

    def measured_on(self, clause: Clause) -> str:
        return (f"held-out {clause.task} examples, the edge alone path-patched "
                f"({clause.mode} of its sender)")

    def value_range(self, clause: Clause) -> tuple[float, float]:
        return drop_range(clause.metric)

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        batch = task_batch(data, clause)
        result = edge_drop(model, batch, clause.edges[0], metric=clause.metric,
                           mode=clause.mode)
        drop, (low, high) = result.drop, result.ci
        return ClauseResult(clause, holds(drop, clause.at_least, clause.at_most),
                            number_or_none(drop), clause.threshold_text(), str(clause.edges[0]),
                            ci=(low, high),
                            details={"clean": result.clean, "patched": result.patched,
                                     "examples": int(batch.tokens.shape[0])},
                            stderr=number_or_none(ci_stderr(low, high)))

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        if clause.at_least is None or clause.at_least <= 0:
            return
        dead = gated_heads(ctx, clause.edges, clause.task or "")
        fixed = _fixed_patterns(ctx, clause.edges[0])
        if fixed:
            raise SpecError(f"{clause.path}: {clause.describe()} {clause.threshold_text()} "
                            f"cannot hold: {fixed}'s structural mask ({ctx.masks.get(fixed)}) "
                            "leaves each query at most one key, so its pattern cannot depend "
                            f"on its {clause.edges[0].via} input; expected a value path "
                            "(via v) or an unmasked receiver")
        if dead:
            raise SpecError(f"{clause.path}: {clause.describe()} {clause.threshold_text()} "
                            f"cannot hold: the fixed gates switch {','.join(map(str, dead))} "
                            f"off on {clause.task} examples (heads.<selector>.tasks), so the "
                            f"path carries nothing there; expected heads that serve "
                            f"{clause.task}")

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return path_bound(result, model, data, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        return drop_examples(clause, level)

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        return path_lever(ctx, clause)


def path_lever(ctx: PlanContext, clause: Clause) -> ClauseLever:
    """The lever of a path clause (module docstring), its objectives added to ``ctx``."""
    edge, task = clause.edges[0], clause.task or ""
    task_ids = [list(ctx.task_names).index(task)]
    mode = clause.mode or "mean"
    parts: list[tuple[str, tuple[Edge, ...]]] = []
    first_stage = False
    others = tuple(e for e in edges_into(edge.receiver, edge.via, model_shape(ctx.model))
                   if e != edge)
    if clause.at_least is not None:
        for i, stage in enumerate(ctx.config.carrier_stages):
            for part in stage:
                if part == "others" and others:
                    parts.append(("others", others))
                    first_stage = first_stage or i == 0
                elif part == "margin":
                    parts.append(("margin", (edge,)))
    if clause.at_most is not None:
        parts.append(("self", (edge,)))
    staged = len(ctx.config.carrier_stages) > 1 and first_stage
    words = {"others": f"ablate the other {len(others)} edges into "
                       f"{edge.receiver}{' via ' + edge.via if edge.via else ''}",
             "margin": f"hinge on the {edge}-ablated model",
             "self": f"ablate {edge}"}
    lever = ClauseLever(LeverKind.ABLATION, "; ".join(f"{words[what]} on {task} examples"
                                                      for what, _ in parts),
                        scale=ctx.config.ablation_scale, cap=ctx.config.p_max,
                        loss_from=ctx.config.staged_from if staged else 0.0,
                        perturbs=frozenset({task}))
    for what, edges in parts:
        name = f"enforce:path-{what}[{edge}][{clause.path}]"
        if what == "margin":
            obj = ctx.add(PathAblatedMargin(ctx.model, edges, task_ids, mode=mode,
                                            pool=ctx.task_sampler(task)), name)
            lever.loss_terms.append(obj)  # a loss term: weight = multiplier excess, not p
        else:
            obj = ctx.add(StochasticPathAblation(ctx.model, edges, task_ids, mode=mode,
                                                 pool=ctx.task_sampler(task)), name)
        lever.objectives.append(obj)
    if clause.at_least is not None:
        implied = implied_roles(ctx, edge, task)
        lever.assists = [ctx.add(ctx.on_task(PatternObjective(ctx.model, ctx.heads(h), role,
                                                              kind="ce"), task),
                                 f"enforce:assist:{role}[{h}][{clause.path}]")
                         for role, h in implied]
        if implied:
            lever.description += ("; if it stops improving, the roles the path implies: "
                                  + ", ".join(f"{role} on {h}" for role, h in implied))
    return lever


K_COMPOSITION = ("previous_token", "induction")  # sender role, receiver role of a key path


def implied_roles(ctx: PlanContext, edge: Edge, task: str) -> list[tuple[str, Head]]:
    """The role objectives a path implies: a key path between two heads, on a task whose
    known circuit (declared by its generator or proposed from its data) is previous-token ->
    induction, implies previous-token on the sender and induction on the receiver. A head whose
    structural mask fixes its pattern, or that another clause asks for another role, gets
    none."""
    circuit = {role for role, _ in ctx.structure.circuits.get(task, ())}
    if edge.via != "k" or edge.sender.kind != "head" or not set(K_COMPOSITION) <= circuit:
        return []
    ends = (Head(edge.sender.layer, edge.sender.head),
            Head(edge.receiver.layer, edge.receiver.head))
    return [(role, h) for role, h in zip(K_COMPOSITION, ends, strict=True)
            if h not in ctx.fixed and _free_for(ctx, h, role)]


def _free_for(ctx: PlanContext, head: Head, role: str) -> bool:
    """Whether no clause asks ``head`` for a role score other than ``role``."""
    return all(c.score in (None, role) for c in ctx.contract if head in c.heads)


def _fixed_patterns(ctx: PlanContext, edge: Edge) -> Head | None:
    """A receiver head of a query or key edge whose structural mask fixes its pattern
    (``PlanContext.fixed``), so that input cannot move it; ``None`` otherwise. A key edge
    reaches every query head of its kv group: each must be so fixed."""
    if edge.via not in ("q", "k") or edge.receiver.kind != "head":
        return None
    span = model_shape(ctx.model).group if edge.via == "k" else 1
    heads = [Head(edge.receiver.layer, edge.receiver.head + j) for j in range(span)]
    return heads[0] if all(h in ctx.fixed for h in heads) else None


KIND = PathKind()
