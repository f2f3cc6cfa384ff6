"""FactoredMatrix against the dense product and torch.linalg on it."""

from __future__ import annotations

import pytest
import torch

from headwise.model.factored import FactoredMatrix


@pytest.fixture()
def fm() -> FactoredMatrix:
    g = torch.Generator().manual_seed(0)  # leading (2, 3); m = n = 7, inner k = 4
    return FactoredMatrix(torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64),
                          torch.randn(2, 3, 4, 7, generator=g, dtype=torch.float64))


def test_product_transpose_matmul_and_indexing(fm: FactoredMatrix) -> None:
    dense = fm.A @ fm.B
    assert fm.shape == (2, 3, 7, 7)
    assert torch.equal(fm.AB, dense)
    torch.testing.assert_close(fm.T.AB, dense.transpose(-1, -2))
    other = torch.randn(7, 5, dtype=torch.float64)
    torch.testing.assert_close((fm @ other).AB, dense @ other)
    torch.testing.assert_close((other.T @ fm).AB, other.T @ dense)
    torch.testing.assert_close(fm[1, 2].AB, dense[1, 2])
    torch.testing.assert_close(fm[:, 0].AB, dense[:, 0])
    with pytest.raises(IndexError, match="leading axes only"):
        fm[0, 0, 1]


def test_svd_eigenvalues_and_norm_match_the_dense_matrix(fm: FactoredMatrix) -> None:
    dense = fm.AB
    U, S, V = fm.svd()
    assert U.shape == (2, 3, 7, 4) and S.shape == (2, 3, 4) and V.shape == (2, 3, 7, 4)
    torch.testing.assert_close(U @ torch.diag_embed(S) @ V.transpose(-1, -2), dense)
    torch.testing.assert_close(S, torch.linalg.svdvals(dense)[..., :4])
    torch.testing.assert_close(fm.norm(), torch.linalg.matrix_norm(dense))
    # AB (rank 4) has 4 non-zero eigenvalues, those of BA.
    ours = fm.eigenvalues[1, 2]
    ref = torch.linalg.eigvals(dense[1, 2])
    ref = ref[ref.abs().argsort(descending=True)][:4]
    key = lambda z: (round(z.real.item(), 6), round(z.imag.item(), 6))  # noqa: E731
    assert sorted(map(key, ours)) == sorted(map(key, ref))


def test_mismatched_factors_are_refused() -> None:
    with pytest.raises(ValueError, match=r"A \(3, 4\) and B \(5, 3\) do not multiply"):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(5, 3))


def test_a_product_of_factored_matrices_and_with_vectors(fm: FactoredMatrix) -> None:
    """``FactoredMatrix @ FactoredMatrix`` is the dense product (TransformerLens:
    ``(M @ A') @ B'``), e.g. a head's OV followed by another's QK; a vector gives a tensor."""
    g = torch.Generator().manual_seed(1)
    other = FactoredMatrix(torch.randn(3, 7, 2, generator=g, dtype=torch.float64),
                           torch.randn(3, 2, 5, generator=g, dtype=torch.float64))
    product = fm @ other
    assert isinstance(product, FactoredMatrix) and product.shape == (2, 3, 7, 5)
    torch.testing.assert_close(product.AB, fm.AB @ other.AB)
    v = torch.randn(7, generator=g, dtype=torch.float64)
    torch.testing.assert_close(fm @ v, fm.AB @ v)
    torch.testing.assert_close(v @ fm, v @ fm.AB)
