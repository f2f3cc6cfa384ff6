"""The starting model a trained model is compared with: its adapters switched off, or a copy.

``capture_base(model)`` is called before training and returns the model's ``BaseReference``
(kept on the model, so the levers planned on it find the same one: ``base_of(model)``):

- when every trainable parameter of the model is a LoRA factor (``headwise.control.lora``),
  the base is the model itself with its adapters switched off (``lora_disabled``): nothing is
  copied, and the base's outputs are bit-identical to the model's before ``apply_lora``;
- otherwise it is a frozen deep copy of the model as captured (weights, masks, gates, adapters):
  one more copy of the weights, kept on the model's device (and moved with it).

``with base.model() as m:`` runs ``m`` (the base) in eval mode and under ``torch.no_grad()``;
structural masks and gates installed before the capture are part of the base in both cases.
``base.forward(tokens, ...)`` is the one start forward of a training step that every
distillation lever reads (the final hidden states and the attention patterns the levers asked
for with ``want_patterns``): levers on the same batch share it instead of running one each.
``preserve`` clauses (``headwise.contract.preserve``) measure against it and their
distillation levers (``headwise.control.distill``) pull towards it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control.lora import lora_disabled, lora_modules
from headwise.memory import check_memory
from headwise.model.eval_mode import eval_mode
from headwise.model.hook_point import Hook, HookContext


class BaseReference:
    """The starting model of ``model`` (see the module docstring); build with ``capture_base``.

    Args:
        model: the model being trained.
        frozen: its frozen copy, or ``None`` when the base is ``model`` with adapters off.
    """

    def __init__(self, model: nn.Module, frozen: nn.Module | None) -> None:
        self._model = model
        self._frozen = frozen
        self._patterns: dict[int, set[int]] = {}  # layer -> heads whose patterns levers read
        self._last: tuple[tuple[Any, ...], Tensor, dict[int, Tensor]] | None = None

    @property
    def shares_weights(self) -> bool:
        """Whether the base is the trained model with its adapters switched off (no copy)."""
        return self._frozen is None

    @property
    def copied_bytes(self) -> int:
        """Bytes of parameters and buffers the reference holds beyond the model's own."""
        if self._frozen is None:
            return 0
        tensors = [*self._frozen.parameters(), *self._frozen.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    @contextlib.contextmanager
    def model(self) -> Iterator[Any]:
        """The base model (a headwise Transformer) for the ``with`` block: eval mode, no
        gradient, adapters off (when it shares the trained model's weights); every state is
        restored afterwards."""
        m = self._model if self._frozen is None else self._follow()
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(eval_mode(m))
            if self._frozen is None:
                stack.enter_context(lora_disabled(m))
            yield m

    def want_patterns(self, layer: int, heads: Iterable[int]) -> None:
        """Have ``forward`` also capture these heads' attention patterns in ``layer``."""
        self._patterns.setdefault(layer, set()).update(heads)
        self._last = None

    def pattern_heads(self, layer: int) -> tuple[int, ...]:
        """The heads of ``layer`` whose patterns ``forward`` captures, ascending."""
        return tuple(sorted(self._patterns.get(layer, ())))

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None,
                task_ids: Tensor | None = None) -> tuple[Tensor, dict[int, Tensor]]:
        """The base's final hidden states (B, T, D) and the wanted patterns ``{layer: (B, h, T,
        T)}`` (heads as ``pattern_heads``), without gradient; run once per batch: a second
        call on the same tensors (another lever of the same step) returns the same result.

        The base does not change while the model trains (its adapters are off and only they
        train, or it is a frozen copy), so the result of the last batch stays valid; it is
        kept until the next batch (the tensors themselves are the key).
        """
        key = (tokens, attention_mask, task_ids)
        if self._last is not None and all(a is b for a, b in zip(self._last[0], key,
                                                                  strict=True)):
            return self._last[1], self._last[2]
        self._last = None
        patterns: dict[int, Tensor] = {}

        def grab(layer: int) -> Any:
            def fn(x: Tensor, ctx: HookContext) -> None:
                patterns[layer] = x
            return fn
        hooks = [Hook(f"blocks.{l}.attn.hook_pattern", grab(l), self.pattern_heads(l),
                      read_only=True) for l in sorted(self._patterns)]
        with self.model() as m, m.hooks(*hooks):
            hidden = m.hidden(tokens, attention_mask=attention_mask, task_ids=task_ids)
        self._last = (key, hidden, patterns)
        return hidden, patterns

    def _follow(self) -> nn.Module:
        """The frozen copy, moved to the trained model's device if that moved (verification
        runs on the CPU after training on an accelerator)."""
        assert self._frozen is not None
        here = next(self._model.parameters()).device
        if next(self._frozen.parameters()).device != here:
            self._frozen.to(here)
        return self._frozen


def _only_adapters_train(model: nn.Module) -> bool:
    """Whether the model has adapters and every trainable parameter is one of their factors."""
    adapters = lora_modules(model)
    if not adapters:
        return False
    factors = {id(p) for m in adapters.values() for p in (m.lora_A, m.lora_B)}
    return all(id(p) in factors for p in model.parameters() if p.requires_grad)


def capture_base(model: nn.Module) -> BaseReference:
    """Take the starting model of ``model`` now (before training) and keep it on the model.

    Raises:
        ValueError: the model already has a base reference, or its adapters are merged.
        ResourceError: the frozen copy would not fit in memory.
    """
    if base_of(model) is not None:
        raise ValueError("capture_base: the model already has a base reference (captured "
                         "before training); use base_of(model)")
    if any(m.merged for m in lora_modules(model).values()):
        raise ValueError("capture_base: adapters are merged; unmerge_lora first")
    if _only_adapters_train(model):
        ref = BaseReference(model, None)
    else:
        size = sum(t.numel() * t.element_size()
                   for t in (*model.parameters(), *model.buffers()))
        check_memory("the frozen copy of the starting model (preserve clauses)", size)
        frozen = copy.deepcopy(model).eval()
        frozen.requires_grad_(False)
        ref = BaseReference(model, frozen)
    model.__dict__["base_reference"] = ref  # a plain attribute: never in the state dict
    return ref


def base_of(model: nn.Module) -> BaseReference | None:
    """The base reference ``capture_base`` kept on ``model``, or ``None``."""
    ref = model.__dict__.get("base_reference")
    return ref if isinstance(ref, BaseReference) else None
