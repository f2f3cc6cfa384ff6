"""Activation patching: copy one head's activation from a clean run into a corrupted run.

For each head ``h``: run the corrupted input with ``h``'s value at ``point`` (default ``z``,
the head's output before ``o_proj``) replaced by its value on the clean input, and measure
``metric(logits)``. ``recovered = (patched - corrupted) / (clean - corrupted)``: 1 means the
head alone restores the clean behaviour, 0 that it carries none of the difference (Meng et al.
2022; Wang et al. 2022).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headwise.heads import Head, select_heads
from headwise.hooks.interventions import patch
from headwise.model.eval_mode import in_eval_mode

Metric = Callable[[Tensor], "float | Tensor"]


@dataclass
class PatchingResult:
    """Clean and corrupted metric values and, per head, the patched value and recovered share."""

    clean: float
    corrupted: float
    point: str
    patched: dict[Head, float] = field(default_factory=dict)

    def recovered(self, head: Head) -> float:
        """``(patched - corrupted) / (clean - corrupted)``; NaN when clean == corrupted."""
        gap = self.clean - self.corrupted
        return (self.patched[head] - self.corrupted) / gap if gap != 0 else math.nan

    def to_records(self) -> list[dict[str, Any]]:
        """``[{"layer", "head", "patched", "recovered", "clean", "corrupted", "point"}]``."""
        out = []
        for h, v in self.patched.items():
            r = self.recovered(h)
            out.append({"layer": h.layer, "head": h.head, "patched": v,
                        "recovered": None if math.isnan(r) else r, "clean": self.clean,
                        "corrupted": self.corrupted, "point": self.point})
        return out


@in_eval_mode
@torch.no_grad()
def activation_patching(model: nn.Module, clean: Tensor, corrupted: Tensor, metric: Metric,
                        heads: Any = None, point: str = "z",
                        **forward_kwargs: Any) -> PatchingResult:
    """Patch each head's clean activation into the corrupted run, one head at a time.

    Args:
        model: a headwise Transformer.
        clean, corrupted: (B, T) long token batches of the same shape.
        metric: ``logits (B, T, V) -> scalar`` (e.g. the logit difference of two answers).
        heads: selector of heads to patch (default all).
        point: attention hook leaf to patch (``z``, ``q``, ``k``, ``v``, ``pattern``, ``result``).
        forward_kwargs: extra inputs used by both runs (``attention_mask``, ``task_ids``).

    Raises:
        ValueError: ``clean`` and ``corrupted`` differ in shape.
    """
    if clean.shape != corrupted.shape:
        raise ValueError(f"corrupted: got shape {tuple(corrupted.shape)}, expected the clean "
                         f"shape {tuple(clean.shape)}")
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's methods from mypy
    hs = select_heads(model, heads)
    names = [f"blocks.{layer}.attn.hook_{point}" for layer in hs.layers]
    logits, cache = m.run_with_cache(clean, names=names, heads=hs, **forward_kwargs)
    result = PatchingResult(float(metric(logits)), float(metric(model(corrupted,
                                                                      **forward_kwargs))),
                            point)
    for head in hs:
        with m.hooks(patch(model, cache, head, point)):
            result.patched[head] = float(metric(model(corrupted, **forward_kwargs)))
    return result
