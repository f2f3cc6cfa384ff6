"""Training signals for role forecasts: the task loss and each head's gradient alignment.

Used by the forecast benchmark's feature study (``bench_forecast --ablation``), which found
they add nothing the score curves do not tell (docs/benchmarks.md); they do not ship in the
package.

At a checkpoint, one forward and backward pass of the training loss (task loss plus the run's
pattern objectives) on a held-out batch gives, besides the loss itself, the gradient of the loss
with respect to every head's attention pattern ``A`` (B, H, T, T). The direction training moves
a pattern in is ``D = -dL/dA`` projected onto the simplex (its mean over each row's allowed keys
removed, zero on keys the model's masks forbid). A head's **gradient alignment** with role ``r``
is the cosine, over the rows where ``r`` is defined, between ``D`` and ``W_r - A`` (``W_r``:
the role's target from ``headwise.patterns``):

    align_r = <D, W_r - A> / (|D| |W_r - A|)    in [-1, 1]

Positive: the loss pulls the head's pattern towards role ``r``; NaN where ``r`` is undefined
on the batch or the gradient vanishes.

A pattern can only move as the head's own query and key weights allow, so the same question is
also asked in parameter space: a head's **parameter alignment** with role ``r`` is the cosine
between the gradient of its role score ``s_r`` (the mass on ``r``'s target, as role scores
define it) and the descent direction of the loss, both over the head's own rows of the
``q_proj`` and ``k_proj`` weights (its group's rows of ``k_proj`` under grouped-query
attention; NaN when they are frozen): ``cos(grad s_r, -grad L)``, the first-order sign and share
of a small gradient step that goes to role ``r``. The score pass stops gradients at every
block's input (``hook_resid_pre``), so a head's score gradient is its own, not later layers'.

No training-time state is needed: both are computed from a model (a saved checkpoint, or the
live model at an evaluation point), at the cost of two forward passes and one backward pass
per role on the batch per checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis import TOP_ROLE_CANDIDATES, Trajectory
from headwise.hooks import Hook, HookContext
from headwise.model.eval_mode import eval_mode
from headwise.patterns import allowed_keys, role_target
from headwise.training import task_loss
from headwise.training.evaluate import forward


@dataclass(frozen=True)
class Signals:
    """Training signals at one checkpoint: ``loss`` (the training loss on a held-out batch) and
    ``alignment`` and ``param_alignment`` (N, len(TOP_ROLE_CANDIDATES)), each head's gradient
    alignment with each role in pattern and in parameter space (NaN where undefined), heads in
    the trajectory's order."""

    loss: float
    alignment: Tensor
    param_alignment: Tensor


def attach_signals(traj: Trajectory, signals: Mapping[int, Signals]) -> Trajectory:
    """``traj`` with ``loss`` (C,), ``alignment`` and ``param_alignment`` (C, N, R) stacked
    over its checkpoints from ``signals`` (``{step: Signals}``; every step must have them).

    Raises:
        ValueError: a checkpoint without signals, or alignments of another shape.
    """
    missing = [s for s in traj.steps if s not in signals]
    if missing:
        raise ValueError(f"signals: no signals at checkpoints {missing}")
    sig = [signals[s] for s in traj.steps]
    shape = (len(traj.heads), len(TOP_ROLE_CANDIDATES))
    for step, x in zip(traj.steps, sig, strict=True):
        if x.alignment.shape != shape or x.param_alignment.shape != shape:
            raise ValueError(f"signals: checkpoint {step} has alignments of shape "
                             f"{tuple(x.alignment.shape)}, {tuple(x.param_alignment.shape)}, "
                             f"expected {shape}")
    traj.loss = torch.tensor([x.loss for x in sig], dtype=torch.float64)  # type: ignore[attr-defined]
    traj.alignment = torch.stack([x.alignment.double() for x in sig])  # type: ignore[attr-defined]
    traj.param_alignment = torch.stack(  # type: ignore[attr-defined]
        [x.param_alignment.double() for x in sig])
    return traj


def signals_from_dict(d: dict[str, Any]) -> dict[int, Signals] | None:
    """The ``Signals`` of a trajectory summary that carries them (``None`` when it has none)."""
    keys = ("alignment", "param_alignment")
    if "loss" not in d or not all(k in h for h in d["heads"] for k in keys):
        return None

    def table(key: str, c: int) -> Tensor:
        return torch.tensor([[math.nan if h[key][r][c] is None else h[key][r][c]
                              for r in TOP_ROLE_CANDIDATES] for h in d["heads"]],
                            dtype=torch.float64)

    return {int(step): Signals(float(d["loss"][c]), table(keys[0], c), table(keys[1], c))
            for c, step in enumerate(d["steps"])}

MAX_EXAMPLES = 64  # examples of the batch used (the signal is a direction, not a statistic)


def _patterns(model: nn.Module, batch: Any, objectives: Sequence[Any]
              ) -> tuple[Tensor, list[Tensor]]:
    """The training loss on ``batch`` (with gradient) and every layer's pattern (B, H, T, T)."""
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    n_layers = m.config.n_layers
    store: dict[str, Tensor] = {}

    def keep(x: Tensor, ctx: HookContext) -> None:
        store[ctx.name] = x

    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
    device = next(model.parameters()).device
    with m.hooks(*[Hook(n, keep) for n in names]):
        logits, terms = forward(model, model, batch, objectives, False, device)
    n_tasks = int(batch.task_ids.max()) + 1 if batch.task_ids is not None else 1
    loss, _ = task_loss(logits, batch, n_tasks)
    total = loss + sum((t for t, _ in terms), torch.zeros((), device=loss.device))
    return total, [store[n] for n in names]


def _cosines(d: Tensor, a: Tensor, tokens: Tensor, mask: Tensor | None,
             causal: bool) -> Tensor:
    """(H, R) cosine between the descent direction ``d`` and ``W_r - a`` per role (see module).

    d, a: (B, H, T, T) float64.
    """
    out = torch.full((a.shape[1], len(TOP_ROLE_CANDIDATES)), math.nan, dtype=torch.float64)
    for j, role in enumerate(TOP_ROLE_CANDIDATES):
        tgt = role_target(role, tokens, mask, causal)
        rows = tgt.rows[:, None, :, None].to(a.dtype)  # (B, 1, T, 1)
        if not bool(tgt.rows.any()):
            continue
        e = (tgt.weights.to(a.dtype)[:, None] - a) * rows  # (B, H, T, T)
        dr = d * rows
        num = (dr * e).sum((0, 2, 3))  # (H,)
        den = (dr.pow(2).sum((0, 2, 3)) * e.pow(2).sum((0, 2, 3))).sqrt()
        out[:, j] = torch.where(den > 0, num / den.clamp_min(1e-300),
                                torch.full_like(num, math.nan))
    return out


def _qk_params(model: nn.Module) -> list[Tensor] | None:
    """Every layer's query and key weights, ``[q_0, k_0, q_1, k_1, ...]`` (a wrapped projection's
    ``base_layer``); ``None`` when some are frozen (no gradient to compare)."""
    out = []
    m: Any = model
    for block in m.blocks:
        for proj in (block.attn.q_proj, block.attn.k_proj):
            out.append(getattr(proj, "base_layer", proj).weight)
    return out if all(p.requires_grad for p in out) else None


def _head_rows(grads: Sequence[Tensor | None], n_heads: int, n_kv: int) -> Tensor:
    """(L, H, P) each head's own rows of the (q, k) gradients, flattened."""
    rows = []
    for i in range(0, len(grads), 2):
        gq, gk = grads[i], grads[i + 1]
        assert gq is not None and gk is not None
        dh = gq.shape[0] // n_heads
        q = gq.reshape(n_heads, dh, -1).flatten(1)  # (H, Dh * D)
        k = gk.reshape(n_kv, dh, -1).flatten(1).repeat_interleave(n_heads // n_kv, 0)
        rows.append(torch.cat([q, k], 1))
    return torch.stack(rows).double()


def _param_alignment(model: nn.Module, b: Any, loss: Tensor) -> Tensor:
    """(N, R) parameter alignment of every head with every role (see module)."""
    m: Any = model
    cfg = m.config
    out = torch.full((cfg.n_layers * cfg.n_heads, len(TOP_ROLE_CANDIDATES)), math.nan,
                     dtype=torch.float64)
    params = _qk_params(model)
    if params is None:
        return out
    n_kv = cfg.n_kv_heads or cfg.n_heads
    descent = -_head_rows(torch.autograd.grad(loss, params, retain_graph=True), cfg.n_heads,
                          n_kv)  # (L, H, P)
    store: dict[str, Tensor] = {}

    def keep(x: Tensor, ctx: HookContext) -> None:
        store[ctx.name] = x

    def cut(x: Tensor, ctx: HookContext) -> Tensor:
        return x.detach()

    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)]
    hooks = [Hook(n, keep) for n in names] + [
        Hook(f"blocks.{layer}.hook_resid_pre", cut) for layer in range(cfg.n_layers)]
    with m.hooks(*hooks):
        model(b.tokens, attention_mask=b.attention_mask, task_ids=b.task_ids)
    for j, role in enumerate(TOP_ROLE_CANDIDATES):
        tgt = role_target(role, b.tokens, b.attention_mask, bool(cfg.causal))
        if not bool(tgt.rows.any()):
            continue
        rows = tgt.rows.to(store[names[0]].dtype)  # (B, T)
        support = tgt.support[:, None].to(rows.dtype)  # (B, 1, T, T)
        total = torch.stack([((store[n] * support).sum(-1) * rows[:, None]).sum()
                             for n in names]).sum() / rows.sum()  # sum of every head's s_r
        g = _head_rows(torch.autograd.grad(total, params, retain_graph=True), cfg.n_heads,
                       n_kv)  # (L, H, P)
        den = g.norm(dim=-1) * descent.norm(dim=-1)
        cos = (g * descent).sum(-1) / den.clamp_min(1e-300)
        out[:, j] = torch.where(den > 0, cos, torch.full_like(cos, math.nan)).flatten().cpu()
    return out


def gradient_signals(model: nn.Module, batch: Any, objectives: Sequence[Any] = ()) -> Signals:
    """The loss and every head's gradient alignment with each top-role candidate.

    Args:
        model: a headwise Transformer (its mode is restored; it is scored in eval mode).
        batch: held-out examples with ``tokens``, ``targets``, ``attention_mask``, ``task_ids``
            (the first ``MAX_EXAMPLES`` are used).
        objectives: the run's pattern objectives (their terms join the loss, as in training).

    Returns:
        ``Signals(loss, alignment, param_alignment)``, alignments (N, R) for heads in
        layer-major order and roles in ``TOP_ROLE_CANDIDATES`` order.
    """
    b = type(batch)(*(None if v is None else v[:MAX_EXAMPLES]
                      for v in (batch.tokens, batch.targets, batch.attention_mask,
                                batch.task_ids)))
    with eval_mode(model), torch.enable_grad():
        loss, pats = _patterns(model, b, objectives)
        grads = torch.autograd.grad(loss, pats, allow_unused=True, retain_graph=True)
        param = _param_alignment(model, b, loss)
    m: Any = model
    causal = bool(m.config.causal)
    tokens = b.tokens.cpu()
    mask = None if b.attention_mask is None else b.attention_mask.cpu()
    allowed = allowed_keys(tokens, mask, causal)[:, None]  # (B, 1, T, T)
    n_keys = allowed.sum(-1, keepdim=True).clamp_min(1)
    rows = []
    for a, g in zip(pats, grads, strict=True):
        a = a.detach().double().cpu()
        g = torch.zeros_like(a) if g is None else g.double().cpu()
        d = torch.where(allowed, -g, torch.zeros_like(g))
        d = torch.where(allowed, d - d.sum(-1, keepdim=True) / n_keys, torch.zeros_like(d))
        rows.append(_cosines(d, a, tokens, mask, causal))
    return Signals(float(loss.detach()), torch.cat(rows), param)
