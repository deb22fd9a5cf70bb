"""Random-matrix nulls of the Jacobian view: how many real eigenvalues a Gaussian matrix has.

    >>> round(frac_complex_null(4096), 3)
    0.987
"""

from __future__ import annotations

import math

__all__ = ["expected_real_eigenvalues", "frac_complex_null"]


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
