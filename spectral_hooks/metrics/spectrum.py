"""Spectrum of a layer matrix F for the power-method view (METRICS.md section 1).

The power view's table builders (:mod:`spectral_hooks.metrics.power`) and the training events
compute every spectrum here, on the route :func:`power_route` picks.
``F`` is a layer matrix [d, d] or a stack [L, d, d] (column convention, x -> F x); all numerics
run in float64 (complex128 for eigenpairs) whatever the input dtype.

>>> s = spectrum(torch.diag(torch.tensor([3.0, 1.0, 0.5])))
>>> s.lambda1, s.gap_ratio
((3+0j), 0.3333333333333333)

Large d (``d > dense_limit``, default 4096): only the ``top_k`` leading eigenpairs are computed,
with the project's Krylov solver (:func:`spectral_hooks.linalg.eigs`, which="LM", float64) on F
(``iterate="F"``) or on the shifted operator I + F (``iterate="I+F"``; eigenvalues of F are
mu - 1). That is enough for lambda1, lambda2, the gap ratio, B and B2; the spectrum is then
marked ``truncated`` (LayerSpectrum.truncated / n_computed, a ``truncated`` column in both tables)
and a solver that did not converge is logged as a warning and reported as ``converged=False``
instead of raising. For d <= dense_limit nothing changes (full dense float64 eigen-decomposition,
``truncated=False``, ``converged=True``).

A factored F = A B (a :class:`~spectral_hooks.linalg.LowRankOperator` with inner width r < d, as
``anatomy.weights.layer_operators`` builds for grouped-query models) with r <= min(FACTORED_EXACT_MAX,
dense_limit) gets every eigenvalue exactly instead: the r of the r x r matrix B A, then d - r
zeros (:func:`spectral_hooks.linalg.lowrank_eig`; ``truncated=False``).

Spectra are computed once per layer matrix: :func:`power_table` and :func:`spectra_table` share a
small in-process cache keyed on the identity of the F tensor passed in (checked through a weak
reference, so a freed tensor's address can never alias), its data_ptr, ``_version`` (bumped by
in-place edits), shape, strides, dtype and device, the layer and the options. Call
:func:`clear_spectrum_cache` to drop it (e.g. after editing F through ``.data``, which does not
bump ``_version``). :func:`spectrum` itself never caches (it returns all eigenvectors).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
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
    "DENSE_LIMIT",
    "TOP_K",
    "FACTORED_EXACT_MAX",
    "MATRIX_FREE_D",
    "ROUTES",
    "clear_spectrum_cache",
]

# Named after power.py, where this code lived: log records (and any logging config that filters
# on the name) stay as they were before the split.
logger: logging.Logger = logging.getLogger("spectral_hooks.metrics.power")

#: Above this d the spectrum of F is truncated to its top-k eigenpairs (Krylov, eigs).
DENSE_LIMIT = 4096
#: Default number of leading eigenpairs computed above DENSE_LIMIT (at least 3 are always used).
TOP_K = 8
#: Largest inner width r at which a factored F = A B (a ``LowRankOperator``, r < d: grouped-query
#: layers) gets its full spectrum exactly from the r x r matrix B A instead of its top-k by
#: Krylov, at about the cost of Krylov's top 8 or less (one core, random init): r = 1024, d = 4096:
#: 2.1 s against 5.0 s; r = 2048, d = 3584: 7.7 s against 7.2 s (benchmarks/power_factored.py).
FACTORED_EXACT_MAX = 2048
#: d_model from which the power view computes F's top-k eigenpairs by Krylov on the thin
#: products x -> W_O (W_V x) instead of F's dense eig (when F is not thin enough to be exact from
#: its factors). Measured (benchmarks/results/dense_threshold.md, one thread, random init): the
#: dense eig takes 0.54x the matrix-free time at d = 1024 and 0.75x at d = 1536, so the two
#: cross near d = 2000; ``analyze()`` and the training events both switch here.
MATRIX_FREE_D = 2048
#: How one layer's spectrum is computed: "dense" (the eig of the formed d x d F), "factored" (every
#: eigenvalue exactly from the r x r matrix of F's thin factors) or "krylov" (the top k by eigs).
ROUTES = ("dense", "factored", "krylov")
# Options of linalg.eigs in the top-k path (module-level so tests can shrink max_restarts).
_EIGS_KW: dict = {"tol": 1e-10, "max_restarts": 1000, "seed": 0}

ITERATES = ("F", "I+F")


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
    is_real = vals.imag.abs() <= real_tol * vals.abs()
    vals = torch.where(is_real, vals.real.to(torch.complex128), vals)
    vecs = vecs.clone()
    vecs[:, is_real] = _realify(vecs[:, is_real])
    pos, neg = (~is_real) & (vals.imag > 0), (~is_real) & (vals.imag < 0)
    if int(pos.sum()) == int(neg.sum()):  # always so for a real matrix; make the pairs exact
        vals = torch.cat([vals[is_real], vals[pos], vals[pos].conj()])
        vecs = torch.cat([vecs[:, is_real], vecs[:, pos], vecs[:, pos].conj()], dim=1)
        n_real, n_pairs = int(is_real.sum()), int(pos.sum())
        is_real = torch.arange(n_real + 2 * n_pairs) < n_real
    order = _order(vals, iterate)
    return vals[order], vecs[:, order], is_real[order]


def _order(vals: Tensor, iterate: str) -> Tensor:
    """Positions of ``vals`` by descending |q| (q = lambda, or 1 + lambda for "I+F"), ties by
    descending real then imaginary part."""
    q = vals + 1 if iterate == "I+F" else vals
    return torch.from_numpy(np.lexsort((-vals.imag.numpy(), -vals.real.numpy(), -q.abs().numpy())))


def _factored_eig(F: LowRankOperator, iterate: str, real_tol: float, vectors: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Every eigenpair of a factored F = A B from B A (linalg.lowrank_eig), tidied. Without
    ``vectors`` the null-space basis of B (the zero eigenvalues' vectors, d^2 r to build) is
    skipped unless a zero is among the three leading positions: the vectors returned are
    then the r others', sorted, of which only the leading ones are used (B, B2)."""
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
    F: Tensor | LinearOperator, iterate: str, real_tol: float, dense_limit: int = DENSE_LIMIT,
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
    """
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
    else:
        vals, vecs, is_real = _eig_sorted(cast(Tensor, F), iterate, real_tol)  # formed above
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
            s = replace(layer_spectrum(F[t], iterate, real_tol, dense_limit, top_k, layer=t,
                                      dense_eig=batched.get(t), vectors=False),
                        eigenvectors=None)
            table[(t, *opts)] = s
        out.append(s)
    return out


def spectrum(
    F: Float[Tensor, "*L d d"], *, iterate: str = "F", real_tol: float = 1e-9,
    dense_limit: int = DENSE_LIMIT, top_k: int = TOP_K,
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
