"""linalg.sorted_eig's top-k of a thin F = A B from its r x r matrix B A (checked against the
dense float64 eig of A B), its fallback where F's zeros could rank among the top k, and
linalg.threads.cpu_threads (this thread's counts only, restored after)."""

import threading

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import LowRankOperator
from spectral_hooks.linalg import sorted_eig as SE
from spectral_hooks.linalg.threads import cpu_threads, thread_controls

EIGS_KW = {"tol": 1e-10, "max_restarts": 1000, "seed": 0}


def _thin(d: int, r: int, seed: int, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, r, dtype=torch.float64, generator=g) / r ** 0.5
    B = torch.randn(r, d, dtype=torch.float64, generator=g) / d ** 0.5
    if shift:  # B A = B0 A + shift I: move B A's spectrum (A's left inverse carries the shift)
        B = B + shift * torch.linalg.pinv(A)
    return A, B


def _oracle_top(F: torch.Tensor, iterate: str, k: int) -> np.ndarray:
    vals = torch.linalg.eigvals(F)
    q = vals + (1.0 if iterate == "I+F" else 0.0)
    return vals[q.abs().argsort(descending=True)][:k].numpy()


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_factored_topk_is_the_dense_top_k(monkeypatch, iterate):
    """The top k of F = A B from B A (r = 40 < d = 160): the values of the dense eig of A B to
    solver tolerance, unit vectors with F x = lambda x, and B A (not the d x d F) is what the
    solver saw."""
    A, B = _thin(160, 40, seed=1, shift=1.5 if iterate == "I+F" else 0.0)
    seen = []
    real = SE.eigs
    monkeypatch.setattr(SE, "eigs", lambda M, *a, **k: seen.append(tuple(M.shape)) or real(M, *a, **k))
    vals, vecs, is_real, converged = SE.eig_topk(LowRankOperator(A, B), iterate, 1e-9, 6, EIGS_KW)
    assert converged and seen == [(40, 40)]
    top = _oracle_top(A @ B, iterate, vals.numel())
    q = 1.0 if iterate == "I+F" else 0.0
    np.testing.assert_allclose(np.abs(vals.numpy() + q), np.abs(top + q), rtol=1e-9)
    np.testing.assert_allclose(np.sort_complex(vals.numpy()), np.sort_complex(top),
                               rtol=0, atol=1e-9 * abs(top[0]))
    F = (A @ B).to(torch.complex128)
    for i in range(vecs.shape[1]):
        assert abs(float(vecs[:, i].norm()) - 1) < 1e-12
        assert float((F @ vecs[:, i] - vals[i] * vecs[:, i]).norm()) <= 1e-8 * abs(top[0])


def test_zeros_that_rank_in_the_top_k_take_the_solver_on_f(monkeypatch):
    """For "I+F" F's d - r zeros sort at |1 + 0| = 1: where B A's eigenvalues all lie inside
    the unit disc around -1 (here shifted by -1.5), the zeros lead, their vectors are not A y,
    so the solver runs on F itself (x -> A (B x)) and gives the dense top k, zeros included."""
    A, B = _thin(60, 12, seed=2, shift=-1.5)
    seen = []
    real = SE.eigs
    monkeypatch.setattr(SE, "eigs", lambda M, *a, **k: seen.append(tuple(M.shape)) or real(M, *a, **k))
    vals, _, _, converged = SE.eig_topk(LowRankOperator(A, B), "I+F", 1e-9, 4, EIGS_KW)
    assert converged and seen == [(12, 12), (60, 60)]
    top = _oracle_top(A @ B, "I+F", vals.numel())
    np.testing.assert_allclose(np.abs(vals.numpy() + 1), np.abs(top + 1), rtol=0, atol=1e-9)
    assert np.abs(vals.numpy()).min() <= 1e-9  # the zeros are there


def test_cpu_threads_limits_this_thread_only():
    """Inside, this thread's kernels see at most n threads; a thread started meanwhile keeps
    the process's count (torch.set_num_threads would have handed it n for good); after, the
    count is the caller's again."""
    if thread_controls().omp_set is None:
        pytest.skip("torch without an OpenMP runtime: nothing to limit")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = {}
        with cpu_threads(1):
            seen["inside"] = torch.get_num_threads()
            other = threading.Thread(target=lambda: seen.setdefault("other", torch.get_num_threads()))
            other.start()
            other.join()
        assert seen == {"inside": 1, "other": 2} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
