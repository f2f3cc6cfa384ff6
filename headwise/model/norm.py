"""Normalisation layers (LayerNorm, RMSNorm) with a ``hook_normalized`` point before the affine."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.model.hook_point import HookPoint


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (Ba et al. 2016).

    Args:
        d: normalised dimension D.
        eps: added to the variance.
        bias: whether to learn an additive bias.
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:  # (..., D) -> (..., D)
        if not self.hook_normalized.active:  # fused kernel; same maths
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        x = x - x.mean(-1, keepdim=True)
        x = self.hook_normalized(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        x = x * self.weight
        return x + self.bias if self.bias is not None else x


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich 2019), computed in float32.

    Args:
        d: normalised dimension D.
        eps: added to the mean square.
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:  # (..., D) -> (..., D)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * self.hook_normalized(x32.to(dtype))
