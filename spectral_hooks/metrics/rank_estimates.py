"""Matrix-free estimates of the full-spectrum ranks of an operator, with standard errors.

Above the bottleneck's top-k (``bottleneck_k``, 32 by default) the effective rank and the count
of surviving directions of an end-to-end Jacobian P cannot be read off the computed singular
values: those are ranks of a truncated spectrum. Here they are estimated from all of P's
singular values by stochastic Lanczos quadrature (SLQ) on A = P^T P, whose eigenvalues are
sigma_i^2: for ``n_probes`` Rademacher vectors z, ``steps`` Lanczos steps from z (full
reorthogonalisation) give a tridiagonal T = U diag(theta) U^T, and z^T f(A) z ~ ||z||^2
sum_j U[0, j]^2 f(theta_j) (Gauss quadrature: exact for every f once steps >= d, and for
polynomials of degree < 2 steps). The mean over probes estimates tr f(A); the standard error is
that of the probe mean (the quadrature error for steps < d is not in it, but bracketed below).

- erank (Roy-Vetterli) = exp(-sum p_i log p_i), p_i = sigma_i / sum sigma
  = exp(log S1 - S2 / S1) with S1 = tr A^{1/2} = sum sigma, S2 = sum sigma log sigma; its
  standard error by the delta method from the per-probe pairs (S1, S2). Each probe has two rules
  from the same steps: Gauss, and Gauss-Radau with a node at 0 (``GaussRule.radau``). For sqrt
  they bracket the probe's exact value (Gauss above, Radau below: sqrt's even derivatives are
  negative, its odd ones positive). ``erank_est_lo`` / ``erank_est_hi`` are the eranks of the
  two rules' probe means (for erank the bracket is observed on every spectrum tested, to
  about 2e-4 relative, not proven: docs/metrics.md); ``erank_est`` uses, per probe, the mean
  of the two rules' (S1, S2). Spectra with mass near 0 (products of transformer Jacobians:
  LayerNorm null directions) are where the Gauss rule alone overestimates most.
- surviving = #{sigma_i >= tau sigma_1} = tr 1[A >= tau^2 sigma_1^2], sigma_1^2 taken as the
  largest Ritz value over the probes (Lanczos finds the top of the spectrum first). A step
  function converges slowly under Gauss quadrature (on MiniLM-L6 end-to-end Jacobians, d = 384,
  48 steps miss the exact count by up to 8 standard errors), so each probe's quadrature error is
  bounded too, by the Chebyshev-Markov-Stieltjes inequalities: with Ritz values
  theta_1 < ... < theta_m, weights w_j and theta_p < c <= theta_{p+1}, the mass of the probe's
  spectral measure below c lies in [w_1 + ... + w_{p-1}, w_1 + ... + w_{p+1}]. The probe means
  of the resulting counts are ``surviving_est_lo`` and ``surviving_est_hi`` (equal to
  ``surviving_est`` where Lanczos exhausted the probe's Krylov space): the exact count lies
  between them up to the Monte Carlo error ``surviving_est_se``.

>>> import torch
>>> P = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5, 0.01] + [0.0] * 3, dtype=torch.float64))
>>> est = rank_estimates(P, n_probes=4, steps=8, seed=0)   # diagonal: every probe is exact
>>> from spectral_hooks.linalg import effective_rank
>>> round(est["erank_est"], 9) == round(float(effective_rank(torch.diag(P))), 9)
True
>>> round(est["surviving_est"], 9), est["surviving_est_se"] < 1e-9
(4.0, True)
>>> round(est["surviving_est_lo"], 9), round(est["surviving_est_hi"], 9)   # exact quadrature
(4.0, 4.0)
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence, Union

import torch
from torch import Tensor
from torch.profiler import record_function

from spectral_hooks.linalg import DenseOperator, LinearOperator
from spectral_hooks.linalg.quadrature import GaussRule, gram_quadrature

from ..checks import check_float, check_int

__all__ = ["rank_estimates", "rank_estimates_of", "RANK_ESTIMATE_COLUMNS"]

#: the keys of :func:`rank_estimates`
RANK_ESTIMATE_COLUMNS = ("erank_est", "erank_est_se", "erank_est_lo", "erank_est_hi",
                         "surviving_est", "surviving_est_se", "surviving_est_lo",
                         "surviving_est_hi")


def rank_estimates(P: Union[Tensor, LinearOperator], *, n_probes: int = 16, steps: int = 48,
                   seed: int = 0, tau: float = 1e-2) -> Dict[str, float]:
    """Estimates of erank and surviving over *all* singular values of ``P`` (a [m, d] tensor or
    a LinearOperator with an adjoint), with the standard errors of the probe means (see the
    module docstring: SLQ on P^T P, ``n_probes`` Rademacher probes, ``steps`` Lanczos steps,
    ``steps`` capped at d). Cost: n_probes x steps products with P and with P^T.
    Keys: ``RANK_ESTIMATE_COLUMNS``."""
    return rank_estimates_of([P], n_probes=n_probes, steps=steps, seeds=[seed], tau=tau)[0]


def rank_estimates_of(operators: Sequence[Union[Tensor, LinearOperator]], *, n_probes: int = 16,
                      steps: int = 48, seeds: Sequence[int], tau: float = 1e-2
                      ) -> List[Dict[str, float]]:
    """:func:`rank_estimates` of each operator (one shape; operator i with seed ``seeds[i]``:
    the same probes, the same estimates up to rounding), their Lanczos runs in lockstep: a step
    is one product of the batch and one of its adjoint. Operators of one
    :class:`~spectral_hooks.linalg.chains.ChainProducts` (the end-to-end products of a stack)
    are then applied in one sweep through their shared factors, not one chain after another.
    Runs of at most BASIS_BYTES of Lanczos basis at a time.

    >>> from spectral_hooks.linalg import effective_rank
    >>> s = torch.tensor([4.0, 2.0, 1.0, 0.5], dtype=torch.float64)
    >>> est = rank_estimates_of([torch.diag(s), torch.diag(2 * s)], n_probes=2, steps=4,
    ...                         seeds=[0, 1])           # 4 steps on d = 4: exact quadrature
    >>> all(abs(e["erank_est"] - float(effective_rank(s))) < 1e-9 for e in est)
    True
    """
    check_int("n_probes", n_probes, minimum=2, hint="rank_estimates")
    check_int("steps", steps, minimum=1, hint="rank_estimates")
    check_float("tau", tau, above=0, below=1, hint="rank_estimates")
    if len(seeds) != len(operators):
        raise ValueError(f"rank_estimates_of: {len(seeds)} seeds for {len(operators)} operators")
    ops = [P if isinstance(P, LinearOperator) else DenseOperator(
        torch.as_tensor(P).detach().to(torch.float64)) for P in operators]
    if not ops:
        return []
    d = ops[0].shape[1]
    steps = min(int(steps), d)
    per_op = (steps + 1) * d * n_probes * 8  # float64 basis bytes
    chunk = max(1, BASIS_BYTES // per_op)
    out: list[dict] = []
    for i in range(0, len(ops), chunk):
        out += _lockstep(ops[i:i + chunk], list(seeds[i:i + chunk]), n_probes, steps, tau)
    return out


#: at most this many bytes of Lanczos basis at once (a run of several operators holds
#: steps + 1 vectors of d float64 numbers for each of its n_probes x operators columns)
BASIS_BYTES = 2 ** 29


def _lockstep(ops: list[LinearOperator], seeds: list[int], n_probes: int, steps: int,
              tau: float) -> list[dict]:
    d = ops[0].shape[1]
    rules = gram_quadrature(ops, [_probes(d, n_probes, seed) for seed in seeds], steps,
                            what="rank_estimates")
    with record_function("spectral_hooks.host"):  # the rules are host tensors
        return [_from_rules(r, d, tau) for r in rules]


def _probes(d: int, n_probes: int, seed: int) -> Tensor:
    """[d, n_probes] Rademacher probes drawn from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    return (torch.randint(0, 2, (d, n_probes), generator=g) * 2 - 1).to(torch.float64)


def _sums(d: int, nodes: Tensor, weights: Tensor) -> tuple[float, float]:
    """One probe's (S1, S2) = d x its rule's integrals of sigma and sigma log sigma."""
    sigma = nodes.sqrt()
    slog = torch.where(sigma > 0, sigma * sigma.clamp(min=1e-300).log(), torch.zeros_like(sigma))
    return d * float((weights * sigma).sum()), d * float((weights * slog).sum())


def _erank(x: Tensor) -> tuple[float, float]:
    """erank = exp(log S1 - S2 / S1) of the probe means of x = [[S1...], [S2...]] and its
    delta-method standard error."""
    m1, m2 = float(x[0].mean()), float(x[1].mean())
    if m1 <= 0:
        return float("nan"), float("nan")
    erank = math.exp(math.log(m1) - m2 / m1)
    grad = torch.tensor([erank * (1 / m1 + m2 / m1 ** 2), -erank / m1], dtype=torch.float64)
    var = float(grad @ torch.cov(x) @ grad) / x.shape[1]
    return erank, math.sqrt(max(var, 0.0))


def _from_rules(rules: list[GaussRule], d: int, tau: float) -> dict:
    """The estimates from each probe's Gauss rule and its Gauss-Radau rule at 0."""
    top = max(float(rule.nodes.max()) for rule in rules)
    if top <= 0:
        return dict.fromkeys(RANK_ESTIMATE_COLUMNS, float("nan"))
    gauss, radau, cnt, lo, hi = [], [], [], [], []
    for rule in rules:
        theta, w = rule.nodes, rule.weights
        gauss.append(_sums(d, theta, w))
        radau.append(_sums(d, *rule.radau(0.0)))
        above = theta >= tau ** 2 * top
        cnt.append(d * float(w[above].sum()))
        p = int((~above).sum())  # Ritz values below the threshold (theta ascending)
        lo.append(cnt[-1] if rule.exact else d * (1.0 - float(w[:p + 1].sum())))
        hi.append(cnt[-1] if rule.exact else d * (1.0 - float(w[:max(p - 1, 0)].sum())))
    g = torch.tensor(gauss, dtype=torch.float64).T  # [2, n]: S1, S2 per probe
    r = torch.tensor(radau, dtype=torch.float64).T
    erank, se = _erank((g + r) / 2)
    ends = sorted((_erank(g)[0], _erank(r)[0]))
    n = len(rules)
    c = torch.tensor(cnt, dtype=torch.float64)
    # One correctly rounded mean for the three counts: where Lanczos is exhausted lo = hi = cnt
    # probe by probe, and the means are then equal to the bit on any BLAS and thread count.
    return {"erank_est": erank, "erank_est_se": se, "erank_est_lo": ends[0],
            "erank_est_hi": ends[1],
            "surviving_est": math.fsum(cnt) / n, "surviving_est_se": float(c.std() / math.sqrt(n)),
            "surviving_est_lo": math.fsum(lo) / n, "surviving_est_hi": math.fsum(hi) / n}
