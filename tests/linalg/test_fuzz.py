"""Seeded fuzz of ``eigs`` and ``svds`` against dense float64 oracles: random shapes, k, which,
ncv, block widths, device path, batches and spectra (Gaussian, symmetric, rank-deficient,
permutation matrices with tied conjugate pairs, repeated singular values, extreme scales,
complex and Hermitian).
Every run either raises an ``OptionError`` naming a bad option, or returns a result that, where
it says converged, holds the oracle's top-k (compared by the ``which`` key, so ties and
conjugate pairs may come in either order; ``which`` LM, LR and SM) and vectors that meet the
claim: unit eigenvectors whose fresh residuals are the reported ones, within tol; orthonormal
singular vectors with both residuals within tol * s_1. The quick profile runs a few cases of
each kind, ``make test-all`` a thousand; each case is one seed, so a failure reproduces from
its id.

The two rounds of fuzzing (2026-12-07) that this file keeps found: conjugate pairs split
(a shape error from inside), blocks wider than the space, wide ``svds``, tiny scales, repeated
top singular values, each reported converged with a wrong answer or crashing.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import DenseOperator, eigs, svds

from ..profiles import FULL

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CASES = range(1000 if FULL else 12)
KINDS = ("gauss", "symmetric", "low_rank", "permutation", "repeated", "identity_plus_low_rank",
         "scaled", "complex", "hermitian")


def _matrix(kind: str, m: int, n: int, g: torch.Generator) -> torch.Tensor:
    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    if kind == "permutation" and m == n:
        return torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=g)]
    if kind == "symmetric" and m == n:
        X = randn(n, n)
        return X + X.T
    if kind in ("complex", "hermitian"):
        Z = torch.randn(m, n, generator=g, dtype=torch.complex128)
        return Z + Z.mH if kind == "hermitian" and m == n else Z
    if kind == "low_rank":
        return randn(m, 2) @ randn(2, n)
    if kind == "repeated":  # a third of the values equal, at a random place in the spectrum
        r = min(m, n)
        s = torch.linspace(6, 0.1, r - r // 3, dtype=torch.float64)
        at = int(torch.randint(0, len(s), (1,), generator=g))
        s = torch.cat([s, s[at].repeat(r // 3)]).sort(descending=True).values
        U = torch.linalg.qr(randn(m, r)).Q
        V = torch.linalg.qr(randn(n, r)).Q
        return U @ torch.diag(s) @ V.T
    if kind == "identity_plus_low_rank" and m == n:  # 1 repeated n - 2 times, as in I + J
        return torch.eye(n, dtype=torch.float64) + randn(n, 2) @ randn(2, n) / n ** 0.5
    scale = 10.0 ** float(torch.randint(-200, 150, (1,), generator=g)) if kind == "scaled" else 1.0
    return randn(m, n) * scale


def _top(values: torch.Tensor, which: str, k: int) -> torch.Tensor:
    key = {"LM": values.abs(), "LR": values.real, "SM": -values.abs()}[which]
    return key.sort(descending=True).values[..., :k]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_eigs_converged_means_the_oracle_top_k(kind, case):
    g = torch.Generator().manual_seed(1000 * KINDS.index(kind) + case)
    n = int(torch.randint(4, 90, (1,), generator=g))
    k = int(torch.randint(1, max(2, n - 2), (1,), generator=g))
    which = ("LM", "LR", "SM")[(case // 3) % 3]
    options = dict(which=which, seed=case)
    if case % 3 == 1:
        options["ncv"] = int(torch.randint(k + 2, n + 1, (1,), generator=g))
    if case % 4 == 2:
        options["device_path"] = True
    A = _matrix(kind, n, n, g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = eigs(A, k, **options)
        except OptionError:
            return
    if not bool(res.converged):
        return
    scale = float(torch.linalg.matrix_norm(A, 2)) or 1.0
    got = _top(res.values, which, k)
    want = _top(torch.linalg.eigvals(A), which, k)
    assert float((got - want).abs().max()) <= 1e-6 * scale, (n, k, options)
    # the vectors are eigenvectors to the reported residuals, and those meet tol
    V, lam = res.vectors, res.values
    assert V is not None
    assert float((torch.linalg.vector_norm(V, dim=0) - 1).abs().max()) <= 1e-10
    fresh = torch.linalg.vector_norm(A.to(V.dtype) @ V - V * lam, dim=0)
    assert bool((fresh <= 1e-9 * scale + 10 * res.residuals * lam.abs()).all()), (n, k, options)
    assert float(res.residuals.max()) <= 1e-10, (n, k, options)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_svds_converged_means_the_oracle_top_k(kind, case):
    g = torch.Generator().manual_seed(7000 + 1000 * KINDS.index(kind) + case)
    m, n = (int(torch.randint(2, 120, (1,), generator=g)) for _ in range(2))
    k = int(torch.randint(1, min(m, n) + 1, (1,), generator=g))
    options = dict(seed=case, block_size=(None, 1, 4, 16)[case % 4])
    if case % 5 == 3:
        options = dict(seed=case, device_path=True)
    A = _matrix(kind, m, n, g)
    batch = case % 6 == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = svds([DenseOperator(A), DenseOperator(2 * A)] if batch else A, k, **options)
        except OptionError:
            return
    s = torch.linalg.svdvals(A)[:k]
    scale = float(s[0]) or 1.0
    U, Vh = res.U.reshape(-1, m, k), res.Vh.reshape(-1, k, n)
    for i, (got, factor, ok) in enumerate(zip(res.S.reshape(-1, k), (1, 2),
                                              res.converged.reshape(-1))):
        if bool(ok):
            assert float((got - factor * s).abs().max()) <= 1e-8 * factor * scale, (m, n, k,
                                                                                     options)
            # converged means both residuals <= tol * s_1 and orthonormal vectors
            Af = factor * A
            right = torch.linalg.vector_norm(Af @ Vh[i].mH - U[i] * got, dim=0)
            left = torch.linalg.vector_norm(Af.mH @ U[i] - Vh[i].mH * got, dim=0)
            tol = 1e-10 * factor * scale + 1e-12 * factor * scale
            assert float(torch.maximum(right, left).max()) <= 10 * tol, (m, n, k, options)
            eye = torch.eye(k, dtype=U.dtype)
            assert float((U[i].mH @ U[i] - eye).abs().max()) <= 1e-8, (m, n, k, options)
            assert float((Vh[i] @ Vh[i].mH - eye).abs().max()) <= 1e-8, (m, n, k, options)


@pytest.mark.parametrize("block_size", [1, 3, None])
@pytest.mark.parametrize("where", ["top", "middle"])
def test_svds_finds_every_copy_of_a_repeated_value_in_a_part_of_the_space(where, block_size):
    # a Krylov space from b start vectors holds at most b copies of an exactly repeated value;
    # before the probe, 100 x 100 with 33 copies of the top value, k = 8 to 20, one column a
    # step, came back converged with one copy and the next distinct values
    g = torch.Generator().manual_seed(3)
    s = torch.linspace(6, 0.1, 67, dtype=torch.float64)
    s = torch.cat([s, s[0 if where == "top" else 3].repeat(33)]).sort(descending=True).values
    U = torch.linalg.qr(torch.randn(100, 100, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(100, 100, generator=g, dtype=torch.float64)).Q
    A = U @ torch.diag(s) @ V.T
    for k in (8, 12, 16, 20):
        res = svds(A, k, block_size=block_size)
        assert bool(res.converged)
        assert float((res.S - s[:k]).abs().max()) <= 1e-9, (k, res.S)
        left = torch.linalg.vector_norm(A @ res.Vh.mH - res.U * res.S, dim=0)
        assert float(left.max()) <= 1e-9
        assert float((res.Vh @ res.Vh.mH - torch.eye(k)).abs().max()) <= 1e-9
