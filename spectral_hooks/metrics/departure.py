"""Bounds on Henrici's departure from normality that need no full spectrum (METRICS.md section 2).

dep(J)^2 = ||J||_F^2 - sum_i |lambda_i|^2 needs every eigenvalue; so does any estimate of it
(sum |lambda_i|^2 is not a trace of a polynomial in J: no Hutchinson estimator exists). Two
bounds need only products with J and J^T and the top-k eigenvalues:

* Upper (exact identity, then a subset): with the complex Schur form J = Q (Lambda + N) Q^*,
  the skew-symmetric part K = (J - J^T) / 2 is unitarily similar to the skew-Hermitian part of
  Lambda + N, whose squared norm is sum_i (Im lambda_i)^2 + ||N||_F^2 / 2; and dep = ||N||_F. So

      dep^2 = 2 (||K||_F^2 - sum_i (Im lambda_i)^2)     (every eigenvalue i)
            <= 2 (||K||_F^2 - sum_{i in T} (Im lambda_i)^2)   for any subset T,

  with equality iff every eigenvalue outside T is real. T = the top-k of J by modulus gives
  ``departure_rel_upper_top{k}``; its excess over the exact value is exactly
  2 sum_{i not in T} (Im lambda_i)^2 / ||Delta J||_F^2 (under the square root).
* Lower (Eberlein 1962): dep(A)^2 >= ||A^T A - A A^T||_F^2 / (6 ||A||_F^2) for every real A.
  dep and the commutator are shift-invariant, so A = Delta J - (tr Delta J / d) I, the shift
  that minimises ||A||_F: ``departure_rel_lower`` = ||C||_F / (sqrt(6) ||A||_F ||Delta J||_F).
  Loose in practice (MiniLM-L6: 0.02-0.06 where the exact value is 0.24-0.59): a bracket, not a
  measurement.

Both are divided by ||Delta J||_F like ``departure_rel``. Dense: exact (:func:`departure_bounds`).
Matrix-free (:func:`departure_bounds_from_probes`): ||K||_F^2, ||C||_F^2, ||Delta J||_F^2 and
tr Delta J are Hutchinson estimates from the Rademacher probes Z of the jacobian metrics
(Y = Delta J Z, W = Delta J^T Z, C Z), the standard errors by the delta method over probes.

>>> import torch
>>> J = torch.tensor([[1.0, 2.0], [0.0, 3.0]], dtype=torch.float64)  # real eigenvalues 1, 3
>>> D = J - torch.eye(2, dtype=torch.float64)
>>> b = departure_bounds(D, torch.tensor([3.0 + 0j]))
>>> exact = 2.0 / float(torch.linalg.matrix_norm(D))   # dep = |off-diagonal| = 2
>>> round(b["upper"], 12) == round(exact, 12), b["lower"] <= exact
(True, True)
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = ["departure_bounds", "departure_bounds_from_probes", "EBERLEIN"]

#: the constant of Eberlein's lower bound dep^2 >= ||C||_F^2 / (EBERLEIN ||A||_F^2)
EBERLEIN = 6.0


def _imag_sq(top: Tensor) -> float:
    return float((top.imag.to(torch.float64) ** 2).sum()) if top.is_complex() else 0.0


def _upper(k2: Tensor, f2: Tensor, im2: float) -> Tensor:
    return torch.sqrt(torch.clamp(2 * (k2 - im2), min=0.0) / f2)


def _lower(c2: Tensor, f2: Tensor, t: Tensor, d: int) -> Tensor:
    return torch.sqrt(c2 / (EBERLEIN * (f2 - t ** 2 / d) * f2))


def departure_bounds(D: Tensor, top: Tensor) -> dict[str, float]:
    """Exact ``upper`` (from the eigenvalues ``top`` of J = D + I, any subset with multiplicity)
    and ``lower`` bounds of dep(J) / ||D||_F for a dense real D = Delta J."""
    D = D.to(torch.float64)
    d = D.shape[0]
    f2 = torch.linalg.matrix_norm(D) ** 2
    if float(f2) == 0:
        return {"upper": float("nan"), "lower": float("nan")}
    k2 = torch.linalg.matrix_norm(0.5 * (D - D.T)) ** 2
    c2 = torch.linalg.matrix_norm(D.T @ D - D @ D.T) ** 2
    lower = _lower(c2, f2, torch.trace(D), d) if float(c2) > 0 else torch.zeros(())
    return {"upper": float(_upper(k2, f2, _imag_sq(top))), "lower": float(lower)}


def _delta(samples: Tensor, f: Callable[[Tensor], Tensor]) -> tuple[float, float]:
    """f(probe means) and its delta-method standard error; ``samples`` is [quantities, probes]."""
    n = samples.shape[1]
    mean = samples.mean(1).detach().requires_grad_(True)
    value = f(mean)
    v = float(value.detach())
    if not math.isfinite(v) or n < 2:
        return v, float("nan")
    (grad,) = torch.autograd.grad(value, mean)
    if not bool(torch.isfinite(grad).all()):
        return v, float("nan")
    var = float(grad @ torch.cov(samples) @ grad) / n
    return v, math.sqrt(max(var, 0.0))


def departure_bounds_from_probes(Z: Tensor, Y: Tensor, W: Tensor, CZ: Tensor,
                                 top: Tensor) -> dict[str, float]:
    """Hutchinson estimates of :func:`departure_bounds` and their standard errors from probes
    Z [d, n] (Rademacher), Y = Delta J Z, W = Delta J^T Z and CZ = C Z (C the commutator of
    Delta J). Keys: upper, upper_se, lower, lower_se. An estimated ||K||_F^2 below
    sum_T (Im lambda)^2 gives upper 0 with a NaN standard error."""
    k2 = (((Y - W) / 2) ** 2).sum(0)
    f2 = ((Y ** 2).sum(0) + (W ** 2).sum(0)) / 2
    t = (Z * Y).sum(0)
    return departure_bounds_from_sums(k2, f2, t, (CZ ** 2).sum(0), Z.shape[0], top)


def departure_bounds_from_sums(k2: Tensor, f2: Tensor, t: Tensor, c2: Tensor, d: int,
                               top: Tensor) -> dict[str, float]:
    """:func:`departure_bounds_from_probes` from its per-probe sums [n]: ``k2`` = ||K z||^2,
    ``f2`` = (||Delta J z||^2 + ||Delta J^T z||^2) / 2, ``t`` = z^T Delta J z and ``c2`` =
    ||C z||^2 (the form a batched caller reduces its probes to on the device)."""
    im2 = _imag_sq(top)
    with torch.enable_grad():
        up, up_se = _delta(torch.stack([k2, f2]).to(torch.float64),
                           lambda m: _upper(m[0], m[1], im2))
        low, low_se = _delta(torch.stack([c2, f2, t]).to(torch.float64),
                             lambda m: _lower(m[0], m[1], m[2], d))
    if up == 0.0:
        up_se = float("nan")
    return {"upper": up, "upper_se": up_se, "lower": low, "lower_se": low_se}
