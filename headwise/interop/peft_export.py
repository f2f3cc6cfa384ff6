"""PEFT exchange: export headwise LoRA adapters as a PEFT adapter directory, and import them.

PEFT computes ``delta W = B @ A * scaling`` with ``scaling = lora_alpha / r`` (or
``/ sqrt(r)`` with rsLoRA); headwise's ``LoRALinear.full_factors()`` gives exactly these ``A``
(r, in) and ``B`` (out, r), zero outside a head scope, so a head-scoped adapter exports as a
module adapter that is zero outside the head's slice. Keys follow PEFT's saved layout
``base_model.model.<HF module>.lora_A.weight`` for the family's ``peft_model_class`` (e.g.
``LlamaForCausalLM``). A fused HF module (GPT-2's ``c_attn`` = q|k|v) holding several of our
adapters gets ``A`` stacked and ``B`` block-diagonal, rank = the sum of ranks: still exact.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headwise.atomic import ADAPTER, check_output_dir, remove_entries, write_bytes_atomic
from headwise.control.lora import LoRAConfig, apply_lora, lora_modules
from headwise.control.lora_layer import LoRALinear
from headwise.errors import CheckpointError, show
from headwise.interop.converter import Converter
from headwise.interop.registry import get_converter
from headwise.interop.weights import read_json, read_pickle, read_safetensors
from headwise.training.safetensors_io import check_finite, save_tensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_BIN)
PREFIX = "base_model.model."
_KEY = re.compile(r"(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight")


def export_peft(model: nn.Module, out_dir: str | Path, model_type: str, *,
                base_model_name_or_path: str | None = None, overwrite: bool = False) -> Path:
    """Write the model's LoRA adapters as a PEFT adapter for the matching HF model.

    Args:
        model: a headwise model with adapters (``apply_lora`` / ``load_lora``).
        out_dir: directory for ``adapter_config.json`` and ``adapter_model.safetensors``.
        model_type: the HF ``model_type`` the base model came from (``"llama"``, ``"gpt2"``...).
        base_model_name_or_path: recorded in the config (e.g. the local HF directory).
        overwrite: replace an adapter already in ``out_dir`` (its files are deleted first).
            ``out_dir`` follows the output rule (``headwise.atomic.check_output_dir``).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: no adapters, or an adapter on a module the HF family has no PEFT target
            for (naming it and listing the exportable ones).
        CheckpointError: unknown ``model_type``.
        ConfigError: ``out_dir`` is refused by the output rule.
    """
    out = Path(out_dir)
    check_output_dir(out, "out_dir", overwrite=overwrite, replaces=(ADAPTER,))
    converter = get_converter(model_type)
    adapters = lora_modules(model)
    if not adapters:
        raise ValueError("export_peft: the model has no LoRA adapters (apply_lora first)")
    tensors, shapes = _peft_tensors(model, converter, adapters, model_type)
    config = _peft_config(model, converter, shapes, base_model_name_or_path)
    if overwrite:
        remove_entries(out, ADAPTER_FILES, keep=(ADAPTER_CONFIG, ADAPTER_WEIGHTS))
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, out / ADAPTER_WEIGHTS, {"format": "pt"})
    text = json.dumps(config, indent=2) + "\n"
    write_bytes_atomic(out / ADAPTER_CONFIG, text.encode("utf-8"))
    return out


def _peft_tensors(model: nn.Module, converter: Converter, adapters: dict[str, LoRALinear],
                  model_type: str) -> tuple[dict[str, Tensor], dict[str, tuple[int, float]]]:
    """PEFT's ``lora_A`` / ``lora_B`` tensors by key, and each HF module's ``(r, alpha)``.

    Raises:
        ValueError: an adapter on a module the family has no PEFT target for.
    """
    owner = {ours: (hf, k) for hf, parts in converter.peft_modules.items()
             for k, ours in enumerate(parts)}
    groups: dict[tuple[str, int], dict[int, LoRALinear]] = {}
    for name, mod in adapters.items():
        template, layer = _template(name)
        if template not in owner:
            raise ValueError(f"export_peft: adapter {name} has no {model_type} PEFT target; "
                             f"exportable modules: {sorted(owner)}")
        hf_template, part = owner[template]
        groups.setdefault((hf_template, layer), {})[part] = mod
    tensors: dict[str, Tensor] = {}
    shapes: dict[str, tuple[int, float]] = {}
    for (hf_template, layer), parts in sorted(groups.items()):
        sizes = [_out_features(model, t.format(i=layer))
                 for t in converter.peft_modules[hf_template]]
        A, B, r, alpha = _fuse(parts, sizes)
        hf_name = hf_template.format(i=layer)
        tensors[f"{PREFIX}{hf_name}.lora_A.weight"] = A.detach().contiguous().cpu()
        tensors[f"{PREFIX}{hf_name}.lora_B.weight"] = B.detach().contiguous().cpu()
        shapes[hf_name] = (r, alpha)
    return tensors, shapes


def _peft_config(model: nn.Module, converter: Converter, shapes: dict[str, tuple[int, float]],
                 base_model_name_or_path: str | None) -> dict[str, Any]:
    """``adapter_config.json``: the commonest ``(r, alpha)`` global, the others as patterns."""
    counts = Counter(shapes.values())  # ties: the smallest
    r0, alpha0 = min(counts, key=lambda ra: (-counts[ra], ra))
    lora_config = getattr(model, "lora_config", None)
    return {
        "peft_type": "LORA", "task_type": converter.peft_task_type,
        "base_model_name_or_path": base_model_name_or_path, "inference_mode": True,
        "r": r0, "lora_alpha": alpha0,
        "lora_dropout": float(lora_config.dropout) if lora_config is not None else 0.0,
        "target_modules": sorted(shapes), "bias": "none",
        "fan_in_fan_out": converter.peft_fan_in_fan_out,
        "rank_pattern": {n: r for n, (r, _) in shapes.items() if r != r0},
        "alpha_pattern": {n: a for n, (_, a) in shapes.items() if a != alpha0},
        "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None,
    }


def _fuse(parts: dict[int, LoRALinear], sizes: list[int]) -> tuple[Tensor, Tensor, int, float]:
    """One PEFT ``(A, B, r, alpha)`` for the adapters on the parts of one HF module."""
    if len(sizes) == 1:
        mod = parts[0]
        A, B = mod.full_factors()
        return A, B, mod.rank, float(mod.alpha)
    order = sorted(parts)
    ref = parts[order[0]].scaling
    r = sum(parts[k].rank for k in order)
    B = torch.zeros(sum(sizes), r, dtype=parts[order[0]].lora_B.dtype)
    As, col = [], 0
    for k in order:
        A_k, B_k = parts[k].full_factors()
        row = sum(sizes[:k])
        factor = parts[k].scaling / ref  # 1.0 when every part shares alpha / r
        B[row:row + sizes[k], col:col + parts[k].rank] = B_k.detach() * factor
        As.append(A_k.detach())
        col += parts[k].rank
    uniform = all(parts[k].scaling == ref for k in order)
    alpha = sum(parts[k].alpha for k in order) if uniform else ref * r
    return torch.cat(As, 0), B, r, float(alpha)


def import_peft(model: nn.Module, adapter_dir: str | Path, model_type: str) -> LoRAConfig:
    """Wrap the model's projections in adapters carrying a PEFT LoRA adapter's weights.

    Adapters get one common rank (the largest; smaller ones are zero-padded) and scaling (B is
    rescaled where a module's ``alpha / r`` differs), so ``B @ A * scaling`` equals PEFT's delta
    for every module. Modules of the chosen layers and targets that the adapter does not cover
    get ``B = 0`` (no change).

    Args:
        model: a headwise model of the same family without adapters.
        adapter_dir: PEFT adapter directory (``adapter_config.json`` and
            ``adapter_model.safetensors``, or ``adapter_model.bin`` read with weights_only).
        model_type: the HF ``model_type`` of the base model.

    Returns:
        The ``LoRAConfig`` from ``apply_lora``.

    Raises:
        CheckpointError: unsupported adapter features (DoRA, bias, modules_to_save; named), a
            key for a module headwise cannot map, a missing A/B, or a wrong shape.
    """
    converter = get_converter(model_type)
    cfg, raw, source = _read_adapter(Path(adapter_dir))
    loaded = _loaded_factors(model, converter, cfg, _pairs(raw, source), source)
    if not loaded:
        raise CheckpointError(f"{source}: no LoRA weights (lora_A / lora_B) found; expected a "
                              "PEFT LoRA adapter")
    rank = max(A.shape[0] for A, _, _ in loaded.values())
    common = loaded[sorted(loaded)[0]][2]
    targets = sorted({n.rsplit(".", 1)[1] for n in loaded})
    layers = sorted({_template(n)[1] for n in loaded})
    config = apply_lora(model, targets, layers=layers, rank=rank, alpha=common * rank,
                        dropout=float(cfg.get("lora_dropout") or 0.0))
    with torch.no_grad():
        for name, mod in lora_modules(model).items():
            if name not in loaded:
                mod.lora_B.zero_()
                continue
            A, B, scaling = loaded[name]
            r = A.shape[0]
            mod.lora_A.zero_()
            mod.lora_A[:r] = A
            mod.lora_B.zero_()
            mod.lora_B[:, :r] = B if scaling == common else B * (scaling / common)
    return config


def _read_adapter(d: Path) -> tuple[dict[str, Any], dict[str, Tensor], Path]:
    """A PEFT adapter directory's checked config, its raw tensors and the file they came from."""
    cfg = read_json(d / ADAPTER_CONFIG)
    _check_config(cfg, d / ADAPTER_CONFIG)
    source = d / ADAPTER_WEIGHTS if (d / ADAPTER_WEIGHTS).is_file() else d / ADAPTER_BIN
    if not source.is_file():
        raise CheckpointError(f"{d}: no {ADAPTER_WEIGHTS} or {ADAPTER_BIN} found")
    raw = read_safetensors(source) if source.suffix == ".safetensors" else read_pickle(source)
    return cfg, raw, source


def _loaded_factors(model: nn.Module, converter: Converter, cfg: dict[str, Any],
                    factors: dict[str, tuple[Tensor, Tensor]],
                    source: Path) -> dict[str, tuple[Tensor, Tensor, float]]:
    """``our module -> (A, B part, scaling)`` for every PEFT module, shapes checked.

    Raises:
        CheckpointError: a module headwise cannot map, or a wrong shape (naming the key).
    """
    loaded: dict[str, tuple[Tensor, Tensor, float]] = {}
    for hf_name, (A, B) in sorted(factors.items()):
        hf_template, layer = _match_module(converter, hf_name, source)
        ours = [t.format(i=layer) for t in converter.peft_modules[hf_template]]
        alpha = _alpha(cfg, hf_name, source.parent / ADAPTER_CONFIG)
        r = A.shape[0]
        scaling = alpha / (r ** 0.5 if cfg.get("use_rslora") else r)
        bases = [_base(model, n) for n in ours]
        sizes = [b.out_features for b in bases]
        key = f"{PREFIX}{hf_name}"
        if B.shape != (sum(sizes), r):
            raise CheckpointError(f"{source}: key {key}.lora_B.weight: got shape "
                                  f"{tuple(B.shape)}, expected {(sum(sizes), r)}")
        if A.shape[1] != bases[0].in_features:
            raise CheckpointError(f"{source}: key {key}.lora_A.weight: got shape "
                                  f"{tuple(A.shape)}, expected {(r, bases[0].in_features)}")
        check_finite(A, source, f"{key}.lora_A.weight")
        check_finite(B, source, f"{key}.lora_B.weight")
        for name, B_part in zip(ours, B.split(sizes, 0), strict=True):
            loaded[name] = (A.float(), B_part.float(), scaling)
    return loaded


def _check_config(cfg: dict[str, Any], path: Path) -> None:
    checks = (("peft_type", "LORA"), ("use_dora", False), ("bias", "none"),
              ("modules_to_save", None), ("lora_bias", False), ("target_parameters", None))
    for name, want in checks:
        value = cfg.get(name, want)
        if value != want and not (want is None and not value) and not (want is False
                                                                       and not value):
            raise CheckpointError(f"{path}: {name}: got {value!r}, expected {want!r} "
                                  "(headwise imports plain LoRA adapters on Linear modules)")


def _pairs(raw: dict[str, Tensor], source: Path) -> dict[str, tuple[Tensor, Tensor]]:
    parts: dict[str, dict[str, Tensor]] = {}
    for key, value in raw.items():
        m = _KEY.fullmatch(key)
        if not key.startswith(PREFIX) or m is None:
            raise CheckpointError(f"{source}: key {key!r} is not a LoRA A/B weight under "
                                  f"{PREFIX!r} (embedding, DoRA or bias adapters are not "
                                  "supported)")
        parts.setdefault(m["module"][len(PREFIX):], {})[m["ab"]] = value
    out = {}
    for module, ab in parts.items():
        for which in "AB":
            if which not in ab:
                raise CheckpointError(f"{source}: missing key "
                                      f"'{PREFIX}{module}.lora_{which}.weight'")
        out[module] = (ab["A"], ab["B"])
    return out


def _match_module(converter: Converter, hf_name: str, source: Path) -> tuple[str, int]:
    for template in converter.peft_modules:
        pattern = re.escape(template).replace(r"\{i\}", r"(\d+)")
        m = re.fullmatch(pattern, hf_name)
        if m is not None:
            return template, int(m.group(1))
    raise CheckpointError(f"{source}: module {hf_name!r} is not one headwise can map for "
                          f"{converter.model_type[0]} ({converter.peft_model_class}); "
                          f"supported: {sorted(converter.peft_modules)}")


# alpha_pattern keys are regular expressions in PEFT; headwise accepts module names only
# ('.' still matches any character), so a pattern from a file can never backtrack for minutes.
_MODULE_NAME = re.compile(r"[A-Za-z0-9_.]{1,200}")


def _alpha(cfg: dict[str, Any], name: str, path: Path) -> float:
    """The ``lora_alpha`` of module ``name``: its ``alpha_pattern`` entry, else the global one
    (PEFT's ``get_pattern_key`` semantics).

    Raises:
        CheckpointError: a pattern that is not a module name, or an alpha that is not a finite
            positive number (naming the field).
    """
    patterns = cfg.get("alpha_pattern") or {}
    if not isinstance(patterns, dict):
        raise CheckpointError(f"{path}: alpha_pattern: expected an object of module names")
    field, value = "lora_alpha", cfg.get("lora_alpha", 8)
    for key, alpha in patterns.items():
        if not _MODULE_NAME.fullmatch(key):
            raise CheckpointError(f"{path}: alpha_pattern: key {show(key, 80)} is not a module "
                                  "name (letters, digits, '_' and '.'); headwise does not run "
                                  "regular expressions from adapter files")
        if re.match(rf"(.*\.)?({key})$", name):
            field, value = f"alpha_pattern.{key}", alpha
            break
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise CheckpointError(f"{path}: {field}: got {show(value, 80)}, expected a finite "
                              "number > 0")
    return float(value)


def _base(model: nn.Module, name: str) -> nn.Linear:
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise CheckpointError(f"import_peft: the model has no module {name}") from None
    if isinstance(module, LoRALinear):
        raise ValueError("import_peft: the model already has LoRA adapters; remove_lora first")
    assert isinstance(module, nn.Linear)
    return module


def _out_features(model: nn.Module, name: str) -> int:
    module = model.get_submodule(name)
    assert isinstance(module, (nn.Linear, LoRALinear))
    return int(module.out_features)


def _template(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if m is None:
        raise ValueError(f"{name}: expected a module under blocks.<layer>")
    return f"blocks.{{i}}.{m.group(2)}", int(m.group(1))
