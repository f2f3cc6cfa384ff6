"""Batch: the tensors one training step consumes, and the shared vocabulary layout.

Vocabulary layout shared by every built-in synthetic task, so that several tasks can train one
model with one embedding table:

=====  =========  ==========================================================================
id     name       meaning
=====  =========  ==========================================================================
0      ``PAD``    padding (never a target; ``attention_mask`` is 0 there)
1      ``BOS``    beginning of sequence (every synthetic sequence starts with it)
2      ``SEP``    separator between a task's input and its answer (``=`` in arithmetic)
3      ``QUERY``  task-specific marker (``+`` in modular addition, the query in key-value)
4...   content    task symbols: ``CONTENT + i`` for symbol ``i``
=====  =========  ==========================================================================

Tasks draw their symbols from ``[CONTENT, vocab_size)``, so a model whose vocabulary is at least
each task's ``vocab_size`` can serve them all. Text tasks (``TextTask``) use their own vocabulary
(bytes 0-255 or a tokenizer's ids) and no special ids.

Targets follow next-token prediction: ``targets[b, t]`` is the id the model should output at
position ``t`` (already shifted), and ``IGNORE`` (-100) where nothing is scored. Loss and accuracy
are computed only where ``targets != IGNORE``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PAD = 0
BOS = 1
SEP = 2
QUERY = 3
CONTENT = 4
IGNORE = -100


@dataclass(frozen=True)
class Batch:
    """One batch of examples.

    Attributes:
        tokens: (B, T) long input ids.
        targets: (B, T) long target ids, ``IGNORE`` (-100) where not scored.
        attention_mask: (B, T) long, 1 for real tokens and 0 for padding; ``None`` if no padding.
        task_ids: (B,) long index of each example's task (0 for a single task; a ``Mixture``
            writes the index of the task in ``mixture.names``).
    """

    tokens: Tensor
    targets: Tensor
    attention_mask: Tensor | None
    task_ids: Tensor

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2 or self.tokens.dtype != torch.long:
            raise ValueError(f"Batch.tokens: expected a (B, T) long tensor, got "
                             f"{tuple(self.tokens.shape)} {self.tokens.dtype}")
        if self.targets.shape != self.tokens.shape or self.targets.dtype != torch.long:
            raise ValueError(f"Batch.targets: expected a long tensor of shape "
                             f"{tuple(self.tokens.shape)}, got {tuple(self.targets.shape)} "
                             f"{self.targets.dtype}")
        if self.attention_mask is not None and self.attention_mask.shape != self.tokens.shape:
            raise ValueError(f"Batch.attention_mask: expected shape {tuple(self.tokens.shape)}, "
                             f"got {tuple(self.attention_mask.shape)}")
        if self.task_ids.shape != self.tokens.shape[:1]:
            raise ValueError(f"Batch.task_ids: expected shape ({self.tokens.shape[0]},), "
                             f"got {tuple(self.task_ids.shape)}")

    @property
    def size(self) -> int:
        """Number of examples B."""
        return int(self.tokens.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device``."""
        mask = self.attention_mask.to(device) if self.attention_mask is not None else None
        return Batch(self.tokens.to(device), self.targets.to(device), mask,
                     self.task_ids.to(device))

    def slice(self, start: int, stop: int) -> Batch:
        """Examples ``start:stop`` (a data-parallel shard)."""
        mask = self.attention_mask[start:stop] if self.attention_mask is not None else None
        return Batch(self.tokens[start:stop], self.targets[start:stop], mask,
                     self.task_ids[start:stop])

    def with_task_id(self, task_id: int) -> Batch:
        """The same batch with every example's task id set to ``task_id``."""
        return Batch(self.tokens, self.targets, self.attention_mask,
                     torch.full_like(self.task_ids, task_id))
