"""Head importance per task: ablation effects, gradient (head-mask) importance, with bootstrap CIs.

Metrics on a batch with next-token ``targets`` (-100 ignored) are token-weighted over the
scored positions: ``loss`` (mean cross-entropy, nats) and ``accuracy`` (argmax hits);
``exact`` is per example (the share of examples whose every scored token is right). The
*drop* caused by an intervention is signed so that positive means "the head mattered":
``accuracy``: clean - ablated; ``loss``: ablated - clean (the loss increase). Confidence
intervals come from a paired bootstrap over examples (the same resampled examples for the clean
and the ablated run), percentile method.

``gradient_importance`` is Michel et al. 2019's ``I_h = E_x |dL(x)/d xi_h|``: a gate ``xi``
(ones) multiplies each head's output ``z`` at ``hook_z``; the absolute value is taken per
example, before averaging (per-batch gradients of opposite sign cancel). One backward pass gives
every example's gradient because example ``x``'s loss depends only on its own gate row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.analysis.batched_ablation import ablated_stats
from headwise.analysis.importance_matrix import (
    ImportanceMatrix,
    bootstrap_ci,
    bootstrap_value_ci,
)
from headwise.analysis.scored import forward_kwargs, scored_stats
from headwise.heads import HeadSet, select_heads
from headwise.model.eval_mode import in_eval_mode
from headwise.model.hook_point import Hook

IGNORE = -100
METRICS = ("loss", "accuracy", "exact")


def example_stats(logits: Tensor, targets: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-example numerators and token counts of each metric.

    Args:
        logits: (B, T, V); the cross-entropy is computed in float32, or in float64 for
            float64 logits.  targets: (B, T) long, -100 where not scored.

    Returns:
        ``{"loss": (sum CE (B,), count (B,)), "accuracy": (hits (B,), count (B,)),
        "exact": (every scored token right (B,), 1 per example with a scored token (B,))}``.
    """
    valid = targets != IGNORE
    # Half precision is upcast to float32; float64 stays float64 (a float64 model's loss is
    # exact enough for finite differences, which float32 rounding of the loss is not).
    wide = logits if logits.dtype == torch.float64 else logits.float()
    ce = F.cross_entropy(wide.transpose(1, 2), targets, ignore_index=IGNORE,
                         reduction="none")  # (B, T), 0 where ignored
    hits = (logits.argmax(-1) == targets) & valid
    count = valid.sum(1).double()
    hit = hits.sum(1).double()
    scored = (count > 0).double()
    return {"loss": (ce.sum(1).double(), count), "accuracy": (hit, count),
            "exact": ((hit == count).double() * scored, scored)}


def _cpu(stats: dict[str, tuple[Tensor, Tensor]]) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-example statistics on the CPU (the bootstrap's generator and quantiles live there)."""
    return {m: (n.detach().cpu(), c.cpu()) for m, (n, c) in stats.items()}


@in_eval_mode
@torch.no_grad()
def task_metrics(model: nn.Module, batch: Any) -> dict[str, float]:
    """Token-weighted ``loss`` and ``accuracy``, and ``exact``, of ``model`` on ``batch``."""
    stats = scored_stats(model, batch)
    return {m: float(num.sum() / den.sum().clamp_min(1)) for m, (num, den) in stats.items()}


@in_eval_mode
@torch.no_grad()
def task_metric_ci(model: nn.Module, batch: Any, metric: str, n_boot: int = 1000,
                   confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """One metric of ``model`` on ``batch`` with a percentile bootstrap CI over examples.

    The same resampling as the ablation drops' CIs (``bootstrap_value_ci``).

    Returns:
        ``(value, low, high)`` (the bounds are NaN with fewer than two examples).

    Raises:
        ValueError: unknown metric.
    """
    if metric not in METRICS:
        raise ValueError(f"metric: got {metric!r}, expected one of {list(METRICS)}")
    stats = _cpu(scored_stats(model, batch))
    num, count = stats[metric]
    gen = torch.Generator().manual_seed(seed)
    return bootstrap_value_ci(num, count, n_boot, confidence, gen)


def _units(model: nn.Module, heads: Any, groups: Sequence[Any] | None) -> list[HeadSet]:
    if groups is not None:
        return [select_heads(model, g, f"groups[{i}]") for i, g in enumerate(groups)]
    return [select_heads(model, h) for h in select_heads(model, heads)]


def _as_tasks(batches: Mapping[str, Any] | Any) -> dict[str, Any]:
    return dict(batches) if isinstance(batches, Mapping) else {"task": batches}


@in_eval_mode
@torch.no_grad()
def ablation_importance(model: nn.Module, batches: Mapping[str, Any] | Any, heads: Any = None,
                        mode: Literal["zero", "mean", "resample"] = "zero",
                        reference: Mapping[str, Tensor] | Tensor | None = None,
                        groups: Sequence[Any] | None = None, n_boot: int = 1000,
                        confidence: float = 0.95, seed: int = 0) -> ImportanceMatrix:
    """Effect of ablating each head (or each group) on each task's loss and accuracy.

    The ablations run batched from the clean residual stream at each ablated layer, with the
    output head at the scored positions only (``headwise.analysis.batched_ablation``); the
    numbers are those of ablating one unit at a time.

    Args:
        model: a headwise Transformer.
        batches: ``{task: batch}`` (or one batch) with ``tokens``, ``targets``,
            ``attention_mask``, ``task_ids`` attributes (``headwise.data.Batch``).
        heads: heads ablated one at a time (selector; default all).
        mode: ``zero``, ``mean`` or ``resample`` (see ``headwise.hooks.ablate``).
        reference: tokens for mean/resample ablation, per task or shared; default each task's
            own batch (with its mask and task ids).
        groups: instead of single heads, sets ablated together (selectors).
        n_boot: bootstrap resamples.  confidence: CI mass.  seed: bootstrap and resample seed.

    Returns:
        ImportanceMatrix of drops (units x tasks x metrics) with confidence intervals.

    Raises:
        ValueError: unknown mode, or a reference shorter than a task's batch.
    """
    if mode not in ("zero", "mean", "resample"):
        raise ValueError(f"mode: got {mode!r}, expected 'zero', 'mean' or 'resample'")
    tasks = _as_tasks(batches)
    units = _units(model, heads, groups)
    shape = (len(units), len(tasks), len(METRICS))
    drop, lo, hi, abl = (torch.full(shape, float("nan"), dtype=torch.float64) for _ in range(4))
    gen = torch.Generator().manual_seed(seed)
    clean_vals: dict[str, dict[str, float]] = {}
    for ti, (task, batch) in enumerate(tasks.items()):
        ref = reference.get(task) if isinstance(reference, Mapping) else reference
        ref_kw = forward_kwargs(batch) if ref is None else {}
        ref = batch.tokens if ref is None else ref
        clean_t, ablated = ablated_stats(model, batch, units, mode,
                                         None if mode == "zero" else ref, ref_kw, seed)
        clean = _cpu(clean_t)
        clean_vals[task] = {m: float(n.sum() / d.sum().clamp_min(1))
                            for m, (n, d) in clean.items()}
        for ui, unit_stats in enumerate(ablated):
            stats = _cpu(unit_stats)
            for mi, m in enumerate(METRICS):
                sign = 1.0 if m == "loss" else -1.0  # positive = the head mattered
                (cn, cd), (an, ad) = clean[m], stats[m]
                abl[ui, ti, mi] = an.sum() / ad.sum().clamp_min(1)
                point, low, high = bootstrap_ci(cn, an, cd, sign, n_boot, confidence, gen)
                drop[ui, ti, mi], lo[ui, ti, mi], hi[ui, ti, mi] = point, low, high
    return ImportanceMatrix(units, list(tasks), list(METRICS), drop, lo, hi, clean_vals, abl,
                            {"method": "ablation", "mode": mode, "n_boot": n_boot,
                             "confidence": confidence})


def _gate_fn(gate: Tensor, layer: int) -> Callable[[Tensor, Any], Tensor]:
    """Hook multiplying ``z`` (B, T, H, Dh) by the gate row of ``layer`` (B, H)."""
    def fn(z: Tensor, ctx: Any) -> Tensor:
        return z * gate[:, layer, None, :, None].to(z.dtype)
    return fn


@in_eval_mode
def gradient_importance(model: nn.Module, batches: Mapping[str, Any] | Any, heads: Any = None,
                        n_boot: int = 1000, confidence: float = 0.95,
                        seed: int = 0) -> ImportanceMatrix:
    """Michel et al. 2019 head importance ``E_x |dL(x)/d xi_h|`` per task (metric ``gradient``).

    ``L(x)`` is example ``x``'s mean cross-entropy over its scored positions. The model's
    parameter gradients are left untouched (``torch.autograd.grad`` on the gate only). The
    gradient is as precise as the model's dtype: float32 (half precision upcast), or float64
    for a float64 model.
    """
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    cfg = m.config
    tasks = _as_tasks(batches)
    units = _units(model, heads, None)
    shape = (len(units), len(tasks), 1)
    val, lo, hi = (torch.full(shape, float("nan"), dtype=torch.float64) for _ in range(3))
    gen = torch.Generator().manual_seed(seed)
    clean_vals: dict[str, dict[str, float]] = {}
    # The gate's gradient is kept in float64 for a float64 model, else float32.
    wide = any(p.dtype == torch.float64 for p in model.parameters())
    dtype = torch.float64 if wide else torch.float32
    for ti, (task, batch) in enumerate(tasks.items()):
        B = batch.tokens.shape[0]
        gate = torch.ones(B, cfg.n_layers, cfg.n_heads, device=batch.tokens.device,
                          dtype=dtype, requires_grad=True)
        hooks = [Hook(f"blocks.{l}.attn.hook_z", _gate_fn(gate, l)) for l in range(cfg.n_layers)]
        with m.hooks(hooks):
            logits = model(batch.tokens, **forward_kwargs(batch))
        num, count = example_stats(logits, batch.targets)["loss"]
        per_example = num / count.clamp_min(1)  # (B,)
        (grad,) = torch.autograd.grad(per_example.sum(), gate)  # (B, L, H): dL(x)/d xi
        imp = grad.abs().double().cpu()
        keep = count.cpu() > 0
        clean_vals[task] = {"loss": float(num.detach().sum() / count.sum().clamp_min(1))}
        for ui, unit in enumerate(units):
            (h,) = tuple(unit)
            x = imp[keep, h.layer, h.head]
            point, low, high = bootstrap_ci(torch.zeros_like(x), x, torch.ones_like(x), 1.0,
                                            n_boot, confidence, gen)
            val[ui, ti, 0], lo[ui, ti, 0], hi[ui, ti, 0] = point, low, high
    return ImportanceMatrix(units, list(tasks), ["gradient"], val, lo, hi, clean_vals, None,
                            {"method": "gradient (Michel et al. 2019)", "n_boot": n_boot,
                             "confidence": confidence})
