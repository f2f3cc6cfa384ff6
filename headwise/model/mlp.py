"""Position-wise feed-forward networks: ``down(act(up(x)))`` and the gated SwiGLU variant."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from headwise.model.hook_point import HookPoint

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form (BERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's gelu_new
    "silu": F.silu,
}


class MLP(nn.Module):
    """``down_proj(act(up_proj(x)))`` with ``hook_pre`` (before act) and ``hook_post`` (after).

    Args:
        up_proj: Linear D -> F.
        down_proj: Linear F -> D.
        activation: a key of ``ACTIVATIONS``.
        dropout: applied to the output.
    """

    def __init__(self, up_proj: nn.Linear, down_proj: nn.Linear, activation: str,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        pre = self.hook_pre(self.up_proj(x))  # (B, T, F)
        post = self.hook_post(self.act(pre))  # (B, T, F)
        return self.dropout(self.down_proj(post))


class GatedMLP(nn.Module):
    """SwiGLU (Shazeer 2020): ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    Hook points: ``hook_pre`` (gate pre-activation), ``hook_pre_linear`` (up branch),
    ``hook_post`` (their product), as in TransformerLens.
    """

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.dropout = nn.Dropout(dropout)
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        gate = self.hook_pre(self.gate_proj(x))  # (B, T, F)
        up = self.hook_pre_linear(self.up_proj(x))  # (B, T, F)
        post = self.hook_post(F.silu(gate) * up)
        return self.dropout(self.down_proj(post))
