"""BERT's masked-LM head in checkpoints: read ``cls.predictions`` when a checkpoint has one,
write it back on export when the model's head came from one.

A family declares its head's keys in its converter (``Converter.mlm_head_keys``: our
``mlm_head.*`` name -> HF key) and the class and base-model prefix a checkpoint with the head
uses (``Converter.mlm_export``: ``("BertForMaskedLM", "bert.")``). The decoder is tied to the
word embeddings in transformers (its weight and bias are the embeddings and
``cls.predictions.bias``), so its keys, when a checkpoint stores them, are not read.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.config import ModelConfig
from headwise.errors import CheckpointError
from headwise.interop.converter import Converter
from headwise.model import MLMHead, build_mlm_head
from headwise.training.safetensors_io import check_finite

PREFIX = "mlm_head."


def read_mlm_head(converter: Converter, config: ModelConfig, hf: dict[str, Tensor],
                  source: str, dtype: torch.dtype = torch.float32) -> MLMHead | None:
    """The checkpoint's masked-LM head, or ``None`` when it has none.

    Args:
        converter: the family converter.
        config: our config of the checkpoint.
        hf: the checkpoint's tensors by HF key, prefixes stripped.
        source: named in errors (the directory).
        dtype: floating tensors are cast to this dtype.

    Raises:
        CheckpointError: only part of the head present, a wrong shape or a non-finite value.
    """
    rules = converter.mlm_head_keys
    if not any(r.hf in hf for r in rules.values()):
        return None
    head = build_mlm_head(config, seed=0, added=False)
    shapes = {PREFIX + k: tuple(v.shape) for k, v in head.state_dict().items()}
    state = {}
    for key, shape in shapes.items():
        rule = rules[key]
        if rule.hf not in hf:
            raise CheckpointError(f"{source}: missing key {rule.hf!r} (the masked-LM head is "
                                  "incomplete)")
        if tuple(hf[rule.hf].shape) != rule.hf_shape(shape):
            raise CheckpointError(f"{source}: key {rule.hf!r}: got shape "
                                  f"{tuple(hf[rule.hf].shape)}, expected {shape}")
        tensor = rule.apply(hf[rule.hf]).to(dtype)
        check_finite(tensor, source, rule.hf, f" (as {dtype})")
        state[key.removeprefix(PREFIX)] = tensor
    head.load_state_dict(state)
    return head.to(dtype)


def split_mlm_head(converter: Converter, model: nn.Module, state: dict[str, Tensor]
                   ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Our state dict without the head, and the head's tensors under HF keys to write.

    A head the model's checkpoint had (``MLMHead.added`` false) is written back; a head added
    for training is dropped, so the export is the kind of model it came from.

    Raises:
        ConfigError: never; a family without an MLM head gets the head dropped.
    """
    body = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
    head = getattr(model, "mlm_head", None)
    if head is None or head.added or not converter.mlm_head_keys:
        return body, {}
    return body, {converter.mlm_head_keys[k].hf: v.detach().cpu().contiguous()
                  for k, v in state.items() if k.startswith(PREFIX)}
