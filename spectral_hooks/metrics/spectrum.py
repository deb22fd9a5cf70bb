"""Spectrum of a layer matrix F for the power-method view (METRICS.md section 1).

The power view's table builders (:mod:`spectral_hooks.metrics.power`) and the training events
compute every spectrum here, on the route :func:`power_route` picks.
``F`` is a layer matrix [d, d] or a stack [L, d, d] (column convention, x -> F x); all numerics
run in float64 (complex128 for eigenpairs) whatever the input dtype.

>>> s = spectrum(torch.diag(torch.tensor([3.0, 1.0, 0.5])))
>>> s.lambda1, s.gap_ratio
((3+0j), 0.3333333333333333)

Large d (``d > dense_limit``, default SPECTRUM_DENSE_MAX_D = 4096; ``analyze()`` routes by
:func:`power_route`, from MATRIX_FREE_D = 1024): only the ``top_k`` leading eigenpairs are computed,
with the project's Krylov solver (:func:`spectral_hooks.linalg.eigs`, which="LM", float64) on F
(``iterate="F"``) or on the shifted operator I + F (``iterate="I+F"``; eigenvalues of F are
mu - 1). That is enough for lambda1, lambda2, the gap ratio, B and B2; the spectrum is then
marked ``truncated`` (LayerSpectrum.truncated / n_computed, a ``truncated`` column in both tables)
and a solver that did not converge is logged as a warning and reported as ``converged=False``
instead of raising. For d <= dense_limit every eigenvalue is computed (``truncated=False``,
``converged=True``): the full dense float64 eigen-decomposition where every eigenvector is
asked for (:func:`spectrum`), else LAPACK's eigenvalues without eigenvectors and only the
leading eigenvectors (B, B2) by inverse iteration, each kept when its residual is below
VECTOR_RESIDUAL_TOL and its eigenvalue stands apart from the others (SEPARATION_TOL), the full
eig otherwise. The power view's LAPACK work runs on POWER_THREADS (1) CPU threads.

A factored F = A B (a :class:`~spectral_hooks.linalg.LowRankOperator` with inner width r < d, as
``anatomy.weights.layer_operators`` builds for grouped-query models) with r <= min(FACTORED_EXACT_MAX,
dense_limit) gets every eigenvalue exactly instead: the r of the r x r matrix B A, then d - r
zeros (values-first as above, the leading vectors A y from B A's; or
:func:`spectral_hooks.linalg.lowrank_eig`; ``truncated=False``).

Spectra are computed once per layer matrix: :func:`power_table` and :func:`spectra_table` share a
small in-process cache keyed on the identity of the F tensor passed in (checked through a weak
reference, so a freed tensor's address can never alias), its data_ptr, ``_version`` (bumped by
in-place edits), shape, strides, dtype and device, the layer and the options. Call
:func:`clear_spectrum_cache` to drop it (e.g. after editing F through ``.data``, which does not
bump ``_version``). :func:`spectrum` itself never caches (it returns all eigenvectors).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor

from spectral_hooks.linalg.krylov import eigs
from spectral_hooks.linalg.lowrank import LowRankOperator, lowrank_eig
from spectral_hooks.linalg.operators import IdentityOperator, LinearOperator

from ..checks import check_choice, check_int, check_type

if TYPE_CHECKING:  # shape annotations only (jaxtyping is not a runtime dependency)
    from jaxtyping import Complex, Float

__all__ = [
    "LayerSpectrum",
    "spectrum",
    "layer_spectrum",
    "layer_spectra",
    "power_route",
    "power_spectrum_options",
    "check_iterate",
    "check_spectrum_options",
    "checked_matrices",
    "SPECTRUM_DENSE_MAX_D",
    "TOP_K",
    "ITERATES",
    "POWER_THREADS",
    "power_threads",
    "FACTORED_EXACT_MAX",
    "MATRIX_FREE_D",
    "ROUTES",
    "clear_spectrum_cache",
]

# Named after power.py, where this code lived: log records (and any logging config that filters
# on the name) stay as they were before the split.
logger: logging.Logger = logging.getLogger("spectral_hooks.metrics.power")

#: The power view's orderings: "F" (by |lambda|) or "I+F" (by |1 + lambda|); the one home of
#: the names (``analysis.options`` checks ``iterate`` against it).
ITERATES = ("F", "I+F")
#: Default number of leading eigenpairs the Krylov route computes (at least 3 are always used);
#: the one home of that default (``PowerOptions.k`` and the training events take it from here).
TOP_K = 8
#: Default ``dense_limit`` of the functions of a formed F (:func:`spectrum`, ``power_table``,
#: ``spectra_table``): every eigenpair (dense eig) up to this d, the top-k by Krylov above it.
#: ``analyze()`` and the training events route by :func:`power_route` instead.
SPECTRUM_DENSE_MAX_D = 4096
#: How one layer's spectrum is computed: "dense" (the eig of the formed d x d F), "factored" (every
#: eigenvalue exactly from the r x r matrix of F's thin factors) or "krylov" (the top k by eigs).
ROUTES = ("dense", "factored", "krylov")
# Options of linalg.eigs in the top-k path (module-level so tests can shrink max_restarts).
_EIGS_KW: dict = {"tol": 1e-10, "max_restarts": 1000, "seed": 0}

# The route thresholds, set by F's own eig on random-init layers of real shapes, one thread
# (benchmarks/power_shapes.py, benchmarks/RESULTS.md "Power view at real shapes"):
#: Largest inner width r at which a factored F = A B (a ``LowRankOperator``, r < d: grouped-query
#: layers) gets its full spectrum exactly from the r x r matrix B A (values-first) instead of its
#: top-k by Krylov. Per layer, one thread, random init (2026-12-07, machine load 6-11): exact /
#: Krylov's top 8 on the factors = 0.41 / 0.37 s at d = 2048, r = 512; 1.42 / 1.63 s at
#: d = 2048, r = 1024; 1.70 / 2.77 s at d = 4096, r = 1024; 17.9 / 34.3 s at d = 3584, r = 2048:
#: every eigenvalue for at most ~1.1x the top 8 up to here.
FACTORED_EXACT_MAX = 2048
#: d_model from which the power view computes F's top-k eigenpairs by Krylov (on the formed F
#: where r >= d / 2, else on its factors) instead of every eigenvalue by the dense eig (when F is
#: not thin enough to be exact from its factors). Per layer, one thread, random init (2026-12-07,
#: machine load 6): dense values-first 0.56 / 0.73 / 2.09 s at d = 512 / 768 / 1024 against
#: Krylov's top 8 0.24 / 0.27 / 0.43 s (2.3x, 2.7x, 4.6x). Below 1024 the full spectrum is kept
#: at under a second a layer and under 3x Krylov; from 1024 the top k is 4-5x cheaper.
MATRIX_FREE_D = 1024
#: The CPU threads the power view's own LAPACK / BLAS calls run on, at most (torch's count is
#: lowered for one layer's spectrum and restored after; while it is lowered, other Python threads
#: of the process see it too). Issue 57 measured the power view of 4 GPT-2-medium layers at 4.8 s
#: on one thread and 4.0 s on two with the machine quiet, 6.9 s and 22.4 s with both cores busy
#: (LAPACK's OpenMP threads spin at barriers). With this cap, 8 GPT-2-medium layers, both cores
#: busy: torch's default 2 threads / 1 thread = 1.01x (0.95-1.18; benchmarks/power_shapes.py --busy).
POWER_THREADS = 1

# The values-first eig (every eigenvalue from LAPACK without eigenvectors; the few eigenvectors
# B and B2 read by inverse iteration), which the full eig backs up:
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


@contextmanager
def power_threads() -> Iterator[None]:
    """At most :data:`POWER_THREADS` torch CPU threads inside; the caller's count restored after.

        >>> before = torch.get_num_threads()
        >>> with power_threads():
        ...     torch.get_num_threads() <= max(POWER_THREADS, 1)
        True
        >>> torch.get_num_threads() == before
        True
    """
    before = torch.get_num_threads()
    if before <= POWER_THREADS:
        yield
        return
    torch.set_num_threads(POWER_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def power_route(d: int, r: int, *, full: bool | None = None, top_k: int = TOP_K) -> str:
    """The power view's one routing rule: how layer F = W_O W_V (width d, factors of inner
    width r) gets its spectrum, one of :data:`ROUTES`.

        >>> power_route(768, 768), power_route(4096, 1024), power_route(4096, 4096)
        ('dense', 'factored', 'krylov')
        >>> power_route(4096, 1024, full=True), power_route(768, 768, full=False)
        ('dense', 'krylov')

    ``full=None`` (the default): "factored" where r < d and r <= :data:`FACTORED_EXACT_MAX`
    (grouped-query layers), else "dense" below :data:`MATRIX_FREE_D`, else "krylov";
    ``full=True``: always "dense"; ``full=False``: "krylov". A d too small for Krylov (the
    top max(top_k, 3) need d >= max(top_k, 3) + 2) is "dense" whatever ``full`` says.
    """
    if full is None and r < d and r <= FACTORED_EXACT_MAX:
        return "factored"
    if full or (full is None and d < MATRIX_FREE_D) or max(int(top_k), 3) > d - 2:
        return "dense"
    return "krylov"


def power_spectrum_options(d: int, *, full: bool | None = None) -> dict[str, Any]:
    """The ``dense_limit`` under which :func:`layer_spectrum` takes the route
    :func:`power_route` chose for each layer, given F_t formed ([d, d] tensor) where the route is
    "dense" and as its thin factors (a LowRankOperator) otherwise.

        >>> power_spectrum_options(64), power_spectrum_options(64, full=False)
        ({'dense_limit': 64}, {'dense_limit': 0})
    """
    return {"dense_limit": 0 if full is False else int(d)}


@dataclass(frozen=True)
class LayerSpectrum:
    """Eigen-structure of one layer matrix F, ordered for the chosen power iteration.

    eigenvalues: complex128 [d] (or [n_computed] when ``truncated``), eigenvalues of F sorted by
        descending |q| where the ordering quantity q is lambda (``iterate="F"``) or
        mu = 1 + lambda (``iterate="I+F"``); conjugate pairs are adjacent, positive imaginary part first.
    eigenvectors: complex128 [d, d] (or [d, n_computed]), unit columns matching ``eigenvalues``
        (real columns for real eigenvalues).
    lambda1, lambda2: eigenvalues of F (not of I+F) at the leading position and at the first
        position that is not the conjugate partner of lambda1 (NaN when there is none).
    mu1, mu2: the ordering quantities of lambda1, lambda2 (equal to them for ``iterate="F"``).
    gap_ratio: |mu2| / |mu1| (NaN when mu1 = 0 or there is no lambda2).
    B: float64 [d, 1] (real lambda1) or [d, 2] (complex: orthonormalised Re v1, Im v1).
    B2: float64 [d, 2..4], orthonormal basis of the real plane of lambda1 plus that of lambda2
        (just B when there is no lambda2, e.g. d = 1 or d = 2 with a complex pair).
    truncated: True when only the leading eigenpairs were computed (d > dense_limit, Krylov
        top-k); ``eigenvalues`` then holds n_computed < d values (top_k, or top_k + 1 when a
        conjugate pair straddles the cut).
    n_computed: number of eigenvalues held (= d when not truncated).
    converged: False when the Krylov solver did not converge (values are then its last Ritz
        estimates); always True for the dense path.
    """

    eigenvalues: Complex[Tensor, " d"]
    eigenvectors: Complex[Tensor, "d d"]
    iterate: str
    lambda1: complex
    lambda2: complex
    mu1: complex
    mu2: complex
    gap_ratio: float
    lambda1_is_complex: bool
    lambda2_is_complex: bool
    B: Float[Tensor, "d r"]
    B2: Float[Tensor, "d r2"]
    truncated: bool = False
    n_computed: int = -1  # -1: filled in from eigenvalues
    converged: bool = True

    def __post_init__(self) -> None:
        if self.n_computed < 0:
            object.__setattr__(self, "n_computed", int(self.eigenvalues.numel()))


def _is_operators(F) -> bool:
    """A stack of layer operators: ``F.shape == (L, d, d)`` and ``F[t]`` a LinearOperator."""
    return not isinstance(F, Tensor) and hasattr(F, "shape") and hasattr(F, "__getitem__")


def checked_matrices(F: Tensor) -> Tensor:
    """F [d, d] or [L, d, d] as a finite real float64 CPU tensor (ValueError otherwise); a stack
    of layer operators (``F[t]`` a LinearOperator) is returned as it is, its shape checked."""
    if _is_operators(F):
        if len(F.shape) != 3 or F.shape[1] != F.shape[2]:
            raise ValueError(f"operator stack must be [L, d, d], got shape {tuple(F.shape)}")
        return F
    check_type("F", F, Tensor, "a real tensor [d, d] or [L, d, d], or a LinearOperator")
    if F.ndim not in (2, 3) or F.shape[-1] != F.shape[-2] or F.shape[-1] == 0:
        raise ValueError(f"F must be [d, d] or [L, d, d] with d >= 1, got shape {tuple(F.shape)}")
    if F.is_complex():
        raise ValueError("F must be real")
    F = F.detach().to("cpu", torch.float64)
    if not torch.isfinite(F).all():
        raise ValueError("F contains NaN or Inf")
    return F


def check_iterate(iterate: str) -> None:
    """OptionError unless ``iterate`` is one of :data:`ITERATES`."""
    check_choice("iterate", iterate, ITERATES)


def _realify(vecs: Tensor) -> Tensor:
    """Rotate each complex column by a phase so it is real (for real eigenvalues), unit norm."""
    if vecs.shape[1] == 0:
        return vecs
    idx = vecs.abs().argmax(dim=0)
    pivot = vecs.gather(0, idx[None])
    real = (vecs * (pivot.conj() / pivot.abs())).real
    return (real / real.norm(dim=0, keepdim=True)).to(torch.complex128)


def check_spectrum_options(dense_limit: int, top_k: int) -> None:
    """OptionTypeError / OptionError unless ``dense_limit`` is an int >= 0 and ``top_k`` an int >= 1."""
    check_int("dense_limit", dense_limit, minimum=0)
    check_int("top_k", top_k, minimum=1)


def _eig_sorted(F: Tensor, iterate: str, real_tol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Eigenpairs with near-real values snapped to real, exact conjugate pairs, sorted (see LayerSpectrum)."""
    vals, vecs = torch.linalg.eig(F)
    return _tidy(vals, vecs, iterate, real_tol)


def _tidy(vals: Tensor, vecs: Tensor, iterate: str, real_tol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Snap near-real eigenvalues (and their vectors) to real, make conjugate pairs exact, sort."""
    vals, tidy_vecs, is_real = _tidy_parts(vals, vecs, iterate, real_tol)
    assert tidy_vecs is not None
    return vals, tidy_vecs, is_real


def _tidy_values(vals: Tensor, iterate: str, real_tol: float) -> tuple[Tensor, Tensor]:
    """:func:`_tidy` of eigenvalues alone: (values, is_real), in the same order."""
    vals, _, is_real = _tidy_parts(vals, None, iterate, real_tol)
    return vals, is_real


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
    order = _order(vals, iterate)
    return vals[order], (vecs[:, order] if vecs is not None else None), is_real[order]


def _order(vals: Tensor, iterate: str) -> Tensor:
    """Positions of ``vals`` by descending |q| (q = lambda, or 1 + lambda for "I+F"), ties by
    descending real then imaginary part."""
    q = vals + 1 if iterate == "I+F" else vals
    return torch.from_numpy(np.lexsort((-vals.imag.numpy(), -vals.real.numpy(), -q.abs().numpy())))


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


def _leading_vectors(M: Tensor, vals: Tensor, is_real: Tensor,
                     lift: Callable[[Tensor, complex], Tensor | None] | None = None
                     ) -> Tensor | None:
    """Unit eigenvectors (complex128 [., c], c = :func:`_leading_count`) of the leading sorted
    eigenvalues ``vals`` of M, by inverse iteration, a conjugate pair's second vector the
    conjugate of its first; ``lift`` maps each to a vector of F (None: refused). None where an
    eigenvalue lies within SEPARATION_TOL ||M||_F of another (repeated or clustered to rounding:
    its eigenvector is then whatever LAPACK returns, so the caller takes the full eig) or a
    residual fails."""
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


def _eig_leading(F: Tensor, iterate: str, real_tol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Every eigenvalue of F from LAPACK without eigenvectors, tidied and sorted as by
    :func:`_tidy`, and the eigenvectors of the leading positions only (:func:`_leading_vectors`,
    [d, c]); the full eig (:func:`_eig_sorted`) where a vector is refused."""
    vals, is_real = _tidy_values(torch.linalg.eigvals(F), iterate, real_tol)
    vecs = _leading_vectors(F, vals, is_real)
    if vecs is None:
        logger.debug("values-first eig refused a leading vector (d=%d): full eig", F.shape[0])
        return _eig_sorted(F, iterate, real_tol)
    return vals, vecs, is_real


def _real_times(M: Tensor, v: Tensor) -> Tensor:
    """M @ v for a real M and a real or complex v, without a complex copy of M."""
    return torch.complex(M @ v.real, M @ v.imag) if v.is_complex() else M @ v


def _factored_leading(F: LowRankOperator, iterate: str, real_tol: float
                      ) -> tuple[Tensor, Tensor, Tensor] | None:
    """:func:`_eig_leading` for a real factored F = A B (r < d): the r eigenvalues of B A from
    LAPACK without eigenvectors, then d - r zeros, and the leading eigenvectors A y from B A's
    (each residual checked on F). None where that does not apply (complex factors, r >= d, a
    zero eigenvalue among the leading three) or a vector is refused."""
    d, r = F.shape[0], F.rank_bound
    if F.dtype.is_complex or r >= d:
        return None
    A = F.left.detach().to("cpu", torch.float64)
    B = F.right.detach().to("cpu", torch.float64)
    BA = B @ A
    vals_r, real_r = _tidy_values(torch.linalg.eigvals(BA), iterate, real_tol)
    q_zero = 1.0 if iterate == "I+F" else 0.0  # where the d - r zeros sort
    if int(((vals_r + q_zero).abs() > q_zero).sum()) < 3:
        return None
    scale_F = float(torch.linalg.matrix_norm(A)) * float(torch.linalg.matrix_norm(B))  # >= ||F||_F

    def lift(y: Tensor, lam: complex) -> Tensor | None:
        x = _real_times(A, y)
        norm = float(torch.linalg.vector_norm(x))
        if not norm > 0.0:
            return None
        x = x / norm
        target = lam if y.is_complex() else lam.real
        residual = float(torch.linalg.vector_norm(_real_times(A, _real_times(B, x)) - target * x))
        return x if residual <= VECTOR_RESIDUAL_TOL * scale_F else None

    vecs = _leading_vectors(BA, vals_r, real_r, lift)
    if vecs is None:
        return None
    all_vals = torch.cat([vals_r, torch.zeros(d - r, dtype=vals_r.dtype)])
    order = _order(all_vals, iterate)
    is_real = torch.cat([real_r, torch.ones(d - r, dtype=torch.bool)])
    return all_vals[order], vecs, is_real[order]


def _factored_eig(F: LowRankOperator, iterate: str, real_tol: float, vectors: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Every eigenpair of a factored F = A B from B A (linalg.lowrank_eig), tidied. Without
    ``vectors`` the null-space basis of B (the zero eigenvalues' vectors, d^2 r to build) is
    skipped unless a zero is among the three leading positions: the vectors returned are
    then the r others', sorted, of which only the leading ones are used (B, B2); where the
    factors are real, the values come from LAPACK without eigenvectors and only the leading
    vectors are computed (:func:`_factored_leading`)."""
    if not vectors:
        leading = _factored_leading(F, iterate, real_tol)
        if leading is not None:
            return leading
    vals, vecs = lowrank_eig(F, null_space=vectors)
    if vecs.shape[1] == vals.numel():
        return _tidy(vals, vecs, iterate, real_tol)
    r = vecs.shape[1]
    vals_r, vecs_r, real_r = _tidy(vals[:r], vecs, iterate, real_tol)
    q_zero = 1.0 if iterate == "I+F" else 0.0  # where the d - r zeros sort
    if int(((vals_r + q_zero).abs() > q_zero).sum()) < 3:
        return _tidy(*lowrank_eig(F, null_space=True), iterate, real_tol)
    all_vals = torch.cat([vals_r, vals[r:]])
    order = _order(all_vals, iterate)
    is_real = torch.cat([real_r, torch.ones(vals.numel() - r, dtype=torch.bool)])
    return all_vals[order], vecs_r, is_real[order]


def _plane(v: Tensor, is_complex: bool) -> Tensor:
    """Orthonormal float64 basis of the real invariant plane of eigenvector v: [d, 1] or [d, 2]."""
    if not is_complex:
        re = v.real
        return (re / re.norm())[:, None]
    q, _ = torch.linalg.qr(torch.stack([v.real, v.imag], dim=1))
    return q


def _eig_topk(F: Tensor | LinearOperator, iterate: str, real_tol: float, k: int) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Top-k eigenpairs of F (of I + F for "I+F") by linalg.eigs, tidied like :func:`_eig_sorted`."""
    if isinstance(F, Tensor):
        A = F + torch.eye(F.shape[0], dtype=F.dtype) if iterate == "I+F" else F
    else:  # a LinearOperator (matrix-free F, on the model's device)
        A = F + IdentityOperator(F.shape[0], dtype=F.dtype, device=F.device) \
            if iterate == "I+F" else F
    res = eigs(A, k, which="LM", return_vectors=True, **_EIGS_KW)
    vals = res.values.to("cpu", torch.complex128)
    assert res.vectors is not None  # return_vectors=True
    vecs = res.vectors.to("cpu", torch.complex128)
    keep = torch.isfinite(vals) & torch.isfinite(vecs).all(dim=0)
    vals, vecs = vals[keep], vecs[:, keep]
    if iterate == "I+F":
        vals = vals - 1
    return (*_tidy(vals, vecs, iterate, real_tol), bool(res.converged))


def layer_spectrum(
    F: Tensor | LinearOperator, iterate: str, real_tol: float, dense_limit: int = SPECTRUM_DENSE_MAX_D,
    top_k: int = TOP_K,
    *, layer: int | None = None, dense_eig: tuple[Tensor, Tensor] | None = None,
    vectors: bool = True, factored_max: int | None = None,
) -> LayerSpectrum:
    """One layer's :class:`LayerSpectrum`, on the path its arguments say: a factored F (a
    ``LowRankOperator`` with r < d, r <= min(``factored_max``, dense_limit)) exactly from its
    r x r matrix; else, where d > dense_limit (an operator: always) and d leaves room for Krylov,
    the top max(top_k, 3) by ``linalg.eigs``; else the dense eig (``dense_eig``: computed
    already). ``vectors=False``: the caller keeps only B and B2, so the result's
    ``eigenvectors`` may be partial (a factored F's zero eigenvalues' vectors are skipped).
    ``factored_max``: the widest factored F done through its r x r matrix (FACTORED_EXACT_MAX).

        >>> layer_spectrum(torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64)), "F", 1e-9).gap_ratio
        0.3333333333333333

    The dense route without ``vectors`` computes every eigenvalue from LAPACK without
    eigenvectors and only the leading eigenvectors by inverse iteration (the full eig where one
    is refused: module constants VECTOR_RESIDUAL_TOL, SEPARATION_TOL); everything runs on at
    most POWER_THREADS CPU threads (:func:`power_threads`).
    """
    with power_threads():
        return _layer_spectrum(F, iterate, real_tol, dense_limit, top_k, layer=layer,
                               dense_eig=dense_eig, vectors=vectors, factored_max=factored_max)


def _layer_spectrum(
    F: Tensor | LinearOperator, iterate: str, real_tol: float, dense_limit: int, top_k: int,
    *, layer: int | None, dense_eig: tuple[Tensor, Tensor] | None, vectors: bool,
    factored_max: int | None,
) -> LayerSpectrum:
    d = F.shape[-1]
    k = max(int(top_k), 3)  # 3 values always hold lambda1 (maybe a pair) and lambda2
    truncated = d > dense_limit and k <= d - 2  # eigs needs k <= d - 2; tiny d stays dense
    factored = isinstance(F, LowRankOperator) and F.rank_bound < d \
        and F.rank_bound <= min(factored_max or FACTORED_EXACT_MAX, dense_limit)
    if not isinstance(F, Tensor):  # an operator: top-k, or formed when d is too small
        truncated = k <= d - 2 and not factored
        if not truncated and not factored:
            F = F.to_dense().to("cpu", torch.float64)
    converged = True
    if factored:  # exact, every eigenvalue: from the r x r matrix B A
        vals, vecs, is_real = _factored_eig(cast(LowRankOperator, F), iterate, real_tol, vectors)
    elif truncated:
        vals, vecs, is_real, converged = _eig_topk(F, iterate, real_tol, k)
        if not converged:
            where = f"layer {layer}" if layer is not None else "F"
            logger.warning(
                "top-%d eigenpairs of %s (d=%d, iterate=%s) did not converge; reporting the last "
                "Ritz estimates with converged=False", k, where, d, iterate)
    elif dense_eig is not None:  # computed already, batched over layers on the device
        vals, vecs, is_real = _tidy(*dense_eig, iterate, real_tol)
    elif vectors:
        vals, vecs, is_real = _eig_sorted(cast(Tensor, F), iterate, real_tol)  # formed above
    else:  # every eigenvalue, and only the leading eigenvectors
        vals, vecs, is_real = _eig_leading(cast(Tensor, F), iterate, real_tol)
    shift = 1.0 if iterate == "I+F" else 0.0
    c1 = not bool(is_real[0])
    i2 = 2 if c1 else 1
    B = _plane(vecs[:, 0], c1)
    lam1 = complex(vals[0])
    if i2 < vals.numel():
        lam2, c2 = complex(vals[i2]), not bool(is_real[i2])
        B2, _ = torch.linalg.qr(torch.cat([B, _plane(vecs[:, i2], c2)], dim=1))
    else:
        lam2, c2, B2 = complex(float("nan"), float("nan")), False, B
    mu1, mu2 = lam1 + shift, lam2 + shift
    gap = abs(mu2) / abs(mu1) if abs(mu1) > 0 else float("nan")
    return LayerSpectrum(vals, vecs, iterate, lam1, lam2, mu1, mu2, gap, c1, c2, B, B2,
                         truncated=truncated, n_computed=int(vals.numel()), converged=converged)


# Shared by power_table / spectra_table: {id(F): (weakref(F), fingerprint, {options: spectrum})},
# least recently used first; spectra are stored without eigenvectors (B, B2 are kept).
_CACHE_SIZE = 4
_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def clear_spectrum_cache() -> None:
    """Forget the spectra shared between :func:`power_table` and :func:`spectra_table`."""
    with _cache_lock:
        _cache.clear()


def _fingerprint(F: Tensor) -> tuple | None:
    if _is_operators(F):  # built from the live weights on demand: keyed by identity only
        return ("operators", tuple(F.shape))
    try:
        version = F._version
    except RuntimeError:  # inference tensors have no version counter: do not cache them
        return None
    return (F.data_ptr(), version, tuple(F.shape), F.stride(), F.dtype, str(F.device))


#: device types whose dense eigen-decompositions run batched over layers, on the device (tests
#: add "cpu" to run that path on the CPU)
BATCHED_EIG_DEVICES = {"cuda"}


def _batched_eigs(F_in, layers: Sequence[int], dense_limit: int, top_k: int) -> dict:
    """{layer: (values, vectors)} (CPU, complex128) from ONE batched float64 ``torch.linalg.eig``
    on F_in's device, when F_in is a dense stack on a BATCHED_EIG_DEVICES device and the layers
    take the dense path; {} otherwise (each layer then runs its own eig on the CPU)."""
    if not isinstance(F_in, Tensor) or F_in.ndim != 3 or not layers:
        return {}
    d = F_in.shape[-1]
    if F_in.device.type not in BATCHED_EIG_DEVICES or (d > dense_limit and max(top_k, 3) <= d - 2):
        return {}
    vals, vecs = torch.linalg.eig(F_in.detach()[list(layers)].to(torch.float64))
    vals, vecs = vals.to("cpu", torch.complex128), vecs.to("cpu", torch.complex128)
    return {t: (vals[i], vecs[i]) for i, t in enumerate(layers)}


def layer_spectra(
    F_in: Tensor, F: Tensor, layers: Sequence[int], iterate: str, real_tol: float, dense_limit: int,
    top_k: int,
) -> list[LayerSpectrum]:
    """Spectra (without eigenvectors) of F[t] for t in layers, through the shared cache.

        >>> F = torch.diag(torch.tensor([2.0, 1.0]))[None].double()
        >>> layer_spectra(F, F, [0], "F", 1e-9, 2, 8)[0].lambda1
        (2+0j)

    F_in is the tensor the caller passed (the cache key), F its float64 CPU [L, d, d] copy (or
    a stack of layer operators, ``F[t]`` a LinearOperator: F_in itself).
    """
    fp = _fingerprint(F_in)
    opts = (iterate, float(real_tol), int(dense_limit), int(top_k), tuple(sorted(_EIGS_KW.items())))
    table: dict = {}
    if fp is not None:
        with _cache_lock:
            for key in [k for k, (ref, _, _) in _cache.items() if ref() is None]:
                del _cache[key]  # tensors that were freed
            entry = _cache.get(id(F_in))
            if entry is not None and entry[0]() is F_in and entry[1] == fp:
                table = entry[2]
                _cache.move_to_end(id(F_in))
            else:
                _cache[id(F_in)] = (weakref.ref(F_in), fp, table)
                while len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
    batched = _batched_eigs(F_in, [t for t in layers if (t, *opts) not in table], dense_limit, top_k)
    out = []
    for t in layers:
        s = table.get((t, *opts))
        if s is None:
            with power_threads():  # F[t] may be formed here (a stack of layer operators)
                s = replace(layer_spectrum(F[t], iterate, real_tol, dense_limit, top_k, layer=t,
                                          dense_eig=batched.get(t), vectors=False),
                            eigenvectors=None)
            table[(t, *opts)] = s
        out.append(s)
    return out


def spectrum(
    F: Float[Tensor, "*L d d"], *, iterate: str = "F", real_tol: float = 1e-9,
    dense_limit: int = SPECTRUM_DENSE_MAX_D, top_k: int = TOP_K,
) -> LayerSpectrum | list[LayerSpectrum]:
    """Eigen-decomposition of a layer matrix (float64), ordered for the power iteration.

    >>> s = spectrum(torch.tensor([[0.0, -2.0], [2.0, 0.0]]))   # rotation-scaling: lambda = +-2i
    >>> round(s.lambda1.imag, 12), s.lambda1_is_complex, tuple(s.B.shape)
    (2.0, True, (2, 2))

    F: [d, d] -> one :class:`LayerSpectrum`; [L, d, d] -> a list of L of them (their bases can
    have different widths, so they are not stacked).
    iterate: "F" orders by |lambda|; "I+F" by |1 + lambda| (the matrix a normalised residual
    update iterates); it changes lambda1/lambda2, gap_ratio, B and B2, never the eigenvalues.
    real_tol: an eigenvalue counts as real when |Im lambda| <= real_tol * |lambda|; such values
    are snapped to the real axis (their eigenvectors made real).
    dense_limit, top_k: d <= dense_limit -> every eigenpair (dense torch.linalg.eig); above it
    only the leading max(top_k, 3) (+1 if a conjugate pair straddles the cut) by the Krylov
    solver ``linalg.eigs`` (which="LM" on F, or on I + F for ``iterate="I+F"``), and the result
    says ``truncated=True`` / ``n_computed``; ``converged=False`` (with a logged warning) if the
    solver did not converge. A d too small for eigs (d < max(top_k, 3) + 2) stays dense.
    Eigenvectors of defective / repeated eigenvalues are whatever LAPACK returns.
    """
    check_iterate(iterate)
    check_spectrum_options(dense_limit, top_k)
    F = checked_matrices(F)
    if F.ndim == 3:
        return [layer_spectrum(f, iterate, real_tol, dense_limit, top_k, layer=t) for t, f in enumerate(F)]
    return layer_spectrum(F, iterate, real_tol, dense_limit, top_k)
