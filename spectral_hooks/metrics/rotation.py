"""Rotation statistics of a set of eigenvalues of J (METRICS.md section 2, "Rotation").

    >>> import torch
    >>> lam = torch.tensor([2 + 1j, 2 - 1j, -1.5 + 0j, 0.5 + 0j])
    >>> r = rotation_stats(lam)
    >>> r.frac_complex, r.frac_negative, round(r.mean_abs_angle, 6)
    (0.5, 0.25, 0.463648)
    >>> top_k_by_modulus(lam, 1).shape[0]            # the k-th has its conjugate next: k + 1
    2

An eigenvalue counts as complex when |Im lambda| > COMPLEX_RTOL |lambda|; a real negative one is
a reflection (``frac_negative``), never a rotation. ``mean_abs_angle`` is the |lambda|-weighted
mean of |arg lambda| over the complex eigenvalues only (NaN when there is none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["COMPLEX_RTOL", "ZERO_RTOL", "RotationStats", "rotation_stats", "top_k_by_modulus"]

COMPLEX_RTOL = 1e-6  # an eigenvalue counts as complex when |Im| > COMPLEX_RTOL |lambda|
# an eigenvalue with |lambda| <= ZERO_RTOL max |lambda| is a numerical zero (e.g. the direction a
# LayerNorm removes): its sign and phase are rounding noise, so it is neither complex nor negative
ZERO_RTOL = 1e-10


@dataclass(frozen=True)
class RotationStats:
    """frac_complex, mean_abs_angle (radians) and frac_negative of a set of eigenvalues."""

    frac_complex: float
    mean_abs_angle: float
    frac_negative: float


def _is_complex(lam: Tensor) -> Tensor:
    return (lam.imag.abs() > COMPLEX_RTOL * lam.abs()) & ~_is_zero(lam)


def _is_zero(lam: Tensor) -> Tensor:
    a = lam.abs()
    return a <= ZERO_RTOL * a.max()


def rotation_stats(lam: Tensor) -> RotationStats:
    """Rotation statistics of the eigenvalues ``lam`` (complex or real tensor, any order).

    >>> rotation_stats(torch.tensor([1.0, -1.0])).mean_abs_angle     # no complex one: NaN
    nan
    """
    lam = torch.as_tensor(lam).to(torch.complex128).reshape(-1)
    if lam.numel() == 0:
        return RotationStats(float("nan"), float("nan"), float("nan"))
    cplx = _is_complex(lam)
    neg = ~cplx & ~_is_zero(lam) & (lam.real < 0)
    a = lam.abs()
    tot = float(a[cplx].sum())
    angle = float((a[cplx] * torch.angle(lam[cplx]).abs()).sum()) / tot if tot > 0 \
        else float("nan")
    n = lam.numel()
    return RotationStats(float(cplx.sum()) / n, angle, float(neg.sum()) / n)


def top_k_by_modulus(lam: Tensor, k: int) -> Tensor:
    """The k eigenvalues of largest modulus (descending), k + 1 when the k-th is complex and its
    conjugate is not among the first k (a pair is never split).

    >>> top_k_by_modulus(torch.tensor([3.0, 1j, -1j, 0.5]), 2).imag.tolist()
    [0.0, 1.0, -1.0]
    """
    lam = torch.as_tensor(lam).to(torch.complex128).reshape(-1)
    order = torch.argsort(lam.abs(), descending=True, stable=True)
    lam = lam[order]
    if k >= lam.numel():
        return lam
    head = lam[:k]
    last = head[-1]
    if bool(_is_complex(last.reshape(1))[0]):
        scale = max(float(last.abs()), 1e-300)
        paired = float((head[:-1] - last.conj()).abs().min()) <= 1e-6 * scale if k > 1 \
            else False
        if not paired:
            return lam[:k + 1]
    return head


def mc_error(values: Tensor) -> float:
    """Standard error of the mean of ``values`` (NaN for fewer than two)."""
    n = values.numel()
    return float(values.std(correction=1)) / math.sqrt(n) if n > 1 else float("nan")
