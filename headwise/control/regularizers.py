"""Regularisers in the Objective protocol: head diversity (Li et al. 2018) and FFN penalties.

Both are re-exported by ``headwise.control.objectives``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control._common import masked_mean, model_shape
from headwise.control.objective import Objective
from headwise.model.hook_point import Hook, HookContext
from headwise.patterns import real_tokens


class HeadDiversity(Objective):
    """Disagreement regularisation between the heads of one layer (Li et al. 2018, EMNLP).

    Li et al. maximise ``D = -1/H^2 sum_i sum_j sim(i, j)`` over all ordered pairs (i = j
    included); this objective minimises ``-D``:

    - ``on="pattern"`` (their "disagreement on attended positions"):
      ``sim(i, j) = mean_rows sum_k P^i_qk P^j_qk`` over real query rows ``q``.
    - ``on="output"`` (their "disagreement on outputs", the per-head outputs ``z_i`` before
      the output projection): ``sim(i, j) = mean_pos cos(z_i, z_j)`` over real positions,
      ``cos(a, b) = a.b / (max(|a|, eps) max(|b|, eps))``.

    ``loss = weight * 1/H^2 sum_ij sim(i, j)``. Logged per head:
    ``diversity/L{l}.H{i} = 1/H sum_j sim(i, j)``. ``on="pattern"`` computes all heads of the
    layer explicitly; ``on="output"`` leaves the fused path alone.

    Raises:
        ValueError: ``on`` unknown or ``layer`` out of range.
    """

    def __init__(self, model: nn.Module, layer: int, on: str = "pattern",
                 weight: float = 1.0) -> None:
        n_layers, n_heads, _, _ = model_shape(model)
        if on not in ("pattern", "output"):
            raise ValueError(f"on: got {on!r}, expected 'pattern' or 'output'")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise ValueError(f"layer: got {layer!r}, expected 0-{n_layers - 1}")
        self.name = "diversity"
        self.weight = float(weight)
        self.layer, self.on, self.n_heads = layer, on, n_heads
        self._log_names = [f"{self.name}/L{layer}.H{h}" for h in range(n_heads)]
        self._value: Tensor | None = None

    def hooks(self) -> list[Hook]:
        def grab(x: Tensor, ctx: HookContext) -> None:
            self._value = x
        point = "hook_pattern" if self.on == "pattern" else "hook_z"
        return [Hook(f"blocks.{self.layer}.attn.{point}", grab, tuple(range(self.n_heads)),
                     read_only=True)]

    def reset(self) -> None:
        self._value = None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        if self._value is None:
            raise RuntimeError(f"no value captured for layer {self.layer}: run the forward "
                               "inside `with model.hooks(*objective.hooks())`")
        x, self._value = self._value, None
        real = real_tokens(tokens, attention_mask)
        if self.on == "pattern":
            sim = torch.einsum("bhqk,bgqk->bqhg", x, x)  # (B, T, H, H)
        else:
            zn = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # (B, T, H, Dh)
            sim = zn @ zn.transpose(-1, -2)  # (B, T, H, H)
        w = real.to(sim.dtype)[..., None, None]
        pair = (sim * w).sum((0, 1)) / w.sum().clamp_min(1.0)  # (H, H)
        per_head = pair.detach().mean(-1)  # (H,)
        logs = dict(zip(self._log_names, per_head.unbind(), strict=True))
        return self.weight * pair.mean(), logs


class FFNPenalty(Objective):
    """Penalties on FFN outputs ``m = hook_mlp_out`` (B, T, D) at chosen layers.

    Per layer, over real positions ``t`` (``attention_mask``):
    ``kind="l1"``: ``mean_t mean_d |m_td|``;  ``kind="target"``: ``mean_t mean_d
    (m_td - target_td)^2`` with ``target`` a tensor broadcastable to (B, T, D) (e.g. (D,)) or
    ``fn(tokens) -> (B, T, D)``. The loss is the mean over layers times ``weight``; logged as
    ``ffn/L{l}``.

    Raises:
        ValueError: unknown ``kind``, ``kind="target"`` without a target, or a layer that is
            out of range or has no MLP (attention-only models).
    """

    def __init__(self, model: nn.Module, layers: int | Iterable[int] | None = None,
                 kind: str = "l1", target: Tensor | Callable[[Tensor], Tensor] | None = None,
                 weight: float = 1.0) -> None:
        n_layers, _, _, _ = model_shape(model)
        if kind not in ("l1", "target"):
            raise ValueError(f"kind: got {kind!r}, expected 'l1' or 'target'")
        if kind == "target" and target is None:
            raise ValueError("target: kind='target' needs a target tensor or function")
        chosen = (list(range(n_layers)) if layers is None
                  else [layers] if isinstance(layers, int) else list(layers))
        for l in chosen:
            if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < n_layers:
                raise ValueError(f"layers: got {l!r}, expected 0-{n_layers - 1}")
            if getattr(model.blocks[l], "mlp", None) is None:  # type: ignore[index]
                raise ValueError(f"layers: layer {l} has no MLP (attention-only model)")
        self.name = "ffn"
        self.weight = float(weight)
        self.layers, self.kind, self.target = chosen, kind, target
        self._values: dict[int, Tensor] = {}

    def hooks(self) -> list[Hook]:
        def grab(layer: int) -> Callable[[Tensor, HookContext], None]:
            def fn(x: Tensor, ctx: HookContext) -> None:
                self._values[layer] = x
            return fn
        return [Hook(f"blocks.{l}.hook_mlp_out", grab(l)) for l in self.layers]

    def reset(self) -> None:
        self._values.clear()

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        real = real_tokens(tokens, attention_mask)
        terms, logs = [], {}
        for l in self.layers:
            if l not in self._values:
                raise RuntimeError(f"no FFN output captured for layer {l}: run the forward "
                                   "inside `with model.hooks(*objective.hooks())`")
            m = self._values.pop(l)  # (B, T, D)
            if self.kind == "l1":
                per_pos = m.abs().mean(-1)
            else:
                tgt: Any = self.target(tokens) if callable(self.target) else self.target
                per_pos = (m - tgt.to(m)).pow(2).mean(-1)
            value = masked_mean(per_pos, real)
            terms.append(value)
            logs[f"{self.name}/L{l}"] = value.detach()
        return self.weight * torch.stack(terms).mean(), logs
