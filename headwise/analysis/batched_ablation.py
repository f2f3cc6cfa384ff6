"""Many heads' ablations in one forward, from the clean residual stream at the ablated layer.

Ablating a head of layer ``l`` changes nothing below ``l``: the clean forward's residual stream
entering ``l`` (``blocks.{l}.hook_resid_pre``) is where every ablation of that layer starts.
``ablated_stats`` runs the clean batch once (keeping those streams), then, for each layer, the
blocks from ``l`` up on the batch repeated once per ablation set (``S`` sets x ``B`` examples;
``S`` capped so one chunk's activations stay under ``CHUNK_ELEMENTS``), with each copy's heads
replaced at ``hook_z`` as ``headwise.hooks.ablate`` replaces them (``zero``; ``mean`` over the
reference batch per position; ``resample``: each example's value from a seeded random
reference example, drawn per set exactly as ``ablate`` draws them), and the output head applied
at the scored positions only (``headwise.analysis.scored``). The statistics equal those of one
set at a time (``tests/analysis/test_batched_ablation.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.scored import forward_kwargs, output_head, scored_positions, stats_at
from headwise.heads import HeadSet
from headwise.model.cache import run_with_cache
from headwise.model.hook_point import Hook, HookContext
from headwise.model.mask_plan import mask_plan

Stats = dict[str, tuple[Tensor, Tensor]]
# Activation elements one chunk of ablated copies may hold at its widest point (the MLP's
# hidden layer, an attention pattern or the scored logits): 2^26 floats, 256 MiB in float32.
CHUNK_ELEMENTS = 1 << 26


def _widest(model: Any, B: int, T: int, N: int) -> int:
    """Elements of the widest activation of one copy of a (B, T) batch with N scored rows."""
    cfg = model.config
    return max(B * T * max(cfg.d_ff, 3 * cfg.d_model), B * cfg.n_heads * T * T,
               N * cfg.vocab_size, 1)


def _clean(model: Any, batch: Any) -> tuple[Stats, list[Tensor]]:
    """The clean statistics and the residual stream entering every block (B, T, D)."""
    streams: list[Tensor] = []
    hooks = [Hook(f"blocks.{l}.hook_resid_pre", lambda x, ctx: streams.append(x),
                  read_only=True) for l in range(len(model.blocks))]
    with model.hooks(hooks):
        hidden = model.hidden(batch.tokens, **forward_kwargs(batch))
    rows, cols = scored_positions(batch.targets)
    return stats_at(output_head(model, hidden[rows, cols]), batch.targets), streams


def _replacements(model: Any, units: Sequence[HeadSet], mode: str, reference: Tensor | None,
                  ref_kw: dict[str, Any], seed: int, B: int, T: int
                  ) -> list[dict[int, Tensor | None]]:
    """Per unit and layer: the values its ablated heads take at ``hook_z`` ((B, T, H, Dh), or
    ``None`` for zeros), drawn as ``headwise.hooks.ablate`` draws them."""
    if mode == "zero":
        return [{l: None for l in u.layers} for u in units]
    if reference is None:
        raise ValueError(f"reference: mode={mode!r} needs a batch of reference tokens")
    layers = sorted({l for u in units for l in u.layers})
    names = [f"blocks.{l}.attn.hook_z" for l in layers]
    with torch.no_grad():
        _, cache = run_with_cache(model, reference, names, **ref_kw)
    stored = {}
    for l, name in zip(layers, names, strict=True):
        z = cache[name]  # (Bref, Tref, H, Dh)
        if z.shape[1] < T:
            raise ValueError(f"reference: {name} has {z.shape[1]} positions, the input has "
                             f"{T}; use reference tokens at least as long")
        stored[l] = z[:, :T]
    out: list[dict[int, Tensor | None]] = []
    for u in units:
        if mode == "mean":
            out.append({l: stored[l].mean(0, keepdim=True).expand(B, -1, -1, -1)
                        for l in u.layers})
            continue
        gen = torch.Generator().manual_seed(seed)  # one generator per set, as ablate() makes
        picks: dict[int, Tensor | None] = {}
        for l in u.layers:
            pick = torch.randint(0, stored[l].shape[0], (B,), generator=gen)
            picks[l] = stored[l][pick.to(stored[l].device)]
        out.append(picks)
    return out


def _z_hook(keep: Tensor, value: Tensor | None) -> Any:
    """``hook_z`` of S stacked copies: heads where ``keep`` (S, H) is False take ``value``
    ((S, B, T, H, Dh); ``None``: zeros)."""
    def fn(z: Tensor, ctx: HookContext) -> Tensor:
        S = keep.shape[0]
        zs = z.view(S, -1, *z.shape[1:])  # (S, B, T, H, Dh)
        k = keep[:, None, None, :, None]
        other = torch.zeros((), dtype=z.dtype, device=z.device) if value is None else \
            value.to(z.dtype)
        return torch.where(k, zs, other).view_as(z)
    return fn


def _run_chunk(model: Any, batch: Any, start: int, stream: Tensor,
               units: Sequence[HeadSet], values: Sequence[dict[int, Tensor | None]]) -> Stats:
    """The blocks from ``start`` up on ``len(units)`` stacked copies of ``stream``."""
    S, H = len(units), model.config.n_heads
    B, T, D = stream.shape
    hooks = []
    for l in sorted({l for u in units for l in u.layers}):
        keep = torch.ones(S, H, dtype=torch.bool, device=stream.device)
        for s, u in enumerate(units):
            keep[s, list(u.in_layer(l))] = False
        parts = [v.get(l) for v in values]
        value = None
        if any(p is not None for p in parts):
            ref = next(p for p in parts if p is not None)
            value = torch.stack([p if p is not None else torch.zeros_like(ref) for p in parts])
        hooks.append(Hook(f"blocks.{l}.attn.hook_z", _z_hook(keep, value)))
    x = stream.repeat(S, 1, 1)  # (S*B, T, D)
    mask = batch.attention_mask
    padding = None if mask is None else mask.bool().repeat(S, 1)
    plan = mask_plan(T, model.config.causal, padding, device=x.device)  # as Transformer.hidden
    task_ids = getattr(batch, "task_ids", None)
    tids = None if task_ids is None else task_ids.repeat(S)
    with model.hooks(hooks):
        for block in model.blocks[start:]:
            x = block(x, plan, tids)
    if model.ln_final is not None:
        x = model.ln_final(x)
    rows, cols = scored_positions(batch.targets)
    hidden = x.view(S, B, T, D)[:, rows, cols]  # (S, N, D)
    return stats_at(output_head(model, hidden), batch.targets)


@torch.no_grad()
def ablated_stats(model: nn.Module, batch: Any, units: Sequence[HeadSet],
                  mode: str = "zero", reference: Tensor | None = None,
                  ref_kw: dict[str, Any] | None = None, seed: int = 0,
                  max_elements: int = CHUNK_ELEMENTS) -> tuple[Stats, list[Stats]]:
    """Clean statistics and each unit's ablated statistics (``example_stats`` layout).

    Args:
        model: a headwise Transformer in eval mode.
        batch: ``tokens``, ``targets`` (and ``attention_mask``, ``task_ids``).
        units: head sets, each ablated together.
        mode: ``zero``, ``mean`` or ``resample`` (as ``headwise.hooks.ablate``).
        reference: tokens (Bref, T' >= T) for ``mean`` / ``resample``.
        ref_kw: the reference's forward inputs (``attention_mask``, ``task_ids``).
        seed: the resample draws' seed (per unit, as ``ablate(..., seed=seed)``).
        max_elements: the activation budget of one chunk of stacked copies.

    Returns:
        ``(clean, [ablated per unit])``, each ``{metric: (numerators (B,), counts (B,))}``.

    Raises:
        ValueError: a unit with no head, or a reference missing or too short.
    """
    m: Any = model
    clean, streams = _clean(m, batch)
    B, T = batch.tokens.shape
    values = _replacements(m, units, mode, reference, ref_kw or {}, seed, B, T)
    N = int((batch.targets != -100).sum())
    per_chunk = max(1, max_elements // _widest(m, B, T, N))
    out: list[Stats | None] = [None] * len(units)
    by_layer: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        if not len(u):
            raise ValueError(f"units[{i}]: an empty head set; expected at least one head")
        by_layer.setdefault(min(u.layers), []).append(i)
    for start, idx in sorted(by_layer.items()):
        for c in range(0, len(idx), per_chunk):
            chunk = idx[c:c + per_chunk]
            stats = _run_chunk(m, batch, start, streams[start], [units[i] for i in chunk],
                               [values[i] for i in chunk])
            for s, i in enumerate(chunk):
                out[i] = {k: (n[s], d[s]) for k, (n, d) in stats.items()}
    return clean, [o for o in out if o is not None]
