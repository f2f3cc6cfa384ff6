"""The mask plan of one forward: which keys each query may attend, decided once per forward.

``Transformer.hidden`` builds the model's plan (causal and key-padding masks, shared by every
layer) once per forward; each attention layer narrows it by its per-head mask, if it has one,
and hands that plan to whichever path computes its heads (fused, explicit, or both), so no
path rebuilds a mask and nothing is remembered between forwards.

A plan without ``allowed`` means the causal mask alone (or no mask in a bidirectional layer),
which the kernels apply themselves (SDPA's ``is_causal``; the explicit path's additive bias).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class MaskPlan(NamedTuple):
    """The keys each query may attend in one forward.

    Attributes:
        allowed: (B|1, H|1, T, T) bool, True = may attend (causal, key padding and per-head
            masks combined), or ``None``: the causal mask alone, or no mask.
        row_ok: (B|1, H|1, T, 1) bool, the query rows with at least one allowed key
            (``None`` with ``allowed``). A row without one gets a zero pattern and a zero
            output, never NaN.
    """

    allowed: Tensor | None = None
    row_ok: Tensor | None = None

    def at_heads(self, idx: Tensor) -> MaskPlan:
        """The plan of the heads ``idx`` (along the head axis); a plan shared by every head
        (head axis 1) or without a mask is the same for any heads."""
        if self.allowed is None or self.row_ok is None or self.allowed.shape[1] == 1:
            return self
        return MaskPlan(self.allowed.index_select(1, idx), self.row_ok.index_select(1, idx))


def mask_plan(T: int, causal: bool, key_padding: Tensor | None = None,
              head_mask: Tensor | None = None, base: MaskPlan | None = None,
              device: torch.device | str = "cpu") -> MaskPlan:
    """The plan of ``T`` positions: causal (when ``causal``), key padding and a per-head mask.

    Args:
        T: sequence length.
        causal: whether keys after the query are masked.
        key_padding: (B, T) bool, True at real tokens, or ``None``.
        head_mask: (H, T, T) or (B, H, T, T) bool, True = may attend, or ``None``.
        base: a plan these masks narrow (a layer's per-head mask narrows the model's plan);
            ``key_padding`` is then already in it.
        device: where a mask built from nothing (causal and a head mask only) is made.

    Returns:
        ``MaskPlan()`` when only the causal mask (or none) applies; else the combined plan.
    """
    allowed = base.allowed if base is not None else None
    if key_padding is None and head_mask is None:
        return base if base is not None else MaskPlan()
    if allowed is None:
        allowed = torch.ones(1, 1, T, T, dtype=torch.bool, device=device)  # (1, 1, T, T)
        if causal:
            allowed = allowed.tril()
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :].bool()  # (B, 1, T, T)
    if head_mask is not None:
        allowed = allowed & (head_mask[None] if head_mask.dim() == 3 else head_mask)
    return MaskPlan(allowed, allowed.any(-1, keepdim=True))  # (B|1, H|1, T, T), (.., T, 1)
