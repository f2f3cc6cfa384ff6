"""Checks on model inputs where data enters from outside: shapes, dtypes and id ranges.

``forward`` checks shapes and dtypes, and the ranges of task and segment ids that live on the
host (``check_host_ids``: reading them costs no synchronisation); it never reads ids on an
accelerator, which would synchronise every step. The ranges of token ids, and of task ids on
any device, are checked once per batch of outside data by ``check_tokens``
(``run_with_cache``, data mixtures and the CLI call it); a task gate never wraps a negative id
to the last task (``headwise.control.gates`` selects with ``index_select``, which refuses it).

``task_ids`` given to a model without task gates or per-task masks are accepted and change
nothing: a batch from a data mixture carries every example's task whatever levers the model
has, so one call serves a model with or without them. Negative ids are refused all the same.
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
    if task_ids is not None:
        _check_range("task_ids", task_ids, n_tasks)


def check_host_ids(task_ids: Tensor | None, n_tasks: int | None,
                   token_type_ids: Tensor | None, n_token_types: int) -> None:
    """Check the ranges of task and segment ids that live on the host (the forward's check:
    no synchronisation; ids on an accelerator are left to ``check_tokens``).

    Args:
        n_tasks: the tasks the model's gates take (``None``: no gates; ids must be >= 0).
        n_token_types: the model's segment embedding size (0: none).

    Raises:
        ValueError: naming the tensor whose ids are out of range, and the range expected.
    """
    if task_ids is not None and task_ids.device.type == "cpu":
        _check_range("task_ids", task_ids, n_tasks)
    if token_type_ids is not None and token_type_ids.device.type == "cpu":
        _check_range("token_type_ids", token_type_ids, n_token_types)


def _check_range(name: str, ids: Tensor, n: int | None) -> None:
    """Refuse ids below 0 or (with ``n``) at or above ``n``, naming the tensor. The test is a
    tensor assertion (``torch._assert_async``: on the host it raises at once, and a valid
    batch is never converted to a Python value, so a training step stays free of host
    reads); only a failing batch's minimum and maximum are read, for the message."""
    if not ids.numel():
        return
    ok = (ids >= 0) if n is None else (ids >= 0) & (ids < n)
    try:
        torch._assert_async(ok.all())
    except RuntimeError:
        low, high = torch.stack([ids.min(), ids.max()]).tolist()
        expected = f"ids in [0, {n})" if n is not None else "ids >= 0"
        raise ValueError(f"{name}: got range [{low}, {high}], expected {expected}") from None


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
                 task_ids: Tensor | None, token_type_ids: Tensor | None = None) -> None:
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
    check_mask_type(attention_mask)
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
    if token_type_ids is not None and (token_type_ids.shape != tokens.shape
                                       or token_type_ids.dtype not in _ID_DTYPES):
        raise ValueError(f"token_type_ids: expected an integer tensor of shape "
                         f"{tuple(tokens.shape)} like tokens, got "
                         f"{tuple(token_type_ids.shape)} {token_type_ids.dtype}")


def check_mask_type(attention_mask: object) -> None:
    """Refuse an ``attention_mask`` that is not a tensor, with one line. The forward's second
    positional argument is the mask, where TransformerLens's is ``return_type``: ``model(tokens,
    "loss")`` lands here.

    Raises:
        ValueError: naming the argument and what was given.
    """
    if attention_mask is not None and not isinstance(attention_mask, Tensor):
        raise ValueError(f"attention_mask: got {type(attention_mask).__name__} "
                         f"{attention_mask!r:.40}, expected a (B, T) tensor or None (the second "
                         "positional argument is the mask: return_type and the other "
                         "TransformerLens options are keyword arguments)")
