"""Checks on model inputs where data enters from outside: shapes, dtypes and id ranges.

``forward`` checks shapes and dtypes only (no host synchronisation on the hot path); the ranges
of token and task ids are checked once per batch of outside data by ``check_tokens``
(``run_with_cache``, data mixtures and the CLI call it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.model.hook_point import tree_memo

_ID_DTYPES = (torch.long, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_tokens(tokens: Tensor, vocab_size: int, attention_mask: Tensor | None = None,
                 task_ids: Tensor | None = None, n_tasks: int | None = None) -> None:
    """Check model inputs where they enter: shapes, dtype, token ids and task ids ranges.

    Reads the ids' minima and maxima on the host (one synchronisation): call it once per
    batch of outside data, not inside a training step.

    Args:
        n_tasks: check ``task_ids`` against ``[0, n_tasks)`` (models with task gates); without
            it, task ids must still be >= 0 (a negative id would index from the end).

    Raises:
        ValueError: naming the tensor whose shape, dtype or range is wrong.
    """
    check_shapes(tokens, attention_mask, task_ids)
    if tokens.numel():
        low, high = torch.stack([tokens.min(), tokens.max()]).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(f"tokens: ids must lie in [0, {vocab_size}), got range "
                             f"[{low}, {high}]")
    if task_ids is not None and task_ids.numel():
        low, high = torch.stack([task_ids.min(), task_ids.max()]).tolist()
        if low < 0 or (n_tasks is not None and high >= n_tasks):
            expected = f"ids in [0, {n_tasks})" if n_tasks is not None else "ids >= 0"
            raise ValueError(f"task_ids: got range [{low}, {high}], expected {expected}")


def gate_tasks(model: nn.Module) -> int | None:
    """The number of tasks the model's installed head gates take (``None``: no gates); found
    by one walk of the module tree, kept until a module is registered (``tree_memo``)."""
    n_tasks: int | None = tree_memo(model, "gate_tasks", _walk_gates)
    return n_tasks


def _walk_gates(model: nn.Module) -> int | None:
    gates = [getattr(m, "head_gate", None) for m in model.modules()]
    counts = [int(getattr(g, "n_tasks", 1)) for g in gates if isinstance(g, nn.Module)]
    return max(counts) if counts else None


def check_shapes(tokens: Tensor, attention_mask: Tensor | None,
                 task_ids: Tensor | None) -> None:
    """Check the shapes and dtype of model inputs (no host synchronisation).

    Raises:
        ValueError: naming the tensor whose shape or dtype is wrong.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        got = (f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor)
               else type(tokens).__name__)
        raise ValueError(f"tokens: expected a (B, T) long tensor, got {got}")
    if tokens.is_meta:  # no data: the forward would compute on nothing and return garbage
        raise ValueError("tokens: got a tensor on the meta device, expected token ids with data")
    if attention_mask is not None and attention_mask.shape != tokens.shape:
        raise ValueError(f"attention_mask: expected shape {tuple(tokens.shape)} like tokens, "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask is not None and (attention_mask.is_floating_point()
                                       or attention_mask.is_complex()):
        raise ValueError(f"attention_mask: expected a bool or integer tensor of 0/1 (1: "
                         f"attend), got {attention_mask.dtype} (a float mask would be read "
                         "as keep-or-drop, never as weights)")
    if task_ids is not None and task_ids.shape != tokens.shape[:1]:
        raise ValueError(f"task_ids: expected shape ({tokens.shape[0]},), "
                         f"got {tuple(task_ids.shape)}")
    if task_ids is not None and task_ids.dtype not in _ID_DTYPES:
        raise ValueError(f"task_ids: expected an integer tensor, got {task_ids.dtype}")
