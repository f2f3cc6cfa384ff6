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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from headwise.analysis.graph import EMBED, Edge, Node, Shape, make_edge, model_shape, parse_node
from headwise.analysis.importance import example_stats
from headwise.model.attention import effective_weight
from headwise.model.eval_mode import eval_mode
from headwise.model.hook_point import Hook

Metric = str | Callable[[Tensor], Tensor]
Mode = Literal["corrupted", "mean", "zero"]
METRIC_NAMES = ("loss", "accuracy", "exact")


def forward_kwargs(batch: Any) -> dict[str, Any]:
    """``attention_mask`` and ``task_ids`` of a ``Batch`` (nothing for a bare token tensor)."""
    kw: dict[str, Any] = {}
    for name in ("attention_mask", "task_ids"):
        if getattr(batch, name, None) is not None:
            kw[name] = getattr(batch, name)
    return kw


def tokens_of(batch: Any) -> Tensor:
    """The (B, T) tokens of a ``Batch`` or a token tensor."""
    return batch if isinstance(batch, Tensor) else batch.tokens


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


def head_outputs(block: nn.Module, z: Tensor, task_ids: Tensor | None) -> Tensor:
    """(B, T, H, D) each head's contribution ``gate(z)_h W_O[h]^T`` from ``z`` (B, T, H, Dh)."""
    attn: Any = block.attn
    if attn.head_gate is not None:
        z = attn.head_gate(z, task_ids)
    w = effective_weight(attn.o_proj)  # (D, H*Dh)
    return torch.einsum("bthd,mhd->bthm", z, w.view(w.shape[0], attn.n_heads, attn.d_head))


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
        """A checked edge of this model (``headwise.analysis.graph.make_edge``)."""
        return make_edge(self.node(sender, "sender"), self.node(receiver, "receiver"), via,
                         self.shape)

    def clean(self, metric: Metric) -> float:
        """The metric of the unablated model."""
        return float(metric_value(self.clean_logits, self.batch, metric))

    def value(self, edges: Iterable[Edge], metric: Metric) -> float:
        """The metric with ``edges`` ablated together."""
        with torch.no_grad():
            return float(metric_value(self.run(edges), self.batch, metric))

    def run(self, edges: Iterable[Edge]) -> Tensor:
        """(B, T, V) logits of the batch with ``edges`` ablated together (eval mode)."""
        into: dict[tuple[int, str, int], list[Node]] = {}
        for e in edges:
            r = e.receiver
            key = ((self.shape.n_layers, "logits", 0) if r.kind == "logits" else
                   (r.layer, "mlp", 0) if r.kind == "mlp" else (r.layer, e.via or "", r.head))
            into.setdefault(key, []).append(e.sender)
        state = _RunState(self, into)
        with eval_mode(self.model), self.model.hooks(state.hooks()):  # type: ignore[operator]
            return self.model(tokens_of(self.batch), **self.kw)


def source_input(source: Any, batch: Any) -> tuple[Tensor, dict[str, Any]]:
    """The tokens and forward arguments of a corrupted ``source`` (a token tensor runs with
    ``batch``'s mask and task ids).

    Raises:
        ValueError: a source of another shape than the batch.
    """
    tokens = tokens_of(source)
    if tokens.shape != tokens_of(batch).shape:
        raise ValueError(f"source: got shape {tuple(tokens.shape)}, expected the batch's "
                         f"{tuple(tokens_of(batch).shape)}")
    return tokens, forward_kwargs(batch if isinstance(source, Tensor) else source)


def stream_names(shape: Shape) -> list[str]:
    """The hook points a run records: block inputs, ``z``, attention and MLP outputs, and the
    stream an MLP reads (pre-norm: ``hook_resid_mid``; post-norm: its normalised form)."""
    names = []
    for l in range(shape.n_layers):
        names += [f"blocks.{l}.hook_resid_pre", f"blocks.{l}.attn.hook_z",
                  f"blocks.{l}.hook_attn_out"]
        if shape.has_mlp:
            mid = "hook_normalized_resid_mid" if shape.post_norm else "hook_resid_mid"
            names += [f"blocks.{l}.hook_mlp_out", f"blocks.{l}.{mid}"]
    return names


def capture(model: nn.Module, tokens: Tensor, kw: dict[str, Any],
            names: Iterable[str]) -> tuple[Tensor, dict[str, Tensor]]:
    """``(logits, {name: value})`` of one forward with read-only captures at ``names`` (the
    outputs are bit-identical to a forward without them)."""
    store: dict[str, Tensor] = {}
    hooks = [Hook(n, _storer(store, n), read_only=True) for n in names]
    with model.hooks(hooks):  # type: ignore[operator]
        logits = model(tokens, **kw)
    return logits, store


def sender_outputs(model: nn.Module, values: dict[str, Tensor],
                   task_ids: Tensor | None) -> dict[Node, Tensor]:
    """Every sender's output from a run's captures (``stream_names``): ``EMBED`` (B, T, D);
    per layer ``Node("head", l)`` (B, T, H, D), every head at once, and the MLP (B, T, D)."""
    blocks: Any = model.blocks
    out = {EMBED: values["blocks.0.hook_resid_pre"]}
    for l in range(len(blocks)):
        out[Node("head", l)] = head_outputs(blocks[l], values[f"blocks.{l}.attn.hook_z"],
                                            task_ids)
        if f"blocks.{l}.hook_mlp_out" in values:
            out[Node("mlp", l)] = values[f"blocks.{l}.hook_mlp_out"]
    return out


def reduce_values(values: dict[Node, Tensor], mode: str,
                  mask: Tensor | None) -> dict[Node, Tensor]:
    """The source of ``mean`` or ``zero`` ablation, shaped (1, T, ...): the mean over the batch
    per position (positions where ``mask`` (B, T) is 0 left out), or zeros."""
    if mode == "zero":
        return {n: torch.zeros_like(v[:1]) for n, v in values.items()}
    out = {}
    for n, v in values.items():
        w = (torch.ones(v.shape[:2], dtype=v.dtype, device=v.device) if mask is None
             else mask.to(v.dtype))  # (B, T)
        w = w.view(*w.shape, *([1] * (v.dim() - 2)))
        out[n] = (v * w).sum(0, keepdim=True) / w.sum(0, keepdim=True).clamp_min(1)
    return out


def _storer(store: dict[str, Tensor], name: str) -> Callable[[Tensor, Any], None]:
    def fn(x: Tensor, ctx: Any) -> None:
        store[name] = x
    return fn


class _RunState:
    """The hooks of one ablated run and what they record on the way."""

    def __init__(self, patcher: PathPatcher, into: dict[tuple[int, str, int], list[Node]]):
        self.p, self.into = patcher, into
        self.shape = patcher.shape
        self.store: dict[str, Tensor] = {}
        self.diffs: dict[int, Tensor] = {}  # layer -> (B, T, H, D) current - source head outputs
        self.mlp_inputs: dict[int, tuple[Tensor, Tensor]] = {}

    def hooks(self) -> list[Hook]:
        if not self.into:
            return []
        top = max(k[0] for k in self.into)
        hooks = [Hook(n, _storer(self.store, n), read_only=True)
                 for n in stream_names(self.shape) if int(n.split(".")[1]) <= top]
        for (layer, via, _) in sorted(set((k[0], k[1], 0) for k in self.into)):
            if via in ("q", "k", "v"):
                hooks.append(Hook(f"blocks.{layer}.attn.hook_{via}", self._head_hook(layer, via)))
            elif via == "mlp":
                mlp = self.p.blocks[layer].mlp
                hooks.append(Hook(f"blocks.{layer}.mlp.hook_pre",
                                  self._mlp_hook(layer, mlp.gate_proj if hasattr(mlp, "gate_proj")
                                                 else mlp.up_proj)))
                if hasattr(mlp, "gate_proj"):
                    hooks.append(Hook(f"blocks.{layer}.mlp.hook_pre_linear",
                                      self._mlp_hook(layer, mlp.up_proj)))
            else:
                last = self.shape.n_layers - 1
                point = "hook_normalized_resid_post" if self.shape.post_norm else "hook_resid_post"
                hooks.append(Hook(f"blocks.{last}.{point}", self._logits_hook))
        return hooks

    # -- the senders' current - source outputs -------------------------------------------------
    def diff(self, node: Node) -> Tensor:
        src = self.p.source
        if node.kind == "embed":
            return self.store["blocks.0.hook_resid_pre"] - src[EMBED]
        if node.kind == "mlp":
            return self.store[f"blocks.{node.layer}.hook_mlp_out"] - src[node]
        if node.layer not in self.diffs:
            z = self.store[f"blocks.{node.layer}.attn.hook_z"]
            cur = head_outputs(self.p.blocks[node.layer], z, self.p.kw.get("task_ids"))
            self.diffs[node.layer] = cur - src[Node("head", node.layer)]
        return self.diffs[node.layer][:, :, node.head]

    def delta(self, groups: Sequence[list[Node]], kind: str | None = None,
              layer: int | None = None) -> Tensor | None:
        """(R, B, T, D): per receiver the summed diffs of its senders (of ``kind`` in ``layer``
        when given); ``None`` when there are none."""
        rows, any_ = [], False
        for senders in groups:
            chosen = [self.diff(u) for u in senders
                      if kind in (None, u.kind) and layer in (None, u.layer)]
            any_ = any_ or bool(chosen)
            rows.append(torch.stack(chosen).sum(0) if chosen else None)
        if not any_:
            return None
        like = next(r for r in rows if r is not None)
        return torch.stack([r if r is not None else torch.zeros_like(like) for r in rows])

    # -- the receivers' streams ----------------------------------------------------------------
    def streams(self, layer: int, stage: str, current: Tensor,
                groups: Sequence[list[Node]]) -> Tensor:
        """(R, B, T, D) the stream each receiver at (``layer``, ``stage``) reads with its
        senders ablated; ``current`` (B, T, D) is the stream there in this run."""
        if not self.shape.post_norm:
            d = self.delta(groups)
            return current.expand(len(groups), *current.shape) - (0 if d is None else d)
        return self._post_norm_chain(layer, stage, groups)

    def _post_norm_chain(self, layer: int, stage: str, groups: Sequence[list[Node]]) -> Tensor:
        """Recompute the stream from the lowest ablated sender through the norms, every
        attention and MLP output frozen at this run's."""
        s = self.store
        first = min((u for g in groups for u in g), key=Node.sort_key)
        if first.kind == "embed":
            k, phase = 0, "x"
            d = self.delta(groups, "embed")
            x = s["blocks.0.hook_resid_pre"] - (0 if d is None else d)
        else:
            k, phase = first.layer, "x" if first.kind == "head" else "y"
            x = s[f"blocks.{k}.hook_resid_pre" if phase == "x"
                  else f"blocks.{k}.hook_normalized_resid_mid"].expand(len(groups), -1, -1, -1)
        while True:
            block: Any = self.p.blocks[k] if k < self.shape.n_layers else None
            if phase == "x":
                if block is None or (stage == "attn" and k == layer):
                    return x
                d = self.delta(groups, "head", k)
                x = block.ln1(x + s[f"blocks.{k}.hook_attn_out"] - (0 if d is None else d))
                phase = "y" if self.shape.has_mlp else "x"
                k += 0 if self.shape.has_mlp else 1
                continue
            if stage == "mlp" and k == layer:
                return x
            d = self.delta(groups, "mlp", k)
            x = block.ln2(x + s[f"blocks.{k}.hook_mlp_out"] - (0 if d is None else d))
            phase, k = "x", k + 1

    # -- the hooks that change receivers -------------------------------------------------------
    def _head_hook(self, layer: int, via: str) -> Callable[[Tensor, Any], Tensor]:
        block = self.p.blocks[layer]
        proj = {"q": block.attn.q_proj, "k": block.attn.k_proj, "v": block.attn.v_proj}[via]
        group = 1 if via == "q" else self.shape.group

        def fn(value: Tensor, ctx: Any) -> Tensor:  # (B, T, H|Hkv, Dh)
            keys = [k for k in self.into if k[0] == layer and k[1] == via]
            groups = [self.into[k] for k in keys]
            x = self.store[f"blocks.{layer}.hook_resid_pre"]
            new = self.streams(layer, "attn", x, groups)  # (R, B, T, D)
            dn = (new - x) if self.shape.post_norm else block.ln1(new) - block.ln1(x)
            w = effective_weight(proj).view(value.shape[2], value.shape[3], -1)  # (Hx, Dh, D)
            idx = [k[2] // group for k in keys]
            change = torch.einsum("rbtd,rhd->rbth", dn, w[idx])  # (R, B, T, Dh)
            out = value.clone()
            for i, h in enumerate(idx):
                out[:, :, h] = value[:, :, h] + change[i]
            return out
        return fn

    def _mlp_hook(self, layer: int, proj: nn.Module) -> Callable[[Tensor, Any], Tensor]:
        block = self.p.blocks[layer]

        def fn(value: Tensor, ctx: Any) -> Tensor:  # (B, T, F)
            if layer not in self.mlp_inputs:
                mid = "hook_normalized_resid_mid" if self.shape.post_norm else "hook_resid_mid"
                x = self.store[f"blocks.{layer}.{mid}"]
                new = self.streams(layer, "mlp", x, [self.into[(layer, "mlp", 0)]])[0]
                self.mlp_inputs[layer] = ((new, x) if self.shape.post_norm
                                          else (block.ln2(new), block.ln2(x)))
            new, x = self.mlp_inputs[layer]
            return value + (new - x) @ effective_weight(proj).T
        return fn

    def _logits_hook(self, value: Tensor, ctx: Any) -> Tensor:  # (B, T, D)
        groups = [self.into[(self.shape.n_layers, "logits", 0)]]
        return value + (self.streams(self.shape.n_layers, "out", value, groups)[0] - value)


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
