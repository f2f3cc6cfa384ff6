"""Per-head weights stacked over layers, in TransformerLens's shapes (``model.W_Q`` ...).

TransformerLens writes a head as ``q = x @ W_Q[l, h] + b_Q[l, h]`` and its output as
``z_h @ W_O[l, h]``; headwise stores ``nn.Linear`` weights (out, in), so these are transposed
slices of ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (``headwise.model.attention.head_weights``,
the one definition of a head's slices; LoRA adapters included through their effective weight):

    W_Q, W_K, W_V   (L, H, D, Dh)    W_O   (L, H, Dh, D)
    b_Q, b_K, b_V   (L, H, Dh)       b_O   (L, D)
    OV = W_V @ W_O, QK = W_Q @ W_K^T   (L, H, D, D) as ``FactoredMatrix``

Under grouped-query attention k/v are expanded to the query heads, as TransformerLens's
``W_K`` is: entry ``h`` holds kv head ``h // (H / H_kv)``. Missing biases are zeros. RoPE is not
part of ``QK`` (it depends on the positions), as in TransformerLens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from headwise.model.attention import Attention, HeadWeights, effective_weight, head_weights
from headwise.model.factored import FactoredMatrix


def _attns(blocks: Iterable[nn.Module]) -> list[Attention]:
    return [block.attn for block in blocks]  # type: ignore[misc]


def _stack(blocks: Iterable[nn.Module], part: Callable[[HeadWeights], Tensor]) -> Tensor:
    return torch.stack([torch.stack([part(head_weights(a, h)) for h in range(a.n_heads)])
                        for a in _attns(blocks)])


def W_Q(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, D, Dh): ``q_h = x @ W_Q[l, h] + b_Q[l, h]``."""
    return _stack(blocks, lambda w: w.q.T)


def W_K(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, D, Dh), kv heads expanded to the query heads that read them."""
    return _stack(blocks, lambda w: w.k.T)


def W_V(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, D, Dh), kv heads expanded to the query heads that read them."""
    return _stack(blocks, lambda w: w.v.T)


def W_O(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, Dh, D): head h's contribution to the residual is ``z_h @ W_O[l, h]``."""
    return _stack(blocks, lambda w: w.o.T)


def _bias(blocks: Iterable[nn.Module], proj: str) -> Tensor:
    rows = []
    for a in _attns(blocks):
        linear = getattr(a, proj)
        bias = getattr(linear, "bias", None)
        n = a.n_heads if proj == "q_proj" else a.n_kv_heads
        b = bias if bias is not None else torch.zeros(
            n * a.d_head, dtype=linear.weight.dtype, device=linear.weight.device)
        rows.append(b.view(n, a.d_head).repeat_interleave(a.n_heads // n, dim=0))
    return torch.stack(rows)


def b_Q(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, Dh) query biases (zeros without biases)."""
    return _bias(blocks, "q_proj")


def b_K(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, Dh) key biases, expanded to query heads under GQA."""
    return _bias(blocks, "k_proj")


def b_V(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, H, Dh) value biases, expanded to query heads under GQA."""
    return _bias(blocks, "v_proj")


def b_O(blocks: Iterable[nn.Module]) -> Tensor:
    """(L, D) output-projection biases (zeros without biases)."""
    out = []
    for a in _attns(blocks):
        bias = getattr(a.o_proj, "bias", None)
        w = effective_weight(a.o_proj)  # (D, H*Dh)
        out.append(bias if bias is not None else torch.zeros(
            w.shape[0], dtype=w.dtype, device=w.device))
    return torch.stack(out)


def OV(blocks: Iterable[nn.Module]) -> FactoredMatrix:
    """(L, H, D, D) OV circuits ``W_V[l, h] @ W_O[l, h]``, factored."""
    return FactoredMatrix(W_V(blocks), W_O(blocks))


def QK(blocks: Iterable[nn.Module]) -> FactoredMatrix:
    """(L, H, D, D) QK circuits ``W_Q[l, h] @ W_K[l, h]^T``, factored: the attention score
    of a query residual ``x_q`` on a key residual ``x_k`` is ``x_q @ QK @ x_k^T / sqrt(Dh)``
    (biases and RoPE left out)."""
    return FactoredMatrix(W_Q(blocks), W_K(blocks).transpose(-1, -2))
