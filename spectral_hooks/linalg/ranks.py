"""Effective ranks of a spectrum of singular values (METRICS.md section 4).

Example::

    >>> import torch
    >>> s = torch.tensor([1.0, 1.0, 1.0, 1.0])
    >>> float(effective_rank(s)), float(participation_ratio(s)), float(stable_rank(s))
    (4.0, 4.0, 4.0)

Inputs are singular values (any order) along the last dimension, 1-D or batched. An all-zero
spectrum has rank 0 by convention (every function returns 0 for it). Negative or NaN values
raise ValueError. From a truncated spectrum these are the ranks of that truncation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from ..errors import OptionTypeError

__all__ = ["effective_rank", "participation_ratio", "stable_rank", "surviving"]

if TYPE_CHECKING:
    import numpy as np


def _check(s: Tensor | Sequence[float] | np.ndarray, name: str) -> Tensor:
    if not isinstance(s, Tensor):
        try:
            s = torch.as_tensor(s, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise OptionTypeError("s", s, f"{name}: singular values (a tensor, list or "
                                  "array of numbers)") from None
    if s.ndim < 1 or s.shape[-1] == 0:
        raise ValueError(f"{name}: need singular values along a non-empty last dimension, "
                         f"got shape {tuple(s.shape)}")
    if s.is_complex() or not s.is_floating_point():
        s = s.abs().to(torch.float64) if s.is_complex() else s.to(torch.float64)
    if bool(torch.isnan(s).any()):
        raise ValueError(f"{name}: singular values contain NaN")
    if bool((s < 0).any()):
        raise ValueError(f"{name}: singular values must be >= 0, got min {float(s.min()):g}")
    return s


def effective_rank(s: Tensor | Sequence[float] | np.ndarray) -> Tensor:
    """Roy-Vetterli effective rank exp(-sum p log p), p = s / sum s (0 log 0 = 0)."""
    s = _check(s, "effective_rank")
    tot = s.sum(-1, keepdim=True)
    p = s / torch.where(tot > 0, tot, torch.ones_like(tot))
    ent = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))),
                       torch.zeros_like(p)).sum(-1)
    return torch.where(tot[..., 0] > 0, torch.exp(ent), torch.zeros_like(ent))


def participation_ratio(s: Tensor | Sequence[float] | np.ndarray) -> Tensor:
    """(sum s^2)^2 / sum s^4."""
    s = _check(s, "participation_ratio")
    s = s / s.amax(-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)  # scale-free
    s2, s4 = (s ** 2).sum(-1), (s ** 4).sum(-1)
    return torch.where(s4 > 0, s2 ** 2 / torch.where(s4 > 0, s4, torch.ones_like(s4)),
                       torch.zeros_like(s4))


def stable_rank(s: Tensor | Sequence[float] | np.ndarray) -> Tensor:
    """sum s^2 / max(s)^2."""
    s = _check(s, "stable_rank")
    mx = s.amax(-1)
    r = (s ** 2).sum(-1) / torch.where(mx > 0, mx, torch.ones_like(mx)) ** 2
    return torch.where(mx > 0, r, torch.zeros_like(r))


def surviving(s: Tensor | Sequence[float] | np.ndarray, tau: float = 1e-2) -> Tensor:
    """Number of directions with s_i >= tau * max(s) (an integer tensor; 0 if all zero)."""
    if not (0 < tau <= 1):
        raise ValueError(f"surviving: tau must be in (0, 1], got {tau}")
    s = _check(s, "surviving")
    mx = s.amax(-1, keepdim=True)
    return ((s >= tau * mx) & (mx > 0)).sum(-1)
