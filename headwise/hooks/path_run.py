"""One ablated run: the captures it reads and the hooks that recompute each receiver's input.

The maths is ``headwise.analysis.paths``'s; this module holds the machinery both path patching
and edge attribution use: which hook points a run records (``stream_names``), every sender's
output from those records (``sender_outputs``; a head's is its gated ``z_h W_O[h]``), the
sources of mean and zero ablation (``reduce_values``), and ``AblatedRun``, whose hooks change
each receiver by ``(n(x_v') - n(x_v)) W^T`` during the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.hooks.graph import EMBED, Edge, Node, Shape
from headwise.model.attention import effective_weight
from headwise.model.hook_point import Hook


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


def head_outputs(block: nn.Module, z: Tensor, task_ids: Tensor | None) -> Tensor:
    """(B, T, H, D) each head's contribution ``gate(z)_h W_O[h]^T`` from ``z`` (B, T, H, Dh)."""
    attn: Any = block.attn
    if attn.head_gate is not None:
        z = attn.head_gate(z, task_ids)
    w = effective_weight(attn.o_proj)  # (D, H*Dh)
    return torch.einsum("bthd,mhd->bthm", z, w.view(w.shape[0], attn.n_heads, attn.d_head))


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


Into = dict[tuple[int, str, int], list[Node]]
"""Per receiver input ``(layer, via | "mlp" | "logits", head)`` (``head``: the kv group's first
query head for ``k``/``v``, else 0 for an MLP and the logits) the senders ablated into it."""


def ablation_targets(edges: Iterable[Edge], shape: Shape) -> Into:
    """The receiver inputs ``edges`` ablate into, each with its senders (an edge named twice is
    ablated once)."""
    into: Into = {}
    for e in edges:
        r = e.receiver
        group = shape.group if e.via in ("k", "v") else 1  # a kv head's input
        key = ((shape.n_layers, "logits", 0) if r.kind == "logits" else
               (r.layer, "mlp", 0) if r.kind == "mlp" else
               (r.layer, e.via or "", r.head - r.head % group))
        senders = into.setdefault(key, [])
        if e.sender not in senders:
            senders.append(e.sender)
    return into


class AblatedRun:
    """The hooks of one ablated run and what they record on the way.

    Args:
        patcher: what the run reads besides ``into``: ``shape``, ``blocks``, ``kw`` (the
            forward's ``task_ids`` gate head outputs) and ``replacement(node, current)``, the
            sender's output that replaces ``current`` (its output in this run) in the
            receivers (a ``PathPatcher``'s source; a training lever's per-row mix).
        into: the receiver inputs and their ablated senders (``ablation_targets``).

    The hooks keep references to this run's activations until ``clear()``; a run object can
    serve many forwards if it is cleared between them.
    """

    def __init__(self, patcher: Any, into: Into) -> None:
        self.p, self.into = patcher, into
        self.shape = patcher.shape
        self.store: dict[str, Tensor] = {}
        self.diffs: dict[int, Tensor] = {}  # layer -> (B, T, H, D) current - source head outputs
        self.mlp_inputs: dict[int, tuple[Tensor, Tensor]] = {}

    def clear(self) -> None:
        """Forget the last forward's activations (in place: the hooks hold these dicts)."""
        self.store.clear()
        self.diffs.clear()
        self.mlp_inputs.clear()

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
        """(B, T, D) the sender's output in this run minus its replacement."""
        if node.kind == "embed":
            cur = self.store["blocks.0.hook_resid_pre"]
            return cur - self.p.replacement(EMBED, cur)
        if node.kind == "mlp":
            cur = self.store[f"blocks.{node.layer}.hook_mlp_out"]
            return cur - self.p.replacement(node, cur)
        if node.layer not in self.diffs:
            z = self.store[f"blocks.{node.layer}.attn.hook_z"]
            cur = head_outputs(self.p.blocks[node.layer], z, self.p.kw.get("task_ids"))
            self.diffs[node.layer] = cur - self.p.replacement(Node("head", node.layer), cur)
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
