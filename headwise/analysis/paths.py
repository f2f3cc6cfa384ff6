"""Path patching: run a model with chosen edges ablated, each receiver's input recomputed.

Direct-path semantics (Wang et al. 2022; Goldowsky-Dill et al. 2023): ablating the edge
``u -> v`` replaces ``u``'s contribution to ``v``'s input, and only there. In a pre-norm model
``v`` reads::

    x_v' = x_v - sum_{u ablated into v} (a_u - a_u')        (B, T, D)

where ``x_v`` is the residual stream ``v`` reads (before its norm), ``a_u`` the sender's output
in this run and ``a_u'`` its output on the source: a corrupted batch, the per-position mean over
the batch (padding left out), or zero. Every other reader of ``u`` still gets ``a_u``, every
other sender reaches ``v`` unchanged, and ``v``'s new output flows downstream as usual. The
receiver's value is changed at its hook point by ``(n(x_v') - n(x_v)) W^T``: for a head, ``n``
is its block's first norm and ``W`` its query rows (``hook_q``) or its kv head's key / value
rows (``hook_k`` / ``hook_v``, read by every query head of the group); for an MLP, ``n`` is
the block's second norm and ``W`` the MLP's input projections (``mlp.hook_pre``, and
``hook_pre_linear`` for SwiGLU); for the logits, the final residual itself is replaced.

A post-norm block renormalises the stream after each sub-layer, so there ``x_v'`` is the
stream recomputed from the sender up to ``v`` through those norms, with every component in
between frozen at its output in this run (the norms are the residual path; no ``n`` is applied
before a head or an MLP, which read the normalised stream directly).

A head's output ``a_h`` is its gated ``z_h W_O[h]`` (task gates included; ``b_O`` belongs to no
head and stays), an MLP's is ``hook_mlp_out``, the embeddings' is ``blocks.0.hook_resid_pre``
(token, position and segment embeddings after any embedding norm). Masks apply as in every
forward. Ablating many edges at once (a circuit's outside) uses the sender's output in the
same ablated run, as ACDC does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.importance import example_stats
from headwise.hooks.graph import Edge, Node, make_edge, model_shape, parse_node
from headwise.hooks.path_run import (
    AblatedRun,
    ablation_targets,
    capture,
    forward_kwargs,
    reduce_values,
    sender_outputs,
    source_input,
    stream_names,
    tokens_of,
)
from headwise.model.eval_mode import eval_mode

Metric = str | Callable[[Tensor], Tensor]
METRIC_NAMES = ("loss", "accuracy", "exact")


def metric_value(logits: Tensor, batch: Any, metric: Metric) -> Tensor:
    """``metric`` of ``logits`` (B, T, V) on ``batch``: a 0-dim tensor (differentiable for
    ``loss`` and for a differentiable callable).

    ``loss`` / ``accuracy`` / ``exact`` are token-weighted over the scored positions of
    ``batch.targets`` (``headwise.analysis.importance``); a callable gets the logits.

    Raises:
        ValueError: an unknown metric name, or a name without ``batch.targets``.
    """
    if callable(metric):
        return torch.as_tensor(metric(logits))
    if metric not in METRIC_NAMES or getattr(batch, "targets", None) is None:
        raise ValueError(f"metric: got {metric!r}, expected one of {list(METRIC_NAMES)} with a "
                         "Batch that has targets, or a function of the logits")
    num, count = example_stats(logits, batch.targets)[metric]
    return num.sum() / count.sum().clamp_min(1)


def drop_of(metric: Metric, clean: float, ablated: float) -> float:
    """Signed so that positive means the ablated part mattered: ``ablated - clean`` for the loss,
    ``clean - ablated`` for every other metric (higher is better)."""
    return ablated - clean if metric == "loss" else clean - ablated


@dataclass(frozen=True)
class PathPatchResult:
    """One edge ablated: the metric ``clean`` and ``patched``; ``effect = patched - clean`` and
    ``drop`` (positive: the edge mattered; see ``drop_of``)."""

    edge: Edge
    metric: str
    mode: str
    clean: float
    patched: float

    @property
    def effect(self) -> float:
        return self.patched - self.clean

    @property
    def drop(self) -> float:
        return drop_of(self.metric, self.clean, self.patched)


class PathPatcher:
    """A model, a batch and a source, for running the batch with any set of edges ablated.

    Args:
        model: a headwise Transformer.
        batch: a ``Batch`` (tokens, targets, attention_mask, task_ids) or (B, T) tokens.
        source: a corrupted ``Batch`` or (B, T) tokens (a token tensor runs with ``batch``'s
            mask and task ids); senders take their outputs on it.
        mode: without ``source``: ``mean`` (default; per position over ``batch``, padding left
            out) or ``zero``.

    Raises:
        ValueError: ``source`` together with a mode other than ``corrupted``, an unknown mode,
            or a source of another shape.
    """

    def __init__(self, model: nn.Module, batch: Any, source: Any = None,
                 mode: str | None = None) -> None:
        if source is not None and mode not in (None, "corrupted"):
            raise ValueError(f"mode: got {mode!r} with a source batch; a source is corrupted "
                             "input (leave mode out), mean and zero take none")
        mode = "corrupted" if source is not None else (mode or "mean")
        if mode not in ("corrupted", "mean", "zero"):
            raise ValueError(f"mode: got {mode!r}, expected 'mean', 'zero' or a source batch")
        self.model, self.batch, self.mode = model, batch, mode
        self.shape = model_shape(model)
        self.kw = forward_kwargs(batch)
        self.blocks: Any = model.blocks
        names = stream_names(self.shape)
        with eval_mode(model), torch.no_grad():
            self.clean_logits, clean = capture(model, tokens_of(batch), self.kw, names)
            if mode == "corrupted":
                tokens, kw = source_input(source, batch)
                _, values = capture(model, tokens, kw, names)
                self.source = sender_outputs(model, values, kw.get("task_ids"))
            else:
                self.source = reduce_values(sender_outputs(model, clean, self.kw.get("task_ids")),
                                            mode, self.kw.get("attention_mask"))

    def node(self, text: str | Node, what: str = "node") -> Node:
        """A node from its text form (``embed``, ``L1.H2``, ``L0.MLP``, ``logits``)."""
        return text if isinstance(text, Node) else parse_node(str(text), self.shape, what)

    def edge(self, sender: str | Node, receiver: str | Node, via: str | None = None) -> Edge:
        """A checked edge of this model (``headwise.hooks.graph.make_edge``)."""
        return make_edge(self.node(sender, "sender"), self.node(receiver, "receiver"), via,
                         self.shape)

    def clean(self, metric: Metric) -> float:
        """The metric of the unablated model."""
        return float(metric_value(self.clean_logits, self.batch, metric))

    def value(self, edges: Iterable[Edge], metric: Metric) -> float:
        """The metric with ``edges`` ablated together."""
        with torch.no_grad():
            return float(metric_value(self.run(edges), self.batch, metric))

    def replacement(self, node: Node, current: Tensor) -> Tensor:
        """The sender's output on the source (``AblatedRun``): corrupted, mean or zero."""
        return self.source[node]

    def run(self, edges: Iterable[Edge]) -> Tensor:
        """(B, T, V) logits of the batch with ``edges`` ablated together (eval mode)."""
        state = AblatedRun(self, ablation_targets(edges, self.shape))
        with eval_mode(self.model), self.model.hooks(state.hooks()):  # type: ignore[operator]
            return self.model(tokens_of(self.batch), **self.kw)


def path_patch(model: nn.Module, batch: Any, sender: str | Node, receiver: str | Node,
               via: str | None = None, *, source: Any = None, mode: str | None = None,
               metric: Metric = "loss") -> PathPatchResult:
    """The effect on ``metric`` of ablating one edge ``sender -> receiver`` (direct path).

    Args:
        model: a headwise Transformer.
        batch: a ``Batch`` or (B, T) tokens (then ``metric`` must be a function).
        sender: ``embed``, a head ``L0.H1`` or an MLP ``L0.MLP`` (text or ``Node``).
        receiver: a head, an MLP or ``logits``.
        via: ``q``, ``k`` or ``v`` for a head receiver (``k``/``v``: its kv head's input).
        source: a corrupted batch or tokens; the sender's output is taken on it.
        mode: without ``source``: ``mean`` (default) or ``zero``.
        metric: ``loss``, ``accuracy``, ``exact`` or ``fn(logits (B, T, V)) -> scalar``.

    Returns:
        ``PathPatchResult`` (clean and patched metric, effect, drop).

    Raises:
        SpecError: a malformed edge (names the part).  ValueError: see ``PathPatcher``.
    """
    patcher = PathPatcher(model, batch, source, mode)
    edge = patcher.edge(sender, receiver, via)
    return PathPatchResult(edge, str(metric) if isinstance(metric, str) else "custom",
                           patcher.mode, patcher.clean(metric), patcher.value([edge], metric))


def exact_effects(patcher: PathPatcher, edges: Iterable[Edge], metric: Metric = "loss"
                  ) -> dict[Edge, float]:
    """Each edge's exact ``patched - clean`` when ablated alone: one forward per edge."""
    clean = patcher.clean(metric)
    return {e: patcher.value([e], metric) - clean for e in edges}
