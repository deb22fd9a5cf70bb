"""Spectrum of a layer matrix F for the power-method view (METRICS.md section 1): what it
holds, which route computes it, and the cache the power and spectra tables share.

The power view's table builders (:mod:`spectral_hooks.metrics.power`) and the training events
compute every spectrum here, on the route :func:`power_route` picks; the numerics of each route
(sorting, values-first eig, inverse iteration and its residual checks, the factored and Krylov
paths) live in :mod:`spectral_hooks.linalg.sorted_eig`.
``F`` is a layer matrix [d, d] or a stack [L, d, d] (column convention, x -> F x); all numerics
run in float64 (complex128 for eigenpairs) whatever the input dtype.

>>> s = spectrum(torch.diag(torch.tensor([3.0, 1.0, 0.5])))
>>> s.lambda1, s.gap_ratio
((3+0j), 0.3333333333333333)

Large d (``d > dense_limit``, default SPECTRUM_DENSE_MAX_D = 4096; ``analyze()`` routes by
:func:`power_route`, from MATRIX_FREE_D = 1024): only the ``top_k`` leading eigenpairs are computed,
with the project's Krylov solver (:func:`spectral_hooks.linalg.eigs`, which="LM", float64) on F
(``iterate="F"``) or on the shifted operator I + F (``iterate="I+F"``; eigenvalues of F are
mu - 1); for a thin F = A B (r < d) on the r x r matrix B A (same nonzero eigenvalues, the
vectors A y), where F's d - r zeros cannot rank among the top k. That is enough for lambda1,
lambda2, the gap ratio, B and B2; the spectrum is then
marked ``truncated`` (LayerSpectrum.truncated / n_computed, a ``truncated`` column in both tables)
and a solver that did not converge is logged as a warning and reported as ``converged=False``
instead of raising. For d <= dense_limit every eigenvalue is computed (``truncated=False``,
``converged=True``): the full dense float64 eigen-decomposition where every eigenvector is
asked for (:func:`spectrum`), else LAPACK's eigenvalues without eigenvectors and only the
leading eigenvectors (B, B2) by inverse iteration, each kept when its residual is below
``linalg.sorted_eig.VECTOR_RESIDUAL_TOL`` and its eigenvalue stands apart from the others
(``SEPARATION_TOL``), the full eig otherwise. The power view's LAPACK work runs on
POWER_THREADS (1) CPU threads of the calling thread (:func:`power_threads`).

A factored F = A B (a :class:`~spectral_hooks.linalg.LowRankOperator` with inner width r < d, as
``anatomy.weights.layer_operators`` builds for grouped-query models) with r <= dense_limit and
:func:`exact_from_factors` (r <= FACTORED_EXACT_MAX, or d < MATRIX_FREE_D) gets every
eigenvalue exactly instead: the r of the r x r matrix B A, then d - r zeros (values-first as
above, the leading vectors A y from B A's; or :func:`spectral_hooks.linalg.lowrank_eig`;
``truncated=False``).

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
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from spectral_hooks.linalg.lowrank import LowRankOperator
from spectral_hooks.linalg.operators import LinearOperator
from spectral_hooks.linalg.sorted_eig import eig_leading, eig_topk, factored_eig, sorted_eig, tidy
from spectral_hooks.linalg.threads import cpu_threads

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
    "spectrum_workers",
    "SPECTRUM_WORKERS_MAX",
    "FACTORED_EXACT_MAX",
    "exact_from_factors",
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
# (benchmarks/power_shapes.py --calibrate, benchmarks/RESULTS.md "Power view at real shapes"):
#: Largest inner width r at which a factored F = A B (a ``LowRankOperator``, r < d: grouped-query
#: layers) of width d >= MATRIX_FREE_D gets its full spectrum exactly from the r x r matrix B A
#: (values-first) instead of its top-k by Krylov on B A (below MATRIX_FREE_D it always does:
#: :func:`exact_from_factors`). Per layer, d = 2048, one thread, random init (2026-12-07, machine
#: load 7-8, power_shapes.py --calibrate): exact / Krylov's top 8 on B A = 0.27x at r = 128,
#: 0.57x at 256, 0.67x at 384, 1.9x at 512, 2.1x at 1024: every eigenvalue up to here for less
#: than the top 8.
FACTORED_EXACT_MAX = 384
#: d_model from which the power view computes F's top-k eigenpairs by Krylov (on the formed F
#: where r = d, else on the r x r B A of its factors) instead of every eigenvalue by the dense eig (when F is
#: not thin enough to be exact from its factors). Per layer, one thread, random init (2026-12-07,
#: machine load 6): dense values-first 0.56 / 0.73 / 2.09 s at d = 512 / 768 / 1024 against
#: Krylov's top 8 0.24 / 0.27 / 0.43 s (2.3x, 2.7x, 4.6x). Below 1024 the full spectrum is kept
#: at under a second a layer and under 3x Krylov; from 1024 the top k is 4-5x cheaper.
MATRIX_FREE_D = 1024
#: The CPU threads the power view's own LAPACK / BLAS calls run on, at most: the calling
#: thread's OpenMP and MKL counts are lowered for the spectrum and restored after
#: (:func:`spectral_hooks.linalg.threads.cpu_threads`; torch's process-wide count and other
#: threads are not touched). Issue 57 measured the power view of 4 GPT-2-medium layers at 4.8 s
#: on one thread and 4.0 s on two with the machine quiet, 6.9 s and 22.4 s with both cores busy
#: (LAPACK's OpenMP threads spin at barriers; benchmarks/RESULTS.md, "Power view at real shapes").
POWER_THREADS = 1


#: Most layers whose spectra run at once (:func:`spectrum_workers`): each holds its F (128 MB
#: at d = 4096 formed) while it runs, and the Krylov solver's Python steps share one GIL.
SPECTRUM_WORKERS_MAX = 4
#: the calling thread's CPU thread count where power_threads was entered first (its layers'
#: spectra then run on that many threads of POWER_THREADS each: :func:`spectrum_workers`)
_OUTER_THREADS: ContextVar[int | None] = ContextVar("spectral_hooks_outer_threads", default=None)


def spectrum_workers() -> int:
    """How many layers' spectra run at once: the CPU threads torch would use in the calling
    thread (``torch.get_num_threads()``, the count the user set or torch's default) outside
    any :func:`power_threads`, divided by POWER_THREADS, at most SPECTRUM_WORKERS_MAX. Layers
    run in separate Python threads, each its own single-threaded LAPACK: no OpenMP team, so
    nothing waits at a barrier for a thread the OS has descheduled when other processes share
    the cores.

        >>> outside = spectrum_workers()
        >>> with power_threads():   # inside, torch's count is 1; the workers stay the caller's
        ...     spectrum_workers() == outside
        True
    """
    outer = _OUTER_THREADS.get()
    threads = torch.get_num_threads() if outer is None else outer
    return max(1, min(SPECTRUM_WORKERS_MAX, threads // max(POWER_THREADS, 1)))


@contextmanager
def power_threads() -> Iterator[None]:
    """At most :data:`POWER_THREADS` CPU threads for torch's kernels called from this thread
    inside; its counts restored after, other threads untouched (``linalg.threads.cpu_threads``).

        >>> before = torch.get_num_threads()
        >>> with power_threads():
        ...     torch.get_num_threads() <= max(POWER_THREADS, 1)
        True
        >>> torch.get_num_threads() == before
        True
    """
    token = _OUTER_THREADS.set(torch.get_num_threads()) if _OUTER_THREADS.get() is None else None
    try:
        with cpu_threads(POWER_THREADS):
            yield
    finally:
        if token is not None:
            _OUTER_THREADS.reset(token)


def exact_from_factors(d: int, r: int) -> bool:
    """Whether a factored F = A B (width d, inner width r) gets every eigenvalue exactly from
    its r x r matrix B A by default: r < d, and r <= :data:`FACTORED_EXACT_MAX` or d below
    :data:`MATRIX_FREE_D` (where the alternative is the dense eig of the d x d F).

        >>> exact_from_factors(4096, 256), exact_from_factors(2048, 512), exact_from_factors(896, 640)
        (True, False, True)
    """
    return r < d and (r <= FACTORED_EXACT_MAX or d < MATRIX_FREE_D)


def power_route(d: int, r: int, *, full: bool | None = None, top_k: int = TOP_K) -> str:
    """The power view's one routing rule: how layer F = W_O W_V (width d, factors of inner
    width r) gets its spectrum, one of :data:`ROUTES`.

        >>> power_route(768, 768), power_route(4096, 256), power_route(4096, 1024)
        ('dense', 'factored', 'krylov')
        >>> power_route(4096, 256, full=True), power_route(768, 768, full=False)
        ('dense', 'krylov')

    ``full=None`` (the default): "factored" where :func:`exact_from_factors` (grouped-query
    layers), else "dense" below :data:`MATRIX_FREE_D`, else "krylov" (on B A where r < d);
    ``full=True``: always "dense"; ``full=False``: "krylov". A d too small for Krylov (the
    top max(top_k, 3) need d >= max(top_k, 3) + 2) is "dense" whatever ``full`` says.
    """
    if full is None and exact_from_factors(d, r):
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


def check_spectrum_options(dense_limit: int, top_k: int) -> None:
    """OptionTypeError / OptionError unless ``dense_limit`` is an int >= 0 and ``top_k`` an int >= 1."""
    check_int("dense_limit", dense_limit, minimum=0)
    check_int("top_k", top_k, minimum=1)


def _plane(v: Tensor, is_complex: bool) -> Tensor:
    """Orthonormal float64 basis of the real invariant plane of eigenvector v: [d, 1] or [d, 2]."""
    if not is_complex:
        re = v.real
        return (re / re.norm())[:, None]
    q, _ = torch.linalg.qr(torch.stack([v.real, v.imag], dim=1))
    return q


def layer_spectrum(
    F: Tensor | LinearOperator, iterate: str, real_tol: float, dense_limit: int = SPECTRUM_DENSE_MAX_D,
    top_k: int = TOP_K,
    *, layer: int | None = None, dense_eig: tuple[Tensor, Tensor] | None = None,
    vectors: bool = True, factored_max: int | None = None,
) -> LayerSpectrum:
    """One layer's :class:`LayerSpectrum`, on the path its arguments say: a factored F (a
    ``LowRankOperator`` with r < d, r <= dense_limit and :func:`exact_from_factors`, or
    r <= ``factored_max`` where given) exactly from its r x r matrix; else, where
    d > dense_limit (an operator: always) and d leaves room for Krylov, the top max(top_k, 3)
    by ``linalg.eigs`` (a thin F's on its r x r B A); else the dense eig (``dense_eig``:
    computed already). ``vectors=False``: the caller keeps only B and B2, so the result's
    ``eigenvectors`` may be partial (a factored F's zero eigenvalues' vectors are skipped).
    ``factored_max``: the widest factored F done exactly through its r x r matrix (None: the
    default rule, :func:`exact_from_factors`).

        >>> layer_spectrum(torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64)), "F", 1e-9).gap_ratio
        0.3333333333333333

    The dense route without ``vectors`` computes every eigenvalue from LAPACK without
    eigenvectors and only the leading eigenvectors by inverse iteration (the full eig where one
    is refused: ``linalg.sorted_eig.VECTOR_RESIDUAL_TOL``, ``SEPARATION_TOL``); everything runs on at
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
    factored = isinstance(F, LowRankOperator) and F.rank_bound <= dense_limit and (
        exact_from_factors(d, F.rank_bound) if factored_max is None
        else F.rank_bound < d and F.rank_bound <= factored_max)
    if not isinstance(F, Tensor):  # an operator: top-k, or formed when d is too small
        truncated = k <= d - 2 and not factored
        if not truncated and not factored:
            F = F.to_dense().to("cpu", torch.float64)
    converged = True
    if factored:  # exact, every eigenvalue: from the r x r matrix B A
        vals, vecs, is_real = factored_eig(cast(LowRankOperator, F), iterate, real_tol, vectors)
    elif truncated:
        vals, vecs, is_real, converged = eig_topk(F, iterate, real_tol, k, _EIGS_KW)
        if not converged:
            where = f"layer {layer}" if layer is not None else "F"
            logger.warning(
                "top-%d eigenpairs of %s (d=%d, iterate=%s) did not converge; reporting the last "
                "Ritz estimates with converged=False", k, where, d, iterate)
    elif dense_eig is not None:  # computed already, batched over layers on the device
        vals, vecs, is_real = tidy(*dense_eig, iterate, real_tol)
    elif vectors:
        vals, vecs, is_real = sorted_eig(cast(Tensor, F), iterate, real_tol)  # formed above
    else:  # every eigenvalue, and only the leading eigenvectors
        vals, vecs, is_real = eig_leading(cast(Tensor, F), iterate, real_tol)
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
    top_k: int, *, done: Callable[[int], None] | None = None,
) -> list[LayerSpectrum]:
    """Spectra (without eigenvectors) of F[t] for t in layers, through the shared cache.

        >>> F = torch.diag(torch.tensor([2.0, 1.0]))[None].double()
        >>> layer_spectra(F, F, [0], "F", 1e-9, 2, 8)[0].lambda1
        (2+0j)

    F_in is the tensor the caller passed (the cache key), F its float64 CPU [L, d, d] copy (or
    a stack of layer operators, ``F[t]`` a LinearOperator: F_in itself). Layers not cached run
    :func:`spectrum_workers` at a time; ``done(t)`` is called as each layer's spectrum is
    ready (a cached one's first).
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
    missing = list(dict.fromkeys(t for t in layers if (t, *opts) not in table))
    batched = _batched_eigs(F_in, missing, dense_limit, top_k)

    def compute(F_t: Tensor | LinearOperator, t: int) -> LayerSpectrum:
        with power_threads():
            return replace(layer_spectrum(F_t, iterate, real_tol, dense_limit, top_k, layer=t,
                                          dense_eig=batched.get(t), vectors=False),
                           eigenvectors=None)
    for t in dict.fromkeys(layers):
        if t not in missing and done is not None:
            done(t)
    for t, s in _each_layer(F, missing, compute):
        table[(t, *opts)] = s
        if done is not None:
            done(t)
    return [table[(t, *opts)] for t in layers]


def _each_layer(F, layers: list[int], compute: Callable[[Any, int], LayerSpectrum]
                ) -> Iterator[tuple[int, LayerSpectrum]]:
    """(t, compute(F[t], t)) for t in ``layers``, in order: F[t] read in this thread (a stack of
    layer operators builds it from the weights here), the spectra on up to
    :func:`spectrum_workers` threads of one CPU thread each, at most that many layers held."""
    workers = min(spectrum_workers(), len(layers))
    if workers <= 1:
        for t in layers:
            with power_threads():  # F[t] may be formed here
                F_t = F[t]
            yield t, compute(F_t, t)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="spectral_hooks-spectra") as pool:
        pending: deque = deque()
        for t in layers:
            with power_threads():
                F_t = F[t]
            pending.append((t, pool.submit(compute, F_t, t)))
            if len(pending) >= workers:
                t0, done = pending.popleft()
                yield t0, done.result()
        while pending:
            t0, done = pending.popleft()
            yield t0, done.result()


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
