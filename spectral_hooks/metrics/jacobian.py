"""Jacobian view of one block (METRICS.md section 2): spectrum, rotation, symmetry, non-normality.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator
    >>> g = torch.Generator().manual_seed(0)
    >>> J = torch.eye(64, dtype=torch.float64) + torch.randn(64, 64, generator=g,
    ...                                                     dtype=torch.float64) / 8
    >>> m = jacobian_metrics(DenseOperator(J), k=8, n_samples=64)     # matrix-free
    >>> m.eigenvalues.shape[0] >= 8, m.departure is None
    (True, True)
    >>> exact = jacobian_metrics(J, k=8, dense=True)                   # all 64 eigenvalues
    >>> exact.eigenvalues.shape[0], exact.departure is not None
    (64, True)
    >>> sorted(jacobian_row(m, layer=0, position=0))[:4]
    ['commutator', 'commutator_se', 'converged', 'd']

One definition, two computations (the contract of docs/metrics.md). ``J`` is the block Jacobian
(d x d, real) as a LinearOperator with ``rmatvec`` (a VJP), or a dense tensor; Delta J = J - I.

* Rotation is read from the eigenvalues of J (not of Delta J: in a post-LN model the top of
  J - I is the directions the norm removes, J ~ 0 there, so J - I ~ -1: a reflection that an
  angle statistic would read as maximal rotation). The top-k versions (``*_top{k}``) are
  computed in both modes, from the exact top-k in dense mode; the full-spectrum versions only
  in dense mode.
* Non-normality: the commutator ||Delta J^T Delta J - Delta J Delta J^T||_F / ||Delta J||_F^2
  (exact dense; a Hutchinson estimate with its standard error matrix-free) and Henrici's
  departure, unnormalised and divided by ||Delta J||_F (dense mode only: None matrix-free),
  bracketed in both modes by ``departure_rel_upper_top{k}`` (from ||K||_F^2 and the imaginary
  parts of the top-k eigenvalues) and ``departure_rel_lower`` (Eberlein's commutator bound):
  metrics/departure.py; exact dense, Hutchinson estimates with standard errors matrix-free.
* sym_energy: exact dense, a Hutchinson ratio with its standard error matrix-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor

from spectral_hooks.checks import check_int
from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import DenseOperator, IdentityOperator, LinearOperator, eigs, svds
from spectral_hooks.metrics.departure import departure_bounds, departure_bounds_from_probes
from spectral_hooks.metrics.jacobian_nulls import (
    expected_real_eigenvalues,
    frac_complex_null,
    frac_complex_top_null,
)
from spectral_hooks.metrics.rotation import (
    COMPLEX_RTOL,
    RotationStats,
    rotation_stats,
    top_k_by_modulus,
)
from spectral_hooks.metrics.schur import SCHUR_MAX_D, schur_diagonal, symmetric_part

__all__ = ["JacobianMetrics", "jacobian_metrics", "jacobian_row", "eigen_rows",
           "frac_complex_null", "frac_complex_top_null", "expected_real_eigenvalues",
           "symmetric_part", "schur_diagonal", "SCHUR_MAX_D", "COMPLEX_RTOL",
           "MATRIX_FREE_ABSENT"]

#: columns of the exact (dense) table that the matrix-free one does not have, and why
MATRIX_FREE_ABSENT = {
    "frac_complex": "full-spectrum share of complex eigenvalues: needs every eigenvalue of J",
    "frac_complex_null": "the EKS null of the full-spectrum frac_complex",
    "mean_abs_angle": "full-spectrum mean rotation angle: needs every eigenvalue of J",
    "frac_negative": "full-spectrum share of reflections: needs every eigenvalue of J",
    "departure": "Henrici departure needs every eigenvalue (sum |lambda_i|^2 is no trace of a "
                 "polynomial in J: no Hutchinson estimator exists); departure_rel_upper_top{k} "
                 "and departure_rel_lower bracket departure_rel matrix-free",
    "departure_rel": "as departure",
}


@dataclass(frozen=True)
class JacobianMetrics:
    """Per-(layer, position) Jacobian metrics; see :func:`jacobian_metrics`.

    eigenvalues / eig_residuals: matrix-free, the top-k' of J by modulus (k' = k, or k + 1 when
    a conjugate pair straddles k) and ||J v - lambda v|| / |lambda|; dense, all d.
    top: rotation statistics of the top-k' eigenvalues (both modes); full: of all d (dense
    only, else None). top_null / top_null_se: Monte Carlo null of top.frac_complex for the same
    (d, k). singular_values / delta_singular_values: top-k of J and Delta J (dense: all d).
    ``*_se``: standard errors of the Hutchinson estimates (0 in dense mode). departure,
    departure_rel: Henrici's departure and its ratio to ||Delta J||_F (None matrix-free).
    departure_rel_upper / departure_rel_lower (+ ``_se``): bounds of departure_rel from the
    top-k eigenvalues and ||K||_F^2, and from the commutator (metrics/departure.py).
    """

    d: int
    k: int
    dense: bool
    eigenvalues: Tensor
    eig_residuals: Tensor
    converged: bool
    singular_values: Tensor
    delta_singular_values: Tensor
    top: RotationStats
    top_null: float
    top_null_se: float
    full: Optional[RotationStats]
    frac_complex_null: Optional[float]
    sym_energy: float
    sym_energy_se: float
    commutator: float
    commutator_se: float
    departure: Optional[float]
    departure_rel: Optional[float]
    departure_rel_upper: float
    departure_rel_upper_se: float
    departure_rel_lower: float
    departure_rel_lower_se: float
    self_alignment: float
    top_eig_abs: float
    frob_sq: float
    n_matvecs: int


# --------------------------------------------------------------------------- dense


def _self_alignment(U: Tensor, Vh: Tensor, k: int) -> float:
    return float(torch.linalg.matrix_norm(U[:, :k].T @ Vh[:k].T) ** 2) / k


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def _sorted_eig(J: Tensor) -> tuple[Tensor, Tensor]:
    lam, V = torch.linalg.eig(J)
    order = torch.argsort(lam.abs(), descending=True, stable=True)
    lam, V = lam[order], V[:, order]
    res = torch.linalg.vector_norm(J.to(V.dtype) @ V - V * lam, dim=0) / lam.abs().clamp(
        min=1e-300)
    return lam, res


def _dense(J: Tensor, k: int, seed: int, n_matvecs: int) -> JacobianMetrics:
    d = J.shape[0]
    D = J - torch.eye(d, dtype=torch.float64, device=J.device)
    lam, res = _sorted_eig(J)
    U, sd, Vh = torch.linalg.svd(D)
    fro_d = float(torch.linalg.matrix_norm(D) ** 2)
    sym = float(torch.linalg.matrix_norm(0.5 * (D + D.T)) ** 2)
    comm = float(torch.linalg.matrix_norm(D.T @ D - D @ D.T))
    dep = math.sqrt(max(0.0, fro_d - float(((lam - 1).abs() ** 2).sum())))
    kk = min(k, d)
    null, null_se = frac_complex_top_null(d, kk, seed=seed)
    top = top_k_by_modulus(lam, kk)
    bounds = departure_bounds(D, top)
    return JacobianMetrics(
        d=d, k=kk, dense=True, eigenvalues=lam, eig_residuals=res, converged=True,
        singular_values=torch.linalg.svdvals(J), delta_singular_values=sd,
        top=rotation_stats(top), top_null=null, top_null_se=null_se,
        full=rotation_stats(lam), frac_complex_null=frac_complex_null(d),
        sym_energy=_ratio(sym, fro_d), sym_energy_se=0.0, commutator=_ratio(comm, fro_d),
        commutator_se=0.0, departure=dep, departure_rel=_ratio(dep, math.sqrt(fro_d)),
        departure_rel_upper=bounds["upper"], departure_rel_upper_se=0.0,
        departure_rel_lower=bounds["lower"], departure_rel_lower_se=0.0,
        self_alignment=_self_alignment(U, Vh, kk), top_eig_abs=float(lam[0].abs()),
        frob_sq=float(torch.linalg.matrix_norm(J) ** 2), n_matvecs=n_matvecs)


# --------------------------------------------------------------------------- matrix-free


def _ratio_se(num: Tensor, den: Tensor) -> tuple[float, float]:
    """mean(num) / mean(den) and its delta-method standard error."""
    n, a, b = num.numel(), float(num.mean()), float(den.mean())
    r = _ratio(a, b)
    se = float((num - r * den).std(correction=1)) / math.sqrt(n) / b if n > 1 and b > 0 \
        else float("nan")
    return r, se


def _sqrt_ratio_se(num: Tensor, den: Tensor) -> tuple[float, float]:
    """sqrt(mean(num)) / mean(den) and its delta-method standard error."""
    n, a, b = num.numel(), float(num.mean()), float(den.mean())
    if not (a > 0 and b > 0):
        return (0.0 if a == 0 and b > 0 else float("nan")), float("nan")
    c = math.sqrt(a) / b
    lin = num / (2 * math.sqrt(a) * b) - math.sqrt(a) * den / b ** 2
    return c, float(lin.std(correction=1)) / math.sqrt(n) if n > 1 else float("nan")


def _hutchinson(J: LinearOperator, n_samples: int, seed: int, top: Tensor) -> dict:
    """sym_energy, commutator, the departure bounds (each with its standard error) and
    ||J||_F^2 from shared Rademacher probes z: Y = Delta J z, W = Delta J^T z estimate
    ||Delta J||_F^2 by (||Y||^2 + ||W||^2) / 2 and ||S||_F^2 by ||Y + W||^2 / 4; C z =
    Delta J^T Y - Delta J W estimates ||C||_F^2 by ||C z||^2 (C the commutator); ||z + Y||^2
    estimates ||J||_F^2; ``top`` (eigenvalues of J) enter the upper departure bound."""
    g = torch.Generator().manual_seed(int(seed))
    Z = (torch.randint(0, 2, (J.shape[1], n_samples), generator=g) * 2 - 1).to(
        device=J.device, dtype=torch.float64)

    def apply(f, X: Tensor) -> Tensor:
        out = f(X.to(J.dtype)).to(torch.float64)
        if not bool(torch.isfinite(out).all()):
            raise FloatingPointError("jacobian_metrics: operator returned NaN or Inf")
        return out
    JZ, JtZ = apply(J.matmat, Z), apply(J.rmatmat, Z)
    Y, W = JZ - Z, JtZ - Z
    CZ = (apply(J.rmatmat, Y) - Y) - (apply(J.matmat, W) - W)
    den = ((Y ** 2).sum(0) + (W ** 2).sum(0)) / 2
    sym, sym_se = _ratio_se(((Y + W) ** 2).sum(0) / 4, den)
    comm, comm_se = _sqrt_ratio_se((CZ ** 2).sum(0), den)
    b = departure_bounds_from_probes(Z, Y, W, CZ, top)
    return dict(sym_energy=sym, sym_energy_se=sym_se, commutator=comm, commutator_se=comm_se,
                departure_rel_upper=b["upper"], departure_rel_upper_se=b["upper_se"],
                departure_rel_lower=b["lower"], departure_rel_lower_se=b["lower_se"],
                frob_sq=float((JZ ** 2).sum(0).mean()))


def _matrix_free(op: LinearOperator, k: int, n_samples: int, seed: int, tol: float,
                 start: int) -> JacobianMetrics:
    d = op.shape[0]
    op._need_adjoint()
    delta = op - IdentityOperator(d, dtype=op.dtype, device=op.device)
    ej = eigs(op, k, tol=tol, seed=seed, return_vectors=False)
    sj = svds(op, k, tol=tol, seed=seed + 2, return_vectors=False)
    sd = svds(delta, k, tol=tol, seed=seed + 3)
    conv = bool(ej.converged) and bool(sj.converged) and bool(sd.converged)
    lam = top_k_by_modulus(ej.values, k)
    hutch = _hutchinson(op, n_samples, seed + 4, lam)
    null, null_se = frac_complex_top_null(d, k, seed=seed)
    assert sd.U is not None and sd.Vh is not None  # svds returns vectors by default
    return JacobianMetrics(
        d=d, k=k, dense=False, eigenvalues=ej.values, eig_residuals=ej.residuals,
        converged=conv, singular_values=sj.S, delta_singular_values=sd.S,
        top=rotation_stats(lam), top_null=null, top_null_se=null_se, full=None,
        frac_complex_null=None, departure=None, departure_rel=None,
        self_alignment=_self_alignment(sd.U, sd.Vh, k), top_eig_abs=float(lam[0].abs()),
        n_matvecs=op.n_matvecs - start, **hutch)


def _as_operator(J: Union[LinearOperator, Tensor]) -> LinearOperator:
    if isinstance(J, Tensor):
        if J.ndim != 2 or J.shape[0] != J.shape[1]:
            raise ValueError(f"jacobian_metrics: J must be square [d, d], got {tuple(J.shape)}")
        if J.is_complex():
            raise ValueError("jacobian_metrics: J must be real")
        return DenseOperator(J.to(torch.float64), name="J")
    if isinstance(J, LinearOperator):
        if J.shape[0] != J.shape[1]:
            raise ValueError(f"jacobian_metrics: J must be square, got shape {J.shape}")
        if J.dtype.is_complex:
            raise ValueError("jacobian_metrics: J must be real")
        return J
    raise TypeError(f"jacobian_metrics: J must be a LinearOperator or a tensor [d, d], got "
                    f"{type(J).__name__}")


def jacobian_metrics(J: Union[LinearOperator, Tensor], *, k: int = 16, dense: bool = False,
                     n_samples: int = 64, seed: int = 0, tol: float = 1e-8) -> JacobianMetrics:
    """All section-2 metrics of one block Jacobian J (d x d, real).

    >>> m = jacobian_metrics(torch.eye(8, dtype=torch.float64) * 2, k=2, dense=True)
    >>> m.sym_energy, round(m.departure, 6), m.commutator, m.top.frac_complex
    (1.0, 0.0, 0.0, 0.0)

    Matrix-free (default): needs ``1 <= k <= d - 2``; top-k eigenvalues by ``linalg.eigs``,
    top-k singular values of J and Delta J by ``linalg.svds``, sym_energy, commutator and
    ||J||_F^2 from ``n_samples`` shared Rademacher probes (2 products with J and 2 with J^T
    each); no full-spectrum statistic and no Henrici departure (None). Dense (``dense=True``):
    every eigenvalue and singular value, exact everything (Henrici's departure from
    ||Delta J||_F^2 - sum |lambda - 1|^2: accurate to ~sqrt(eps) ||Delta J||_F); the top-k
    statistics are taken from the exact top-k. ``tol``: eigs/svds tolerance; ``seed`` fixes
    every start vector, probe and the Monte Carlo null. ``converged`` is False when any eigs/svds run was not.
    """
    op = _as_operator(J)
    d = op.shape[0]
    check_int("k", k, minimum=1, hint="jacobian_metrics")
    start = op.n_matvecs
    if dense:
        if d > SCHUR_MAX_D:
            raise ValueError(f"jacobian_metrics: dense mode needs d <= SCHUR_MAX_D = "
                             f"{SCHUR_MAX_D}, got d = {d}")
        Jd = J.to(torch.float64) if isinstance(J, Tensor) else op.to_dense().to(torch.float64)
        return _dense(Jd, k, seed, op.n_matvecs - start)
    if k > d - 2:
        raise OptionError("k", k, f"k <= d - 2 = {d - 2} in matrix-free mode",
                          hint=f"jacobian_metrics: d = {d}; use dense=True for the full spectrum")
    check_int("n_samples", n_samples, minimum=2, hint="jacobian_metrics")
    return _matrix_free(op, k, n_samples, seed, tol, start)


# --------------------------------------------------------------------------- rows


def jacobian_row(metrics: JacobianMetrics, *, layer: int, position: int) -> dict[str, Any]:
    """One row of ``report.jacobian``: top-k statistics carry ``_top{k}`` in their names; the
    full-spectrum ones and Henrici's departure appear only in dense mode.

    >>> row = jacobian_row(jacobian_metrics(torch.eye(4) * 2, k=2, dense=True), layer=0,
    ...                    position=3)
    >>> row["layer"], row["position"], row["frac_complex_top2"], round(row["departure"], 6)
    (0, 3, 0.0, 0.0)
    """
    m, t = metrics, f"_top{metrics.k}"
    row: dict[str, Any] = dict(layer=int(layer), position=int(position), top_eig_abs=m.top_eig_abs)
    # each null right after the metric it qualifies
    row.update({f"frac_complex{t}": m.top.frac_complex, f"frac_complex{t}_null": m.top_null,
                f"frac_complex{t}_null_se": m.top_null_se,
                f"mean_abs_angle{t}": m.top.mean_abs_angle, f"frac_negative{t}": m.top.frac_negative})
    if m.full is not None:
        row.update(frac_complex=m.full.frac_complex, frac_complex_null=m.frac_complex_null,
                   mean_abs_angle=m.full.mean_abs_angle, frac_negative=m.full.frac_negative)
    row.update(sym_energy=m.sym_energy, sym_energy_se=m.sym_energy_se, commutator=m.commutator,
               commutator_se=m.commutator_se)
    if m.departure is not None:
        row.update(departure=m.departure, departure_rel=m.departure_rel)
    row.update({f"departure_rel_upper{t}": m.departure_rel_upper,
                f"departure_rel_upper{t}_se": m.departure_rel_upper_se,
                "departure_rel_lower": m.departure_rel_lower,
                "departure_rel_lower_se": m.departure_rel_lower_se})
    row.update({f"self_alignment{t}": m.self_alignment})
    row.update(n_matvecs=int(m.n_matvecs), k=int(m.k), n_eigenvalues=int(m.eigenvalues.shape[0]),
               d=int(m.d), dense=bool(m.dense), converged=bool(m.converged))
    return row


def eigen_rows(metrics: JacobianMetrics, *, layer: int, position: int) -> list[dict[str, Any]]:
    """Rows of the long ``spectra`` table: the eigenvalues of J, by descending modulus.

    >>> eigen_rows(jacobian_metrics(torch.eye(3) * 2, dense=True), layer=1, position=0)[0]
    {'source': 'jacobian', 'layer': 1, 'position': 0, 'index': 0, 'real': 2.0, 'imag': 0.0, 'abs': 2.0}
    """
    return [dict(source="jacobian", layer=int(layer), position=int(position), index=i,
                 real=float(z.real), imag=float(z.imag), abs=float(abs(z)))
            for i, z in enumerate(metrics.eigenvalues.tolist())]
