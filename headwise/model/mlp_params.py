"""MLP weights stacked over layers, in TransformerLens's shapes (``model.W_in`` ...).

TransformerLens writes an MLP as ``post = act(x @ W_in[l] + b_in[l])`` (gated:
``act(x @ W_gate[l]) * (x @ W_in[l] + b_in[l])``) and its output as ``post @ W_out[l] + b_out[l]``;
these are the transposed weights of ``up_proj`` / ``gate_proj`` / ``down_proj`` (adapters
included through their effective weight). Missing biases are zeros.

    W_in, W_gate   (L, D, F)    W_out   (L, F, D)    b_in (L, F)    b_out (L, D)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from headwise.errors import ConfigError
from headwise.model.attention import effective_weight


def _projs(blocks: Iterable[nn.Module], proj: str, what: str) -> list[nn.Module]:
    mlps = [getattr(block, "mlp", None) for block in blocks]
    if any(m is None for m in mlps):
        raise ConfigError(f"{what}: the model is attention-only; expected a model with MLPs")
    projs = [getattr(m, proj, None) for m in mlps]
    if any(p is None for p in projs):
        raise ConfigError(f"{what}: the MLPs have no {proj}; expected a gated (swiglu) MLP")
    return projs  # type: ignore[return-value]


def W_in(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, D, F): the MLP's input weights (the linear branch of a gated MLP)."""
    return torch.stack([effective_weight(p).T for p in _projs(blocks, "up_proj", "W_in")])


def W_gate(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, D, F): a gated MLP's gate weights (the branch through the activation)."""
    return torch.stack([effective_weight(p).T for p in _projs(blocks, "gate_proj", "W_gate")])


def W_out(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, F, D): the MLP's output weights."""
    return torch.stack([effective_weight(p).T for p in _projs(blocks, "down_proj", "W_out")])


def _bias(blocks: Iterable[nn.Module], proj: str, what: str) -> Tensor:
    out = []
    for p in _projs(blocks, proj, what):
        bias = getattr(p, "bias", None)
        weight = effective_weight(p)
        out.append(bias if bias is not None else weight.new_zeros(weight.shape[0]))
    return torch.stack(out)


def b_in(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, F): the MLP's input biases."""
    return _bias(blocks, "up_proj", "b_in")


def b_out(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, D): the MLP's output biases."""
    return _bias(blocks, "down_proj", "b_out")
