"""A head's OV circuit: which token it writes when it attends to a token (copying scores).

The direct-path OV circuit of head ``h`` in layer ``l`` (Elhage et al. 2021) maps a token ``t``
to logits::

    M[t] = W_U' W_O^h W_V^h n(E[t])          M: (V, V)

with ``E`` the token embedding, ``n`` the normalisation the block applies before attention
(``ln1`` in pre-norm blocks; the embedding norm, if any, in post-norm models), ``W_V^h`` the
head's value rows (its kv group's under GQA), ``W_O^h`` its output columns, and ``W_U'`` the
unembedding with the final norm's gain folded in. Biases, positional embeddings, the final norm's
centring/scaling and every other path are ignored (the standard direct-path approximation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from headwise.heads import Head
from headwise.model.attention import head_weights
from headwise.model.block import PreNormBlock


def _parts(model: nn.Module, head: Head) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(n(E) (V,D), W_V^h (Dh,D), W_O^h (D,Dh), W_U' (V,D)) for ``head``."""
    m: Any = model  # nn.Module.__getattr__ hides the Transformer's attributes from mypy
    w = head_weights(m.blocks[head.layer].attn, head.head)
    return _embedding_in(model, head.layer)[1], w.v, w.o, _unembedding(model)


def _embedding_in(model: nn.Module, layer: int) -> tuple[str, Tensor]:
    """``n(E)`` (V, D) as ``layer``'s attention reads it, and the name of ``n`` (layers that
    read the embedding through the same normalisation share it)."""
    m: Any = model
    name, norm = _embedding_norm(model, layer)
    return name, m.embed.weight if norm is None else norm(m.embed.weight)


def _embedding_norm(model: nn.Module, layer: int) -> tuple[str, nn.Module | None]:
    """The normalisation ``n`` between the embedding and ``layer``'s attention, and its name."""
    m: Any = model
    block = m.blocks[layer]
    if isinstance(block, PreNormBlock):
        return f"blocks.{layer}.ln1", block.ln1
    if getattr(model, "embed_norm", None) is not None:
        return "embed_norm", m.embed_norm
    return "embed", None


def _unembedding(model: nn.Module) -> Tensor:
    """``W_U'`` (V, D): the unembedding with the final norm's gain folded in."""
    m: Any = model
    wu = m.unembed.weight
    gain = getattr(getattr(model, "ln_final", None), "weight", None)
    return wu * gain[None, :] if gain is not None else wu


@torch.no_grad()
def ov_logits(model: nn.Module, head: Head, tokens: Tensor | None = None) -> Tensor:
    """Rows of the OV circuit ``M`` for ``tokens`` (default: all V tokens): (n, V)."""
    E, wv, wo, wu = _parts(model, head)
    if tokens is not None:
        E = E[tokens]
    return ((E @ wv.T) @ wo.T) @ wu.T  # (n, Dh) -> (n, D) -> (n, V)


@torch.no_grad()
def ov_top1(model: nn.Module, head: Head, tokens: Tensor | None = None,
            chunk: int = 1024) -> Tensor:
    """(V,) bool: whether ``M[t]`` ranks ``t`` itself first (the head copies ``t``).

    Args:
        tokens: token ids to test (default all V); entries for other ids are False.
        chunk: rows per matrix product, so a 50k vocabulary never builds the full V x V matrix.

    Each tested token costs one row of V logits (``2 * D * V`` flops).
    """
    m: Any = model
    V = m.embed.weight.shape[0]
    ids_all = torch.arange(V) if tokens is None else torch.unique(tokens.flatten().cpu())
    out = torch.zeros(V, dtype=torch.bool)
    device = m.embed.weight.device
    for start in range(0, len(ids_all), chunk):
        ids = ids_all[start:start + chunk]
        rows = ov_logits(model, head, ids.to(device))  # (n, V)
        out[ids] = rows.argmax(-1).cpu() == ids
    return out


@torch.no_grad()
def copying_eigen_ratio(model: nn.Module, head: Head) -> float:
    """Elhage et al. 2021's copying statistic ``sum(lambda_i) / sum(|lambda_i|)`` of ``M``.

    +1 when every eigenvalue is positive (the head copies), -1 when all are negative. The
    non-zero eigenvalues of ``M = (n(E) W_V^T)(W_O^T W_U'^T)`` equal those of the small
    (Dh, Dh) product ``W_O^T (W_U'^T n(E)) W_V^T``, which is what we decompose.
    """
    return copying_eigen_ratios(model, [head])[head]


@torch.no_grad()
def copying_eigen_ratios(model: nn.Module, heads: Iterable[Head]) -> dict[Head, float]:
    """``copying_eigen_ratio`` of each of ``heads``.

    The product over the vocabulary, ``G = W_U'^T n(E)`` (D, D), is formed once per
    normalisation ``n`` (once for a post-norm model, once per layer for a pre-norm one); each
    head then costs ``W_O^T G W_V^T``, two products of (D, D) size, instead of two products over
    the vocabulary.
    """
    m: Any = model
    wu = _unembedding(model)
    grams: dict[str, Tensor] = {}
    out = {}
    for head in heads:
        name = _embedding_norm(model, head.layer)[0]
        if name not in grams:
            grams[name] = wu.T @ _embedding_in(model, head.layer)[1]  # (D, V) @ (V, D)
        w = head_weights(m.blocks[head.layer].attn, head.head)
        small = (w.o.T @ grams[name]) @ w.v.T  # (Dh, D) @ (D, D) @ (D, Dh) -> (Dh, Dh)
        lam = torch.linalg.eigvals(small.double())
        total = lam.abs().sum()
        out[head] = float(lam.sum().real / total) if total > 0 else 0.0
    return out
