"""The residual stream as a stack of parts: per-head results, component outputs, states by layer.

TransformerLens's ``ActivationCache`` methods, as functions of ``(model, cache)``; names,
arguments and labels follow it, except head labels, written as headwise's ``L0.H1``. In a
pre-norm model (eval mode, no embedding norm) the stream is a sum::

    hook_resid_pre[l] = hook_embed + hook_pos_embed + sum_{j<l} (attn_out[j] + mlp_out[j])
    attn_out[l] = sum_h z[l, h] @ W_O[l, h] + b_O[l]

``stack_head_results`` gives the terms ``z[l, h] @ W_O[l, h]``, ``decompose_resid`` the
terms of the first line, ``accumulated_resid`` the partial sums (the stream entering each
layer). Scaling by a norm (``apply_ln``) is ``headwise.analysis.logit_attrs.apply_ln_to_stack``.
A post-norm model renormalises its stream inside every block, so only ``stack_head_results``
(without ``incl_remainder``/``apply_ln``) and ``accumulated_resid`` (without ``apply_ln``)
apply there.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from headwise.analysis.logit_attrs import (
    PosSlice,
    apply_ln_to_stack,
    need,
    pos_index,
    require_pre_norm,
)
from headwise.errors import ConfigError
from headwise.model.cache import ActivationCache
from headwise.model.head_params import W_O
from headwise.model.transformer import Transformer


def _n_layers(model: Transformer, layer: int | None) -> int:
    """``layer`` as a count of whole layers (``None`` / ``-1``: all of them)."""
    L = len(model.blocks)
    if layer is None or layer == -1:
        return L
    if not 0 <= layer <= L:
        raise ValueError(f"layer: got {layer}, expected 0-{L} or -1/None (all layers)")
    return layer


def stack_head_results(model: Transformer, cache: ActivationCache, layer: int | None = -1,
                       return_labels: bool = False, incl_remainder: bool = False,
                       pos_slice: PosSlice = None, apply_ln: bool = False
                       ) -> Tensor | tuple[Tensor, list[str]]:
    """Every head's contribution to the residual stream, layers before ``layer``.

    Head h of layer l contributes ``hook_z[l][..., h, :] @ W_O[l, h]`` (``hook_result``, no
    bias); computed from the cached ``hook_z`` (every head) when ``hook_result`` is not cached.

    Args:
        layer: heads of layers ``< layer`` (``None`` / ``-1``: all layers).
        return_labels: also return labels ``L0.H0``, ``L0.H1``, ...
        incl_remainder: append ``hook_resid_post[layer - 1]`` minus the heads' sum
            (``remainder``); pre-norm models.
        pos_slice: positions to keep (an int removes the axis).
        apply_ln: scale by the norm reading the stream at ``layer`` (final norm for all layers).

    Returns:
        (layer * H, B, T, D), layer-major, and the labels if asked.
    """
    n = _n_layers(model, layer)
    if n == 0:
        raise ValueError("layer: got 0, expected 1 or more (heads of the layers before it)")
    if incl_remainder or apply_ln:
        _pre_norm_only(model, "stack_head_results with incl_remainder/apply_ln")
    W = W_O(model.blocks)  # (L, H, Dh, D)
    parts: list[Tensor] = []
    labels: list[str] = []
    for l in range(n):
        result = f"blocks.{l}.attn.hook_result"
        if result in cache and cache.heads_of(result) is None:
            r = cache[result]  # (B, T, H, D)
        else:
            z_name = f"blocks.{l}.attn.hook_z"
            z = need(cache, z_name, "stack_head_results")
            if cache.heads_of(z_name) is not None:
                raise KeyError(f"stack_head_results needs every head's {z_name!r}; the cache "
                               f"holds heads {cache.heads_of(z_name)}")
            r = torch.einsum("...hd,hdm->...hm", z, W[l].to(z.dtype))  # (B, T, H, D)
        r = pos_index(r, pos_slice, dim=-3)
        parts.extend(r.movedim(-2, 0))
        labels.extend(f"L{l}.H{h}" for h in range(r.shape[-2]))
    if incl_remainder:
        total = need(cache, f"blocks.{n - 1}.hook_resid_post", "incl_remainder")
        parts.append(pos_index(total, pos_slice) - torch.stack(parts).sum(0))
        labels.append("remainder")
    stack = torch.stack(parts)
    if apply_ln:
        stack = apply_ln_to_stack(model, cache, stack, n, pos_slice=pos_slice)
    return (stack, labels) if return_labels else stack


def decompose_resid(model: Transformer, cache: ActivationCache, layer: int | None = None,
                    mlp_input: bool = False, mode: Literal["all", "mlp", "attn"] = "all",
                    apply_ln: bool = False, pos_slice: PosSlice = None,
                    incl_embeds: bool = True, return_labels: bool = False
                    ) -> Tensor | tuple[Tensor, list[str]]:
    """The stream entering ``layer`` as the outputs that were added to it.

    Components, in order: ``embed``, ``pos_embed`` (learned/sinusoidal positions), then per
    layer ``l < layer``: ``{l}_attn_out``, ``{l}_mlp_out``; with ``mlp_input`` also
    ``{layer}_attn_out``. They sum to ``hook_resid_pre[layer]`` (``hook_resid_mid[layer]``
    with ``mlp_input``; ``hook_resid_post`` of the last layer for ``None``).

    Args:
        layer: 0..n_layers, or ``None`` / ``-1`` for the final stream.
        mode: ``"attn"`` or ``"mlp"`` keeps only those outputs.
        apply_ln: scale by the norm that reads this stream.
        incl_embeds: include ``embed`` and ``pos_embed``.

    Returns:
        (n, B, T, D) components, and their labels if asked.

    Raises:
        ConfigError: a post-norm model, or an embedding norm / token types before layer 0.
    """
    _pre_norm_only(model, "decompose_resid")
    n = _n_layers(model, layer)
    m: Any = model
    if mlp_input and n == len(m.blocks):
        raise ValueError("mlp_input: needs a layer below n_layers (the final stream feeds no MLP)")
    parts: list[Tensor] = []
    labels: list[str] = []
    if incl_embeds:
        for name, label in _embed_names(model):
            parts.append(_full(pos_index(need(cache, name, "decompose_resid"), pos_slice),
                               cache, pos_slice))
            labels.append(label)
    has_mlp = m.blocks[0].mlp is not None
    for l in range(n + (1 if mlp_input else 0)):
        if mode != "mlp":
            parts.append(pos_index(need(cache, f"blocks.{l}.hook_attn_out", "decompose_resid"),
                                   pos_slice))
            labels.append(f"{l}_attn_out")
        if mode != "attn" and has_mlp and l < n:
            parts.append(pos_index(need(cache, f"blocks.{l}.hook_mlp_out", "decompose_resid"),
                                   pos_slice))
            labels.append(f"{l}_mlp_out")
    if not parts:
        raise ValueError("decompose_resid: no components selected (layer 0 without embeddings)")
    stack = torch.stack(parts)
    if apply_ln:
        stack = apply_ln_to_stack(model, cache, stack, n, mlp_input, pos_slice)
    return (stack, labels) if return_labels else stack


def accumulated_resid(model: Transformer, cache: ActivationCache, layer: int | None = None,
                      incl_mid: bool = False, apply_ln: bool = False,
                      pos_slice: PosSlice = None, mlp_input: bool = False,
                      return_labels: bool = False) -> Tensor | tuple[Tensor, list[str]]:
    """The stream as it enters each layer up to ``layer``: ``{l}_pre`` (``hook_resid_pre``),
    ``{l}_mid`` with ``incl_mid`` (and for ``layer`` itself with ``mlp_input``), and
    ``final_post`` (the last ``hook_resid_post``) when ``layer`` is ``None`` / ``-1`` /
    ``n_layers``.

    Args:
        apply_ln: at the final stream, ``model.ln_final`` applied to each state with its own
            statistics (the logit lens: ``stack @ model.W_U`` are logits); before it, the scale
            of the norm reading layer ``layer``'s input (``apply_ln_to_stack``).

    Returns:
        (n, B, T, D) states, and their labels if asked.
    """
    n = _n_layers(model, layer)
    L = len(model.blocks)
    parts: list[Tensor] = []
    labels: list[str] = []
    for l in range(n + 1):
        if l == L:
            parts.append(need(cache, f"blocks.{L - 1}.hook_resid_post", "accumulated_resid"))
            labels.append("final_post")
            continue
        parts.append(need(cache, f"blocks.{l}.hook_resid_pre", "accumulated_resid"))
        labels.append(f"{l}_pre")
        if (incl_mid and l < n) or (mlp_input and l == n):
            parts.append(need(cache, f"blocks.{l}.hook_resid_mid", "accumulated_resid"))
            labels.append(f"{l}_mid")
    stack = torch.stack([pos_index(p, pos_slice) for p in parts])
    if apply_ln:
        stack = apply_ln_to_stack(model, cache, stack, n, mlp_input, pos_slice,
                                  recompute_ln=n == L)
    return (stack, labels) if return_labels else stack


def _pre_norm_only(model: Transformer, what: str) -> None:
    require_pre_norm(model, what)
    m: Any = model
    if m.embed_norm is not None or m.token_type_embed is not None:
        raise ConfigError(f"{what}: the embedding has a norm or token types, so the stream "
                          "entering layer 0 is not hook_embed + hook_pos_embed")


def _embed_names(model: Transformer) -> list[tuple[str, str]]:
    names = [("hook_embed", "embed")]
    if getattr(model, "pos_embed", None) is not None:
        names.append(("hook_pos_embed", "pos_embed"))
    return names


def _full(value: Tensor, cache: ActivationCache, pos_slice: PosSlice) -> Tensor:
    """``hook_pos_embed`` (T, D) broadcast to the batch's (B, T, D)."""
    like = pos_index(cache["hook_embed"], pos_slice)
    return value.expand_as(like)
