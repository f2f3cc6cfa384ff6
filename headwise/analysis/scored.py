"""Logits at the scored positions only: the final hidden state, then the output head where a
metric reads.

A task metric reads the logits where ``targets != -100`` (a masked-LM batch: about 15% of the
positions); the output head (the unembedding, or BERT's masked-LM head then the unembedding)
over a 30k-50k-word vocabulary at every other position is work thrown away. ``scored_logits``
runs ``model.hidden`` and applies the head to the scored rows only; ``scored_stats`` gives the
per-example statistics of ``headwise.analysis.importance.example_stats`` from them, equal to
the full computation at those positions (``tests/analysis/test_scored.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE = -100


def output_head(model: nn.Module, hidden: Tensor) -> Tensor:
    """The model's logits from final hidden states (..., D) -> (..., V): its masked-LM head
    when it has one, else its unembedding (as ``Transformer.forward``, without ``hook_logits``).
    """
    m: Any = model
    head = getattr(m, "mlm_head", None)
    return m.unembed(hidden) if head is None else head(hidden, m.unembed)


def scored_positions(targets: Tensor) -> tuple[Tensor, Tensor]:
    """Row and column indices (N,) of the scored positions (``targets != -100``) of (B, T)."""
    rows, cols = (targets != IGNORE).nonzero(as_tuple=True)
    return rows, cols


def head_at(model: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    """Logits (N, V) at the scored positions of ``hidden`` (B, T, D), in row-major order."""
    rows, cols = scored_positions(targets)
    return output_head(model, hidden[rows, cols])  # (N, V)


def scored_logits(model: nn.Module, batch: Any) -> Tensor:
    """Logits (N, V) of ``model`` on ``batch`` at its scored positions (row-major order).

    ``batch`` has ``tokens``, ``targets`` and optionally ``attention_mask`` and ``task_ids``.
    Equal to ``model(batch.tokens, ...)[targets != -100]`` up to float rounding.
    """
    m: Any = model
    hidden = m.hidden(batch.tokens, **forward_kwargs(batch))  # (B, T, D)
    return head_at(model, hidden, batch.targets)


def forward_kwargs(batch: Any) -> dict[str, Any]:
    """The forward's keyword inputs a batch carries (``attention_mask``, ``task_ids``)."""
    kw: dict[str, Any] = {}
    if getattr(batch, "attention_mask", None) is not None:
        kw["attention_mask"] = batch.attention_mask
    if getattr(batch, "task_ids", None) is not None:
        kw["task_ids"] = batch.task_ids
    return kw


def stats_at(logits: Tensor, targets: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-example metric statistics from the scored rows' logits.

    Args:
        logits: (N, V) at the scored positions of ``targets`` in row-major order (``head_at``);
            or (S, N, V): S ablated copies of the same batch.  targets: (B, T), -100 unscored.

    Returns:
        As ``example_stats``: ``{"loss": (sum CE, count), "accuracy": (hits, count),
        "exact": (every scored token right, 1 per example with a scored token)}``, each (B,)
        (or (S, B)); the per-example sums run over the same (B, T) layout as the full
        computation, with zeros where nothing is scored.
    """
    rows, cols = scored_positions(targets)
    wanted = targets[rows, cols]  # (N,)
    lead = logits.shape[:-2]
    flat = logits.reshape(-1, logits.shape[-1])  # (S*N, V)
    wide = flat if flat.dtype == torch.float64 else flat.float()
    ce_n = F.cross_entropy(wide, wanted.repeat(flat.shape[0] // max(1, wanted.numel())),
                           reduction="none").reshape(*lead, -1)  # (..., N)
    hit_n = (flat.argmax(-1).reshape(*lead, -1) == wanted)  # (..., N)
    B, T = targets.shape
    ce = ce_n.new_zeros(*lead, B, T)
    ce[..., rows, cols] = ce_n
    hits = torch.zeros(*lead, B, T, dtype=torch.bool, device=targets.device)
    hits[..., rows, cols] = hit_n
    count = (targets != IGNORE).sum(1).double().expand(*lead, B)
    hit = hits.sum(-1).double()
    scored = (count > 0).double()
    return {"loss": (ce.sum(-1).double(), count), "accuracy": (hit, count),
            "exact": ((hit == count).double() * scored, scored)}


def scored_stats(model: nn.Module, batch: Any) -> dict[str, tuple[Tensor, Tensor]]:
    """``example_stats`` of ``model`` on ``batch``, the head applied at scored positions only."""
    return stats_at(scored_logits(model, batch), batch.targets)
