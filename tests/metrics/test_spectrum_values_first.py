"""The power view's values-first eig (metrics.spectrum): every eigenvalue from LAPACK without
eigenvectors, the leading eigenvectors (B, B2) by inverse iteration, the full eig where a vector
is refused. Checked against the dense float64 oracle (torch.linalg.eig) on small and medium sizes,
clustered and complex leading eigenvalues, repeated and defective ones, a failing residual, and a
factored F = A B."""

import threading

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import sorted_eig as SE
from spectral_hooks.linalg.lowrank import LowRankOperator, lowrank_eig
from spectral_hooks.metrics import spectrum as S


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sorted(values: torch.Tensor) -> np.ndarray:
    """Conjugate-invariant order: (|z|, Re z, |Im z|), imaginary parts folded to >= 0."""
    v = values.numpy()
    v = np.real(v) + 1j * np.abs(np.imag(v))
    return v[np.lexsort((v.imag, v.real, -np.abs(v)))]


def _projector(B: torch.Tensor) -> torch.Tensor:
    return B @ B.T


def _check_against_full_eig(F: torch.Tensor, iterate: str, *, proj_tol: float = 1e-8) -> None:
    fast = S.layer_spectrum(F, iterate, 1e-9, vectors=False)
    full = S.layer_spectrum(F, iterate, 1e-9, vectors=True)  # the full eig: today's oracle
    oracle = torch.linalg.eig(F)[0]
    scale = float(torch.linalg.matrix_norm(F))
    np.testing.assert_allclose(_sorted(fast.eigenvalues), _sorted(oracle), rtol=0,
                               atol=1e-12 * scale)
    np.testing.assert_allclose(fast.eigenvalues.numpy(), full.eigenvalues.numpy(), rtol=0,
                               atol=1e-12 * scale)
    for name in ("lambda1", "lambda2", "mu1", "mu2", "gap_ratio"):
        np.testing.assert_allclose(getattr(fast, name), getattr(full, name), rtol=1e-10,
                                   atol=1e-12 * scale, err_msg=name)  # NaN == NaN here
    assert (fast.lambda1_is_complex, fast.lambda2_is_complex) == (
        full.lambda1_is_complex, full.lambda2_is_complex)
    assert fast.B.shape == full.B.shape and fast.B2.shape == full.B2.shape
    torch.testing.assert_close(_projector(fast.B), _projector(full.B), rtol=0, atol=proj_tol)
    torch.testing.assert_close(_projector(fast.B2), _projector(full.B2), rtol=0, atol=proj_tol)
    Fc = F.to(torch.complex128)
    for i in range(fast.eigenvectors.shape[1]):  # every vector returned is an eigenvector
        v, lam = fast.eigenvectors[:, i], fast.eigenvalues[i]
        assert abs(float(torch.linalg.vector_norm(v)) - 1) < 1e-12
        assert float(torch.linalg.vector_norm(Fc @ v - lam * v)) <= 1e-12 * scale


@pytest.mark.parametrize("d", [1, 2, 3, 8, 64, 200])
@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_random_matrices_match_the_full_eig(d, iterate):
    F = torch.randn(d, d, dtype=torch.float64, generator=_gen(d))
    _check_against_full_eig(F, iterate)


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_a_random_init_attention_product_with_a_clustered_top(iterate):
    """F = W_O W_V of Gaussian heads (as at random init): the top of the spectrum is a crowd of
    complex pairs with moduli within ~1% of each other."""
    d, heads, d_head = 256, 8, 32
    W_O = 0.02 * torch.randn(heads, d, d_head, dtype=torch.float64, generator=_gen(1))
    W_V = 0.02 * torch.randn(heads, d_head, d, dtype=torch.float64, generator=_gen(2))
    F = torch.einsum("hdk,hkm->dm", W_O, W_V)
    top = torch.linalg.eigvals(F).abs().sort(descending=True).values
    assert float(top[0] - top[4]) < 0.05 * float(top[0])  # clustered indeed
    _check_against_full_eig(F, iterate, proj_tol=1e-7)


def _similar(eigen_blocks: list[torch.Tensor], seed: int) -> torch.Tensor:
    """A well-conditioned, non-normal matrix with the given real blocks on its diagonal."""
    D = torch.block_diag(*eigen_blocks)
    n = D.shape[0]
    X = torch.eye(n, dtype=torch.float64) + 0.3 * torch.randn(n, n, dtype=torch.float64,
                                                               generator=_gen(seed)) / n ** 0.5
    return X @ D @ torch.linalg.inv(X)


def _pair(modulus: float, angle: float) -> torch.Tensor:
    a, b = modulus * np.cos(angle), modulus * np.sin(angle)
    return torch.tensor([[a, -b], [b, a]], dtype=torch.float64)


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_clustered_complex_pairs_lead(iterate):
    """Three complex pairs within 1e-6 of each other in modulus lead, then real values."""
    blocks = [_pair(1.0, 0.7), _pair(1.0 - 1e-6, 1.9), _pair(1.0 - 2e-6, 2.6)]
    rest = torch.linspace(-0.9, 0.8, 40, dtype=torch.float64)
    F = _similar(blocks + [torch.diag(rest)], seed=3)
    s = S.layer_spectrum(F, iterate, 1e-9, vectors=False)
    if iterate == "F":
        assert s.lambda1_is_complex and s.lambda2_is_complex and s.B2.shape[1] == 4
    _check_against_full_eig(F, iterate, proj_tol=1e-6)


def test_real_and_complex_leaders_mixed():
    blocks = [torch.tensor([[1.5]], dtype=torch.float64), _pair(1.4, 0.3),
              torch.tensor([[-1.3]], dtype=torch.float64)]
    F = _similar(blocks + [torch.diag(torch.linspace(-1, 1, 30, dtype=torch.float64))], seed=4)
    _check_against_full_eig(F, "F")
    _check_against_full_eig(F, "I+F")


def _spy_full_eig(monkeypatch) -> list:
    calls: list = []
    real = SE.sorted_eig  # the full eig: the values-first path's fallback, and vectors=True
    monkeypatch.setattr(SE, "sorted_eig", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(S, "sorted_eig", SE.sorted_eig)
    return calls


@pytest.mark.parametrize("case", ["identity", "repeated", "jordan"])
def test_repeated_or_defective_leaders_take_the_full_eig(monkeypatch, case):
    """A leading eigenvalue repeated to rounding has no unique eigenvector: the values-first path
    refuses it and the layer takes the full eig, so its B is LAPACK's, as before, exactly."""
    rest = torch.diag(torch.linspace(-0.5, 0.5, 20, dtype=torch.float64))
    if case == "identity":
        F = torch.eye(6, dtype=torch.float64)
    elif case == "repeated":
        F = _similar([torch.diag(torch.tensor([2.0, 2.0], dtype=torch.float64)), rest], seed=5)
    else:
        F = _similar([torch.tensor([[2.0, 1.0], [0.0, 2.0]], dtype=torch.float64), rest], seed=6)
    calls = _spy_full_eig(monkeypatch)
    fast = S.layer_spectrum(F, "F", 1e-9, vectors=False)
    assert calls == [1]
    full = S.layer_spectrum(F, "F", 1e-9, vectors=True)
    assert torch.equal(fast.B, full.B) and torch.equal(fast.B2, full.B2)
    assert torch.equal(fast.eigenvalues, full.eigenvalues)


def test_a_failing_residual_falls_back_to_the_full_eig(monkeypatch):
    F = torch.randn(40, 40, dtype=torch.float64, generator=_gen(7))
    calls = _spy_full_eig(monkeypatch)
    S.layer_spectrum(F, "F", 1e-9, vectors=False)
    assert calls == []  # the values-first path kept every vector
    monkeypatch.setattr(SE, "VECTOR_RESIDUAL_TOL", 0.0)  # no residual can pass now
    fast = S.layer_spectrum(F, "F", 1e-9, vectors=False)
    assert calls == [1]
    full = S.layer_spectrum(F, "F", 1e-9, vectors=True)
    assert torch.equal(fast.B, full.B) and torch.equal(fast.eigenvalues, full.eigenvalues)


def test_the_vectors_come_from_inverse_iteration_not_the_full_eig(monkeypatch):
    """The dense route without vectors calls LAPACK without eigenvectors: no full eig."""
    F = torch.randn(30, 30, dtype=torch.float64, generator=_gen(8))
    monkeypatch.setattr(torch.linalg, "eig", lambda *a, **k: pytest.fail("full eig called"))
    s = S.layer_spectrum(F, "F", 1e-9, vectors=False)
    assert s.eigenvalues.numel() == 30 and s.eigenvectors.shape[1] <= 4


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_factored_values_first_matches_the_dense_eig(iterate):
    d, r = 120, 24
    A = torch.randn(d, r, dtype=torch.float64, generator=_gen(9)) / r ** 0.5
    B = torch.randn(r, d, dtype=torch.float64, generator=_gen(10)) / d ** 0.5
    op = LowRankOperator(A, B)
    vals, vecs, is_real = SE.factored_eig(op, iterate, 1e-9, vectors=False)
    ref_vals, _, ref_real = SE.tidy(*lowrank_eig(op), iterate, 1e-9)
    torch.testing.assert_close(vals, ref_vals, rtol=0, atol=1e-12)
    assert torch.equal(is_real, ref_real) and vecs.shape[1] <= 4
    F = (A @ B).to(torch.complex128)
    for i in range(vecs.shape[1]):
        assert float(torch.linalg.vector_norm(F @ vecs[:, i] - vals[i] * vecs[:, i])) <= 1e-12
    fast = S.layer_spectrum(op, iterate, 1e-9, vectors=False)
    full = S.layer_spectrum((A @ B), iterate, 1e-9, vectors=True)
    torch.testing.assert_close(_projector(fast.B), _projector(full.B), rtol=0, atol=1e-9)
    torch.testing.assert_close(_projector(fast.B2), _projector(full.B2), rtol=0, atol=1e-9)


def test_the_spectrum_runs_on_at_most_power_threads(monkeypatch):
    seen = []
    real = torch.linalg.eigvals
    monkeypatch.setattr(torch.linalg, "eigvals",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        S.layer_spectrum(torch.randn(20, 20, dtype=torch.float64), "F", 1e-9, vectors=False)
        assert seen == [min(2, S.POWER_THREADS)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_layers_run_on_the_callers_threads_with_the_same_values(monkeypatch):
    """With torch at 2 threads, layers' spectra run 2 at a time in worker threads (each on one
    CPU thread): the same spectra, bit for bit, as one layer at a time."""
    F = torch.randn(4, 40, 40, dtype=torch.float64, generator=_gen(11))
    names = []
    real = S.layer_spectrum
    together = None  # from the 2-thread run on: each layer waits for a second one to run

    def spectrum(*a, **k):
        names.append(threading.current_thread().name)
        if together is not None:
            together.wait()  # two layers at once, or BrokenBarrierError after the timeout
        return real(*a, **k)

    monkeypatch.setattr(S, "layer_spectrum", spectrum)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = S.layer_spectra(F, F, [0, 1, 2, 3], "F", 1e-9, 40, 8)
        assert not any(n.startswith("spectral_hooks-spectra") for n in names)
        S.clear_spectrum_cache()
        names.clear()
        torch.set_num_threads(2)
        together = threading.Barrier(2, timeout=30)
        done = []
        two = S.layer_spectra(F, F, [0, 1, 2, 3], "F", 1e-9, 40, 8, done=done.append)
    finally:
        torch.set_num_threads(before)
        S.clear_spectrum_cache()
    assert all(n.startswith("spectral_hooks-spectra") for n in names) and len(set(names)) == 2
    assert done == [0, 1, 2, 3]
    for a, b in zip(one, two):
        assert torch.equal(a.eigenvalues, b.eigenvalues) and torch.equal(a.B2, b.B2)
