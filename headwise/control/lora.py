"""LoRA on a headwise model: wrap chosen projections by layer or by head; merge, save, load.

``apply_lora(model, targets=("q_proj", "v_proj"), heads="L1.H2", rank=4)`` wraps
``blocks.1.attn.q_proj`` / ``v_proj`` in ``LoRALinear`` adapters scoped to head 2's output rows
(the kv head it reads, for k/v; its input columns, for o_proj). One adapter per (layer,
module), covering the union of that layer's selected heads. All base parameters are frozen; only
``lora_A`` / ``lora_B`` train. Trainable parameters = ``sum_adapters r * (n_in + n_out)`` where
``n_in`` / ``n_out`` are the scoped input columns / output rows.

Saved adapters are ``adapter.safetensors`` (keys ``<module>.lora_A`` / ``.lora_B``) plus
``adapter_config.json`` (the ``LoRAConfig``), both written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn

from headwise.atomic import ADAPTER, check_output_dir, write_bytes_atomic
from headwise.control._common import as_headset, model_shape
from headwise.control.lora_layer import LoRALinear
from headwise.errors import CheckpointError
from headwise.model.hook_point import tree_changed

ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
FFN_TARGETS = ("up_proj", "down_proj", "gate_proj")
WEIGHTS, CONFIG = "adapter.safetensors", "adapter_config.json"


@dataclass
class LoRAConfig:
    """What ``apply_lora`` did (and what ``load_lora`` needs to redo it)."""

    targets: tuple[str, ...]
    layers: tuple[int, ...] | None
    heads: str | None
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoRAConfig:
        return cls(targets=tuple(data["targets"]),
                   layers=tuple(data["layers"]) if data["layers"] is not None else None,
                   heads=data["heads"], rank=int(data["rank"]), alpha=float(data["alpha"]),
                   dropout=float(data["dropout"]),
                   target_modules=list(data.get("target_modules", [])))


def _scope(model: nn.Module, layer: int, target: str, heads: tuple[int, ...]
           ) -> dict[str, list[int]]:
    """LoRALinear scope kwargs for the selected heads of one layer."""
    _, n_heads, n_kv, dh = model_shape(model)
    if target in ("q_proj", "o_proj"):
        idx = heads
    else:  # k/v: the kv heads the selected query heads read
        idx = tuple(sorted({h // (n_heads // n_kv) for h in heads}))
    span = [i for h in idx for i in range(h * dh, (h + 1) * dh)]
    return {"in_cols": span} if target == "o_proj" else {"out_rows": span}


def _check_args(model: nn.Module, targets: Iterable[str], layers: Any, heads: Any,
                rank: Any, dropout: float) -> tuple[tuple[str, ...], list[int], Any]:
    n_layers, _, _, _ = model_shape(model)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank: got {rank!r}, expected an integer >= 1")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: got {dropout!r}, expected a number in [0, 1)")
    tgts = (targets,) if isinstance(targets, str) else tuple(targets)
    for t in tgts:
        if t not in ATTN_TARGETS + FFN_TARGETS:
            raise ValueError(f"targets: got {t!r}, expected names among "
                             f"{list(ATTN_TARGETS + FFN_TARGETS)}")
    if not tgts:
        raise ValueError("targets: got an empty list, expected at least one module name")
    if heads is not None and layers is not None:
        raise ValueError("apply_lora: give layers or heads, not both (heads imply layers)")
    hs = as_headset(model, heads, "heads") if heads is not None else None
    if hs is not None:
        ffn = [t for t in tgts if t in FFN_TARGETS]
        if ffn:
            raise ValueError(f"targets: {ffn} are FFN modules, which have no heads; a "
                             "head-scoped adapter targets q_proj/k_proj/v_proj/o_proj")
        chosen = list(hs.layers)
    elif layers is None:
        chosen = list(range(n_layers))
    else:
        chosen = [layers] if isinstance(layers, int) else sorted(set(layers))
        for l in chosen:
            if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < n_layers:
                raise ValueError(f"layers: got {l!r}, expected layers 0-{n_layers - 1}")
    return tgts, chosen, hs


def apply_lora(model: nn.Module, targets: Iterable[str] = ("q_proj", "v_proj"),
               layers: int | Iterable[int] | None = None, heads: Any = None, rank: int = 8,
               alpha: float = 16, dropout: float = 0.0) -> LoRAConfig:
    """Wrap ``targets`` in ``LoRALinear`` adapters and freeze every base parameter.

    Args:
        model: a headwise Transformer (without adapters).
        targets: module names among q_proj, k_proj, v_proj, o_proj, up_proj, down_proj,
            gate_proj.
        layers: layers to adapt (default all); not together with ``heads``.
        heads: selector / ``Head`` / ``HeadSet``: head-scoped adapters on those heads' layers.
        rank, alpha, dropout: LoRA hyper-parameters (``scaling = alpha / rank``).

    Returns:
        The ``LoRAConfig`` (also stored as ``model.lora_config``).

    Raises:
        ValueError: rank <= 0, unknown target, FFN targets with heads, a layer out of range,
            a module the model lacks, or a model that already has adapters.
        SelectorError: a head selector out of range.
    """
    if getattr(model, "lora_config", None) is not None:
        raise ValueError("apply_lora: the model already has LoRA adapters; remove_lora first")
    tgts, chosen, hs = _check_args(model, targets, layers, heads, rank, dropout)
    plan: list[tuple[str, nn.Module, str, dict[str, list[int]]]] = []
    for l in chosen:
        for t in tgts:
            parent_name = f"blocks.{l}.{'attn' if t in ATTN_TARGETS else 'mlp'}"
            parent = model.get_submodule(parent_name) if _has(model, parent_name) else None
            base = getattr(parent, t, None) if parent is not None else None
            if not isinstance(base, nn.Linear):
                raise ValueError(f"targets: {parent_name}.{t} is not an nn.Linear of this model"
                                 f" (got {type(base).__name__})")
            scope = _scope(model, l, t, hs.in_layer(l)) if hs is not None else {}
            plan.append((parent_name, parent, t, scope))  # type: ignore[arg-type]
    previous = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    names = []
    for parent_name, parent, t, scope in plan:
        setattr(parent, t, LoRALinear(getattr(parent, t), rank, alpha, dropout, **scope))
        names.append(f"{parent_name}.{t}")
    tree_changed(model)
    config = LoRAConfig(tgts, tuple(chosen) if hs is None else None,
                        str(hs) if hs is not None else None, rank, float(alpha), dropout, names)
    model.lora_config = config  # type: ignore[assignment]
    model._lora_previous_grad = previous  # type: ignore[assignment]
    return config


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
        return True
    except AttributeError:
        return False


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Every adapter of the model by module name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``{"<module>.lora_A": A, "<module>.lora_B": B}`` for every adapter (detached)."""
    out = {}
    for name, mod in lora_modules(model).items():
        out[f"{name}.lora_A"] = mod.lora_A.detach()
        out[f"{name}.lora_B"] = mod.lora_B.detach()
    return out


def save_lora(model: nn.Module, path_dir: str | os.PathLike[str], *,
              overwrite: bool = False) -> Path:
    """Write the adapters alone: ``adapter.safetensors`` + ``adapter_config.json``.

    The directory follows the output rule (``headwise.atomic.check_output_dir``): an existing
    adapter is replaced only with ``overwrite``; a run, checkpoint or model directory, a link
    or a file never.

    Raises:
        ValueError: the model has no adapters.
        ConfigError: a destination the output rule refuses.
    """
    config = getattr(model, "lora_config", None)
    if config is None:
        raise ValueError("save_lora: the model has no LoRA adapters (apply_lora first)")
    out = Path(path_dir)
    check_output_dir(out, "save_lora", overwrite=overwrite, replaces=(ADAPTER,))
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().cpu() for k, v in lora_state_dict(model).items()}
    write_bytes_atomic(out / WEIGHTS, save(tensors, metadata={"format": "pt"}))
    text = json.dumps({"format": "headwise-lora", **config.to_dict()}, indent=2)
    write_bytes_atomic(out / CONFIG, text.encode("utf-8"))
    return out


def load_lora(model: nn.Module, path_dir: str | os.PathLike[str]) -> LoRAConfig:
    """Apply the saved adapters to a model without adapters and load their weights.

    Raises:
        CheckpointError: a missing or unreadable file, or a key/shape mismatch (named).
    """
    src = Path(path_dir)
    try:
        data = json.loads((src / CONFIG).read_text())
        config = LoRAConfig.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{src / CONFIG}: cannot read adapter config ({e})") from None
    try:
        tensors = load_file(str(src / WEIGHTS))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{src / WEIGHTS}: cannot read adapter weights ({e})") from None
    apply_lora(model, config.targets, layers=config.layers, heads=config.heads,
               rank=config.rank, alpha=config.alpha, dropout=config.dropout)
    state = dict(lora_state_dict(model))
    for key in sorted(set(state) | set(tensors)):
        if key not in tensors or key not in state:
            remove_lora(model)
            where = "missing from" if key not in tensors else "unexpected in"
            raise CheckpointError(f"{src / WEIGHTS}: key {key!r} {where} the file")
        if tensors[key].shape != state[key].shape:
            remove_lora(model)
            raise CheckpointError(f"{src / WEIGHTS}: {key!r} has shape "
                                  f"{tuple(tensors[key].shape)}, expected "
                                  f"{tuple(state[key].shape)}")
    with torch.no_grad():
        for key, value in tensors.items():
            state[key].copy_(value)
    return config


def merge_lora(model: nn.Module) -> None:
    """Merge every adapter into its base weight (outputs unchanged up to rounding)."""
    for mod in lora_modules(model).values():
        mod.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Undo ``merge_lora``."""
    for mod in lora_modules(model).values():
        mod.unmerge()


def set_lora_disabled(model: nn.Module, flag: bool) -> None:
    """Switch every adapter off (``True``: base outputs) or back on.

    Raises:
        ValueError: an adapter is merged (its delta is inside the base weight).
    """
    mods = lora_modules(model)
    if any(m.merged for m in mods.values()):
        raise ValueError("set_lora_disabled: adapters are merged; unmerge_lora first")
    for mod in mods.values():
        mod.disabled = bool(flag)


@contextmanager
def lora_disabled(model: nn.Module) -> Iterator[None]:
    """Run the ``with`` block with every adapter switched off (the base model's outputs,
    bit-identical to the model before ``apply_lora``), then restore each adapter's state.

    Raises:
        ValueError: an adapter is merged (its delta is inside the base weight).
    """
    mods = lora_modules(model)
    if any(m.merged for m in mods.values()):
        raise ValueError("lora_disabled: adapters are merged; unmerge_lora first")
    before = {name: m.disabled for name, m in mods.items()}
    for mod in mods.values():
        mod.disabled = True
    try:
        yield
    finally:
        for name, mod in mods.items():
            mod.disabled = before[name]


def remove_lora(model: nn.Module) -> None:
    """Unwrap every adapter (unmerging first) and restore ``requires_grad`` flags."""
    for name, mod in lora_modules(model).items():
        mod.unmerge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, mod.base_layer)
    tree_changed(model)
    previous = getattr(model, "_lora_previous_grad", None) or {}
    for n, p in model.named_parameters():
        p.requires_grad_(previous.get(n, True))
    model.lora_config = None  # type: ignore[assignment]
    model._lora_previous_grad = None  # type: ignore[assignment]


__all__ = ["LoRAConfig", "LoRALinear", "apply_lora", "load_lora", "lora_disabled",
           "lora_modules", "lora_state_dict", "merge_lora", "remove_lora", "save_lora",
           "set_lora_disabled", "unmerge_lora"]
