"""Frozen result records returned by the linalg routines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from torch import Tensor

__all__ = ["EigResult", "SvdResult", "Estimate"]

#: one operator's state inside :func:`~spectral_hooks.linalg.eigs` (internal): its sorted Ritz
#: values "theta" and vectors "Y", the wanted count "kw", "nconv", "gap_ok", the space size "m",
#: ||A|| bounded below ("scale"); after a check the unit vectors "x" and fresh residuals "resid"
EigState = Dict[str, Any]


@dataclass(frozen=True)
class EigResult:
    """Top-k eigenpairs from :func:`eigs`.

    values:    complex [..., k'] sorted by descending modulus (or by the ``which`` key),
               conjugate pairs adjacent with the positive imaginary part first;
               k' = k, or k + 1 when the k-th and (k+1)-th are a conjugate pair. In a batch,
               rows with fewer values are padded with NaN.
    vectors:   complex [..., n, k'] unit-norm eigenvectors (NaN-padded), or None.
    residuals: real [..., k'], ||A v - lambda v|| / |lambda| computed with fresh matvecs
               (for an exact zero, |lambda| <= 1e-12 ||A||, returned as 0: ||A v|| / ||A||).
    converged: bool [...] per operator: every residual <= tol, the k-th value separated from
               the next Ritz value, and the restart budget not exhausted.
    n_matvecs: applications of the operator (max over the batch), final check included.
    """

    values: Tensor
    vectors: Optional[Tensor]
    residuals: Tensor
    converged: Tensor
    n_matvecs: int


@dataclass(frozen=True)
class SvdResult:
    """Top-k singular triplets from :func:`svds`: A ~ U diag(S) Vh.

    U: [..., m, k], S: real [..., k] descending, Vh: [..., k, n] (U and Vh None when
    ``return_vectors=False``); converged: bool [...] (every ||A^H u - s v|| and ||A v - s u||
    <= tol * s_1); n_matvecs counts A and A^H applications (max over the batch).
    """

    U: Optional[Tensor]
    S: Tensor
    Vh: Optional[Tensor]
    n_matvecs: int
    converged: Tensor


@dataclass(frozen=True)
class Estimate:
    """A stochastic estimate: ``value`` +- ``std_error`` (one standard error of the mean)."""

    value: Union[float, Tensor]
    std_error: Union[float, Tensor]
    n_matvecs: int
