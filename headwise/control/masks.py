"""Per-head structural attention masks, installed into the attention modules' ``head_mask`` slot.

A mask says which keys a query may attend to: ``allowed[i, j]`` is True when query position
``i`` may read key position ``j``. The attention module ANDs it with its own causal and padding
masks, so e.g. ``local(3)`` in a causal model means "self and the two previous tokens". A query
row with no allowed key (position 0 under ``previous_token``) gives a zero pattern and a zero
output, never NaN. Masks reach SDPA's ``attn_mask`` argument on the fused path: masking a head
materialises no pattern (``attn.explicit_heads()`` stays empty).

Example::

    handle = apply_masks(model, {"L0.H0": previous_token(), "L0.H1-2": local(4)})
    ...
    handle.remove()   # or remove_masks(model), or use ``with apply_masks(...):``
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control._common import as_headset, attention, model_shape
from headwise.memory import check_memory
from headwise.patterns import position_support

MaskFn = Callable[[int, torch.device], Tensor]


@dataclass(frozen=True)
class MaskSpec:
    """A named mask rule; ``build(T, device)`` gives the (T, T) bool matrix (True = may attend).

    Build one with the constructors of this module (``previous_token()``, ``local(4)``, ...).
    """

    name: str
    fn: MaskFn = field(repr=False, compare=False)

    def build(self, T: int, device: torch.device | str = "cpu") -> Tensor:
        """The mask for ``T`` positions: (T, T) bool.

        Raises:
            ValueError: the rule cannot cover ``T`` positions (e.g. a smaller fixed matrix).
        """
        out = self.fn(T, torch.device(device))
        if out.shape != (T, T) or out.dtype != torch.bool:
            raise ValueError(f"mask {self.name}: built {tuple(out.shape)} {out.dtype}, "
                             f"expected ({T}, {T}) bool")
        return out


def causal() -> MaskSpec:
    """``j <= i``: each position sees itself and earlier positions."""
    return MaskSpec("causal", lambda T, d: torch.ones(T, T, dtype=torch.bool, device=d).tril())


def previous_token() -> MaskSpec:
    """``j == i - 1``: only the previous token (row 0 has no allowed key: zero output).

    The ``previous_token`` role's support (``headwise.patterns``), as every role mask here.
    """
    return MaskSpec("previous_token", lambda T, d: position_support("previous_token", T, d))


def self_only() -> MaskSpec:
    """``j == i``: each position sees only itself (the ``self`` role)."""
    return MaskSpec("self_only", lambda T, d: position_support("self", T, d))


def first_token() -> MaskSpec:
    """``j == 0``: every position sees only the first position (an attention sink)."""
    return MaskSpec("first_token", lambda T, d: position_support("first_token", T, d))


def local(window: int) -> MaskSpec:
    """``|i - j| < window`` (with the model's causal mask: self and ``window - 1`` previous).

    Raises:
        ValueError: ``window`` is not a positive integer.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"local: window got {window!r}, expected an integer >= 1")
    return MaskSpec(f"local({window})", lambda T, d: position_support("local", T, d, window))


def block_diagonal(segments: int | Sequence[int]) -> MaskSpec:
    """Attention only within segments: positions in the same block see each other.

    Args:
        segments: segment lengths in order (``[3, 5]``: positions 0-2 and 3-7), or one int for
            repeating blocks of that length (covers any ``T``).

    Raises:
        ValueError: a length < 1; at build time, ``T`` beyond the sum of the lengths.
    """
    lengths = [segments] if isinstance(segments, int) else list(segments)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                          for n in lengths):
        raise ValueError(f"block_diagonal: segments got {segments!r}, expected positive "
                         "integer lengths")
    repeat = isinstance(segments, int)

    def fn(T: int, d: torch.device) -> Tensor:
        if repeat:
            seg = torch.arange(T, device=d) // lengths[0]
        else:
            if T > sum(lengths):
                raise ValueError(f"block_diagonal: segments {lengths} cover {sum(lengths)} "
                                 f"positions, the input has T={T}")
            seg = torch.repeat_interleave(torch.arange(len(lengths), device=d),
                                          torch.tensor(lengths, device=d))[:T]
        return seg[:, None] == seg[None, :]
    return MaskSpec(f"block_diagonal({segments})", fn)


def from_matrix(matrix: Tensor) -> MaskSpec:
    """A fixed (N, N) bool matrix; an input of ``T <= N`` positions uses its top-left (T, T).

    Raises:
        ValueError: ``matrix`` is not a square 2-D bool tensor; at build time, ``T > N``.
    """
    if not isinstance(matrix, Tensor) or matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        got = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f"from_matrix: matrix got shape {got}, expected a square (N, N) tensor")
    if matrix.dtype != torch.bool:
        raise ValueError(f"from_matrix: matrix got dtype {matrix.dtype}, expected torch.bool "
                         "(True = may attend)")
    m = matrix.detach().clone()
    N = m.shape[0]

    def fn(T: int, d: torch.device) -> Tensor:
        if T > N:
            raise ValueError(f"from_matrix: mask is ({N}, {N}), the input has T={T} positions")
        return m[:T, :T].to(d)
    return MaskSpec(f"from_matrix({N}x{N})", fn)


def from_graph(edges: Iterable[tuple[int, int]], n: int | None = None) -> MaskSpec:
    """Allowed pairs from edges ``(query, key)``; positions beyond ``n`` have no allowed key.

    Args:
        edges: ``(i, j)`` pairs meaning "position i may attend to position j" (directed).
        n: the number of positions the graph describes (default: largest index + 1).

    Raises:
        ValueError: a negative index or a pair that is not two integers.
    """
    pairs = [tuple(e) for e in edges]
    for e in pairs:
        if len(e) != 2 or not all(isinstance(v, int) and v >= 0 for v in e):
            raise ValueError(f"from_graph: edge {e!r}, expected a (query, key) pair of "
                             "non-negative ints")
    size = n if n is not None else max((max(e) for e in pairs), default=-1) + 1
    if any(max(e) >= size for e in pairs):
        raise ValueError(f"from_graph: an edge index is >= n={size}")
    check_memory(f"from_graph: a {size} x {size} mask (n={size})", size * size)
    matrix = torch.zeros(size, size, dtype=torch.bool)
    for i, j in pairs:
        matrix[i, j] = True

    def fn(T: int, d: torch.device) -> Tensor:
        out = torch.zeros(T, T, dtype=torch.bool, device=d)
        k = min(T, size)
        out[:k, :k] = matrix[:k, :k].to(d)
        return out
    return MaskSpec(f"from_graph({len(pairs)} edges)", fn)


class LayerMask:
    """The ``head_mask`` callable of one layer: per-head specs, optionally per task.

    ``mask(T, task_ids, device)`` returns (H, T, T) bool, or (B, H, T, T) when task-specific
    specs exist and ``task_ids`` is given. Heads without a spec are all True (the model's own
    causal and padding masks still apply).
    """

    def __init__(self, n_heads: int, default: dict[int, MaskSpec],
                 per_task: dict[int, dict[int, MaskSpec]]) -> None:
        self.n_heads = n_heads
        self.default = default
        self.per_task = per_task
        self._cache: dict[tuple[Any, ...], Tensor] = {}
        self._task_cache: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}

    def _table(self, specs: dict[int, MaskSpec], T: int, device: torch.device) -> Tensor:
        out = torch.ones(self.n_heads, T, T, dtype=torch.bool, device=device)
        for h, spec in specs.items():
            out[h] = spec.build(T, device)
        return out  # (H, T, T)

    def _task_tables(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Every task's table stacked (n, H, T, T), and ``lookup`` (m + 2,) from task id to row.

        ``m`` is the largest task id with its own specs; ids without specs (and ids above ``m``,
        clamped to ``m + 1``) read row 0, the default table. Built once per ``(T, device)``.
        """
        key = (T, str(device))
        if key not in self._task_cache:
            ids = sorted(self.per_task)
            tables = [self(T, None, device)] + [
                self._table({**self.default, **self.per_task[t]}, T, device) for t in ids]
            lookup = torch.zeros(ids[-1] + 2, dtype=torch.long)
            lookup[ids] = torch.arange(1, len(ids) + 1)
            self._task_cache[key] = (torch.stack(tables), lookup.to(device))
        return self._task_cache[key]

    def __call__(self, T: int, task_ids: Tensor | None, device: torch.device) -> Tensor:
        key = (T, str(device))
        if key not in self._cache:
            self._cache[key] = self._table(self.default, T, device)
        base = self._cache[key]
        if not self.per_task or task_ids is None:
            return base
        # Tensor indexing only: reading the largest id on the host would sync every step.
        tables, lookup = self._task_tables(T, device)
        rows = lookup[task_ids.clamp(max=lookup.numel() - 1)]  # (B,)
        return tables[rows]  # (B, H, T, T)


class MaskHandle:
    """Installed masks; ``remove()`` (or leaving a ``with`` block) restores the previous slots."""

    def __init__(self, model: nn.Module, previous: dict[int, Any]) -> None:
        self.model = model
        self.previous = previous

    def remove(self) -> None:
        """Put back whatever each layer's ``head_mask`` held before ``apply_masks``."""
        for layer, old in self.previous.items():
            attention(self.model, layer).head_mask = old
        self.previous = {}

    def __enter__(self) -> MaskHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _resolve(model: nn.Module, assignment: Mapping[Any, MaskSpec], what: str
             ) -> dict[int, dict[int, MaskSpec]]:
    out: dict[int, dict[int, MaskSpec]] = {}
    for sel, spec in assignment.items():
        if not isinstance(spec, MaskSpec):
            raise ValueError(f"{what}[{sel!r}]: got {type(spec).__name__}, expected a MaskSpec "
                             "(e.g. previous_token(), local(4), from_matrix(m))")
        for head in as_headset(model, sel, f"{what}[{sel!r}]"):
            layer = out.setdefault(head.layer, {})
            if head.head in layer:
                raise ValueError(f"{what}: {head} is assigned two masks "
                                 f"({layer[head.head].name} and {spec.name})")
            layer[head.head] = spec
    return out


def apply_masks(model: nn.Module, assignment: Mapping[Any, MaskSpec],
                task_masks: Mapping[int, Mapping[Any, MaskSpec]] | None = None) -> MaskHandle:
    """Install per-head masks into ``model.blocks[l].attn.head_mask``.

    Args:
        model: a headwise Transformer.
        assignment: head selector (str, ``Head`` or ``HeadSet``) -> mask, for every example.
        task_masks: task id -> {selector: mask}; for examples whose ``task_ids`` equal that id
            these override ``assignment`` for the heads they name.

    Returns:
        A handle whose ``remove()`` restores the previous slots (also a context manager).

    Raises:
        SelectorError: a selector is malformed or out of range.
        ValueError: a value is not a ``MaskSpec``, a head gets two masks, or a task id < 0.
    """
    _, n_heads, _, _ = model_shape(model)
    default = _resolve(model, assignment, "assignment")
    per_task: dict[int, dict[int, dict[int, MaskSpec]]] = {}
    for t, masks in (task_masks or {}).items():
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"task_masks: task id got {t!r}, expected an integer >= 0")
        for layer, specs in _resolve(model, masks, f"task_masks[{t}]").items():
            per_task.setdefault(layer, {})[t] = specs
    previous: dict[int, Any] = {}
    for layer in sorted(set(default) | set(per_task)):
        attn = attention(model, layer)
        previous[layer] = attn.head_mask
        attn.head_mask = LayerMask(n_heads, default.get(layer, {}), per_task.get(layer, {}))
    return MaskHandle(model, previous)


def remove_masks(model: nn.Module) -> None:
    """Remove every mask ``apply_masks`` installed in ``model`` (slots back to ``None``)."""
    n_layers, _, _, _ = model_shape(model)
    for layer in range(n_layers):
        attn = attention(model, layer)
        if isinstance(attn.head_mask, LayerMask):
            attn.head_mask = None
