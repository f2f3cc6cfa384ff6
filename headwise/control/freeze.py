"""Freezing: train only chosen heads, layers or modules; frozen slices stay bitwise unchanged.

``freeze(model, trainable)`` leaves trainable exactly what ``trainable`` names and freezes the
rest. Whole parameters are frozen with ``requires_grad = False`` (an optimizer skips parameters
without a gradient). A head, however, owns only a *slice* of its layer's shared projections:

    head h:      rows h*Dh:(h+1)*Dh of q_proj.weight / q_proj.bias, columns h*Dh:(h+1)*Dh of
                 o_proj.weight;
    kv head g:   rows g*Dh:(g+1)*Dh of k_proj / v_proj (weight and bias). Under GQA a kv head
                 is trainable if ANY query head of its group (``g = h // (H / H_kv)``) is.
    o_proj.bias is shared by all heads: frozen unless a module pattern names it.

Such partially trainable parameters keep ``requires_grad = True``; their gradient is masked to
zero outside the trainable slice. That alone does not keep the frozen slice fixed: AdamW's
decoupled weight decay multiplies every element by ``1 - lr * wd``, and moments built before
freezing would keep moving it. So the handle snapshots each partial parameter and, after every
``optimizer.step()`` (``register_step_post_hook``), copies the frozen elements back from the
snapshot: the frozen slices are bitwise equal to their values at ``freeze`` time whatever the
optimizer does. Call ``handle.refresh()`` after loading new weights into a frozen model.

A model sharded after ``freeze`` (``train.parallel: fsdp``) has new parameter objects, each a
``DTensor`` holding some rows on each rank: ``attach`` re-binds the handle to them. The gradient
mask then goes on the gathered (whole) parameter that the module uses during its forward and
backward, before the gradient is reduce-scattered, and the snapshot and the copy-back work on
each rank's rows of mask, snapshot and parameter.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control._common import as_headset, attention, model_shape
from headwise.dtensors import is_dtensor
from headwise.heads import Head, HeadSet, is_selector, kv_head


class FreezeHandle:
    """What ``freeze`` did; keeps frozen slices bitwise fixed across optimizer steps.

    Attributes:
        masks: parameter name -> bool mask of its trainable elements (partial parameters).
        trainable: names of fully trainable parameters.
    """

    def __init__(self, model: nn.Module, masks: dict[str, Tensor], trainable: set[str],
                 previous: dict[str, bool]) -> None:
        self.model = model
        self.masks = masks
        self.trainable = trainable
        self._previous = previous
        params = dict(model.named_parameters(remove_duplicate=False))
        self._params = {n: params[n] for n in masks}
        self._snapshots: dict[str, Tensor] = {}
        self._local_masks: dict[str, Tensor] = {}
        self._grad_hooks = [self._params[n].register_hook(
            lambda g, m=m: g * m.to(g.device, g.dtype)) for n, m in masks.items()]
        self._opt_hooks: list[Any] = []
        self.refresh()

    def refresh(self) -> None:
        """Re-take the snapshot of the frozen slices (after loading weights)."""
        self._snapshots = {n: _local(p).detach().clone() for n, p in self._params.items()}

    @torch.no_grad()
    def restore_frozen(self) -> None:
        """Copy the snapshot back into every frozen slice (done after each optimizer step)."""
        for n, p in self._params.items():
            mask = self._local_masks.get(n, self.masks[n]).to(p.device)
            local = _local(p)
            local.copy_(torch.where(mask, local, self._snapshots[n]))

    def _rebind(self) -> None:
        """Follow the model's parameters if it was sharded since ``freeze`` (see module doc)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        if all(params[n] is p for n, p in self._params.items()):
            return
        for h in self._grad_hooks:
            h.remove()
        self._params = {n: params[n] for n in self.masks}
        from torch.distributed.tensor import distribute_tensor  # sharded models only

        sharded: dict[str, Any] = {n: p for n, p in self._params.items() if is_dtensor(p)}
        self._local_masks = {n: distribute_tensor(self.masks[n].to(p.device), p.device_mesh,
                                                  p.placements, src_data_rank=None).to_local()
                             for n, p in sharded.items()}
        modules = dict(self.model.named_modules())
        self._grad_hooks = [
            modules[n.rsplit(".", 1)[0]].register_forward_pre_hook(
                _mask_gathered(n.rsplit(".", 1)[1], m, set()))
            for n, m in self.masks.items() if is_dtensor(self._params[n])]
        self.refresh()

    def attach(self, optimizer: torch.optim.Optimizer) -> FreezeHandle:
        """Restore frozen slices after every ``optimizer.step()``; returns ``self``."""
        self._rebind()
        self._opt_hooks.append(optimizer.register_step_post_hook(
            lambda opt, args, kwargs: self.restore_frozen()))
        return self

    def trainable_count(self) -> int:
        """Number of trainable scalars (whole trainable parameters + trainable slices)."""
        params = dict(self.model.named_parameters())  # deduplicates tied weights
        full = sum(p.numel() for n, p in params.items() if n in self.trainable)
        return full + sum(int(m.sum()) for m in self.masks.values())

    def remove(self) -> None:
        """Undo ``freeze``: original ``requires_grad`` flags, no gradient or optimizer hooks."""
        for h in self._grad_hooks + self._opt_hooks:
            h.remove()
        self._grad_hooks, self._opt_hooks = [], []
        for n, p in self.model.named_parameters(remove_duplicate=False):
            if n in self._previous:
                p.requires_grad_(self._previous[n])


def _local(p: Tensor) -> Tensor:
    """This rank's rows of a sharded parameter (the parameter itself when not sharded)."""
    return p.to_local() if is_dtensor(p) else p  # type: ignore[attr-defined]


def _mask_gathered(attr: str, mask: Tensor, hooked: set[int]) -> Any:
    """A forward pre-hook that masks the gradient of the module's gathered ``attr`` (once per
    gathered tensor: FSDP reuses it at every step)."""
    def pre(module: nn.Module, args: Any) -> None:
        w = getattr(module, attr)
        if is_dtensor(w) or id(w) in hooked or not w.requires_grad:
            return
        hooked.add(id(w))
        w.register_hook(lambda g: g * mask.to(g.device, g.dtype))
    return pre


def _head_masks(model: nn.Module, heads: HeadSet) -> dict[str, Tensor]:
    """Trainable-element masks of the q/k/v/o parameters touched by ``heads``."""
    _, n_heads, n_kv, dh = model_shape(model)
    out: dict[str, Tensor] = {}
    for layer in heads.layers:
        attn = attention(model, layer)
        qs = heads.in_layer(layer)
        kvs = sorted({kv_head(h, n_heads, n_kv) for h in qs})
        for proj, idx, axis in (("q_proj", qs, 0), ("k_proj", kvs, 0), ("v_proj", kvs, 0),
                                ("o_proj", qs, 1)):
            mod = getattr(attn, proj)
            base = getattr(mod, "base_layer", mod)
            prefix = f"blocks.{layer}.attn.{proj}" + (".base_layer" if base is not mod else "")
            for pname in ("weight", "bias"):
                p = getattr(base, pname, None)
                if p is None or (pname == "bias" and axis == 1):
                    continue
                mask = torch.zeros(p.shape, dtype=torch.bool, device=p.device)
                for i in idx:
                    sl = slice(i * dh, (i + 1) * dh)
                    if axis == 0:
                        mask[sl] = True
                    else:
                        mask[:, sl] = True
                out[f"{prefix}.{pname}"] = mask
    return out


def _split(model: nn.Module, trainable: Any) -> tuple[list[Any], list[str]]:
    """Separate head selectors from module-name patterns."""
    items = trainable if isinstance(trainable, (list, tuple, set)) else [trainable]
    heads: list[Any] = []
    patterns: list[str] = []
    for item in items:
        if isinstance(item, (Head, HeadSet)) or (isinstance(item, str) and is_selector(item)):
            heads.append(item)
        elif isinstance(item, str):
            patterns.append(item)
        else:
            raise ValueError(f"trainable: got {item!r}, expected a head selector ('L1.H2'), "
                             "a Head/HeadSet, or a parameter-name pattern ('blocks.1.*')")
    return heads, patterns


def freeze(model: nn.Module, trainable: Any = (), optimizer: torch.optim.Optimizer | None = None
           ) -> FreezeHandle:
    """Freeze everything except ``trainable``.

    Args:
        model: a headwise Transformer.
        trainable: one item or a list of: head selectors / ``Head`` / ``HeadSet`` (trains
            those heads' slices of q/k/v/o, see module docstring), and parameter-name patterns
            in ``fnmatch`` syntax (``"blocks.1.*"`` a whole layer, ``"blocks.*.mlp"`` every
            MLP, ``"unembed.weight"``); a pattern also matches everything below a module name.
        optimizer: if given, ``attach`` it at once.

    Returns:
        A ``FreezeHandle``; call ``.attach(optimizer)`` before training if not passed here.

    Raises:
        SelectorError: a head selector malformed or out of range.
        ValueError: a pattern that matches no parameter, or an item of another type.
    """
    model_shape(model)
    head_items, patterns = _split(model, trainable)
    named = list(model.named_parameters(remove_duplicate=False))
    full: set[str] = set()
    for pat in patterns:
        hit = {n for n, _ in named if fnmatch(n, pat) or fnmatch(n, pat + ".*")}
        if not hit:
            raise ValueError(f"trainable: pattern {pat!r} matches no parameter of the model "
                             f"(names look like {named[0][0]!r})")
        full |= hit
    masks: dict[str, Tensor] = {}
    if head_items:
        hs = as_headset(model, head_items, "trainable")
        masks = {n: m for n, m in _head_masks(model, hs).items() if n not in full}
    previous = {n: p.requires_grad for n, p in named}
    by_id: dict[int, bool] = {}
    for n, p in named:  # a tied parameter is trainable if any of its names is
        by_id[id(p)] = by_id.get(id(p), False) or n in full or n in masks
    for _, p in named:
        p.requires_grad_(by_id[id(p)])
        if not by_id[id(p)]:
            p.grad = None
    handle = FreezeHandle(model, masks, {n for n, p in named if n in full or
                                         (by_id[id(p)] and n not in masks)}, previous)
    if optimizer is not None:
        handle.attach(optimizer)
    return handle
