"""Null models and tests for the power-method metrics (METRICS.md section 1).

- :func:`gamma_null` -- expected alignment of a uniformly random direction with an r-dim subspace.
- :func:`rho_test` -- share of tokens whose alignment grew, with its exact one-sided binomial p-value.

Everything is float64; nothing here needs scipy (it is only used by the tests as an oracle).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_int

__all__ = ["gamma_null", "rho_test", "binom_sf"]


def gamma_null(d: int, r: int = 1, *, exact: bool = True, n_samples: int = 200_000, seed: int = 0) -> float:
    """Expected alignment E ||P u|| of u uniform on the unit sphere of R^d with an r-dim subspace.

    >>> round(gamma_null(768), 5)        # 1-dim: Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))
    0.0288
    >>> gamma_null(4, 4)
    1.0

    Closed form (||P u||^2 ~ Beta(r/2, (d-r)/2), and E sqrt(Beta(a, b)) = B(a + 1/2, b) / B(a, b)):

        E ||P u|| = Gamma(d/2) Gamma((r+1)/2) / (Gamma(r/2) Gamma((d+1)/2)),

    evaluated with lgamma so that any d works (~ sqrt(r/d) for large d).
    ``exact=False`` returns a Monte-Carlo estimate instead (``n_samples`` Gaussian draws, ``seed``);
    it is there for cross-checking, the closed form is the default.
    """
    d = check_int("d", d, minimum=1, hint="gamma_null")
    r = check_int("r", r, minimum=1, maximum=d, hint="gamma_null")
    if r == d:
        return 1.0
    if exact:
        log_val = math.lgamma(d / 2) + math.lgamma((r + 1) / 2) - math.lgamma(r / 2) - math.lgamma((d + 1) / 2)
        return math.exp(log_val)
    check_int("n_samples", n_samples, minimum=1, hint="gamma_null")
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n_samples, d, generator=gen, dtype=torch.float64)
    return float((g[:, :r].norm(dim=1) / g.norm(dim=1)).mean())


def binom_sf(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), summed in log space (exact up to float64 rounding).

    >>> binom_sf(0, 10), round(binom_sf(9, 10) * 2**10, 9)
    (1.0, 11.0)
    """
    if n < 0 or k < 0:
        raise ValueError(f"need n >= 0 and k >= 0, got k={k}, n={n}")
    if k == 0:
        return 1.0
    if k > n:
        return 0.0
    j = torch.arange(k, n + 1, dtype=torch.float64)
    log_terms = math.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma(n - j + 1) - n * math.log(2.0)
    return min(1.0, float(torch.logsumexp(log_terms, dim=0).exp()))


def rho_test(a_in: Tensor, a_out: Tensor) -> tuple[float, float]:
    """Fraction of tokens whose alignment grew through the layer, and its one-sided p-value.

    >>> rho_test(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.5, 0.1]))[0]
    0.6666666666666666

    ``a_in``, ``a_out``: [n] alignments of the same n tokens before / after the layer.
    rho = #{a_out > a_in} / n (ties count as "not grown"); the p-value is the exact binomial tail
    P(X >= k | n, 1/2), the one-sided test of "more tokens grow than shrink".
    n = 0 gives (nan, nan). NaN inputs raise ValueError.
    """
    a_in = torch.as_tensor(a_in, dtype=torch.float64)
    a_out = torch.as_tensor(a_out, dtype=torch.float64)
    if a_in.ndim != 1 or a_in.shape != a_out.shape:
        shapes = f"{tuple(a_in.shape)}, {tuple(a_out.shape)}"
        raise ValueError(f"a_in and a_out must be 1-D of the same length, got {shapes}")
    if torch.isnan(a_in).any() or torch.isnan(a_out).any():
        raise ValueError("a_in / a_out contain NaN")
    n = a_in.numel()
    if n == 0:
        return float("nan"), float("nan")
    k = int((a_out > a_in).sum())
    return k / n, binom_sf(k, n)
