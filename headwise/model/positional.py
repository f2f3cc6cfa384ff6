"""Position information: learned and sinusoidal absolute embeddings, and rotary embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LearnedPositional(nn.Module):
    """A learned vector per position (GPT-2, BERT). ``forward(T) -> (T, D)``."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_seq_len, d_model))

    def forward(self, seq_len: int) -> Tensor:  # -> (T, D)
        return _first_rows(self.weight, seq_len)


class SinusoidalPositional(nn.Module):
    """Fixed sin/cos embeddings of Vaswani et al. 2017: ``PE[t, 2i] = sin(t / 10000^(2i/D))``,
    ``PE[t, 2i+1] = cos(...)``. ``forward(T) -> (T, D)``."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        pos = torch.arange(max_seq_len, dtype=torch.float64)[:, None]
        freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
        )
        table = torch.zeros(max_seq_len, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
        self.register_buffer("table", table.float(), persistent=False)
        self.table: Tensor

    def forward(self, seq_len: int) -> Tensor:  # -> (T, D)
        return _first_rows(self.table, seq_len)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021) in the "rotate half" layout HF Llama uses:
    dimension ``i`` pairs with ``i + Dh/2``.

    ``forward(x)`` takes ``(B, T, H, Dh)`` and rotates position ``t`` by ``t * base^(-2i/Dh)``.
    """

    def __init__(self, d_head: int, max_seq_len: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))
        angles = torch.arange(max_seq_len).float()[:, None] * inv_freq[None, :]  # (T, Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, Dh)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.cos: Tensor
        self.sin: Tensor

    def forward(self, x: Tensor) -> Tensor:  # (B, T, H, Dh) -> (B, T, H, Dh)
        T = x.shape[1]
        cos = _first_rows(self.cos, T)[:, None, :].to(x.dtype)  # (T, 1, Dh)
        sin = self.sin[:T, None, :].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def _first_rows(table: Tensor, seq_len: int) -> Tensor:
    """The embeddings of positions ``0..seq_len-1``: rows of a (max_seq_len, D) table.

    Raises:
        ValueError: ``seq_len`` beyond the table.
    """
    if seq_len > table.shape[0]:
        raise ValueError(f"tokens: sequence length {seq_len} exceeds max_seq_len={table.shape[0]}")
    return table[:seq_len]
