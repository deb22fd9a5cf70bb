"""lowrank_eig: every eigenpair of a thin product A B from B A, checked against the dense
float64 eig of A B; merge_shared_factors: grouped-query heads merged exactly; LowRankOperator
against its dense matrix."""

import logging

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import LowRankOperator, lowrank_eig, merge_shared_factors
from spectral_hooks.linalg.sorted_eig import factored_eig, tidy


def _factors(d, r, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, r, generator=g, dtype=torch.float64).to(dtype)
    B = torch.randn(r, d, generator=g, dtype=torch.float64).to(dtype) / d ** 0.5
    return A, B


def _assert_eigenpairs_of(F, values, vectors):
    """values are F's eigenvalues (the dense oracle's, matched one to one), every vector a
    unit eigenvector for its value."""
    oracle = torch.linalg.eigvals(F).numpy()
    got = values.numpy()
    scale = np.abs(oracle).max()
    left = list(oracle)
    for z in got:  # greedy one-to-one matching
        j = int(np.argmin(np.abs(np.array(left) - z)))
        assert abs(left.pop(j) - z) <= 1e-11 * scale, (z, scale)
    Fc = F.to(torch.complex128)
    np.testing.assert_allclose(torch.linalg.vector_norm(vectors, dim=0).numpy(), 1, atol=1e-12)
    resid = torch.linalg.vector_norm(Fc @ vectors - vectors * values, dim=0)
    assert float(resid.max()) <= 1e-11 * scale * np.sqrt(F.shape[0])


@pytest.mark.parametrize("d,r,seed", [(60, 12, 0), (41, 40, 1), (80, 3, 2)])
def test_every_eigenpair_equals_the_dense_eig(d, r, seed):
    A, B = _factors(d, r, seed)
    values, vectors = lowrank_eig(LowRankOperator(A, B))
    assert values.shape == (d,) and vectors.shape == (d, d)
    assert bool((values[r:] == 0).all())
    assert r < 12 or bool((values[:r].imag != 0).any())  # complex pairs among them
    _assert_eigenpairs_of(A @ B, values, vectors)
    null = vectors[:, r:]  # the zeros' vectors: an orthonormal basis of null(B)
    torch.testing.assert_close(null.mH @ null, torch.eye(d - r, dtype=torch.complex128))
    assert float((B.to(torch.complex128) @ null).abs().max()) <= 1e-13


def test_without_the_null_space_only_the_nonzero_vectors():
    A, B = _factors(50, 10, 3)
    full_values, full_vectors = lowrank_eig(LowRankOperator(A, B))
    values, vectors = lowrank_eig(LowRankOperator(A, B), null_space=False)
    assert vectors.shape == (50, 10)
    torch.testing.assert_close(values, full_values)
    torch.testing.assert_close(vectors, full_vectors[:, :10])


def test_a_rank_deficient_right_factor_is_still_exact():
    A, B = _factors(40, 8, 4)
    B[4:] = B[:4]  # rank(B) = 4 < r = 8: four more zero eigenvalues, from B A
    values, vectors = lowrank_eig(LowRankOperator(A, B))
    _assert_eigenpairs_of(A @ B, values, vectors)


def test_a_left_factor_that_kills_an_eigenvector_falls_back_to_dense(caplog):
    A, B = _factors(30, 4, 5)
    A[:, 3] = 0  # B A has eigenvector e_4 (value 0) and A e_4 = 0
    with caplog.at_level(logging.INFO, logger="spectral_hooks.linalg.lowrank"):
        values, vectors = lowrank_eig(LowRankOperator(A, B))
    assert "dense eig" in caplog.text
    assert values.shape == (30,) and vectors.shape == (30, 30)
    _assert_eigenpairs_of(A @ B, values, vectors)


def test_complex_factors_and_errors():
    A, B = _factors(30, 5, 6, torch.complex128)
    A = A + 1j * _factors(30, 5, 7)[0]
    values, vectors = lowrank_eig(LowRankOperator(A, B))
    _assert_eigenpairs_of(A @ B, values, vectors)
    with pytest.raises(ValueError, match="square"):
        lowrank_eig(LowRankOperator(torch.ones(3, 1), torch.ones(1, 4)))
    with pytest.raises(TypeError, match="LowRankOperator"):
        lowrank_eig(torch.eye(3))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"left \[m, r\] and right \[r, n\]"):
        LowRankOperator(torch.ones(3, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="device and a dtype"):
        LowRankOperator(torch.ones(3, 1), torch.ones(1, 3, dtype=torch.float64))


def test_low_rank_operator_is_its_dense_product():
    A, B = _factors(20, 4, 8)
    op = LowRankOperator(A, B)
    x, X = torch.randn(20, dtype=torch.float64), torch.randn(20, 3, dtype=torch.float64)
    torch.testing.assert_close(op @ x, A @ B @ x)
    torch.testing.assert_close(op.matmat(X), A @ B @ X)
    torch.testing.assert_close(op.rmatvec(x), (A @ B).T @ x)
    torch.testing.assert_close(op.rmatmat(X), (A @ B).T @ X)
    torch.testing.assert_close(op.to_dense(), A @ B)
    assert op.rank_bound == 4 and op.n_matvecs == 1 + 3 + 1 + 3 + 20


@pytest.mark.parametrize("heads,groups", [(8, 2), (6, 6), (4, 1)])
def test_shared_values_merge_exactly(heads, groups):
    g = torch.Generator().manual_seed(heads)
    d, dk = 24, 3
    W_O = torch.randn(heads, d, dk, generator=g, dtype=torch.float64)
    W_V = torch.randn(groups, dk, d, generator=g, dtype=torch.float64).repeat_interleave(
        heads // groups, dim=0)  # how GQA expands its key/value heads
    A, B = merge_shared_factors(W_O, W_V)
    assert A.shape == (d, groups * dk) and B.shape == (groups * dk, d)
    torch.testing.assert_close(A @ B, torch.einsum("hdk,hke->de", W_O, W_V), rtol=1e-13,
                               atol=1e-13)
    with pytest.raises(ValueError, match="W_O"):
        merge_shared_factors(W_O, W_V[:, :2])


def test_cross_attention_values_read_another_width():
    W_O, W_V = torch.randn(4, 10, 2, dtype=torch.float64), torch.randn(4, 2, 7, dtype=torch.float64)
    A, B = merge_shared_factors(W_O, W_V)
    torch.testing.assert_close(A @ B, torch.einsum("hdk,hke->de", W_O, W_V))


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("shift", [0.0, -0.5])
def test_skipping_the_null_space_keeps_the_leading_pairs(iterate, shift):
    """The power view asks for no null-space basis unless a zero eigenvalue leads: with
    eigenvalues near -0.5 every |1 + lambda| < 1, so under "I+F" the zeros (|1 + 0| = 1) lead
    and their vectors (null(B)) must be computed; the leading values and vectors must be
    those of the dense path either way."""
    A, B = _factors(40, 6, 9)
    if shift:  # A B = Q diag(-0.5 +- small) Q^T B-ish: nonzero eigenvalues near -0.5
        Q = torch.linalg.qr(A).Q
        A = Q @ (shift * torch.eye(6, dtype=torch.float64) + 0.01 * torch.randn(
            6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
        B = Q.T.clone()
    op = LowRankOperator(A, B)
    vals, vecs, is_real = factored_eig(op, iterate, 1e-9, vectors=False)
    ref_vals, ref_vecs, ref_real = tidy(*lowrank_eig(op), iterate, 1e-9)
    torch.testing.assert_close(vals, ref_vals)
    assert torch.equal(is_real, ref_real)
    F = (A @ B).to(torch.complex128)
    for i in range(3):  # the positions B and B2 are built from: eigenvectors of their values
        assert float(torch.linalg.vector_norm(F @ vecs[:, i] - vals[i] * vecs[:, i])) <= 1e-12
    if shift and iterate == "I+F":
        assert vals[0] == 0 and vecs.shape[1] == 40  # the zeros lead: null space computed
        assert float((B.to(torch.complex128) @ vecs[:, 0]).abs().max()) <= 1e-13


def test_the_module_examples_run():
    import doctest

    from spectral_hooks.linalg import lowrank

    result = doctest.testmod(lowrank, extraglobs={"torch": torch})
    assert result.failed == 0 and result.attempted >= 11
