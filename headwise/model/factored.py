"""FactoredMatrix: a product ``A @ B`` kept as its two factors (TransformerLens's OV / QK form).

A head's OV circuit ``W_V^h W_O^h`` and QK circuit ``W_Q^h W_K^h^T`` are (D, D) matrices of rank
at most Dh. Stacked over L layers and H heads the dense products would take L*H*D*D numbers (68
GB in float32 for a 32 x 32-head, D = 4096 model); the factors take 2*L*H*D*Dh. ``.AB`` gives
the dense product when it is wanted; ``svd``, ``eigenvalues`` and ``norm`` work on the factors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class FactoredMatrix:
    """``M = A @ B`` for A (..., m, k) and B (..., k, n), leading (batch) axes broadcast.

    Args:
        A: left factor (..., m, k).
        B: right factor (..., k, n).

    Raises:
        ValueError: the inner dimensions differ.
    """

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.dim() < 2 or B.dim() < 2 or A.shape[-1] != B.shape[-2]:
            raise ValueError(f"FactoredMatrix: A {tuple(A.shape)} and B {tuple(B.shape)} do not "
                             "multiply (expected A (..., m, k) and B (..., k, n))")
        self.A, self.B = A, B

    @property
    def shape(self) -> torch.Size:
        """(..., m, n), the shape of the product."""
        lead = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return torch.Size([*lead, self.A.shape[-2], self.B.shape[-1]])

    @property
    def AB(self) -> Tensor:
        """The dense product (..., m, n)."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:
        """``B @ A`` (..., k, k): same non-zero eigenvalues as ``AB`` (square ``M`` only)."""
        if self.A.shape[-2] != self.B.shape[-1]:
            raise ValueError(f"BA: the product {tuple(self.shape)} is not square")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        """The transpose ``B^T A^T``."""
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __matmul__(self, other: Tensor | FactoredMatrix) -> Any:
        """``M @ other``: factored for a matrix or a ``FactoredMatrix`` (``(M @ A') @ B'``, as
        TransformerLens), a tensor (..., m) for a vector (n,)."""
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.dim() < 2:
            return (self.A @ (self.B @ other[:, None]))[..., 0]  # (..., m)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Tensor) -> Any:
        """``other @ M``: factored for a matrix, a tensor (..., n) for a vector (m,)."""
        if other.dim() < 2:
            return ((other[None] @ self.A) @ self.B)[..., 0, :]  # (..., n)
        return FactoredMatrix(other @ self.A, self.B)

    def __getitem__(self, index: Any) -> FactoredMatrix:
        """Index the leading axes only: ``OV[layer, head]`` is that head's (D, D) circuit."""
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) > len(self.shape) - 2 or any(i is Ellipsis or i is None for i in idx):
            raise IndexError(f"FactoredMatrix {tuple(self.shape)}: index {index!r} must address "
                             f"the {len(self.shape) - 2} leading axes only")
        lead = self.shape[:-2]
        A = self.A.expand(*lead, *self.A.shape[-2:])
        B = self.B.expand(*lead, *self.B.shape[-2:])
        return FactoredMatrix(A[idx], B[idx])

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """Thin SVD ``(U, S, V)`` with ``M = U @ diag(S) @ V^T`` (note ``V``, as TransformerLens).

        From the factors: ``A = U_a S_a V_a^T`` and ``B = U_b S_b V_b^T``, then the small
        ``(S_a V_a^T U_b S_b)`` is decomposed; U (..., m, r), S (..., r), V (..., n, r) with
        ``r = min(m, k, n)``.
        """
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        middle = Sa[..., :, None] * (Vha @ Ub) * Sb[..., None, :]
        Um, S, Vhm = torch.linalg.svd(middle, full_matrices=False)
        return Ua @ Um, S, (Vhm @ Vhb).transpose(-1, -2)

    @property
    def S(self) -> Tensor:
        """Singular values (..., r), descending."""
        return self.svd()[1]

    @property
    def eigenvalues(self) -> Tensor:
        """Eigenvalues (..., k) of ``BA``: the non-zero eigenvalues of ``AB`` (complex)."""
        return torch.linalg.eigvals(self.BA)

    def norm(self) -> Tensor:
        """Frobenius norm (...,) of the product."""
        return self.S.pow(2).sum(-1).sqrt()

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.A.shape[-1]})"
