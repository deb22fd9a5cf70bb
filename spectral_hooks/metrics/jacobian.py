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
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor
from torch.profiler import record_function

from spectral_hooks.checks import check_int
from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import (
    BatchGroup,
    BatchMember,
    DenseOperator,
    IdentityOperator,
    LinearOperator,
    eigs,
    svds,
)
from spectral_hooks.linalg.materialize import matrix_of, svd_residuals
from spectral_hooks.linalg.results import SvdResult
from spectral_hooks.metrics.departure import (
    departure_bounds,
    departure_bounds_from_probes,
    departure_bounds_from_sums,
)
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

__all__ = ["JacobianMetrics", "jacobian_metrics", "jacobian_metrics_batch", "jacobian_row", "eigen_rows",
           "self_alignment_of",
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
    (d, k). singular_values / delta_singular_values: top-k of J and Delta J (dense: all d);
    singular_values is None where not asked for (``singular_values=False``: no column of the
    jacobian table reads it).
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
    singular_values: Optional[Tensor]
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


def self_alignment_of(U: Tensor, Vh: Tensor, k: int) -> float:
    """(1/k) ||U_k^T V_k||_F^2 of the top-k singular subspaces of Delta J = U S Vh (column
    ``self_alignment_top{k}``: 1 when the left and right subspaces coincide).

        >>> eye = torch.eye(3, dtype=torch.float64)
        >>> round(self_alignment_of(eye, eye, 2), 12)
        1.0
    """
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
        self_alignment=self_alignment_of(U, Vh, kk), top_eig_abs=float(lam[0].abs()),
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
                 start: int, *, materialize: bool = False,
                 singular_values: bool = True) -> JacobianMetrics:
    d = op.shape[0]
    op._need_adjoint()
    delta = op - IdentityOperator(d, dtype=op.dtype, device=op.device)
    if materialize:
        ej, sj, sd, hutch_op = _on_matrix(op, delta, k, tol, seed, singular_values)
    else:
        ej = eigs(op, k, tol=tol, seed=seed, return_vectors=False)
        sj = svds(op, k, tol=tol, seed=seed + 2, return_vectors=False) if singular_values \
            else None
        sd = svds(delta, k, tol=tol, seed=seed + 3)
        hutch_op = op
    conv = bool(ej.converged) and (sj is None or bool(sj.converged)) and bool(sd.converged)
    lam = top_k_by_modulus(ej.values, k)
    hutch = _hutchinson(hutch_op, n_samples, seed + 4, lam)
    null, null_se = frac_complex_top_null(d, k, seed=seed)
    assert sd.U is not None and sd.Vh is not None  # svds returns vectors by default
    return JacobianMetrics(
        d=d, k=k, dense=False, eigenvalues=ej.values, eig_residuals=ej.residuals,
        converged=conv, singular_values=None if sj is None else sj.S,
        delta_singular_values=sd.S,
        top=rotation_stats(lam), top_null=null, top_null_se=null_se, full=None,
        frac_complex_null=None, departure=None, departure_rel=None,
        self_alignment=self_alignment_of(sd.U, sd.Vh, k), top_eig_abs=float(lam[0].abs()),
        n_matvecs=op.n_matvecs - start, **hutch)


def _on_matrix(op: LinearOperator, delta: LinearOperator, k: int, tol: float, seed: int,
               singular_values: bool):
    """eigs, svds and the operator the Hutchinson probes use, from J's matrix (d columns in
    WIDTH-column products, ``linalg.materialize``): the same iterations and the same probes as
    on the operator, every eigenpair and singular triplet then checked with fresh products of
    the operator itself (``converged`` needs the check)."""
    J = matrix_of(op)
    eye = torch.eye(J.shape[0], dtype=J.dtype, device=J.device)
    ej = eigs(op, k, tol=tol, seed=seed, return_vectors=False, materialize=J)
    sj = svds(J, k, tol=tol, seed=seed + 2) if singular_values else None
    sd = svds(J - eye, k, tol=tol, seed=seed + 3)
    sd = _checked(delta, sd, tol)
    if sj is not None:
        sj = replace(_checked(op, sj, tol), U=None, Vh=None)
    return ej, sj, sd, DenseOperator(J, name=f"{op!r} (materialised)")


def _checked(op: LinearOperator, res: SvdResult, tol: float) -> SvdResult:
    """``res`` (found on op's matrix) with converged only where its triplets also meet tol
    with fresh products of ``op`` (``linalg.materialize.svd_residuals``)."""
    ok = bool((svd_residuals(op, res) <= tol).all())
    return replace(res, converged=res.converged & ok)


def _probe_sums(ops: Sequence[LinearOperator], n_samples: int, seed: int
                ) -> tuple[Tensor, Tensor]:
    """[B, 6, n_samples] per-probe sums of :func:`_hutchinson` for every operator, the B
    operators applied together (one call per product where they share a ``linalg`` batch
    group): rows ||Y + W||^2 / 4, (||Y||^2 + ||W||^2) / 2, ||C z||^2, ||K z||^2, z^T Y,
    ||J z||^2 (Y = Delta J z, W = Delta J^T z, K = (Delta J - Delta J^T) / 2); and whether
    every product was finite (a 0-dim bool tensor: read with the sums, no sync of its own)."""
    op0 = ops[0]
    g = torch.Generator().manual_seed(int(seed))
    Z = (torch.randint(0, 2, (op0.shape[1], n_samples), generator=g) * 2 - 1).to(
        device=op0.device, dtype=torch.float64)
    Zb = Z.expand(len(ops), *Z.shape)
    JZ, JtZ = apply_all(ops, Zb, check=False), apply_all(ops, Zb, adjoint=True, check=False)
    Y, W = JZ - Z, JtZ - Z
    JtY, JW = apply_all(ops, Y, adjoint=True, check=False), apply_all(ops, W, check=False)
    CZ = (JtY - Y) - (JW - W)
    finite = torch.stack([torch.isfinite(P).all() for P in (JZ, JtZ, JtY, JW)]).all()
    return finite, torch.stack([((Y + W) ** 2).sum(1) / 4, ((Y ** 2).sum(1) + (W ** 2).sum(1)) / 2,
                        (CZ ** 2).sum(1), (((Y - W) / 2) ** 2).sum(1), (Z * Y).sum(1),
                        (JZ ** 2).sum(1)], dim=1)


def apply_all(ops: Sequence[LinearOperator], X: Tensor, *, adjoint: bool = False,
              check: bool = True) -> Tensor:
    """[B, n, c] -> [B, m, c] in float64: operator b applied to X[b]; operators that are the
    slots of one ``linalg`` batch group (``BatchMember``) in ONE call of the group.
    ``check``: raise FloatingPointError on a NaN / Inf product (one host read).

    >>> A = DenseOperator(torch.eye(3, dtype=torch.float64) * 2)
    >>> apply_all([A, A], torch.ones(2, 3, 1, dtype=torch.float64))[:, :, 0].tolist()
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """
    groups = {id(o.batch_group) for o in ops if isinstance(o, BatchMember)}
    if len(groups) == 1 and all(isinstance(o, BatchMember) for o in ops):
        group = ops[0].batch_group  # pyright: ignore[reportAttributeAccessIssue]
        slots = [o.batch_index for o in ops]  # pyright: ignore[reportAttributeAccessIssue]
        if isinstance(group, BatchGroup) and len(set(slots)) == len(slots):
            Xg = X.new_zeros((group.size, *X.shape[1:]), dtype=group.dtype)
            Xg[slots] = X.to(group.dtype)
            Yg = group.rmatmat_all(Xg) if adjoint else group.matmat_all(Xg)
            out = Yg[slots].to(torch.float64)
            if check:
                _check_finite(out)
            return out
    out = torch.stack([(o.rmatmat if adjoint else o.matmat)(x.to(o.dtype)).to(torch.float64)
                       for o, x in zip(ops, X)])
    if check:
        _check_finite(out)
    return out


def _check_finite(out: Tensor) -> None:
    if not bool(torch.isfinite(out).all()):
        raise FloatingPointError("jacobian_metrics: operator returned NaN or Inf")


def _to_host(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Small result tensors copied to the host in ONE transfer (complex as real pairs)."""
    parts = [torch.view_as_real(t.to(torch.complex128)) if t.is_complex()
             else t.to(torch.float64) for t in tensors]
    with record_function("spectral_hooks.to_host"):
        flat = torch.cat([p.reshape(-1) for p in parts]).cpu()
    out, i = [], 0
    for t, p in zip(tensors, parts):
        h = flat[i:i + p.numel()].reshape(p.shape)
        i += p.numel()
        out.append(torch.view_as_complex(h) if t.is_complex() else h.to(
            t.dtype if t.dtype == torch.bool else torch.float64))
    return out


def jacobian_metrics_batch(ops: Sequence[LinearOperator], *, k: int = 16, n_samples: int = 64,
                           seed: int = 0, tol: float = 1e-8) -> list[JacobianMetrics]:
    """The matrix-free :func:`jacobian_metrics` of every operator in ``ops`` (d x d, real, with
    adjoints), computed together: one ``eigs`` and two ``svds`` over the list and one batched
    application per Hutchinson product, so operators that share a ``linalg`` batch group
    (``linearize.group``: every layer of a model in one pass) advance in one call per step.
    The small results cross to the host once; the statistics are computed there.

    >>> g = torch.Generator().manual_seed(0)
    >>> Js = [DenseOperator(torch.eye(32, dtype=torch.float64) + torch.randn(
    ...     32, 32, generator=g, dtype=torch.float64) / 8) for _ in range(2)]
    >>> tuple(m.k for m in jacobian_metrics_batch(Js, k=4))
    (4, 4)
    """
    ops = [_as_operator(J) for J in ops]
    if not ops:
        raise OptionError("ops", ops, "a non-empty list of operators",
                          hint="jacobian_metrics_batch")
    d = ops[0].shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d - 2:
        raise OptionError("k", k, f"an int in 1..d - 2 = {d - 2} (matrix-free)",
                          hint="jacobian_metrics_batch")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise OptionError("n_samples", n_samples, "an int >= 2", hint="jacobian_metrics_batch")
    starts = [op.n_matvecs for op in ops]
    for op in ops:
        op._need_adjoint()
    deltas = [op - IdentityOperator(d, dtype=op.dtype, device=op.device) for op in ops]
    ej = eigs(ops, k, tol=tol, seed=seed, return_vectors=False)
    sj = svds(ops, k, tol=tol, seed=seed + 2, return_vectors=False)
    sd = svds(deltas, k, tol=tol, seed=seed + 3)
    finite, sums = _probe_sums(ops, n_samples, seed + 4)
    assert sd.U is not None and sd.Vh is not None  # svds returns vectors by default
    align = torch.linalg.matrix_norm(sd.U[..., :k].mT @ sd.Vh[..., :k, :].mT) ** 2 / k
    conv = ej.converged & sj.converged & sd.converged
    values, resid, S, Sd, align, conv, sums, finite = _to_host(
        [ej.values, ej.residuals, sj.S, sd.S, align, conv, sums, finite])
    out = []
    with record_function("spectral_hooks.host"):  # host copies: no read here touches a device
        if not bool(finite):
            raise FloatingPointError("jacobian_metrics: operator returned NaN or Inf")
        null, null_se = frac_complex_top_null(d, k, seed=seed)
        for b, op in enumerate(ops):
            keep = ~torch.isnan(values[b].real)
            lam_all = values[b][keep]
            lam = top_k_by_modulus(lam_all, k)
            sym_n, den, c2, k2, t, frob = sums[b]
            sym, sym_se = _ratio_se(sym_n, den)
            comm, comm_se = _sqrt_ratio_se(c2, den)
            bounds = departure_bounds_from_sums(k2, den, t, c2, d, lam)
            out.append(JacobianMetrics(
                d=d, k=k, dense=False, eigenvalues=lam_all, eig_residuals=resid[b][keep],
                converged=bool(conv[b]), singular_values=S[b], delta_singular_values=Sd[b],
                top=rotation_stats(lam), top_null=null, top_null_se=null_se, full=None,
                frac_complex_null=None, departure=None, departure_rel=None,
                self_alignment=float(align[b]), top_eig_abs=float(lam[0].abs()),
                n_matvecs=op.n_matvecs - starts[b], sym_energy=sym, sym_energy_se=sym_se,
                commutator=comm, commutator_se=comm_se, departure_rel_upper=bounds["upper"],
                departure_rel_upper_se=bounds["upper_se"],
                departure_rel_lower=bounds["lower"], departure_rel_lower_se=bounds["lower_se"],
                frob_sq=float(frob.mean())))
    return out


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
                     n_samples: int = 64, seed: int = 0, tol: float = 1e-8,
                     materialize: bool = False, singular_values: bool = True
                     ) -> JacobianMetrics:
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

    Matrix-free with ``materialize=True``: the same top-k values and the same estimates, from
    J's matrix instead of the operator: J formed from d columns in 128-column products
    (``linalg.materialize.matrix_of``; on a CPU a column in such a product costs ~0.12 of one
    alone), eigs and svds iterating on it and every returned eigenpair and singular triplet
    checked with fresh products of the operator (``converged`` needs that), the Hutchinson
    probes (the same seeded draws) applied to it. Equal to the operator's run to ``tol``
    (estimates: to rounding). ``singular_values=False`` skips the top-k singular values of J
    in matrix-free mode (``singular_values`` None; no column of :func:`jacobian_row` reads
    them).

    >>> g = torch.Generator().manual_seed(1)
    >>> A = torch.eye(40, dtype=torch.float64) + torch.randn(40, 40, generator=g,
    ...                                                      dtype=torch.float64) / 8
    >>> a = jacobian_metrics(DenseOperator(A), k=4)
    >>> b = jacobian_metrics(DenseOperator(A), k=4, materialize=True, singular_values=False)
    >>> bool(torch.allclose(a.eigenvalues[:4].abs(), b.eigenvalues[:4].abs(), rtol=1e-7))
    True
    >>> abs(a.sym_energy - b.sym_energy) < 1e-12, b.singular_values is None, b.converged
    (True, True, True)
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
    return _matrix_free(op, k, n_samples, seed, tol, start, materialize=materialize,
                        singular_values=singular_values)


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
