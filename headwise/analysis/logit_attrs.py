"""Direct logit attribution: residual components scaled by the final norm, as TransformerLens.

A pre-norm model's logits are ``n(x) @ W_U`` with ``x`` the last block's ``hook_resid_post``
and ``n`` the final norm. With ``s`` the norm's scale at each position (LayerNorm:
``sqrt(var(x) + eps)``; RMSNorm: ``sqrt(mean(x^2) + eps)``) and ``c`` the centring (LayerNorm:
``c(y) = y - mean(y)``; RMSNorm: none), the normalised stream is linear in ``x`` once ``s`` is
fixed, so a decomposition ``x = sum_i x_i`` splits the logit of token ``t`` as::

    logit_t = sum_i  c(x_i) / s  .  (gamma * W_U[:, t])   +  beta . W_U[:, t]  (+ b_U[t])

``apply_ln_to_stack`` computes ``c(x_i) / s`` with the scale of the *whole* stream (as
TransformerLens's does with its cached ``hook_scale``; here ``s`` is recomputed from the norm's
cached input, the same number). ``logit_attrs`` dots that with ``gamma * W_U[:, t]``: the
unembedding with the final norm's gain folded in, as TransformerLens's ``W_U`` is on a model
loaded with ``fold_ln=True`` (its default), so the attributions are the numbers it reports.
The bias terms are left out, as there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.errors import ConfigError
from headwise.model.cache import ActivationCache
from headwise.model.norm import LayerNorm, RMSNorm

PosSlice = int | slice | Sequence[int] | Tensor | None


def pos_index(value: Tensor, pos_slice: PosSlice, dim: int = -2) -> Tensor:
    """``value`` at the positions ``pos_slice`` picks along ``dim`` (an int removes the axis)."""
    if pos_slice is None:
        return value
    if isinstance(pos_slice, int):
        return value.select(dim, pos_slice)
    if isinstance(pos_slice, slice):
        return value[(slice(None),) * (dim % value.dim()) + (pos_slice,)]
    idx = torch.as_tensor(pos_slice, device=value.device)
    return value.index_select(dim, idx)


def need(cache: ActivationCache, name: str, what: str) -> Tensor:
    """``cache[name]``, or a one-line KeyError saying which function needs it."""
    if name not in cache:
        raise KeyError(f"{what} needs {name!r} in the cache (run_with_cache(tokens, "
                       f"names=[..., {name!r}]))")
    return cache[name]


def require_pre_norm(model: nn.Module, what: str) -> None:
    """Refuse post-norm models: their stream is renormalised in every block, not a sum.

    Raises:
        ConfigError: ``model.config.norm`` is not ``"pre"``.
    """
    norm = getattr(getattr(model, "config", None), "norm", None)
    if norm != "pre":
        raise ConfigError(f"{what}: model.config.norm: got {norm!r}, expected 'pre' (a "
                          "post-norm model renormalises its residual stream inside every block, "
                          "so the stream is not a sum of component outputs)")


def _norm_of(model: nn.Module, layer: int | None, mlp_input: bool) -> tuple[nn.Module, str]:
    """The norm reading the stream at ``layer`` (``None``: the final one) and its input's name."""
    m: Any = model
    L = len(m.blocks)
    if layer is None or layer in (-1, L):
        return m.ln_final, f"blocks.{L - 1}.hook_resid_post"
    if not 0 <= layer < L:
        raise ValueError(f"layer: got {layer}, expected 0-{L} or -1/None (the final norm)")
    block = m.blocks[layer]
    if mlp_input:
        if block.ln2 is None:
            raise ValueError(f"mlp_input: layer {layer} has no MLP (attention-only model)")
        return block.ln2, f"blocks.{layer}.hook_resid_mid"
    return block.ln1, f"blocks.{layer}.hook_resid_pre"


def norm_scale(norm: nn.Module, x: Tensor) -> Tensor:
    """(..., 1): the scale ``s`` that ``norm`` divides ``x`` (..., D) by."""
    if isinstance(norm, LayerNorm):
        return (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    if isinstance(norm, RMSNorm):
        return (x.float().pow(2).mean(-1, keepdim=True) + norm.eps).sqrt().to(x.dtype)
    raise TypeError(f"norm: got {type(norm).__name__}, expected LayerNorm or RMSNorm")


def apply_ln_to_stack(model: nn.Module, cache: ActivationCache, residual_stack: Tensor,
                      layer: int | None = None, mlp_input: bool = False,
                      pos_slice: PosSlice = None, recompute_ln: bool = False) -> Tensor:
    """Scale each component of a residual stack as the norm at ``layer`` scales the stream.

    Args:
        residual_stack: (n, B, T, D) components (``pos_slice`` already applied to them).
        layer: whose norm: ``l`` for layer l's ``ln1`` (``ln2`` with ``mlp_input``), or
            ``None`` / ``-1`` / ``n_layers`` for the final norm.
        pos_slice: the positions the stack holds, so the scale is taken at the same ones.
        recompute_ln: final norm only: normalise each component by its own statistics and apply
            the norm's gain and bias (``model.ln_final`` itself: the logit lens, where
            ``stack @ model.W_U`` are the logits each component alone would give).

    Returns:
        (n, B, T, D) ``c(x_i) / s`` with ``s`` the scale of the whole stream at that norm
        (needs its input, e.g. the last block's ``hook_resid_post``, in the cache).

    Raises:
        ConfigError: a post-norm model.
    """
    require_pre_norm(model, "apply_ln_to_stack")
    norm, name = _norm_of(model, layer, mlp_input)
    if recompute_ln:
        if norm is not getattr(model, "ln_final", None):
            raise ValueError("recompute_ln: only for the final norm (layer None, -1 or n_layers)")
        return norm(residual_stack)
    scale = pos_index(norm_scale(norm, need(cache, name, "apply_ln_to_stack")), pos_slice)
    if isinstance(norm, LayerNorm):
        residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
    return residual_stack / scale


def tokens_to_residual_directions(model: nn.Module, tokens: int | Tensor,
                                  center: bool = False) -> Tensor:
    """(..., D): ``gamma * W_U[:, t]`` for each token, the final norm's gain folded in.

    Not centred by default: the unembedding as trained. TransformerLens's model as loaded by
    default (``fold_ln``, ``center_writing_weights``, ``center_unembed``) centres it twice:
    on a LayerNorm model each direction minus its mean over the D dimensions (LayerNorm's
    output has mean 0, so nothing it reads changes), and on every model the mean direction
    over the vocabulary subtracted (every logit of a position moves by the same amount, so
    probabilities and logit differences do not change). ``center=True`` gives those numbers.

    Raises:
        ConfigError: a post-norm model.
    """
    require_pre_norm(model, "tokens_to_residual_directions")
    m: Any = model
    W_U = m.unembed.weight * m.ln_final.weight  # (V, D): the gain folded in
    if center:
        if isinstance(m.ln_final, LayerNorm):
            W_U = W_U - W_U.mean(1, keepdim=True)  # over D: fold_ln's centring
        W_U = W_U - W_U.mean(0, keepdim=True)  # over the vocabulary: center_unembed
    return W_U[torch.as_tensor(tokens, device=W_U.device)]


def logit_attrs(model: nn.Module, cache: ActivationCache, residual_stack: Tensor,
                tokens: int | Tensor, incorrect_tokens: int | Tensor | None = None,
                pos_slice: PosSlice = None) -> Tensor:
    """Each component's direct contribution to the logit of ``tokens`` (TransformerLens's
    ``cache.logit_attrs``).

    Args:
        residual_stack: (n, B, T, D) components of the final residual stream, e.g.
            ``decompose_resid`` or ``stack_head_results`` (``pos_slice`` applied, unscaled).
        tokens: one token id, (B,) ids (one per example, for every position) or (B, T) ids.
        incorrect_tokens: same shape as ``tokens``; attributes the logit difference.
        pos_slice: the positions the stack holds.

    Returns:
        (n, B, T): ``c(x_i) / s . (gamma * W_U[:, t])`` (module docstring).

    Raises:
        ConfigError: a post-norm model.
        ValueError: ``tokens`` and ``incorrect_tokens`` differ in shape.
    """
    directions = tokens_to_residual_directions(model, tokens)
    if incorrect_tokens is not None:
        if torch.as_tensor(tokens).shape != torch.as_tensor(incorrect_tokens).shape:
            raise ValueError(f"incorrect_tokens: got shape "
                             f"{tuple(torch.as_tensor(incorrect_tokens).shape)}, expected "
                             f"tokens' shape {tuple(torch.as_tensor(tokens).shape)}")
        directions = directions - tokens_to_residual_directions(model, incorrect_tokens)
    scaled = apply_ln_to_stack(model, cache, residual_stack, None, pos_slice=pos_slice)
    if directions.dim() == 2 and scaled.dim() == 4 and directions.shape[0] == scaled.shape[1]:
        directions = directions[:, None]  # (B, D): one per example, every position
    return (scaled * directions).sum(-1)
