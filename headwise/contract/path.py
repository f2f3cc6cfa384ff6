"""Path clauses: how much a task needs one edge, one head reading what another wrote.

``{path: L0.H1 -> L1.H2, via: k, task: retrieval, metric: accuracy, drop_at_least: 0.3}``
(``via`` ``q``, ``k`` or ``v`` for a head receiver, or written into ``path``: ``L0.H1 -> L1.H2
via k``; receivers may also be ``L1.MLP`` or ``logits``, senders ``embed``, a head or an MLP;
``headwise.analysis.graph``). Measured by path patching on the task's held-out batch
(``headwise.analysis.circuit.edge_drop``: the receiver's input recomputed with only that
sender's contribution replaced, every other path clean), ``mode`` ``mean`` (default: the
sender's per-position mean over the batch) or ``zero``; the drop is clean - ablated for
accuracies, ablated - clean for the loss, with a paired-bootstrap interval over examples (its
standard error is the clause's, as for ablation clauses). A path whose sender or receiver head
the fixed task gates switch off on the task cannot carry it: ``drop_at_least`` there is refused
before training. No lever builds a path yet: under ``--enforce`` the clause is refused unless
``--allow-unenforced``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from headwise.analysis.circuit import edge_drop
from headwise.analysis.graph import Edge, Shape, parse_edge
from headwise.analysis.importance_matrix import ci_stderr
from headwise.contract import fields
from headwise.contract.ablation import drop_range
from headwise.contract.certify import drop_bound
from headwise.contract.clause import (
    METRICS,
    Clause,
    bounds_text,
    holds,
    number_or_none,
)
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, PlanContext
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet

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
        if dead:
            raise SpecError(f"{clause.path}: {clause.describe()} {clause.threshold_text()} "
                            f"cannot hold: the fixed gates switch {','.join(map(str, dead))} "
                            f"off on {clause.task} examples (heads.<selector>.tasks), so the "
                            f"path carries nothing there; expected heads that serve "
                            f"{clause.task}")

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return drop_bound(result, model, data, confidence)

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        return None


KIND = PathKind()
