"""Stochastic (Hutchinson-type) estimators that need only products with the operator.

Example::

    >>> import torch
    >>> A = torch.randn(100, 100, dtype=torch.float64)
    >>> est = hutchinson_trace(A, n_samples=2000, seed=0)
    >>> abs(est.value - float(A.trace())) < 5 * est.std_error
    True

``op`` is a square LinearOperator or a dense tensor [..., n, n] (then values are tensors
over the batch dimensions). Probes are drawn on the CPU from ``torch.Generator(seed)`` and
moved to the operator's device, so results do not depend on the device. All probes are
applied at once with ``matmat`` (chunked when ``chunk`` columns are exceeded). Each function
returns an :class:`Estimate` (value, standard error of the mean, matvecs used). The sums run
in float64 (complex128), a dense tensor is read in float64, and a LinearOperator is applied
in its own dtype: ``std_error`` is the sampling error, and a float32 operator's own rounding
(~1e-7 of its scale) is not in it.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..errors import OptionError
from .operators import LinearOperator
from .results import Estimate

__all__ = ["hutchinson_trace", "hutchpp_trace", "frobenius_sq", "trace_of_square", "diagonal",
           "column_norms_sq"]


class _Op:
    def __init__(self, op, what: str, *, square: bool = True) -> None:
        if isinstance(op, LinearOperator):
            self.op, self.dense = op, None
            self.shape, self.batch, self.device = op.shape, (), op.device
            self.dtype = torch.complex128 if op.dtype.is_complex else torch.float64
        elif isinstance(op, Tensor) and op.ndim >= 2:
            if not (op.is_floating_point() or op.is_complex()):
                raise TypeError(f"{what}: dense operator must be floating, got {op.dtype}")
            self.dtype = torch.complex128 if op.is_complex() else torch.float64
            # a dense tensor in float64: its estimate then carries no rounding of its own
            self.op, self.dense = None, op.detach().to(self.dtype)
            self.shape, self.batch = tuple(op.shape[-2:]), tuple(op.shape[:-2])
            self.device = op.device
        else:
            raise TypeError(f"{what}: expected a LinearOperator or a tensor [..., n, n], got "
                            f"{type(op).__name__}" + (f" of shape {tuple(op.shape)}"
                                                      if isinstance(op, Tensor) else ""))
        if square and self.shape[0] != self.shape[1]:
            raise ValueError(f"{what}: needs a square operator, got shape {self.shape}")
        self.what = what

    def mm(self, X: Tensor) -> Tensor:
        if self.dense is not None:
            Y = self.dense @ X
        else:  # the operator in its own dtype, the sums in float64
            Y = self.op.matmat(X.to(self.op.dtype)).to(self.dtype)  # pyright: ignore[reportOptionalMemberAccess]
        if not bool(torch.isfinite(Y).all()):
            raise FloatingPointError(f"{self.what}: operator returned NaN or Inf")
        return Y

    def rmm(self, Y: Tensor) -> Tensor:
        if self.dense is not None:
            return self.dense.mH @ Y
        return self.op.rmatmat(Y.to(self.op.dtype)).to(self.dtype)  # pyright: ignore[reportOptionalMemberAccess]


def _probes(n: int, s: int, seed: int, dist: str, dtype, device) -> Tensor:
    g = torch.Generator().manual_seed(int(seed))
    if dist == "rademacher":
        Z = torch.randint(0, 2, (n, s), generator=g).to(torch.float64) * 2 - 1
    elif dist == "gaussian":
        Z = torch.randn(n, s, generator=g, dtype=torch.float64)
    else:
        raise OptionError("distribution", dist, "'rademacher' or 'gaussian'")
    return Z.to(device=device, dtype=dtype if dtype.is_floating_point or dtype.is_complex
                else torch.float64)


def _check_n(n_samples: int, what: str, minimum: int = 1) -> None:
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < minimum:
        raise OptionError("n_samples", n_samples, f"an int >= {minimum}", hint=what)


def _mean(samples: Tensor, n_matvecs: int) -> Estimate:
    """Mean and standard error over the last dimension (samples)."""
    s = samples.shape[-1]
    # each row at an exact power-of-two scale near 1: the deviations' squares (and the sum) can
    # neither underflow nor overflow (at 1e-300 the std error read 0, at 1e150 inf)
    peak = samples.abs().amax(-1, keepdim=True)
    usable = torch.isfinite(peak) & (peak > 0)
    scale = torch.where(usable, torch.exp2(torch.floor(torch.log2(peak.clamp(min=1e-300)))),
                        torch.ones_like(peak))
    x = samples / scale
    scale = scale.squeeze(-1)
    val = x.mean(-1) * scale
    se = (x.std(-1, correction=1) / s ** 0.5 * scale if s > 1
          else torch.full(val.shape, float("nan"), dtype=scale.dtype, device=val.device))
    if val.ndim == 0:
        return Estimate(val.item(), se.item(), n_matvecs)
    return Estimate(val, se, n_matvecs)


def _scalar_est(op: LinearOperator | Tensor, n_samples: int, seed: int, dist: str, what: str,
                f: Callable[[_Op, Tensor], Tensor], per_sample: int) -> Estimate:
    _check_n(n_samples, what, 1)
    A = _Op(op, what)
    Z = _probes(A.shape[1], n_samples, seed, dist, A.dtype, A.device)
    return _mean(f(A, Z), per_sample * n_samples)


def hutchinson_trace(op: LinearOperator | Tensor, *, n_samples: int, seed: int = 0,
                     distribution: str = "rademacher") -> Estimate:
    """tr(A) ~ mean of z^T A z (Hutchinson 1989); n_samples matvecs."""
    return _scalar_est(op, n_samples, seed, distribution, "hutchinson_trace",
                       lambda A, Z: (Z.conj() * A.mm(Z)).sum(-2), 1)


def frobenius_sq(op: LinearOperator | Tensor, *, n_samples: int, seed: int = 0) -> Estimate:
    """||A||_F^2 ~ mean of ||A z||^2, Rademacher z; n_samples matvecs (A may be m x n)."""
    _check_n(n_samples, "frobenius_sq")
    A = _Op(op, "frobenius_sq", square=False)
    Z = _probes(A.shape[1], n_samples, seed, "rademacher", A.dtype, A.device)
    return _mean(A.mm(Z).abs().pow(2).sum(-2), n_samples)


def trace_of_square(op: LinearOperator | Tensor, *, n_samples: int, seed: int = 0) -> Estimate:
    """tr(A A) ~ mean of z^T A (A z), Rademacher z; 2 matvecs per sample, no adjoint."""
    return _scalar_est(op, n_samples, seed, "rademacher", "trace_of_square",
                       lambda A, Z: (Z.conj() * A.mm(A.mm(Z))).sum(-2), 2)


def diagonal(op: LinearOperator | Tensor, *, n_samples: int, seed: int = 0) -> Estimate:
    """diag(A) ~ mean of z * (A z), Rademacher z (Bekas et al. 2007); n_samples matvecs."""
    _check_n(n_samples, "diagonal")
    A = _Op(op, "diagonal")
    Z = _probes(A.shape[1], n_samples, seed, "rademacher", A.dtype, A.device)
    return _mean(Z.conj() * A.mm(Z), n_samples)


def column_norms_sq(op: LinearOperator | Tensor, *, n_samples: int, seed: int = 0) -> Estimate:
    """diag(A^H A) = squared column norms ~ mean of z * A^H (A z); 2 products per sample."""
    _check_n(n_samples, "column_norms_sq")
    A = _Op(op, "column_norms_sq", square=False)
    if A.op is not None:
        A.op._need_adjoint()
    Z = _probes(A.shape[1], n_samples, seed, "rademacher", A.dtype, A.device)
    return _mean((Z.conj() * A.rmm(A.mm(Z))).real, 2 * n_samples)


def hutchpp_trace(op: LinearOperator | Tensor, *, n_matvecs: int, seed: int = 0) -> Estimate:
    """Hutch++ (Meyer, Musco, Musco, Woodruff 2021): tr(A) with n_matvecs products.

    A third of the budget sketches S, Q = orth(A S) captures the top of the spectrum exactly
    (tr(Q^T A Q)); the last third runs Hutchinson on (I - QQ^T) A (I - QQ^T). std_error is
    that of the Hutchinson part.
    """
    if isinstance(n_matvecs, bool) or not isinstance(n_matvecs, int) or n_matvecs < 3:
        raise OptionError("n_matvecs", n_matvecs, "an int >= 3", hint="hutchpp_trace")
    A = _Op(op, "hutchpp_trace")
    n = A.shape[1]
    m = min(n_matvecs // 3, n)
    g = n_matvecs - 2 * m
    S = _probes(n, m, seed, "rademacher", A.dtype, A.device)
    Q = torch.linalg.qr(A.mm(S)).Q
    top = (Q.conj() * A.mm(Q)).sum((-2, -1))
    G = _probes(n, g, seed + 1, "rademacher", A.dtype, A.device)
    G = G - Q @ (Q.mH @ G)
    rest = (G.conj() * A.mm(G)).sum(-2)
    est = _mean(rest, n_matvecs)
    if isinstance(est.value, float):
        return Estimate(float(top.real if top.is_complex() else top) + est.value,
                        est.std_error, n_matvecs)
    return Estimate(top + est.value, est.std_error, n_matvecs)
