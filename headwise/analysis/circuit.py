"""Circuits: a set of edges, its faithfulness, and the smallest one that keeps a task.

A circuit is a set of edges (``headwise.hooks.graph``); running it means ablating every
edge *outside* it together (``PathPatcher``: each receiver reads the source's output of every
sender whose edge into it is outside). Given as nodes (heads ``L0.H1``, MLPs ``L0.MLP``), a
circuit is every edge among those nodes, the embeddings and the logits.

Faithfulness (Wang et al. 2022; MIB, Mueller et al. 2025) is the share of the task metric the
circuit keeps between the model with no edge at all and the whole model::

    kept = (M(circuit) - M(empty)) / (M(model) - M(empty))

``discover_circuit`` ranks every edge by attribution (EAP or EAP-IG, on the loss), takes the
shortest prefix of the ranking whose ``kept`` reaches the threshold (doubling, then bisection),
and then removes its edges one at a time, least-ranked first, wherever ``kept`` stays at or
above the threshold: no single edge of the result can go.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.edges import EdgeScores, edge_attribution
from headwise.analysis.importance import example_stats
from headwise.analysis.importance_matrix import bootstrap_ci
from headwise.analysis.paths import METRIC_NAMES, Metric, PathPatcher, drop_of
from headwise.errors import SpecError
from headwise.heads import Head
from headwise.hooks.graph import (
    EMBED,
    LOGITS,
    Edge,
    Node,
    all_edges,
    model_shape,
    parse_edge,
    parse_node,
)


@dataclass(frozen=True)
class Faithfulness:
    """A circuit's metric against the whole model's and the empty circuit's; ``kept_ci`` and
    ``outside_drop_ci`` are paired-bootstrap intervals over examples (NaN where not measured)."""

    metric: str
    mode: str
    full: float
    circuit: float
    empty: float
    kept_ci: tuple[float, float] = (math.nan, math.nan)
    outside_drop_ci: tuple[float, float] = (math.nan, math.nan)

    @property
    def kept(self) -> float:
        """``(circuit - empty) / (full - empty)``; NaN when the model equals the empty circuit."""
        gap = self.full - self.empty
        return (self.circuit - self.empty) / gap if gap else math.nan

    @property
    def outside_drop(self) -> float:
        """How much ablating everything outside costs (positive: it mattered; ``drop_of``)."""
        return drop_of(self.metric, self.full, self.circuit)


def circuit_edges(model: nn.Module, circuit: Iterable[Any], what: str = "circuit") -> set[Edge]:
    """The edges a circuit names: ``Edge`` objects or edge texts (``"L0.H1 -> L1.H2 via k"``),
    and nodes (``Head``, ``Node`` or texts ``L0.H1`` / ``L0.MLP``) whose edges among each other,
    the embeddings and the logits belong to it.

    Raises:
        SpecError: an item that is neither, naming ``what[i]``.
    """
    shape = model_shape(model)
    edges: set[Edge] = set()
    nodes = {EMBED, LOGITS}
    for i, item in enumerate(circuit):
        label = f"{what}[{i}]"
        if isinstance(item, Edge):
            edges.add(item)
        elif isinstance(item, Head):
            nodes.add(Node("head", item.layer, item.head))
        elif isinstance(item, Node):
            nodes.add(item)
        elif isinstance(item, str) and "->" in item:
            edges.add(parse_edge(item, shape, what=label))
        elif isinstance(item, str):
            nodes.add(parse_node(item, shape, label))
        else:
            raise SpecError(f"{label}: got {item!r}, expected an edge such as 'L0.H1 -> L1.H2 "
                            "via k' or a node such as L0.H1 or L0.MLP")
    group = shape.group
    for e in all_edges(model):
        receiver = e.receiver
        owners = ({Node("head", receiver.layer, receiver.head + j) for j in range(group)}
                  if e.via in ("k", "v") else {receiver})
        if e.sender in nodes and owners & nodes:
            edges.add(e)
    return edges


def faithfulness(model: nn.Module, batch: Any, circuit: Iterable[Any], *,
                 metric: Metric = "accuracy", source: Any = None, mode: str | None = None,
                 patcher: PathPatcher | None = None, n_boot: int = 1000,
                 confidence: float = 0.95, seed: int = 0) -> Faithfulness:
    """How much of ``metric`` the circuit keeps with every edge outside it ablated.

    Args:
        model: a headwise Transformer.
        batch: the task's examples (a ``Batch``: tokens, targets, mask, task ids).
        circuit: edges and / or nodes (``circuit_edges``).
        metric: ``accuracy`` (default), ``loss``, ``exact`` or a function of the logits.
        source, mode: the ablation's source (``PathPatcher``; mean by default).
        patcher: a ``PathPatcher`` of this model and batch to reuse (its source then applies).
        n_boot, confidence, seed: the paired bootstrap over examples of ``kept`` and
            ``outside_drop`` (as ablation clauses'); none for a function metric or
            ``n_boot=0``.

    Returns:
        ``Faithfulness``: ``kept`` and ``outside_drop`` (for a strict circuit), with intervals.
    """
    p = patcher or PathPatcher(model, batch, source, mode)
    inside = circuit_edges(model, circuit)
    every = all_edges(model)
    outside = [e for e in every if e not in inside]
    if callable(metric) or n_boot <= 0:
        return Faithfulness(metric if isinstance(metric, str) else "custom", p.mode,
                            p.clean(metric), p.value(outside, metric), p.value(every, metric))
    (full, count), (circ, _), (empty, _) = (patched_stats(p, e, metric)
                                            for e in ([], outside, every))
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, full.shape[0], (n_boot, full.shape[0]), generator=gen)

    def ratio(num: Tensor, rows: Tensor | None = None) -> Tensor:
        n, c = (num, count) if rows is None else (num[rows], count[rows])
        return n.sum(-1) / c.sum(-1).clamp_min(1e-12)

    kept = (ratio(circ, idx) - ratio(empty, idx)) / (ratio(full, idx) - ratio(empty, idx))
    kept = kept[kept.isfinite()]
    tail = (1 - confidence) / 2
    kept_ci = ((float(kept.quantile(tail)), float(kept.quantile(1 - tail))) if kept.numel()
               else (math.nan, math.nan))
    sign = 1.0 if metric == "loss" else -1.0
    _, low, high = bootstrap_ci(full, circ, count, sign, n_boot, confidence, gen)
    return Faithfulness(metric, p.mode, float(ratio(full)), float(ratio(circ)),
                        float(ratio(empty)), kept_ci, (low, high))


def patched_stats(p: PathPatcher, edges: Sequence[Edge], metric: str) -> tuple[Tensor, Tensor]:
    """Per-example numerators and counts (B,) of ``metric`` (``example_stats``) with ``edges``
    ablated together (none: the clean run), on the CPU in float64."""
    with torch.no_grad():
        logits = p.clean_logits if not edges else p.run(edges)
        num, count = example_stats(logits, p.batch.targets)[metric]
    return num.detach().double().cpu(), count.double().cpu()


@dataclass(frozen=True)
class EdgeDrop:
    """One edge ablated alone: the metric ``clean`` and ``patched``, the ``drop`` (positive:
    the edge mattered; ``drop_of``) and its paired-bootstrap interval ``(low, high)``."""

    edge: Edge
    metric: str
    mode: str
    clean: float
    patched: float
    drop: float
    ci: tuple[float, float]


def edge_drop(model: nn.Module, batch: Any, edge: str | Edge, *, metric: str = "accuracy",
              source: Any = None, mode: str | None = None, n_boot: int = 1000,
              confidence: float = 0.95, seed: int = 0) -> EdgeDrop:
    """One edge ablated alone (``path_patch``): what a clause on a path measures, with the
    paired bootstrap over examples that ablation clauses use.

    ``edge`` is an ``Edge`` or its text (``"L0.H1 -> L1.H2 via k"``, ``"L1.H2 -> logits"``);
    ``metric`` is ``accuracy``, ``loss`` or ``exact``.

    Raises:
        SpecError: a malformed edge.  ValueError: another metric.
    """
    if metric not in METRIC_NAMES:
        raise ValueError(f"metric: got {metric!r}, expected one of {list(METRIC_NAMES)}")
    p = PathPatcher(model, batch, source, mode)
    e = edge if isinstance(edge, Edge) else parse_edge(edge, p.shape)
    (clean, count), (patched, _) = patched_stats(p, [], metric), patched_stats(p, [e], metric)
    gen = torch.Generator().manual_seed(seed)
    sign = 1.0 if metric == "loss" else -1.0
    drop, low, high = bootstrap_ci(clean, patched, count, sign, n_boot, confidence, gen)
    total = count.sum().clamp_min(1)
    return EdgeDrop(e, metric, p.mode, float(clean.sum() / total), float(patched.sum() / total),
                    drop, (low, high))


@dataclass
class Circuit:
    """A discovered circuit: its edges (ranked), their scores and exact drops, its faithfulness.

    Attributes:
        edges: the circuit's edges by decreasing attribution.
        scores: attribution of every edge of the model (the ranking).
        drops: each circuit edge's own drop when ablated alone in the whole model.
        faithfulness: the circuit's ``Faithfulness``.  threshold: the ``kept`` it had to reach.
        evaluations: ablated runs the search made.
    """

    edges: list[Edge]
    scores: EdgeScores
    drops: dict[Edge, float]
    faithfulness: Faithfulness
    threshold: float
    evaluations: int

    def clauses(self, task: str) -> list[dict[str, Any]]:
        """Contract clauses that state this circuit: one ``circuit`` clause (it keeps
        ``threshold`` of the task), and one ``path`` clause per edge whose own drop is positive,
        bounded at half the drop measured here (rounded down to 0.01; an edge whose half-drop
        rounds to 0 gets none) so that fresh examples' noise does not fail it."""
        out: list[dict[str, Any]] = [{"circuit": [str(e) for e in self.edges], "task": task,
                                      "keeps_at_least": self.threshold}]
        for e in self.edges:
            bound = math.floor(self.drops[e] / 2 * 100) / 100
            if bound > 0:
                via = {"via": e.via} if e.via else {}
                out.append({"path": f"{e.sender} -> {e.receiver}", **via, "task": task,
                            "metric": self.faithfulness.metric, "drop_at_least": bound})
        return out

    def heads(self) -> list[Head]:
        """The heads the circuit's edges touch, in order."""
        nodes = {n for e in self.edges for n in (e.sender, e.receiver) if n.kind == "head"}
        return sorted(Head(n.layer, n.head) for n in nodes)


def discover_circuit(model: nn.Module, batch: Any, *, faithfulness_at_least: float = 0.9,
                     metric: Metric = "accuracy", method: str = "eap", steps: int = 5,
                     source: Any = None, mode: str | None = None) -> Circuit:
    """The smallest circuit found that keeps ``faithfulness_at_least`` of ``metric``.

    Edges are ranked by ``edge_attribution(model, batch, "loss", method, steps)``; see the
    module docstring for the search. Costs one attribution, about ``2 log2(E)`` ablated runs
    for the prefix and one per edge of the prefix for the pruning.

    Raises:
        ValueError: a threshold outside (0, 1], or a model whose whole and empty circuits
            score the same (nothing to keep).
    """
    if not 0 < faithfulness_at_least <= 1:
        raise ValueError(f"faithfulness_at_least: got {faithfulness_at_least!r}, expected a "
                         "number in (0, 1]")
    scores = edge_attribution(model, batch, "loss", method, steps, source=source, mode=mode)
    p = PathPatcher(model, batch, source, mode)
    ranked = scores.ranked()
    every = set(ranked)
    full, empty = p.clean(metric), p.value(ranked, metric)
    if full == empty:
        raise ValueError(f"metric: the model and the empty circuit both score {full:g} on "
                         f"{metric}; there is nothing for a circuit to keep")
    runs = 1

    def kept(edges: Sequence[Edge]) -> float:
        nonlocal runs
        runs += 1
        return (p.value(every - set(edges), metric) - empty) / (full - empty)

    hi = 1
    while hi < len(ranked) and kept(ranked[:hi]) < faithfulness_at_least:
        hi *= 2
    hi, lo = min(hi, len(ranked)), hi // 2  # kept(ranked[:lo]) fell short (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if kept(ranked[:mid]) >= faithfulness_at_least else (mid, hi)
    chosen = list(ranked[:hi])
    for e in reversed(ranked[:hi]):
        trial = [x for x in chosen if x != e]
        if trial and kept(trial) >= faithfulness_at_least:
            chosen = trial
    fit = Faithfulness(metric if isinstance(metric, str) else "custom", p.mode, full,
                       p.value(every - set(chosen), metric), empty)
    drops = {e: drop_of(fit.metric, full, p.value([e], metric)) for e in chosen}
    return Circuit(chosen, scores, drops, fit, faithfulness_at_least, runs + len(chosen))
