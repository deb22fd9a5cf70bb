"""SLQ estimates of the full-spectrum erank and surviving count (metrics/rank_estimates.py)
against the dense float64 oracle (torch.linalg.svdvals + linalg.ranks): covered by their
standard errors, and converging as probes grow."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import DenseOperator, effective_rank, surviving
from spectral_hooks.metrics.rank_estimates import rank_estimates


def product(d: int, seed: int, depth: int = 4) -> torch.Tensor:
    """A product of ``depth`` random blocks with decaying column scales: a spread spectrum, many
    directions above 1e-2 sigma_1 (more than a top-32 would hold at d = 96)."""
    g = torch.Generator().manual_seed(seed)
    P = torch.eye(d, dtype=torch.float64)
    for _ in range(depth):
        M = torch.randn(d, d, generator=g, dtype=torch.float64) / d ** 0.5
        M = M * torch.linspace(1.0, 0.2, d, dtype=torch.float64)
        P = M @ P
    return P


@pytest.mark.parametrize("seed", [0, 1])
def test_estimates_cover_the_dense_oracle(seed):
    d = 96
    P = product(d, seed)
    s = torch.linalg.svdvals(P)
    erank, surv = float(effective_rank(s)), int(surviving(s, 1e-2))
    assert surv > 32  # beyond what a top-32 truncation can count
    est = rank_estimates(DenseOperator(P), n_probes=64, steps=d, seed=seed)  # exact quadrature
    assert abs(est["erank_est"] - erank) <= 4 * est["erank_est_se"]
    assert abs(est["surviving_est"] - surv) <= 4 * est["surviving_est_se"] + 1e-9
    assert est["erank_est_se"] < 0.05 * erank and est["surviving_est_se"] < 0.1 * surv
    # fewer Lanczos steps than d: the smooth erank quadrature barely moves
    short = rank_estimates(DenseOperator(P), n_probes=64, steps=40, seed=seed)
    assert abs(short["erank_est"] - erank) <= 4 * short["erank_est_se"] + 0.02 * erank


def test_error_shrinks_with_probes():
    d = 64
    P = product(d, 3)
    erank = float(effective_rank(torch.linalg.svdvals(P)))
    errors = {n: np.mean([abs(rank_estimates(P, n_probes=n, steps=d, seed=s)["erank_est"] - erank)
                          for s in range(4)]) for n in (4, 48)}
    assert errors[48] < errors[4] / 2
    se = [rank_estimates(P, n_probes=n, steps=d, seed=0)["erank_est_se"] for n in (4, 48)]
    assert se[1] < se[0]


def test_bad_options():
    P = torch.eye(4, dtype=torch.float64)
    for kw in ({"n_probes": 1}, {"steps": 0}, {"tau": 1.5}, {"n_probes": True}):
        with pytest.raises(ValueError):
            rank_estimates(P, **kw)
    assert np.isnan(rank_estimates(torch.zeros(4, 4, dtype=torch.float64))["erank_est"])



@pytest.mark.parametrize("steps", [12, 24])
def test_surviving_quadrature_bracket_covers_the_dense_count(steps):
    """Few Lanczos steps: the Gauss estimate of a step function may miss the count by more than
    its standard error; the Chebyshev-Markov-Stieltjes bracket (lo, hi) covers it."""
    d = 96
    P = product(d, 5)
    surv = int(surviving(torch.linalg.svdvals(P), 1e-2))
    est = rank_estimates(DenseOperator(P), n_probes=32, steps=steps, seed=1)
    lo, hi, se = est["surviving_est_lo"], est["surviving_est_hi"], est["surviving_est_se"]
    assert lo <= est["surviving_est"] <= hi and hi - lo > 1  # a real bracket at steps < d
    assert lo - 4 * se <= surv <= hi + 4 * se
    full = rank_estimates(DenseOperator(P), n_probes=8, steps=d, seed=1)
    # exhausted Krylov space: the bracket closes on the estimate (to rounding, see tests/README.md)
    assert full["surviving_est_lo"] == pytest.approx(full["surviving_est"], rel=1e-12)
    assert full["surviving_est_hi"] == pytest.approx(full["surviving_est"], rel=1e-12)


def _hard_spectra(d: int):
    """Singular values that a few Gauss nodes cannot resolve near 0: u^4, eight decades
    log-uniform, a power law, 30% exact zeros over a decaying bulk (LayerNorm null directions)."""
    g = torch.Generator().manual_seed(0)
    Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    u = torch.rand(d, generator=g, dtype=torch.float64)
    for s in (u ** 4, 10.0 ** (-8 * u), 1.0 / torch.arange(1, d + 1, dtype=torch.float64) ** 1.5,
              torch.where(u < 0.3, 0.0, u ** 3)):
        yield s, Q @ torch.diag(s) @ Q.T


@pytest.mark.parametrize("steps", [6, 10, 16])
def test_erank_quadrature_bracket_covers_the_dense_erank(steps):
    """Few Lanczos steps on spectra with mass near 0: the Gauss rule alone (erank_est_hi, the
    estimate before the bracket) misses the dense erank by many standard errors; the bracket
    [erank_est_lo, erank_est_hi] from the Gauss-Radau rule at 0 and the Gauss rule covers it up
    to the Monte Carlo error, and erank_est is its midpoint's estimate."""
    d, gauss_missed = 96, 0
    for s, P in _hard_spectra(d):
        erank = float(effective_rank(s))
        est = rank_estimates(DenseOperator(P), n_probes=64, steps=steps, seed=2)
        lo, hi, se = est["erank_est_lo"], est["erank_est_hi"], est["erank_est_se"]
        assert lo <= est["erank_est"] <= hi
        assert lo - 4 * se <= erank <= hi + 4 * se, (lo, erank, hi, se)
        gauss_missed += abs(hi - erank) > 4 * se
    assert gauss_missed >= 2


def test_erank_bracket_closes_with_the_krylov_space():
    d = 48
    P = product(d, 2)
    est = rank_estimates(DenseOperator(P), n_probes=8, steps=d, seed=0)
    assert est["erank_est_lo"] == pytest.approx(est["erank_est"], rel=1e-12)
    assert est["erank_est_hi"] == pytest.approx(est["erank_est"], rel=1e-12)
