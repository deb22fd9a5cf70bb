"""Jacobian view of one block (METRICS.md section 2): spectrum, rotation, symmetry, non-normality.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator
    >>> g = torch.Generator().manual_seed(0)
    >>> J = torch.eye(64, dtype=torch.float64) + torch.randn(64, 64, generator=g,
    ...                                                     dtype=torch.float64) / 8
    >>> m = jacobian_metrics(DenseOperator(J), k=8, n_samples=64)     # matrix-free
    >>> m.eigenvalues.shape[0] >= 8, m.departure_is_bound
    (True, True)
    >>> exact = jacobian_metrics(J, dense=True)                        # all 64 eigenvalues
    >>> exact.eigenvalues.shape[0], exact.departure_is_bound
    (64, False)
    >>> round(frac_complex_null(4096), 3)                              # the random baseline
    0.987

``J`` is the block Jacobian (d x d, real) as a LinearOperator with ``rmatvec`` (a VJP) or a
dense tensor; Delta J = J - I. Matrix-free mode uses restarted Arnoldi (``linalg.eigs``),
Lanczos bidiagonalisation (``linalg.svds``) and Hutchinson probes; dense mode (``dense=True``)
forms J (d matvecs for an operator) and computes everything exactly. Everything is float64.

Rotation metrics use the eigenvalues of Delta J. Dense: all d of them (= eig(J) - 1).
Matrix-free (``delta_spectrum="eigs"``, the default): the top-k of Delta J by modulus from a
second Arnoldi run on J - I; ``"shift"`` reuses the top-k of J minus 1 instead (no extra
matvecs, but it selects the eigenvalues of Delta J with the largest |1 + mu|, which favours
Re mu > 0 and so biases the angles towards 0).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from spectral_hooks.linalg import (DenseOperator, IdentityOperator, LinearOperator, eigs,
                                   svds)

__all__ = ["JacobianMetrics", "jacobian_metrics", "jacobian_row", "eigen_rows",
           "frac_complex_null", "expected_real_eigenvalues", "symmetric_part",
           "schur_diagonal", "SCHUR_MAX_D", "COMPLEX_RTOL"]

SCHUR_MAX_D = 2048  # dense-mode size limit of the Schur ablation
COMPLEX_RTOL = 1e-6  # an eigenvalue mu counts as complex when |Im mu| > COMPLEX_RTOL |mu|


@dataclass(frozen=True)
class JacobianMetrics:
    """Per-(layer, position) Jacobian metrics; see :func:`jacobian_metrics`.

    eigenvalues / eig_residuals: top-k' of J by modulus (k' = k, or k + 1 when the k-th and
    (k+1)-th are a conjugate pair; dense: all d) and ||J v - lambda v|| / |lambda|.
    delta_eigenvalues: the eigenvalues of Delta J the rotation metrics use.
    singular_values / delta_singular_values: top-k of J and of Delta J (dense: all d).
    sym_energy_se: standard error of the Hutchinson ratio (0 in dense mode).
    frob_sq: ||J||_F^2 (estimated matrix-free). departure_is_bound: departure is the upper
    bound from the top-k eigenvalues (matrix-free) rather than the exact value (dense).
    """

    d: int
    k: int
    dense: bool
    eigenvalues: Tensor
    eig_residuals: Tensor
    delta_eigenvalues: Tensor
    converged: bool
    singular_values: Tensor
    delta_singular_values: Tensor
    frac_complex: float
    frac_complex_null: float
    mean_abs_angle: float
    sym_energy: float
    sym_energy_se: float
    frob_sq: float
    departure: float
    departure_is_bound: bool
    self_alignment: float
    top_eig_abs: float
    n_matvecs: int


# --------------------------------------------------------------------------- nulls


def expected_real_eigenvalues(d: int) -> float:
    """Expected number of real eigenvalues of a d x d matrix with iid N(0, 1) entries.

    >>> expected_real_eigenvalues(1), round(expected_real_eigenvalues(2), 12)
    (1.0, 1.414213562373)

    Edelman, Kostlan & Shub (1994), Theorem 5.1, exact for every d:
    E_d = 1/2 + sqrt(2) 2F1(1, -1/2; d; 1/2) / B(d, 1/2) ~ sqrt(2d/pi) + 1/2.
    The hypergeometric series has terms (-1/2)_j / (d)_j 2^-j and converges geometrically.
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"expected_real_eigenvalues: d must be an int >= 1, got {d!r}")
    total, term, j = 0.0, 1.0, 0
    while abs(term) > 1e-18 * abs(total) or j == 0:
        total += term
        term *= (j - 0.5) / (d + j) * 0.5
        j += 1
    log_beta = math.lgamma(d) + math.lgamma(0.5) - math.lgamma(d + 0.5)
    return 0.5 + math.sqrt(2.0) * total * math.exp(-log_beta)


def frac_complex_null(d: int) -> float:
    """Expected share of non-real eigenvalues of a real Gaussian d x d matrix: 1 - E_d / d.

    >>> frac_complex_null(1), round(frac_complex_null(64), 4)
    (0.0, 0.893)
    """
    return 1.0 - expected_real_eigenvalues(d) / d


# --------------------------------------------------------------------------- operators


def symmetric_part(J: LinearOperator) -> LinearOperator:
    """(J + J^T) / 2 as a matrix-free operator (the Hermitian part J + J^H for complex J).

    >>> A = torch.tensor([[1.0, 2.0], [0.0, 3.0]], dtype=torch.float64)
    >>> symmetric_part(DenseOperator(A)).to_dense()
    tensor([[1., 1.],
            [1., 3.]], dtype=torch.float64)

    Each application costs one matvec and one rmatvec of J; the result is its own adjoint.
    """
    if not isinstance(J, LinearOperator):
        raise TypeError(f"symmetric_part expects a LinearOperator, got {type(J).__name__}")
    if J.shape[0] != J.shape[1]:
        raise ValueError(f"symmetric_part needs a square operator, got shape {J.shape}")
    J._need_adjoint()
    half = lambda X, f, g: 0.5 * (f(X) + g(X))  # noqa: E731
    return LinearOperator(
        J.shape, matvec=lambda x: half(x, J.matvec, J.rmatvec),
        rmatvec=lambda x: half(x, J.matvec, J.rmatvec),
        matmat=lambda X: half(X, J.matmat, J.rmatmat),
        rmatmat=lambda X: half(X, J.matmat, J.rmatmat),
        dtype=J.dtype, device=J.device, name=f"sym({J.name})")


def _check_dense_square(J: Tensor, what: str) -> Tensor:
    if not isinstance(J, Tensor) or J.ndim != 2 or J.shape[0] != J.shape[1]:
        raise ValueError(f"{what}: need a dense square tensor [d, d], got "
                         f"{tuple(J.shape) if isinstance(J, Tensor) else type(J).__name__}")
    if not (J.is_floating_point() or J.is_complex()):
        raise TypeError(f"{what}: need a floating tensor, got {J.dtype}")
    if J.shape[0] > SCHUR_MAX_D:
        raise ValueError(f"{what}: d = {J.shape[0]} exceeds the dense-mode size limit "
                         f"SCHUR_MAX_D = {SCHUR_MAX_D}")
    if not bool(torch.isfinite(J).all()):
        raise ValueError(f"{what}: J contains NaN or Inf")
    return J.to(torch.complex128 if J.is_complex() else torch.float64)


def schur_diagonal(J: Tensor, *, real: Union[bool, None] = None,
                   check_tol: float = 1e-6) -> Tensor:
    """The normal part of J: J = Q T Q^* -> Q diag(T) Q^* (same eigenvalues, departure 0).

    >>> J = torch.tensor([[1.0, 5.0], [0.0, 2.0]], dtype=torch.float64)
    >>> N = schur_diagonal(J)
    >>> torch.allclose(N @ N.T, N.T @ N), sorted(torch.linalg.eigvals(N).real.round().tolist())
    (True, [1.0, 2.0])

    No QR algorithm: for a diagonalisable J = V Lambda V^-1 with V = Q R (QR of the
    eigenvector matrix, eigenvalues by descending modulus), J = Q (R Lambda R^-1) Q^* and
    R Lambda R^-1 is upper triangular with diagonal Lambda, so Q is a complex Schur basis.

    ``real=False`` (default for complex J) returns Q diag(Lambda) Q^*. For real J with
    complex eigenvalues that matrix is in general NOT real (its imaginary part vanishes only
    when each eigenvector pair v, conj(v) is orthogonal), so ``real=True`` (default for
    real J) uses the real analogue: Q from the QR of [Re v, Im v, ...] (pairs adjacent) is a
    real Schur basis (T = Q^T J Q block upper triangular with 1x1 and 2x2 diagonal blocks);
    each 2x2 block is replaced by the normal block [[a, s b], [-s b, a]] with the same
    eigenvalues a +- ib and the block's orientation s = sign(T_12 - T_21), and the
    off-diagonal blocks are dropped. The result is real, normal, with the eigenvalues of J.

    For (nearly) defective J the eigenvector basis is ill-conditioned; a RuntimeWarning is
    issued when the part of Q^* J Q below the (block) diagonal exceeds ``check_tol`` ||J||_F.
    Sizes above ``SCHUR_MAX_D`` raise ValueError.
    """
    J = _check_dense_square(J, "schur_diagonal")
    real = (not J.is_complex()) if real is None else bool(real)
    if real and J.is_complex():
        raise ValueError("schur_diagonal: real=True needs a real J")
    d = J.shape[0]
    lam, V = torch.linalg.eig(J)
    if not real:
        order = torch.argsort(lam.abs(), descending=True, stable=True)
        lam, V = lam[order], V[:, order]
        Q = torch.linalg.qr(V).Q
        T = Q.mH @ J.to(Q.dtype) @ Q
        low = torch.tril(T, -1)
        N = (Q * lam) @ Q.mH
    else:
        # LAPACK returns real eigenvalues with Im == 0 exactly and conjugate pairs adjacent
        reps = [i for i in range(d) if lam[i].imag >= 0]
        reps.sort(key=lambda i: -float(lam[i].abs()))
        cols, blocks = [], []
        for i in reps:
            if lam[i].imag == 0:
                cols.append(V[:, i].real)
                blocks.append((float(lam[i].real),))
            else:
                cols += [V[:, i].real, V[:, i].imag]
                blocks.append((float(lam[i].real), float(lam[i].imag)))
        Q = torch.linalg.qr(torch.stack(cols, dim=1)).Q
        T = Q.T @ J @ Q
        D = torch.zeros(d, d, dtype=torch.float64)
        low = torch.tril(T, -1)
        j = 0
        for blk in blocks:
            if len(blk) == 1:
                D[j, j] = blk[0]
                j += 1
                continue
            a, b = blk
            s = 1.0 if float(T[j, j + 1] - T[j + 1, j]) >= 0 else -1.0
            D[j, j] = D[j + 1, j + 1] = a
            D[j, j + 1], D[j + 1, j] = s * b, -s * b
            low[j + 1, j] = 0.0  # inside the 2x2 block
            j += 2
        N = Q @ D @ Q.T
    jn = float(torch.linalg.matrix_norm(J))
    if float(torch.linalg.matrix_norm(low)) > check_tol * max(jn, 1e-300):
        warnings.warn(f"schur_diagonal: eigenvector basis is ill-conditioned (J nearly "
                      f"defective?); Q^* J Q is triangular only to "
                      f"{float(torch.linalg.matrix_norm(low)) / max(jn, 1e-300):.1e}",
                      RuntimeWarning, stacklevel=2)
    return N


# --------------------------------------------------------------------------- metrics


def _rotation(mu: Tensor) -> tuple[float, float]:
    """frac_complex and mean_abs_angle of eigenvalues mu (of Delta J)."""
    a = mu.abs()
    frac = float((mu.imag.abs() > COMPLEX_RTOL * a).to(torch.float64).mean())
    tot = float(a.sum())
    ang = float((a * torch.angle(mu).abs()).sum()) / tot if tot > 0 else float("nan")
    return frac, ang


def _self_alignment(U: Tensor, Vh: Tensor, k: int) -> float:
    return float(torch.linalg.matrix_norm(U[:, :k].T @ Vh[:k].T) ** 2) / k


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _dense(J: Tensor, k: int, n_matvecs: int) -> JacobianMetrics:
    d = J.shape[0]
    I = torch.eye(d, dtype=torch.float64, device=J.device)
    D = J - I
    lam, V = torch.linalg.eig(J)
    order = torch.argsort(lam.abs(), descending=True, stable=True)
    lam, V = lam[order], V[:, order]
    res = torch.linalg.vector_norm(J.to(V.dtype) @ V - V * lam, dim=0) / lam.abs().clamp(
        min=1e-300)
    s = torch.linalg.svdvals(J)
    U, sd, Vh = torch.linalg.svd(D)
    frac, ang = _rotation(lam - 1)
    fro_d = float(torch.linalg.matrix_norm(D) ** 2)
    sym = float(torch.linalg.matrix_norm(0.5 * (D + D.T)) ** 2)
    fro = float(torch.linalg.matrix_norm(J) ** 2)
    dep = math.sqrt(max(0.0, fro - float((lam.abs() ** 2).sum()))) / math.sqrt(fro) \
        if fro > 0 else float("nan")
    return JacobianMetrics(
        d=d, k=d, dense=True, eigenvalues=lam, eig_residuals=res, delta_eigenvalues=lam - 1,
        converged=True, singular_values=s, delta_singular_values=sd, frac_complex=frac,
        frac_complex_null=frac_complex_null(d), mean_abs_angle=ang,
        sym_energy=_ratio(sym, fro_d), sym_energy_se=0.0, frob_sq=fro, departure=dep,
        departure_is_bound=False, self_alignment=_self_alignment(U, Vh, min(k, d)),
        top_eig_abs=float(lam[0].abs()), n_matvecs=n_matvecs)


def _hutchinson(J: LinearOperator, n_samples: int, seed: int) -> tuple[float, float, float]:
    """sym_energy, its standard error and ||J||_F^2 from shared Rademacher probes z:
    Y = Delta J z, W = Delta J^T z; ||S z||^2 = ||Y + W||^2 / 4 estimates ||S||_F^2 and
    (||Y||^2 + ||W||^2) / 2 estimates ||Delta J||_F^2; ||z + Y||^2 estimates ||J||_F^2."""
    g = torch.Generator().manual_seed(int(seed))
    Z = (torch.randint(0, 2, (J.shape[1], n_samples), generator=g) * 2 - 1).to(
        device=J.device, dtype=torch.float64)
    JZ = J.matmat(Z.to(J.dtype)).to(torch.float64)
    JtZ = J.rmatmat(Z.to(J.dtype)).to(torch.float64)
    if not bool(torch.isfinite(JZ).all() and torch.isfinite(JtZ).all()):
        raise FloatingPointError("jacobian_metrics: operator returned NaN or Inf")
    Y, W = JZ - Z, JtZ - Z
    num = ((Y + W) ** 2).sum(0) / 4
    den = ((Y ** 2).sum(0) + (W ** 2).sum(0)) / 2
    r = _ratio(float(num.mean()), float(den.mean()))
    se = float((num - r * den).std(correction=1)) / math.sqrt(n_samples) / float(den.mean()) \
        if n_samples > 1 and float(den.mean()) > 0 else float("nan")
    return r, se, float((JZ ** 2).sum(0).mean())


def jacobian_metrics(J: Union[LinearOperator, Tensor], *, k: int = 16, dense: bool = False,
                     n_samples: int = 64, seed: int = 0, tol: float = 1e-8,
                     delta_spectrum: str = "eigs") -> JacobianMetrics:
    """All section-2 metrics of one block Jacobian J (d x d, real).

    >>> m = jacobian_metrics(torch.eye(8, dtype=torch.float64) * 2, dense=True)
    >>> m.sym_energy, round(m.departure, 6), m.frac_complex
    (1.0, 0.0, 0.0)

    Matrix-free (default): needs ``1 <= k <= d - 2`` (Arnoldi keeps k + 2 Krylov vectors);
    sym_energy and ||J||_F^2 come from ``n_samples`` shared Rademacher probes (one matmat with J
    and one with J^T), ``departure`` is the upper bound sqrt(||J||_F^2 - sum_top-k |lambda|^2)
    / ||J||_F (clipped at 0, ``departure_is_bound=True``), ``self_alignment`` uses the top-k
    singular pairs of Delta J. Dense (``dense=True``): all d eigenvalues and singular values,
    exact sym_energy and departure (from ||J||_F^2 - sum |lambda|^2, so a normal J gives ~1e-8,
    the square root of rounding); ``k`` is then used only for ``self_alignment``
    (min(k, d) singular pairs). ``tol`` is the eigs/svds tolerance; ``seed`` fixes every
    random start vector and probe. ``converged`` is False when any eigs/svds run was not.
    """
    if isinstance(J, Tensor):
        if J.ndim != 2 or J.shape[0] != J.shape[1]:
            raise ValueError(f"jacobian_metrics: J must be square [d, d], got {tuple(J.shape)}")
        if J.is_complex():
            raise ValueError("jacobian_metrics: J must be real")
        J = J.to(torch.float64)
        op = DenseOperator(J, name="J")
    elif isinstance(J, LinearOperator):
        if J.shape[0] != J.shape[1]:
            raise ValueError(f"jacobian_metrics: J must be square, got shape {J.shape}")
        if J.dtype.is_complex:
            raise ValueError("jacobian_metrics: J must be real")
        op = J
    else:
        raise TypeError(f"jacobian_metrics: J must be a LinearOperator or a tensor [d, d], got "
                        f"{type(J).__name__}")
    d = op.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"jacobian_metrics: k must be an int >= 1, got {k!r}")
    if delta_spectrum not in ("eigs", "shift"):
        raise ValueError(f"jacobian_metrics: delta_spectrum must be 'eigs' or 'shift', got "
                         f"{delta_spectrum!r}")
    start = op.n_matvecs
    if dense:
        if d > SCHUR_MAX_D:
            raise ValueError(f"jacobian_metrics: dense mode needs d <= SCHUR_MAX_D = "
                             f"{SCHUR_MAX_D}, got d = {d}")
        Jd = J if isinstance(J, Tensor) else op.to_dense().to(torch.float64)
        return _dense(Jd, k, op.n_matvecs - start)
    if k > d - 2:
        raise ValueError(f"jacobian_metrics: k = {k} too large for d = {d} (matrix-free "
                         f"mode needs k <= d - 2; use dense=True for the full spectrum)")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"jacobian_metrics: n_samples must be an int >= 2, got {n_samples!r}")
    op._need_adjoint()
    delta = op - IdentityOperator(d, dtype=op.dtype, device=op.device)
    ej = eigs(op, k, tol=tol, seed=seed, return_vectors=False)
    conv = bool(ej.converged)
    if delta_spectrum == "eigs":
        ed = eigs(delta, k, tol=tol, seed=seed + 1, return_vectors=False)
        mu, conv = ed.values, conv and bool(ed.converged)
    else:
        mu = ej.values - 1
    sj = svds(op, k, tol=tol, seed=seed + 2, return_vectors=False)
    sd = svds(delta, k, tol=tol, seed=seed + 3)
    conv = conv and bool(sj.converged) and bool(sd.converged)
    sym, sym_se, fro = _hutchinson(op, n_samples, seed + 4)
    lam = ej.values
    frac, ang = _rotation(mu)
    dep = math.sqrt(max(0.0, fro - float((lam.abs() ** 2).sum()))) / math.sqrt(fro) \
        if fro > 0 else float("nan")
    return JacobianMetrics(
        d=d, k=k, dense=False, eigenvalues=lam, eig_residuals=ej.residuals,
        delta_eigenvalues=mu, converged=conv, singular_values=sj.S,
        delta_singular_values=sd.S, frac_complex=frac, frac_complex_null=frac_complex_null(d),
        mean_abs_angle=ang, sym_energy=sym, sym_energy_se=sym_se, frob_sq=fro, departure=dep,
        departure_is_bound=True, self_alignment=_self_alignment(sd.U, sd.Vh, k),
        top_eig_abs=float(lam[0].abs()), n_matvecs=op.n_matvecs - start)


# --------------------------------------------------------------------------- rows


def jacobian_row(metrics: JacobianMetrics, *, layer: int, position: int) -> dict:
    """One row of ``report.jacobian``.

    >>> row = jacobian_row(jacobian_metrics(torch.eye(4) * 2, dense=True), layer=0, position=3)
    >>> row["layer"], row["position"], row["departure_is_bound"]
    (0, 3, False)
    """
    m = metrics
    return dict(layer=int(layer), position=int(position), frac_complex=m.frac_complex,
                frac_complex_null=m.frac_complex_null, mean_abs_angle=m.mean_abs_angle,
                sym_energy=m.sym_energy, sym_energy_se=m.sym_energy_se, departure=m.departure,
                departure_is_bound=m.departure_is_bound, self_alignment=m.self_alignment,
                top_eig_abs=m.top_eig_abs, n_matvecs=int(m.n_matvecs), k=int(m.k),
                n_eigenvalues=int(m.eigenvalues.shape[0]), d=int(m.d), dense=bool(m.dense),
                converged=bool(m.converged))


def eigen_rows(metrics: JacobianMetrics, *, layer: int, position: int) -> list[dict]:
    """Rows of the long ``spectra`` table: the eigenvalues of J, by descending modulus.

    >>> eigen_rows(jacobian_metrics(torch.eye(3) * 2, dense=True), layer=1, position=0)[0]
    {'source': 'jacobian', 'layer': 1, 'position': 0, 'index': 0, 'real': 2.0, 'imag': 0.0, 'abs': 2.0}
    """
    return [dict(source="jacobian", layer=int(layer), position=int(position), index=i,
                 real=float(z.real), imag=float(z.imag), abs=float(abs(z)))
            for i, z in enumerate(metrics.eigenvalues.tolist())]
