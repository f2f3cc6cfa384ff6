"""Attribution patching: every head's ablation effect on a task's loss estimated from one backward.

Ablating head ``h`` replaces its output ``z_h`` (``hook_z``, (B, T, Dh) per head) by ``z'_h``
(zeros, or the reference batch's mean per position). To first order the loss moves by

    delta L_h  ~=  sum_{b, t} dL/dz_h[b, t] . (z'_h[b, t] - z_h[b, t])

(Nanda 2023, "attribution patching"; Syed et al. 2023). One forward and one backward give
every head's estimate: a zero leaf is added to each layer's ``z`` at its hook point, so its
gradient is the loss's total derivative with respect to ``z`` (every later layer, attention
inputs included, a function of it, as in the exact ablation). ``L`` is the task's
token-weighted cross-entropy at its scored positions (``headwise.analysis.scored``). The
estimate is a *screen*: ``screen_heads`` picks the heads whose exact ablation
(``ablation_importance``) is worth running; reports mark estimates as such. Its agreement
with exact ablation is tested (``tests/analysis/test_attribution.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from headwise.analysis.importance_matrix import ImportanceMatrix
from headwise.analysis.scored import forward_kwargs, head_at, stats_at
from headwise.heads import Head, HeadSet
from headwise.model.cache import run_with_cache
from headwise.model.eval_mode import in_eval_mode
from headwise.model.hook_point import Hook, HookContext


def _delta_hook(zs: dict[int, Tensor], deltas: dict[int, Tensor], layer: int) -> Any:
    """``z + delta`` with ``delta`` a zero leaf: its gradient is the loss's total derivative
    with respect to ``z`` (through every later layer, attention inputs included)."""
    def fn(z: Tensor, ctx: HookContext) -> Tensor:
        zs[layer] = z.detach()
        deltas[layer] = torch.zeros_like(z, requires_grad=True)
        return z + deltas[layer]
    return fn


def _loss_and_z(model: Any, batch: Any
                ) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor], float]:
    """The batch's mean loss, every layer's ``z`` and its zero leaf, and the clean loss."""
    zs: dict[int, Tensor] = {}
    deltas: dict[int, Tensor] = {}
    hooks = [Hook(f"blocks.{l}.attn.hook_z", _delta_hook(zs, deltas, l))
             for l in range(len(model.blocks))]
    with model.hooks(hooks):
        hidden = model.hidden(batch.tokens, **forward_kwargs(batch))
    num, den = stats_at(head_at(model, hidden, batch.targets), batch.targets)["loss"]
    loss = num.sum() / den.sum().clamp_min(1)
    return loss, zs, deltas, float(loss.detach())


@in_eval_mode
def attribution_importance(model: nn.Module, batches: Mapping[str, Any] | Any,
                           mode: Literal["zero", "mean"] = "zero",
                           reference: Mapping[str, Tensor] | Tensor | None = None
                           ) -> ImportanceMatrix:
    """Every head's estimated loss increase when it is ablated, per task (metric ``loss``).

    Args:
        model: a headwise Transformer.
        batches: ``{task: batch}`` (or one batch), as ``ablation_importance`` takes.
        mode: ``zero``, or ``mean`` over ``reference`` (default each task's own batch).
        reference: tokens for ``mean``, per task or shared.

    Returns:
        ImportanceMatrix (every head x tasks x ``loss``), ``info["estimate"]`` true; no
        confidence intervals (NaN).

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode: got {mode!r}, expected 'zero' or 'mean'")
    m: Any = model
    cfg = m.config
    tasks = dict(batches) if isinstance(batches, Mapping) else {"task": batches}
    heads = [Head(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    values = torch.full((len(heads), len(tasks), 1), float("nan"), dtype=torch.float64)
    clean: dict[str, dict[str, float]] = {}
    for ti, (task, batch) in enumerate(tasks.items()):
        means = _means(m, batch, mode, reference.get(task) if isinstance(reference, Mapping)
                       else reference)
        with torch.enable_grad():
            loss, zs, deltas, clean_loss = _loss_and_z(m, batch)
            layers = sorted(deltas)
            grads = torch.autograd.grad(loss, [deltas[l] for l in layers])
        clean[task] = {"loss": clean_loss}
        for l, g in zip(layers, grads, strict=True):
            z = zs[l]  # (B, T, H, Dh)
            target = torch.zeros_like(z) if means is None else means[l].to(z.dtype)
            effect = (g * (target - z)).sum((0, 1, 3))  # (H,)
            values[l * cfg.n_heads:(l + 1) * cfg.n_heads, ti, 0] = effect.double().cpu()
    nan = torch.full_like(values, float("nan"))
    units = [HeadSet([h], cfg.n_layers, cfg.n_heads) for h in heads]
    return ImportanceMatrix(units, list(tasks), ["loss"], values, nan, nan.clone(), clean,
                            None, {"method": "attribution", "mode": mode, "estimate": True})


@torch.no_grad()
def _means(model: Any, batch: Any, mode: str, reference: Tensor | None
           ) -> dict[int, Tensor] | None:
    """Per layer: the mean ``z`` (1, T, H, Dh) over the reference batch, for ``mean``."""
    if mode == "zero":
        return None
    names = [f"blocks.{l}.attn.hook_z" for l in range(len(model.blocks))]
    kw = forward_kwargs(batch) if reference is None else {}
    _, cache = run_with_cache(model, batch.tokens if reference is None else reference, names,
                              **kw)
    T = batch.tokens.shape[1]
    return {l: cache[n][:, :T].mean(0, keepdim=True) for l, n in enumerate(names)}


def screen_heads(estimate: ImportanceMatrix, keep: int,
                 always: Sequence[Head] = ()) -> list[Head]:
    """The heads whose exact ablation a report runs: per task the ``keep`` heads of largest
    estimated effect (by absolute value), and ``always`` (e.g. the heads a contract names),
    in layer-head order."""
    chosen = set(always)
    values = estimate.matrix("loss").abs().nan_to_num(-1.0)  # (U, K)
    for k in range(values.shape[1]):
        for i in values[:, k].argsort(descending=True)[:keep].tolist():
            chosen |= set(estimate.units[i])
    return sorted(chosen)
