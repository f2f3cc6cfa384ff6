"""Edge attribution: every edge's path-patching effect estimated from gradients (EAP, EAP-IG).

EAP (Syed et al. 2023) takes the first-order term of path patching: ablating ``u -> v``
changes ``v``'s input stream by ``-(a_u - a_u')`` (``headwise.analysis.paths``), so::

    effect(u -> v) ~= sum_{b, t, d} (a_u' - a_u)[b, t, d] * G_v[b, t, d]

where ``G_v = dM / dx_v`` is the gradient of the metric with respect to the stream ``v``
reads, through ``v``'s input only: for a query input ``G = J_n(x)^T (g_q[h] W_Q[h])`` with
``g_q = dM/d hook_q`` and ``J_n`` the Jacobian of the block's first norm; for a key / value
input the kv head's rows; for an MLP the input projections and the second norm; for the logits
the gradient at the final residual. In a post-norm model the senders' differences are pushed
up the residual path through the norms' Jacobians (the components in between frozen, as path
patching freezes them). One forward and one backward give every edge.

EAP-IG (Hanna et al. 2024) averages the gradients over ``steps`` runs whose input stream is
interpolated between the source's and the clean one, ``x_0(alpha) = x_0' + alpha (x_0 -
x_0')`` for ``alpha = k / steps``, ``k = 1..steps`` (with ``steps=1`` it is EAP); each run
costs one forward and one backward. The source is the corrupted batch's input stream, or the
mean / zero that ablation uses. Scores estimate ``patched - clean`` of each edge alone, on the
same scale as ``path_patch(...).effect``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.paths import Metric, metric_value
from headwise.hooks.graph import EMBED, Edge, Node, Shape, model_shape, receivers, senders
from headwise.hooks.path_run import (
    capture,
    forward_kwargs,
    reduce_values,
    sender_outputs,
    source_input,
    tokens_of,
)
from headwise.model.attention import effective_weight
from headwise.model.eval_mode import eval_mode
from headwise.model.hook_point import Hook

METHODS = ("eap", "eap-ig")
# EAP-IG's interpolation steps, at most: one forward+backward each; published uses take 5 to
# 50, and 1000 is already 200 times the default of 5 (more is a typo, not a finer estimate).
MAX_IG_STEPS = 1000


@dataclass
class EdgeScores:
    """Estimated effects (``patched - clean`` of each edge ablated alone) of every edge.

    Attributes:
        edges: the edges, ordered by receiver then sender.  scores: (E,) float64.
        metric, method, steps, mode: how they were computed.  passes: forward+backward
            passes run.
    """

    edges: list[Edge]
    scores: Tensor
    metric: str
    method: str
    steps: int
    mode: str
    passes: int = 0
    index: dict[Edge, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.index = {e: i for i, e in enumerate(self.edges)}

    def score(self, edge: Edge) -> float:
        """One edge's estimated effect."""
        return float(self.scores[self.index[edge]])

    def ranked(self) -> list[Edge]:
        """Edges by decreasing ``|score|`` (ties in edge order)."""
        order = sorted(range(len(self.edges)), key=lambda i: (-abs(float(self.scores[i])), i))
        return [self.edges[i] for i in order]

    def to_records(self) -> list[dict[str, Any]]:
        """``[{"edge", "sender", "receiver", "via", "score"}]`` in ranked order."""
        return [{"edge": str(e), "sender": str(e.sender), "receiver": str(e.receiver),
                 "via": e.via, "score": self.score(e)} for e in self.ranked()]


def edge_attribution(model: nn.Module, batch: Any, metric: Metric = "loss",
                     method: str = "eap", steps: int = 5, *, source: Any = None,
                     mode: str | None = None) -> EdgeScores:
    """Every edge's estimated ablation effect on ``metric`` (see the module docstring).

    Args:
        model: a headwise Transformer (its parameter gradients are left untouched).
        batch: a ``Batch`` or (B, T) tokens (then ``metric`` must be a function).
        metric: ``loss`` or a differentiable ``fn(logits (B, T, V)) -> scalar``.
        method: ``eap`` (one forward+backward) or ``eap-ig`` (``steps`` of them).
        steps: interpolation steps of EAP-IG, 1 to ``MAX_IG_STEPS`` (ignored by EAP).
        source, mode: the ablation's source as in ``path_patch`` (corrupted batch; else
            ``mean``, the default, or ``zero``).

    Raises:
        ValueError: an unknown method, ``steps`` outside [1, ``MAX_IG_STEPS``], a metric
            without a gradient (``accuracy``, ``exact``), or a bad source / mode.
    """
    if method not in METHODS:
        raise ValueError(f"method: got {method!r}, expected one of {list(METHODS)}")
    if method == "eap-ig" and (isinstance(steps, bool) or not isinstance(steps, int)
                               or not 1 <= steps <= MAX_IG_STEPS):
        raise ValueError(f"steps: got {steps!r}, expected an integer in [1, {MAX_IG_STEPS}]")
    if isinstance(metric, str) and metric != "loss":
        raise ValueError(f"metric: got {metric!r}, expected 'loss' or a differentiable function "
                         "of the logits (accuracy and exact have no gradient)")
    if source is not None and mode not in (None, "corrupted"):
        raise ValueError(f"mode: got {mode!r} with a source batch; leave mode out")
    mode = "corrupted" if source is not None else (mode or "mean")
    if mode not in ("corrupted", "mean", "zero"):
        raise ValueError(f"mode: got {mode!r}, expected 'mean', 'zero' or a source batch")
    n = steps if method == "eap-ig" else 1
    with eval_mode(model):
        scores = _Attribution(model, batch, metric, mode, source).run(n).detach()
    shape = model_shape(model)
    S, R = senders(shape), receivers(shape)
    s_idx = {s: i for i, s in enumerate(S)}
    r_idx = {r: i for i, r in enumerate(R)}
    from headwise.hooks.graph import all_edges

    edges = all_edges(model)
    flat = torch.tensor([float(scores[s_idx[e.sender], r_idx[(e.receiver, e.via)]])
                         for e in edges], dtype=torch.float64)
    return EdgeScores(edges, flat, metric if isinstance(metric, str) else "custom", method,
                      n, mode, n)


class _Attribution:
    """The gradient runs and the (senders x receivers) score matrix."""

    def __init__(self, model: nn.Module, batch: Any, metric: Metric, mode: str,
                 source: Any) -> None:
        self.model, self.batch, self.metric, self.mode = model, batch, metric, mode
        self.shape: Shape = model_shape(model)
        self.blocks: Any = model.blocks
        self.kw = forward_kwargs(batch)
        self.source: dict[Node, Tensor] | None = None
        if mode == "corrupted":
            tokens, kw = source_input(source, batch)
            with torch.no_grad():
                _, values = capture(model, tokens, kw, self._names())
                self.source = sender_outputs(model, values, kw.get("task_ids"))

    def _names(self) -> list[str]:
        names = []
        for l in range(self.shape.n_layers):
            names += [f"blocks.{l}.hook_resid_pre", f"blocks.{l}.attn.hook_z"]
            if self.shape.has_mlp:
                names += [f"blocks.{l}.hook_mlp_out", f"blocks.{l}.hook_resid_mid"]
            if self.shape.post_norm:
                names.append(f"blocks.{l}.hook_resid_post")
        return names

    def run(self, steps: int) -> Tensor:
        """(S, R) scores averaged over ``steps`` runs, alpha = 1 first (the clean run)."""
        total: Tensor | None = None
        deltas: list[Tensor] = []
        for k in range(steps, 0, -1):
            values, grads = self._gradient_run(k / steps)
            with torch.no_grad():  # (torch.func's vjp / jvp still differentiate inside)
                if not deltas:
                    deltas = self._deltas(values)
                step = self._scores(deltas, values, grads)
            total = step if total is None else total + step
        assert total is not None
        return total / steps

    def _base(self, clean: Tensor) -> Tensor:
        if self.source is not None:
            return self.source[EMBED]
        return reduce_values({EMBED: clean}, self.mode, self.kw.get("attention_mask"))[EMBED]

    def _gradient_run(self, alpha: float) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        values: dict[str, Tensor] = {}
        grads: dict[str, Tensor] = {}
        x0: list[Tensor] = []

        def start(x: Tensor, ctx: Any) -> Tensor:
            x = x.detach()
            if alpha != 1.0:
                x = self._base(x) + alpha * (x - self._base(x))
            x0.append(x.requires_grad_(True))
            return x0[0]

        def keep(store: dict[str, Tensor], name: str) -> Callable[[Tensor, Any], None]:
            def fn(x: Tensor, ctx: Any) -> None:
                store[name] = x.detach()
            return fn

        hooks = [Hook("blocks.0.hook_resid_pre", start)]  # first: the captures see x_0(alpha)
        hooks += [Hook(n, keep(values, n), read_only=True) for n in self._names()]
        for name in self._grad_names():
            hooks.append(Hook(name, keep(grads, name), direction="bwd"))
        with torch.enable_grad(), self.model.hooks(hooks):  # type: ignore[operator]
            logits = self.model(tokens_of(self.batch), **self.kw)
            m = metric_value(logits, self.batch, self.metric)
            torch.autograd.grad(m, x0)
        return values, grads

    def _grad_names(self) -> list[str]:
        names = []
        for l in range(self.shape.n_layers):
            names += [f"blocks.{l}.attn.hook_{p}" for p in ("q", "k", "v")]
            if self.shape.has_mlp:
                names.append(f"blocks.{l}.mlp.hook_pre")
                if hasattr(self.blocks[l].mlp, "gate_proj"):
                    names.append(f"blocks.{l}.mlp.hook_pre_linear")
        last = self.shape.n_layers - 1
        point = "hook_normalized_resid_post" if self.shape.post_norm else "hook_resid_post"
        return names + [f"blocks.{last}.{point}"]

    def _deltas(self, values: dict[str, Tensor]) -> list[Tensor]:
        """Per sender (``senders`` order) ``a_u' - a_u`` (B, T, D)."""
        clean = sender_outputs(self.model, values, self.kw.get("task_ids"))
        src = self.source or reduce_values(clean, self.mode, self.kw.get("attention_mask"))
        out = [src[EMBED] - clean[EMBED]]
        for l in range(self.shape.n_layers):
            d = src[Node("head", l)] - clean[Node("head", l)]  # (B, T, H, D)
            out += list(d.expand(clean[Node("head", l)].shape).unbind(2))
            if self.shape.has_mlp:
                out.append((src[Node("mlp", l)] - clean[Node("mlp", l)]).expand_as(out[0]))
        return [d.expand_as(clean[EMBED]) for d in out]

    def _head_grads(self, l: int, grads: dict[str, Tensor], x: Tensor) -> Tensor:
        """(H + 2 Hkv, B, T, D) receiver gradients of layer ``l``'s q, k, v inputs at the stream."""
        attn = self.blocks[l].attn
        parts = []
        for p, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj)):
            g = grads[f"blocks.{l}.attn.hook_{p}"]  # (B, T, Hx, Dh)
            w = effective_weight(proj).view(g.shape[2], g.shape[3], -1)  # (Hx, Dh, D)
            parts.append(torch.einsum("bthe,hed->hbtd", g, w))
        u = torch.cat(parts)
        return u if self.shape.post_norm else _vjp(self.blocks[l].ln1, x, u)

    def _mlp_grads(self, l: int, grads: dict[str, Tensor], x: Tensor) -> Tensor:
        """(1, B, T, D) the MLP input's receiver gradient at the stream."""
        mlp = self.blocks[l].mlp
        first = mlp.gate_proj if hasattr(mlp, "gate_proj") else mlp.up_proj
        u = grads[f"blocks.{l}.mlp.hook_pre"] @ effective_weight(first)
        if hasattr(mlp, "gate_proj"):
            u = u + grads[f"blocks.{l}.mlp.hook_pre_linear"] @ effective_weight(mlp.up_proj)
        return u[None] if self.shape.post_norm else _vjp(self.blocks[l].ln2, x, u[None])

    def _scores(self, deltas: list[Tensor], values: dict[str, Tensor],
                grads: dict[str, Tensor]) -> Tensor:
        """(S, R) float64: sender differences at each receiver's stream, dotted with its
        gradient; post-norm pushes the differences through the norms on the way up."""
        sh = self.shape
        out = torch.zeros(len(senders(sh)), len(receivers(sh)), dtype=torch.float64)
        stack = deltas[0].new_empty(len(deltas), *deltas[0].shape)
        stack[0] = deltas[0]
        n, r = 1, 0  # stack[:n]: the senders so far, as the current stream carries them
        for l in range(sh.n_layers):
            x = values[f"blocks.{l}.hook_resid_pre"]
            g = self._head_grads(l, grads, x)
            out[:n, r:r + len(g)] = _dots(stack[:n], g)
            r += len(g)
            stack[n:n + sh.n_heads] = torch.stack(deltas[n:n + sh.n_heads])
            n += sh.n_heads
            if sh.post_norm:
                mid = "hook_resid_mid" if sh.has_mlp else "hook_resid_post"
                stack[:n] = _jvp(self.blocks[l].ln1, values[f"blocks.{l}.{mid}"], stack[:n])
            if sh.has_mlp:
                g = self._mlp_grads(l, grads, values[f"blocks.{l}.hook_resid_mid"])
                out[:n, r:r + 1] = _dots(stack[:n], g)
                r += 1
                stack[n] = deltas[n]
                n += 1
                if sh.post_norm:
                    stack[:n] = _jvp(self.blocks[l].ln2, values[f"blocks.{l}.hook_resid_post"],
                                     stack[:n])
        last = sh.n_layers - 1
        point = "hook_normalized_resid_post" if sh.post_norm else "hook_resid_post"
        out[:n, r:r + 1] = _dots(stack[:n], grads[f"blocks.{last}.{point}"][None])
        return out


@dataclass(frozen=True)
class Agreement:
    """How attribution scores agree with exact path patching on the same edges.

    Attributes:
        n_edges: edges compared.  spearman: rank correlation of the signed effects.
        k: size of the top sets.  top_k: share of the exact top-``k`` edges (by ``|effect|``)
            that are also in the attribution's top ``k``.
    """

    n_edges: int
    spearman: float
    k: int
    top_k: float


def agreement(scores: EdgeScores, exact: Mapping[Edge, float], k: int) -> Agreement:
    """Compare ``scores`` with exact effects (``paths.exact_effects``) on ``exact``'s edges.

    Raises:
        ValueError: ``k`` outside 1..len(exact).
    """
    edges = list(exact)
    if not 1 <= k <= len(edges):
        raise ValueError(f"k: got {k}, expected 1-{len(edges)}")
    est = torch.tensor([scores.score(e) for e in edges], dtype=torch.float64)
    ex = torch.tensor([exact[e] for e in edges], dtype=torch.float64)
    top_est = set(est.abs().argsort(descending=True)[:k].tolist())
    top_ex = set(ex.abs().argsort(descending=True)[:k].tolist())
    return Agreement(len(edges), spearman(est, ex), k, len(top_est & top_ex) / k)


def _dots(a: Tensor, b: Tensor) -> Tensor:
    """(n, m) float64 inner products of (n, ...) and (m, ...) over the other axes."""
    return (a.flatten(1) @ b.flatten(1).T).double()


def _vjp(fn: nn.Module, x: Tensor, u: Tensor) -> Tensor:
    """``J_fn(x)^T u[i]`` for each of the (R, ...) cotangents ``u``."""
    pull = torch.func.vjp(fn, x)[1]
    return torch.vmap(pull)(u)[0]


def _jvp(fn: nn.Module, x: Tensor, t: Tensor) -> Tensor:
    """``J_fn(x) t[i]`` for each of the (R, ...) tangents ``t``."""
    return torch.vmap(lambda v: torch.func.jvp(fn, (x,), (v,))[1])(t)


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two 1-d tensors (average ranks for ties)."""
    def ranks(x: Tensor) -> Tensor:
        order = x.double().argsort()
        r = torch.empty_like(order, dtype=torch.float64)
        r[order] = torch.arange(len(x), dtype=torch.float64)
        for v in x.unique():  # average ranks of ties
            tie = x == v
            if int(tie.sum()) > 1:
                r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / denom if denom else math.nan
