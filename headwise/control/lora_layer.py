"""LoRALinear: a low-rank adapter wrapping an ``nn.Linear``, optionally scoped to rows/columns.

Hu et al. (2021): ``y = base(x) + (dropout(x) A^T B^T) * scaling`` with ``A`` (r, in) drawn
kaiming-uniform (``a = sqrt(5)``, as PEFT), ``B`` (out, r) zero, ``scaling = alpha / r``. The
wrapped layer stays as ``base_layer`` (PEFT's layout), so model code never changes.

Head scoping: ``out_rows`` restricts ``B`` to some output rows (a head's rows of q/k/v: the
other rows get exactly ``+0``), ``in_cols`` restricts ``A`` to some input columns (a head's
columns of o_proj: the adapter reads only that head's ``z``). ``full_factors()`` returns the
factors padded with zeros to the full shape, so ``delta = B_full @ A_full * scaling`` exactly as
PEFT computes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.memory import check_memory

Scope = slice | Sequence[int] | None


def _normalise(scope: Scope, size: int, what: str) -> slice | list[int] | None:
    """A contiguous scope becomes a slice, others a sorted list of indices in ``[0, size)``."""
    if scope is None:
        return None
    idx = list(range(size))[scope] if isinstance(scope, slice) else sorted(set(scope))
    if not idx or any(not 0 <= i < size for i in idx):
        raise ValueError(f"{what}: got {scope!r}, expected a non-empty set of indices in "
                         f"[0, {size})")
    if idx == list(range(idx[0], idx[-1] + 1)):
        return slice(idx[0], idx[-1] + 1)
    return idx


def _count(scope: slice | list[int] | None, size: int) -> int:
    if scope is None:
        return size
    return scope.stop - scope.start if isinstance(scope, slice) else len(scope)


class LoRALinear(nn.Module):
    """An ``nn.Linear`` plus a trainable low-rank update.

    Args:
        base_layer: the Linear to adapt (kept, frozen by ``apply_lora``).
        rank: r >= 1.  alpha: scaling numerator (``scaling = alpha / r``).
        dropout: dropout on the adapter's input.
        out_rows: output rows ``B`` writes (slice or indices), or ``None`` for all.
        in_cols: input columns ``A`` reads (slice or indices), or ``None`` for all.

    Raises:
        ValueError: ``rank`` < 1, ``dropout`` outside [0, 1), or an empty/out-of-range scope.
    """

    def __init__(self, base_layer: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 out_rows: Scope = None, in_cols: Scope = None) -> None:
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank: got {rank!r}, expected an integer >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: got {dropout!r}, expected a number in [0, 1)")
        self.base_layer = base_layer
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        self.out_rows = _normalise(out_rows, base_layer.out_features, "out_rows")
        self.in_cols = _normalise(in_cols, base_layer.in_features, "in_cols")
        w = base_layer.weight
        n_in = _count(self.in_cols, base_layer.in_features)
        n_out = _count(self.out_rows, base_layer.out_features)
        check_memory(f"rank={rank} adapter on a {n_out} x {n_in} weight",
                     rank * (n_in + n_out) * w.element_size() * 4)  # A, B, grads, AdamW
        self.lora_A = nn.Parameter(torch.empty(rank, n_in, dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(n_out, rank, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disabled = False
        self.merged = False

    @property
    def weight(self) -> Tensor:
        """The base layer's weight (out, in); see ``effective_weight`` for the adapted one."""
        return self.base_layer.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base_layer.bias

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def _index(self, scope: slice | list[int], device: torch.device) -> Tensor:
        if isinstance(scope, slice):
            return torch.arange(scope.start, scope.stop, device=device)
        return torch.tensor(scope, device=device)

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        y = self.base_layer(x)
        if self.disabled or self.merged:
            return y
        d = self.dropout(x)
        if isinstance(self.in_cols, slice):
            d = d[..., self.in_cols]
        elif self.in_cols is not None:
            d = d.index_select(-1, self._index(self.in_cols, d.device))
        h = (d @ self.lora_A.t()) @ self.lora_B.t() * self.scaling  # (..., n_out)
        if self.out_rows is None:
            return y + h
        if isinstance(self.out_rows, slice):
            return y + F.pad(h, (self.out_rows.start, self.out_features - self.out_rows.stop))
        return y.index_add(-1, self._index(self.out_rows, y.device), h)

    def full_factors(self) -> tuple[Tensor, Tensor]:
        """``(A_full (r, in), B_full (out, r))``, zero outside the scope (differentiable)."""
        A: Tensor = self.lora_A
        B: Tensor = self.lora_B
        if self.in_cols is not None:
            A = A.new_zeros(self.rank, self.in_features).index_copy(
                1, self._index(self.in_cols, A.device), A)
        if self.out_rows is not None:
            B = B.new_zeros(self.out_features, self.rank).index_copy(
                0, self._index(self.out_rows, B.device), B)
        return A, B

    def delta_weight(self) -> Tensor:
        """``B_full @ A_full * scaling`` (out, in)."""
        A, B = self.full_factors()
        return (B @ A) * self.scaling

    def effective_weight(self) -> Tensor:
        """The weight this layer applies: base + delta (unless disabled or already merged)."""
        if self.disabled or self.merged:
            return self.base_layer.weight
        return self.base_layer.weight + self.delta_weight()

    @torch.no_grad()
    def merge(self) -> None:
        """Add the delta into ``base_layer.weight`` (the adapter branch then is skipped)."""
        if not self.merged:
            self.base_layer.weight.add_(self.delta_weight())
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Subtract the delta again (restores the base weight up to float rounding)."""
        if self.merged:
            self.base_layer.weight.sub_(self.delta_weight())
            self.merged = False

    def extra_repr(self) -> str:
        return (f"rank={self.rank}, alpha={self.alpha}, out_rows={self.out_rows}, "
                f"in_cols={self.in_cols}, disabled={self.disabled}, merged={self.merged}")
