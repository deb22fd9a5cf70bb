"""Eigenpairs of a real layer matrix sorted for a power iteration: every eigenvalue with the few
leading eigenvectors (values-first), all of them (the full eig), or the top k (Krylov).

    >>> vals, vecs, is_real = sorted_eig(torch.diag(torch.tensor([1.0, 3.0], dtype=torch.float64)), "F", 1e-9)
    >>> vals.real.tolist(), is_real.tolist()
    ([3.0, 1.0], [True, True])

The order (``iterate``): "F" sorts by descending |lambda|, "I+F" by descending |1 + lambda|
(ties by descending real, then imaginary part); eigenvalues with |Im| <= real_tol |lambda| are
snapped to the real axis (their vectors made real), conjugate pairs made exact and adjacent,
positive imaginary part first. Everything runs in float64 / complex128 on the CPU but the
Krylov products, which stay on the operator's device.

* :func:`sorted_eig`: LAPACK's eig with every eigenvector.
* :func:`eig_leading`: every eigenvalue from LAPACK without eigenvectors, and the eigenvectors
  of the leading positions only (those of the first three and a partner of a pair among them),
  by inverse iteration: each kept when its residual ||M x - lambda x|| is below
  VECTOR_RESIDUAL_TOL ||M||_F and its eigenvalue lies farther than SEPARATION_TOL ||M||_F from
  every other one; the full eig otherwise.
* :func:`factored_eig`: the same for a thin F = A B (r < d) from the r x r matrix B A: its r
  eigenvalues, then d - r zeros, the leading vectors A y (residuals checked on F).
* :func:`eig_topk`: the top k by :func:`~spectral_hooks.linalg.eigs` (on I + F for "I+F"); for a
  real thin F = A B on the r x r matrix B A (products cost r^2 instead of 2 d r), the vectors
  lifted to A y and checked on F, where F's d - r zeros cannot rank among the top k.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import torch
from torch import Tensor

from .krylov import eigs
from .lowrank import LowRankOperator, lowrank_eig
from .operators import IdentityOperator, LinearOperator

__all__ = ["sorted_eig", "eig_leading", "factored_eig", "eig_topk", "tidy", "tidy_values",
           "VECTOR_RESIDUAL_TOL", "SEPARATION_TOL"]

Triple: TypeAlias = tuple[Tensor, Tensor, Tensor]  # (values, vectors, is_real), sorted

#: an inverse-iteration vector x (||x|| = 1) is kept when ||M x - lambda x|| <= this * ||M||_F
#: (LAPACK's own vectors reach ~1e-15 relative here)
VECTOR_RESIDUAL_TOL = 1e-10
#: ... and its eigenvalue lies farther than this * ||M||_F from every other eigenvalue (closer:
#: repeated to rounding, its eigenvector is whatever LAPACK returns, so the full eig is taken)
SEPARATION_TOL = 1e-8
#: the shift of the inverse iteration sits this * ||M||_F off the eigenvalue (the LU is not
#: singular; each step shrinks the other directions by this / SEPARATION_TOL at least)
INVERSE_SHIFT = 2.0 ** -44
#: inverse-iteration steps, then the residual is checked
INVERSE_STEPS = 3


def _shift(iterate: str) -> float:
    """q - lambda for the ordering quantity q: 1 for "I+F", 0 for "F"."""
    return 1.0 if iterate == "I+F" else 0.0


def order(vals: Tensor, iterate: str) -> Tensor:
    """Positions of ``vals`` by descending |q| (q = lambda, or 1 + lambda for "I+F"), ties by
    descending real then imaginary part."""
    q = vals + _shift(iterate)
    return torch.from_numpy(np.lexsort((-vals.imag.numpy(), -vals.real.numpy(), -q.abs().numpy())))


def _realify(vecs: Tensor) -> Tensor:
    """Rotate each complex column by a phase so it is real (for real eigenvalues), unit norm."""
    if vecs.shape[1] == 0:
        return vecs
    idx = vecs.abs().argmax(dim=0)
    pivot = vecs.gather(0, idx[None])
    real = (vecs * (pivot.conj() / pivot.abs())).real
    return (real / real.norm(dim=0, keepdim=True)).to(torch.complex128)


def _tidy_parts(vals: Tensor, vecs: Tensor | None, iterate: str, real_tol: float
                ) -> tuple[Tensor, Tensor | None, Tensor]:
    is_real = vals.imag.abs() <= real_tol * vals.abs()
    vals = torch.where(is_real, vals.real.to(torch.complex128), vals)
    if vecs is not None:
        vecs = vecs.clone()
        vecs[:, is_real] = _realify(vecs[:, is_real])
    pos, neg = (~is_real) & (vals.imag > 0), (~is_real) & (vals.imag < 0)
    if int(pos.sum()) == int(neg.sum()):  # always so for a real matrix; make the pairs exact
        vals = torch.cat([vals[is_real], vals[pos], vals[pos].conj()])
        if vecs is not None:
            vecs = torch.cat([vecs[:, is_real], vecs[:, pos], vecs[:, pos].conj()], dim=1)
        n_real, n_pairs = int(is_real.sum()), int(pos.sum())
        is_real = torch.arange(n_real + 2 * n_pairs) < n_real
    where = order(vals, iterate)
    return vals[where], (vecs[:, where] if vecs is not None else None), is_real[where]


def tidy(vals: Tensor, vecs: Tensor, iterate: str, real_tol: float) -> Triple:
    """Snap near-real eigenvalues (and their vectors) to real, make conjugate pairs exact, sort."""
    vals, tidy_vecs, is_real = _tidy_parts(vals, vecs, iterate, real_tol)
    assert tidy_vecs is not None
    return vals, tidy_vecs, is_real


def tidy_values(vals: Tensor, iterate: str, real_tol: float) -> tuple[Tensor, Tensor]:
    """:func:`tidy` of eigenvalues alone: (values, is_real), in the same order."""
    vals, _, is_real = _tidy_parts(vals, None, iterate, real_tol)
    return vals, is_real


def sorted_eig(F: Tensor, iterate: str, real_tol: float) -> Triple:
    """Every eigenpair of F (float64 [d, d], CPU) by LAPACK, tidied and sorted (:func:`tidy`)."""
    vals, vecs = torch.linalg.eig(F)
    return tidy(vals, vecs, iterate, real_tol)


# ----------------------------------------------------------------------------- values first


def _leading_count(is_real: Tensor) -> int:
    """How many leading positions get eigenvectors on the values-first path: the first three (B
    and B2 read positions 0 and 1 or 2) and the conjugate partner of a pair among them."""
    n, j = is_real.numel(), 0
    while j < min(n, 3):
        j += 1 if bool(is_real[j]) else 2
    return min(j, n)


def _inverse_vector(M: Tensor, lam: complex, real: bool, scale: float,
                    gen: torch.Generator) -> Tensor | None:
    """Unit eigenvector of M [n, n] for its eigenvalue ``lam`` by inverse iteration (float64 for
    a real ``lam``, complex128 otherwise), or None when ||M x - lam x|| stays above
    VECTOR_RESIDUAL_TOL * scale (scale: ||M||_F)."""
    dtype = torch.float64 if real else torch.complex128
    target = complex(lam.real, 0.0) if real else lam
    Mx = M.to(dtype)
    shift = (target.real if real else target) + INVERSE_SHIFT * scale  # off lam: LU not singular
    LU, pivots, _ = torch.linalg.lu_factor_ex(Mx - shift * torch.eye(M.shape[0], dtype=dtype))
    x = torch.randn(M.shape[0], dtype=dtype, generator=gen)
    lam_x = target.real if real else target
    for _ in range(INVERSE_STEPS):  # every step: a step costs O(n^2) beside the LU's O(n^3)
        x = torch.linalg.lu_solve(LU, pivots, x[:, None])[:, 0]
        norm = float(torch.linalg.vector_norm(x))
        if not math.isfinite(norm) or norm == 0.0:
            return None
        x = x / norm
    residual = float(torch.linalg.vector_norm(Mx @ x - lam_x * x))
    return x if residual <= VECTOR_RESIDUAL_TOL * scale else None


def leading_vectors(M: Tensor, vals: Tensor, is_real: Tensor,
                    lift: Callable[[Tensor, complex], Tensor | None] | None = None
                    ) -> Tensor | None:
    """Unit eigenvectors (complex128 [., c], c = the first three positions and a partner of a
    pair among them) of the leading sorted eigenvalues ``vals`` of M, by inverse iteration, a
    conjugate pair's second vector the conjugate of its first; ``lift`` maps each to a vector
    of F (None: refused). None where an eigenvalue lies within SEPARATION_TOL ||M||_F of
    another (repeated or clustered to rounding: its eigenvector is then whatever LAPACK
    returns, so the caller takes the full eig) or a residual fails."""
    scale = float(torch.linalg.matrix_norm(M))
    gen = torch.Generator().manual_seed(0)
    count, cols, j = _leading_count(is_real), [], 0
    while j < count:
        lam, real = complex(vals[j]), bool(is_real[j])
        gaps = (vals - vals[j]).abs()
        gaps[j] = float("inf")
        if gaps.numel() > 1 and float(gaps.min()) <= SEPARATION_TOL * scale:
            return None
        y = _inverse_vector(M, lam, real, scale, gen)
        x = y if y is None or lift is None else lift(y, lam)
        if x is None:
            return None
        cols.append(x.to(torch.complex128))
        if not real:
            cols.append(cols[-1].conj())
        j += 1 if real else 2
    return torch.stack(cols, dim=1)


def eig_leading(F: Tensor, iterate: str, real_tol: float) -> Triple:
    """Every eigenvalue of F from LAPACK without eigenvectors, tidied and sorted as by
    :func:`tidy`, and the eigenvectors of the leading positions only (:func:`leading_vectors`,
    [d, c]); the full eig (:func:`sorted_eig`) where a vector is refused."""
    vals, is_real = tidy_values(torch.linalg.eigvals(F), iterate, real_tol)
    vecs = leading_vectors(F, vals, is_real)
    if vecs is None:
        return sorted_eig(F, iterate, real_tol)
    return vals, vecs, is_real


# ----------------------------------------------------------------------------- thin F = A B


def _real_times(M: Tensor, v: Tensor) -> Tensor:
    """M @ v for a real M and a real or complex v, without a complex copy of M."""
    return torch.complex(M @ v.real, M @ v.imag) if v.is_complex() else M @ v


def _thin_cpu(F: LowRankOperator) -> tuple[Tensor, Tensor, Tensor]:
    """(A, B, B A) of a thin F in float64 on the CPU."""
    A = F.left.detach().to("cpu", torch.float64)
    B = F.right.detach().to("cpu", torch.float64)
    return A, B, B @ A


def _lifter(A: Tensor, B: Tensor, tol: float) -> Callable[[Tensor, complex], Tensor | None]:
    """y (an eigenvector of B A) -> the unit eigenvector A y / ||A y|| of F = A B, or None
    where ||F x - lambda x|| > tol ||A||_F ||B||_F (>= tol ||F||_F) or A y = 0."""
    scale_F = float(torch.linalg.matrix_norm(A)) * float(torch.linalg.matrix_norm(B))

    def lift(y: Tensor, lam: complex) -> Tensor | None:
        x = _real_times(A, y)
        norm = float(torch.linalg.vector_norm(x))
        if not norm > 0.0:
            return None
        x = x / norm
        target = lam if y.is_complex() else lam.real
        residual = float(torch.linalg.vector_norm(_real_times(A, _real_times(B, x)) - target * x))
        return x if residual <= tol * scale_F else None
    return lift


def _nonzero_lead(vals_r: Tensor, iterate: str, count: int) -> bool:
    """Whether the first ``count`` sorted eigenvalues of B A all rank above F's zeros."""
    q_zero = _shift(iterate)  # where the d - r zeros sort
    return int(((vals_r[:count] + q_zero).abs() > q_zero).sum()) == count


def _factored_leading(F: LowRankOperator, iterate: str, real_tol: float) -> Triple | None:
    """:func:`eig_leading` for a real factored F = A B (r < d): the r eigenvalues of B A from
    LAPACK without eigenvectors, then d - r zeros, and the leading eigenvectors A y from B A's
    (each residual checked on F). None where that does not apply (complex factors, r >= d, a
    zero eigenvalue among the leading three) or a vector is refused."""
    d, r = F.shape[0], F.rank_bound
    if F.dtype.is_complex or r >= d:
        return None
    A, B, BA = _thin_cpu(F)
    vals_r, real_r = tidy_values(torch.linalg.eigvals(BA), iterate, real_tol)
    if vals_r.numel() < 3 or not _nonzero_lead(vals_r, iterate, 3):
        return None
    vecs = leading_vectors(BA, vals_r, real_r, _lifter(A, B, VECTOR_RESIDUAL_TOL))
    if vecs is None:
        return None
    all_vals = torch.cat([vals_r, torch.zeros(d - r, dtype=vals_r.dtype)])
    where = order(all_vals, iterate)
    is_real = torch.cat([real_r, torch.ones(d - r, dtype=torch.bool)])
    return all_vals[where], vecs, is_real[where]


def factored_eig(F: LowRankOperator, iterate: str, real_tol: float, vectors: bool) -> Triple:
    """Every eigenpair of a factored F = A B from B A (linalg.lowrank_eig), tidied. Without
    ``vectors`` the null-space basis of B (the zero eigenvalues' vectors, d^2 r to build) is
    skipped unless a zero is among the three leading positions: the vectors returned are
    then the r others', sorted, of which only the leading ones are used (B, B2); where the
    factors are real, the values come from LAPACK without eigenvectors and only the leading
    vectors are computed (values-first, as :func:`eig_leading`)."""
    if not vectors:
        leading = _factored_leading(F, iterate, real_tol)
        if leading is not None:
            return leading
    vals, vecs = lowrank_eig(F, null_space=vectors)
    if vecs.shape[1] == vals.numel():
        return tidy(vals, vecs, iterate, real_tol)
    r = vecs.shape[1]
    vals_r, vecs_r, real_r = tidy(vals[:r], vecs, iterate, real_tol)
    if vals_r.numel() < 3 or not _nonzero_lead(vals_r, iterate, 3):
        return tidy(*lowrank_eig(F, null_space=True), iterate, real_tol)
    all_vals = torch.cat([vals_r, vals[r:]])
    where = order(all_vals, iterate)
    is_real = torch.cat([real_r, torch.ones(vals.numel() - r, dtype=torch.bool)])
    return all_vals[where], vecs_r, is_real[where]


# ----------------------------------------------------------------------------- top k


def _plus_identity(F: Tensor | LinearOperator, iterate: str) -> Tensor | LinearOperator:
    """F, or I + F for "I+F"."""
    if iterate != "I+F":
        return F
    if isinstance(F, Tensor):
        return F + torch.eye(F.shape[0], dtype=F.dtype, device=F.device)
    return F + IdentityOperator(F.shape[0], dtype=F.dtype, device=F.device)


def _eigs_pairs(M: Tensor | LinearOperator, iterate: str, k: int, eigs_kw: dict[str, Any]
                ) -> tuple[Tensor, Tensor, bool]:
    """(values of F, vectors, converged): linalg.eigs's top k of M (F, or I + F for "I+F"), the
    non-finite pairs dropped, on the CPU."""
    res = eigs(_plus_identity(M, iterate), k, which="LM", return_vectors=True, **eigs_kw)
    vals = res.values.to("cpu", torch.complex128)
    assert res.vectors is not None  # return_vectors=True
    vecs = res.vectors.to("cpu", torch.complex128)
    keep = torch.isfinite(vals) & torch.isfinite(vecs).all(dim=0)
    return vals[keep] - _shift(iterate), vecs[:, keep], bool(res.converged)


def _factored_topk(F: LowRankOperator, iterate: str, real_tol: float, k: int,
                   eigs_kw: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor, bool] | None:
    """:func:`eig_topk` of a real thin F = A B from the r x r matrix B A (the same nonzero
    eigenvalues; vectors A y, each residual checked on F to ``eigs_kw["tol"]``-scale). None
    where F's d - r zeros could rank among the top k (their vectors are not A y) or a vector
    is refused (A y = 0): the caller then runs eigs on F itself."""
    if F.dtype.is_complex or F.rank_bound >= F.shape[0] or F.rank_bound < k + 2:
        return None
    A, B = F.left.detach(), F.right.detach()
    vals, Y, converged = _eigs_pairs(B @ A, iterate, k, eigs_kw)
    vals_s = vals[order(vals, iterate)]
    if vals.numel() < min(k, 3) or not _nonzero_lead(vals_s, iterate, vals.numel()):
        return None
    lift = _lifter(A.to("cpu", torch.float64), B.to("cpu", torch.float64), VECTOR_RESIDUAL_TOL)
    cols = [lift(Y[:, j], complex(vals[j])) for j in range(vals.numel())]
    if any(x is None for x in cols):
        return None
    X = torch.stack([x.to(torch.complex128) for x in cols if x is not None], dim=1)
    return (*tidy(vals, X, iterate, real_tol), converged)


def eig_topk(F: Tensor | LinearOperator, iterate: str, real_tol: float, k: int,
             eigs_kw: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor, bool]:
    """(values, vectors, is_real, converged): the top-k eigenpairs of F (of I + F for "I+F") by
    linalg.eigs (``eigs_kw``: its tol, max_restarts, seed), tidied like :func:`tidy`; a real
    thin F = A B from its r x r B A where that gives F's top k (:func:`_factored_topk`)."""
    if isinstance(F, LowRankOperator):
        out = _factored_topk(F, iterate, real_tol, k, eigs_kw)
        if out is not None:
            return out
    vals, vecs, converged = _eigs_pairs(F, iterate, k, eigs_kw)
    return (*tidy(vals, vecs, iterate, real_tol), converged)
