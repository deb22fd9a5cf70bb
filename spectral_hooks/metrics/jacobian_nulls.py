"""Random-matrix nulls of the Jacobian view: how many eigenvalues of a real Gaussian matrix are
complex, over the full spectrum (exact, Edelman-Kostlan-Shub) and over its top-k by modulus
(Monte Carlo, with its Monte Carlo error).

    >>> round(frac_complex_null(4096), 3)
    0.987
    >>> mean, se = frac_complex_top_null(32, 4, seed=0)
    >>> 0 < mean < 1 and 0 < se < 0.1
    True
"""

from __future__ import annotations

import math

import torch

from ..checks import check_int
from .rotation import mc_error, rotation_stats, top_k_by_modulus

__all__ = ["expected_real_eigenvalues", "frac_complex_null", "frac_complex_top_null",
           "NULL_MC_MAX_D", "NULL_MC_DRAWS"]

#: the top-k null is computed on demand (Monte Carlo) up to this d: 64 eigendecompositions of a
#: d x d matrix, ~8 s at d = 384 on one core; above it the null is NaN (said in the metadata)
NULL_MC_MAX_D = 512
NULL_MC_DRAWS = 64


def expected_real_eigenvalues(d: int) -> float:
    """Expected number of real eigenvalues of a d x d matrix with iid N(0, 1) entries.

    >>> expected_real_eigenvalues(1), round(expected_real_eigenvalues(2), 12)
    (1.0, 1.414213562373)

    Edelman, Kostlan & Shub (1994), Theorem 5.1, exact for every d:
    E_d = 1/2 + sqrt(2) 2F1(1, -1/2; d; 1/2) / B(d, 1/2) ~ sqrt(2d/pi) + 1/2.
    The hypergeometric series has terms (-1/2)_j / (d)_j 2^-j and converges geometrically.
    """
    check_int("d", d, minimum=1, hint="expected_real_eigenvalues")
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


def frac_complex_top_null(d: int, k: int, *, seed: int = 0,
                          n_draws: int = NULL_MC_DRAWS) -> tuple[float, float]:
    """(mean, Monte Carlo standard error) of the share of complex eigenvalues among the top-k by
    modulus (k + 1 when a conjugate pair straddles k, as the Jacobian view counts them) of a
    real Gaussian d x d matrix; ``n_draws`` matrices from a private generator seeded ``seed``.
    (NaN, NaN) for d > NULL_MC_MAX_D (too costly to compute on demand). Cached per
    (d, k, seed, n_draws) for the life of the process.

    >>> frac_complex_top_null(4096, 16)
    (nan, nan)
    """
    check_int("d", d, minimum=1, hint="frac_complex_top_null")
    check_int("k", k, minimum=1, maximum=d, hint="frac_complex_top_null")
    if d > NULL_MC_MAX_D:
        return float("nan"), float("nan")
    key = (int(d), int(k), int(seed), int(n_draws))
    if key not in _TOP_NULLS:
        _TOP_NULLS[key] = _top_null(*key)
    return _TOP_NULLS[key]


#: (d, k, seed, n_draws) -> (mean, se): a pure function of its key (no model state), kept for
#: the life of the process so each (d, k) costs its Monte Carlo run once
_TOP_NULLS: dict[tuple[int, int, int, int], tuple[float, float]] = {}


def _top_null(d: int, k: int, seed: int, n_draws: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(seed)
    fracs = torch.empty(n_draws, dtype=torch.float64)
    for i in range(n_draws):
        lam = torch.linalg.eigvals(torch.randn(d, d, generator=g, dtype=torch.float64))
        fracs[i] = rotation_stats(top_k_by_modulus(lam, k)).frac_complex
    return float(fracs.mean()), mc_error(fracs)
