"""``Converter`` and ``Rule``: what a HuggingFace family's converter is (data, no registry).

A converter is data plus two functions: the HF-prefixes to strip, the config translators (HF ->
ours, and ours -> HF for export), a table ``our parameter name -> Rule`` (``{i}`` stands for the
layer index), and patterns of HF keys that are known and deliberately unused. The generic code
in ``headwise.interop.load`` applies the table; ``headwise.interop.hf_export`` applies the same
table in reverse (``Rule.join``); family modules (``gpt2``, ``bert``, ``llama``) hold every
family difference, and ``headwise.interop.registry`` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from headwise.config import ModelConfig


@dataclass(frozen=True)
class Rule:
    """How one of our tensors is read from an HF tensor.

    Applied in this order: ``transpose`` (HF ``Conv1D`` stores ``(in, out)``), then ``split``
    ``(k, n)``: take part ``k`` of ``n`` equal chunks along the output axis (fused q/k/v).

    Args:
        hf: HF key template (``{i}`` = layer index), after prefix stripping.
        transpose: the HF tensor is stored transposed.
        split: ``(part, n_parts)`` of a fused tensor, or ``None``.
    """

    hf: str
    transpose: bool = False
    split: tuple[int, int] | None = None

    def hf_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        """The HF tensor shape this rule expects, given our tensor's shape."""
        shape = list(ours)
        if self.split is not None:
            shape[0] *= self.split[1]
        if self.transpose:
            shape = shape[::-1]
        return tuple(shape)

    def apply(self, tensor: Tensor) -> Tensor:
        """Our tensor from the HF tensor (shape already checked)."""
        if self.transpose:
            tensor = tensor.t()
        if self.split is not None:
            part, n = self.split
            tensor = tensor.chunk(n, dim=0)[part]
        return tensor.contiguous()

    @staticmethod
    def join(pieces: list[tuple[Rule, Tensor]]) -> Tensor:
        """The HF tensor that ``apply`` reads our tensors from: its inverse (used for export).

        Args:
            pieces: ``(rule, our tensor)`` for every rule naming the same HF key (the q, k and v
                parts of a fused tensor, or a single rule).

        Raises:
            ValueError: the rules disagree, or a part of a fused tensor is missing.
        """
        first = pieces[0][0]
        if any(r.hf != first.hf or r.transpose != first.transpose or
               (r.split is None) != (first.split is None) for r, _ in pieces):
            raise ValueError(f"rules for {first.hf!r} disagree: {[r for r, _ in pieces]}")
        if first.split is None:
            if len(pieces) != 1:
                raise ValueError(f"{first.hf!r}: {len(pieces)} tensors map to one unsplit key")
            tensor = pieces[0][1]
        else:
            n = first.split[1]
            parts = {r.split[0]: t for r, t in pieces if r.split is not None}
            if sorted(parts) != list(range(n)) or len(pieces) != n:
                raise ValueError(f"{first.hf!r}: got parts {sorted(parts)}, expected 0..{n - 1}")
            tensor = torch.cat([parts[k] for k in range(n)], dim=0)
        if first.transpose:
            tensor = tensor.t()
        return tensor.contiguous()


@dataclass(frozen=True)
class Converter:
    """Everything family-specific about reading one HF architecture.

    Args:
        model_type: HF ``config.json`` ``model_type`` values this converter reads.
        config_from_hf: translate HF ``config.json`` (a dict) into our ``ModelConfig``;
            raises ``CheckpointError`` naming an unsupported field.
        global_keys: rules for parameters outside the blocks (embeddings, final norm, unembed).
        layer_keys: rules for ``blocks.{i}.*`` parameters.
        prefixes: HF key prefixes to strip (e.g. ``"transformer."`` of ``GPT2LMHeadModel``).
        ignored: regexes of HF keys that are known and unused (buffers, task heads we drop).
        rename: optional normaliser for legacy HF key spellings (e.g. ``gamma`` -> ``weight``).
        peft_modules: HF module path (relative to ``peft_model_class``) -> our module paths it
            holds, in order along its output axis (several for a fused module such as GPT-2's
            ``c_attn`` = q|k|v); used by ``peft_export``.
        peft_model_class: the HF class whose module names PEFT keys follow.
        peft_task_type: PEFT ``task_type`` for that class (``None``: a plain ``PeftModel``).
        peft_fan_in_fan_out: the HF modules are ``Conv1D`` (weights stored ``(in, out)``).
        config_to_hf: for export, our config -> HF ``config.json`` (with ``model_type`` and
            ``architectures``); raises ``ConfigError`` naming a field with no HF equivalent.
        export_prefix: prefix of the exported HF class's base model (``transformer.``).
        head_keys: HF keys (as in the tables) that sit outside that prefix (``lm_head.weight``).
        mlm_head_keys: our ``mlm_head.*`` parameters -> the HF keys of the family's masked-LM
            head (``headwise.interop.mlm_head``); empty: the family has none.
        mlm_export: the HF class and base-model key prefix of a checkpoint with that head.
    """

    model_type: tuple[str, ...]
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    global_keys: dict[str, Rule]
    layer_keys: dict[str, Rule]
    prefixes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    rename: Callable[[str], str] | None = None
    peft_modules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    peft_model_class: str = ""
    peft_task_type: str | None = None
    peft_fan_in_fan_out: bool = False
    config_to_hf: Callable[[ModelConfig], dict[str, Any]] | None = None
    export_prefix: str = ""
    head_keys: tuple[str, ...] = ()
    mlm_head_keys: dict[str, Rule] = field(default_factory=dict)
    mlm_export: tuple[str, str] = ("", "")

    def rule_for(self, our_key: str) -> Rule | None:
        """The rule producing ``our_key`` (layer index substituted), or ``None``."""
        if our_key in self.global_keys:
            return self.global_keys[our_key]
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", our_key)
        if m is None:
            return None
        template = self.layer_keys.get(f"blocks.{{i}}.{m.group(2)}")
        if template is None:
            return None
        return Rule(template.hf.format(i=m.group(1)), template.transpose, template.split)

    def is_ignored(self, hf_key: str) -> bool:
        """Whether an HF key is known and deliberately unused."""
        return any(re.fullmatch(p, hf_key) for p in self.ignored)
