"""Circuit clauses: a set of edges (or heads) that alone keeps a task, or outside which nothing
matters.

``{circuit: [L0.H1 -> L1.H2 via k, L1.H2 -> logits], task: T, keeps_at_least: 0.9}`` states
faithfulness: with every edge outside the circuit ablated together (``mode`` ``mean``, the
default, or ``zero``), the share of the task metric the circuit keeps between the model with
no edge at all and the whole model, ``(M(circuit) - M(empty)) / (M(model) - M(empty))``
(``headwise.analysis.circuit.faithfulness``). ``outside_drop_at_most: d`` bounds instead what
ablating the outside costs the task (``M(model) - M(circuit)`` for accuracies, the loss's
increase: what lies outside may not matter, the strict part of strict interchange intervention
training). A clause states one of the two; write two clauses for both. Items are edges
(``headwise.hooks.graph``) or nodes (``L0.H1``, ``L0.MLP``), whose edges among each other,
the embeddings and the logits belong to the circuit. Measured on the task's held-out batch.

Lever (either bound): every edge outside the circuit stochastically ablated together on the
task's training examples, in the clause's ``mode`` (``headwise.control.path_levers``), so the
model learns to do the task through the circuit alone: faithfulness rises and the outside stops
mattering, as strict interchange intervention training trains its non-circuit nodes. It acts
from the first step at a fixed share (``ClauseLever.start``), not from the first violation:
on every example for ``outside_drop_at_most`` (the clause's own condition), on ``p_max`` of
them for ``keeps_at_least`` (the others train the whole model). Switched on once the model has
learned the task through other heads, the circuit stays at chance for about a hundred steps
(docs/benchmarks.md, "circuit_strict_outside").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headwise.analysis.circuit import circuit_edges, faithfulness
from headwise.analysis.importance_matrix import ci_stderr
from headwise.contract import fields
from headwise.contract.ablation import drop_examples, drop_range
from headwise.contract.certify import circuit_bound
from headwise.contract.clause import METRICS, Clause, holds, number_or_none
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, LeverKind, PlanContext
from headwise.contract.path import PATH_MODES, edge_heads, graph_shape, task_batch
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.path_levers import StochasticPathAblation
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet
from headwise.hooks.graph import Edge, Node, all_edges, parse_edge, parse_node

BOUNDS = ("keeps_at_least", "outside_drop_at_most")
MAX_ITEMS = 4096


class CircuitKind(ClauseKind):
    name = "circuit"
    sharded = False  # path patching reads each head's output weights whole
    keys = frozenset({"circuit", "task", "metric", "mode", *BOUNDS, "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "circuit" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        items = raw.get("circuit")
        if not isinstance(items, list) or not items or len(items) > MAX_ITEMS:
            raise SpecError(f"{path}.circuit: got {_short(items)}, expected a non-empty list "
                            f"(at most {MAX_ITEMS}) of edges such as 'L0.H1 -> L1.H2 via k' "
                            "or nodes such as L0.H1")
        shape = graph_shape(ctx)
        edges: list[Edge] = []
        nodes: list[Node] = []
        for i, item in enumerate(items):
            where = f"{path}.circuit[{i}]"
            if not isinstance(item, str):
                raise SpecError(f"{where}: got {_short(item)}, expected an edge such as "
                                "'L0.H1 -> L1.H2 via k' or a node such as L0.H1")
            if "->" in item:
                edges.append(parse_edge(item, shape, what=where))
            else:
                nodes.append(parse_node(item, shape, where))
        given = [b for b in BOUNDS if b in raw]
        if len(given) != 1:
            raise SpecError(f"{path}: got {given or 'no bound'}, expected one of "
                            f"{list(BOUNDS)} (write two clauses for both)")
        metric = fields.choice(path, raw, "metric", METRICS, "accuracy")
        mode = fields.choice(path, raw, "mode", PATH_MODES, "mean")
        task = fields.task(path, "task", raw.get("task"), ctx.tasks)
        value = fields.number(path, raw, given[0])
        assert value is not None
        if given[0] == "keeps_at_least":
            fields.in_range(path, {given[0]: value}, -math.inf, math.inf, "a finite share")
            lo, hi = value, None
        else:
            low, high = drop_range(metric)
            fields.in_range(path, {given[0]: value}, low, high,
                            f"an {metric} drop in [{low:g}, {high:g}]")
            lo, hi = None, value
        heads = edge_heads(tuple(edges), ctx)
        named = sorted({*heads, *(Head(n.layer, n.head) for n in nodes if n.kind == "head")})
        return Clause(index, self, "set", HeadSet(named, ctx.n_layers, ctx.n_heads),
                      task=task, metric=metric, mode=mode, at_least=lo, at_most=hi,
                      edges=(*edges, *nodes), name=fields.name(path, raw), source=dict(raw))

    def describe(self, clause: Clause) -> str:
        what = "share kept" if clause.at_least is not None else "outside drop"
        return (f"circuit of {len(clause.edges)} item(s): {clause.task} {clause.metric} "
                f"{what} ({clause.mode})")

    def measured_on(self, clause: Clause) -> str:
        return (f"held-out {clause.task} examples, every edge outside the circuit path-patched "
                f"({clause.mode} of its sender)")

    def value_range(self, clause: Clause) -> tuple[float, float]:
        return (-math.inf, math.inf) if clause.at_least is not None else drop_range(
            clause.metric)

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        batch = task_batch(data, clause)
        f = faithfulness(model, batch, [str(x) for x in clause.edges], metric=clause.metric,
                         mode=clause.mode)
        keeps = clause.at_least is not None
        value = f.kept if keeps else f.outside_drop
        low, high = f.kept_ci if keeps else f.outside_drop_ci
        return ClauseResult(clause, holds(value, clause.at_least, clause.at_most),
                            number_or_none(value), clause.threshold_text(), "the circuit",
                            ci=(low, high),
                            details={"full": f.full, "circuit": f.circuit, "empty": f.empty,
                                     "examples": int(batch.tokens.shape[0])},
                            stderr=number_or_none(ci_stderr(low, high)))

    def threshold_text(self, clause: Clause) -> str:
        if clause.at_least is not None:
            return f"keeps >= {clause.at_least:g}"
        return f"outside drop <= {clause.at_most:g}"

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return circuit_bound(result, model, data, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        """The outside drop's size (a drop); a share kept is bounded through the empty
        circuit's drop as well, which the clause alone does not set."""
        return {} if clause.at_most is None else drop_examples(clause, level)

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        inside = circuit_edges(ctx.model, [str(x) for x in clause.edges], clause.path)
        outside = [e for e in all_edges(ctx.model) if e not in inside]
        if not outside:  # the circuit is the whole model: nothing lies outside to train
            return ClauseLever(LeverKind.STRUCTURAL, "the circuit is every edge of the model")
        task = clause.task or ""
        obj = ctx.add(StochasticPathAblation(
            ctx.model, outside, [list(ctx.task_names).index(task)], mode=clause.mode or "mean",
            pool=ctx.task_sampler(task)), f"enforce:circuit-outside[{clause.path}]")
        # From the first step: a model that has learned the task through other heads first
        # learns it through the circuit only after a long plateau (docs/benchmarks.md,
        # "circuit_strict_outside"). The strict part ablates the outside on every example, the
        # clause's own condition; faithfulness on p_max of them, so the rest train the model.
        share = 1.0 if clause.at_most is not None else ctx.config.p_max
        where = (f"every {task} example" if share >= 1.0
                 else f"a share {share:g} of the {task} examples")
        return ClauseLever(LeverKind.ABLATION, f"ablate the {len(outside)} edges outside the "
                           f"circuit on {where} from step 0", [obj],
                           scale=ctx.config.ablation_scale, cap=share, start=share,
                           perturbs=frozenset({task}))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


KIND = CircuitKind()
