"""Hard spectra for eigs (issue 12): repeated, defective, rank-deficient, invariant subspaces,
strongly non-normal; and the two references each test holds eigs against in the same run: a
dense float64 oracle and scipy's ARPACK (its matvec count)."""

import numpy as np
import scipy.sparse.linalg as sla
import torch
from scipy.optimize import linear_sum_assignment


def _orth(n, g):
    return torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q


def _similar(d, normal, g, n):
    if normal:
        Q = _orth(n, g)
        return Q @ torch.diag(d) @ Q.T
    S = _orth(n, g) + 0.5 * torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5
    return S @ torch.diag(d) @ torch.linalg.inv(S)


def repeated(mult, *, normal, gapped, n=300, seed=0):
    """Top eigenvalue 1 with multiplicity `mult` (diagonalisable), then 0.9, 0.85, -0.8 and a
    bulk in [0, 0.7] -- or, `gapped`, 0.5, 0.45, -0.4 and a bulk in [0, 0.3] (fast convergence:
    the missing copies have no time to emerge from rounding)."""
    g = torch.Generator().manual_seed(seed)
    nxt, bulk = ([0.5, 0.45, -0.4], 0.3) if gapped else ([0.9, 0.85, -0.8], 0.7)
    d = torch.cat([torch.ones(mult, dtype=torch.float64), torch.tensor(nxt, dtype=torch.float64),
                   bulk * torch.rand(n - mult - 3, generator=g, dtype=torch.float64)])
    return _similar(d, normal, g, n)


def jordan(n=300, seed=0):
    """A 2x2 Jordan block for eigenvalue 1 at the top, orthogonally rotated."""
    g = torch.Generator().manual_seed(seed)
    d = torch.cat([torch.tensor([1.0, 1.0, 0.8, 0.7], dtype=torch.float64),
                   0.6 * torch.rand(n - 4, generator=g, dtype=torch.float64)])
    T = torch.diag(d)
    T[0, 1] = 1.0
    Q = _orth(n, g)
    return Q @ T @ Q.T


def low_rank(r, *, n=384, seed=0, symmetric=False):
    """U V^T / n of rank r (U U^T / n when symmetric)."""
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(n, r, generator=g, dtype=torch.float64)
    V = U if symmetric else torch.randn(n, r, generator=g, dtype=torch.float64)
    return U @ V.T / n


def invariant(n=300, seed=0):
    """Six distinct top values and 0.5 with multiplicity n - 6 (non-normal, diagonalisable):
    every Krylov space is invariant after 7 steps."""
    g = torch.Generator().manual_seed(seed)
    d = torch.cat([torch.tensor([2.0, 1.8, 1.5, -1.2, 1.1, 0.9], dtype=torch.float64),
                   0.5 * torch.ones(n - 6, dtype=torch.float64)])
    return _similar(d, False, g, n)


def nonnormal_line(n=400, seed=0):
    """Issue 12 problem 10: eigenvalues 1 ... 0.01 on a line, a random strictly upper triangle
    of scale 5/sqrt(n), a random orthogonal similarity. The eigenvalues are so ill-conditioned
    that rounding in forming A moves them by ~0.2: the float64 oracle is the dense eig of A."""
    g = torch.Generator().manual_seed(seed)
    T = torch.diag(torch.linspace(1, 0.01, n, dtype=torch.float64))
    T = T + torch.triu(torch.randn(n, n, generator=g, dtype=torch.float64), 1) * 5 / n ** 0.5
    Q = _orth(n, g)
    return Q @ T @ Q.T


def multiset_error(got, want, scale):
    """Max distance / scale of the best one-to-one matching of two value multisets (either
    may be conjugated as a whole: a real operator's pairs are listed +imag first)."""
    a = np.asarray(got).ravel()
    b = np.asarray(want).ravel()
    if a.shape != b.shape:
        return float("inf")
    errs = []
    for bb in (b, b.conj()):
        C = np.abs(a[:, None] - bb[None, :])
        r, c = linear_sum_assignment(C)
        errs.append(C[r, c].max())
    return float(min(errs)) / scale


def dense_top(A, K):
    ev = torch.linalg.eigvals(A).numpy()
    return ev[np.argsort(-np.abs(ev), kind="stable")][:K]


def arpack(A, k, tol):
    """scipy ARPACK's top-k (largest modulus) and its matvec count (v0 = ones: seeded)."""
    count = [0]
    An = A.numpy()

    def mv(x):
        count[0] += 1
        return An @ x
    op = sla.LinearOperator(An.shape, matvec=mv, dtype=np.float64)
    try:
        w = sla.eigs(op, k=k, tol=tol, v0=np.ones(An.shape[0]), return_eigenvectors=False)
    except sla.ArpackNoConvergence as e:
        w = e.eigenvalues
    return w, count[0]
