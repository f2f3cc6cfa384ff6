"""Tiny models with LoRA adapters on q and v whose B is non-zero, for tests of adapter files."""

from __future__ import annotations

import torch

from headwise.config import ModelConfig
from headwise.control.lora import apply_lora
from headwise.model import build_model


def lora_model(config: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """A model built from ``config`` with rank-2 adapters (alpha 4) on ``q_proj`` and ``v_proj``.

    ``B`` is drawn from a normal distribution seeded by ``seed`` (LoRA zero-initialises it), so
    two seeds give two different adapters and a file that lost the adapter shows.
    """
    model = build_model(config, seed=seed)
    apply_lora(model, ("q_proj", "v_proj"), rank=2, alpha=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(generator=torch.Generator().manual_seed(seed))
    return model
