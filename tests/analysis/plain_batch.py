"""A batch the analysis tests build by hand: tokens and targets, with an optional padding mask
and task ids (``headwise.data.Batch`` requires task ids; these tests also run without)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class B:
    tokens: torch.Tensor
    targets: torch.Tensor
    attention_mask: torch.Tensor | None = None
    task_ids: torch.Tensor | None = None
