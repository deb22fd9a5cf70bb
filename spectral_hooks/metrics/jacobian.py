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
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import DenseOperator, IdentityOperator, LinearOperator, eigs, svds
from spectral_hooks.metrics.jacobian_nulls import expected_real_eigenvalues, frac_complex_null
from spectral_hooks.metrics.schur import SCHUR_MAX_D, schur_diagonal, symmetric_part

__all__ = ["JacobianMetrics", "jacobian_metrics", "jacobian_row", "eigen_rows",
           "frac_complex_null", "expected_real_eigenvalues", "symmetric_part",
           "schur_diagonal", "SCHUR_MAX_D", "COMPLEX_RTOL"]

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
        raise OptionError("k", k, "an int >= 1", hint="jacobian_metrics")
    if delta_spectrum not in ("eigs", "shift"):
        raise OptionError("delta_spectrum", delta_spectrum, "'eigs' or 'shift'",
                          hint="jacobian_metrics")
    start = op.n_matvecs
    if dense:
        if d > SCHUR_MAX_D:
            raise ValueError(f"jacobian_metrics: dense mode needs d <= SCHUR_MAX_D = "
                             f"{SCHUR_MAX_D}, got d = {d}")
        Jd = J if isinstance(J, Tensor) else op.to_dense().to(torch.float64)
        return _dense(Jd, k, op.n_matvecs - start)
    if k > d - 2:
        raise OptionError("k", k, f"k <= d - 2 = {d - 2} in matrix-free mode",
                          hint=f"jacobian_metrics: d = {d}; use dense=True for the full spectrum")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise OptionError("n_samples", n_samples, "an int >= 2", hint="jacobian_metrics")
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
