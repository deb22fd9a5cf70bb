"""The power-view row of one layer from its factors W_O, W_V, for logging while training.

    >>> W_O, W_V = torch.randn(2, 6, 3), torch.randn(2, 3, 6)       # [h, d, dk], [h, dk, d]
    >>> row = power_row_from_factors(W_O, W_V, None, None, layer=0)
    >>> sorted(row)[:3]
    ['abs_lambda1', 'abs_lambda2', 'abs_mu1']

The same values as :func:`spectral_hooks.metrics.power.power_table`'s row for F = sum_h W_O^h
W_V^h, computed one layer at a time (so a training callback can gather a sharded layer, use it
and drop it). Where heads share their W_V (grouped-query attention, merged: inner width
r = key/value heads x d_k) and r < d, r <= min(dense_limit, ``FACTORED_EXACT_MAX``), F is never
formed: every eigenvalue comes exactly from the r x r matrix W_V W_O
(:func:`spectral_hooks.linalg.lowrank_eig`; Llama-3-8B: r = 1024 at d = 4096), at any d.
Otherwise, up to ``dense_limit`` (default :data:`TRAINING_DENSE_LIMIT`) F is formed and fully
eigen-decomposed; above it F is never formed: its top ``top_k`` eigenpairs come from
:func:`spectral_hooks.linalg.eigs` on the operator x -> W_O (W_V x), two thin products per
matvec (2 d r multiply-adds; no d^3 to form F or to decompose it).

Why 1024 (measured here, 1 thread, float64, random-init F whose clustered top spectrum makes
Krylov need ~650-750 matvecs: the worst case for eigs): dense ``eig`` 0.06 s vs ``eigs`` 0.12 s
per layer at d = 384, 1.3-1.9 s vs 2.0 s at d = 768, 9.2 s vs 4.7 s at d = 1536. The dense cost
grows as d^3, the Krylov cost about as d: they cross near d = 1000.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from spectral_hooks.linalg import LinearOperator, LowRankOperator, merge_shared_factors
from spectral_hooks.metrics.power import POWER_COLUMNS, _alignment_columns, _reference_columns
from spectral_hooks.metrics.spectrum import (
    FACTORED_EXACT_MAX,
    TOP_K,
    LayerSpectrum,
    _check_iterate,
    _spectrum_one,
)

__all__ = ["TRAINING_DENSE_LIMIT", "factor_operator", "factor_spectrum",
           "power_row_from_factors"]

#: Largest d at which the training path eigen-decomposes F densely (see the module docstring).
TRAINING_DENSE_LIMIT = 1024


def _flat(W_O: Tensor, W_V: Tensor, gain: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """[d, r] and [r, d] float64, r = h dk or, where heads share their W_V (grouped-query
    attention), (distinct W_V) x dk (the norm gain folded into the columns of W_V)."""
    if W_O.ndim != 3 or W_V.ndim != 3 or W_O.shape[0] != W_V.shape[0] \
            or W_O.shape[2] != W_V.shape[1] or W_O.shape[1] != W_V.shape[2]:
        raise ValueError("need W_O [h, d, dk] and W_V [h, dk, d]; got "
                         f"{tuple(W_O.shape)} and {tuple(W_V.shape)}")
    O, V = merge_shared_factors(*(W.detach().to("cpu", torch.float64) for W in (W_O, W_V)))
    if gain is not None:
        V = V * gain.detach().to("cpu", torch.float64)[None, :]
    return O, V


def factor_operator(W_O: Tensor, W_V: Tensor, *, gain: Optional[Tensor] = None,
                    shift: float = 0.0) -> LinearOperator:
    """x -> (shift I + W_O W_V diag(gain)) x as a LinearOperator (float64, CPU), F never formed."""
    O, V = _flat(W_O, W_V, gain)
    d = O.shape[0]

    def matmat(X: Tensor) -> Tensor:
        Y = O @ (V @ X)
        return Y + shift * X if shift else Y

    return LinearOperator((d, d), matvec=lambda x: matmat(x[:, None])[:, 0], matmat=matmat,
                          dtype=torch.float64, device="cpu", name="W_O W_V")


def factor_spectrum(W_O: Tensor, W_V: Tensor, *, gain: Optional[Tensor] = None,
                    iterate: str = "F", real_tol: float = 1e-9,
                    dense_limit: int = TRAINING_DENSE_LIMIT, top_k: int = TOP_K,
                    layer: Optional[int] = None, vectors: bool = True) -> LayerSpectrum:
    """:class:`LayerSpectrum` of F = sum_h W_O^h W_V^h (diag(gain) on the right): dense up to
    ``dense_limit``, except that where the factors' inner width r (grouped-query heads merged)
    is below d and at most min(dense_limit, ``FACTORED_EXACT_MAX``) F is never formed and every
    eigenvalue comes exactly from the r x r matrix W_V W_O; above it, else the top max(top_k, 3)
    eigenpairs by ``eigs`` on the thin products (``truncated=True``; ``converged=False`` when
    the solver did not converge). ``vectors=False``: only B and B2 are needed, so
    ``eigenvectors`` may be partial (the zero eigenvalues' null-space basis is skipped)."""
    _check_iterate(iterate)
    O, V = _flat(W_O, W_V, gain)
    d, r = O.shape
    k = max(int(top_k), 3)
    factored = r < d and r <= min(FACTORED_EXACT_MAX, dense_limit)
    if not factored and (d <= dense_limit or k > d - 2):
        return _spectrum_one(O @ V, iterate, real_tol, dense_limit=d, top_k=top_k, layer=layer)
    # the same paths, solver and tolerance as the report's matrix-free F
    return _spectrum_one(LowRankOperator(O, V, name="W_O W_V"), iterate, real_tol,
                         dense_limit=dense_limit, top_k=top_k, layer=layer, vectors=vectors)


def power_row_from_factors(W_O: Tensor, W_V: Tensor, resid_pre: Optional[Tensor],
                           resid_post: Optional[Tensor], *, layer: int,
                           gain: Optional[Tensor] = None, iterate: str = "F",
                           dense_limit: int = TRAINING_DENSE_LIMIT,
                           top_k: int = TOP_K) -> dict[str, Any]:
    """One row of ``power_table`` (every column of ``POWER_COLUMNS``) for one layer, from its
    factors and its real tokens [N, d] entering / leaving it (either may be None: NaN columns)."""
    s = factor_spectrum(W_O, W_V, gain=gain, iterate=iterate, dense_limit=dense_limit,
                        top_k=top_k, layer=layer, vectors=False)
    d = W_O.shape[1]
    pre, post = (None if X is None else X.detach().to("cpu", torch.float64)
                 for X in (resid_pre, resid_post))
    row = {
        "layer": layer, "iterate": iterate, "lambda1_real": s.lambda1.real,
        "lambda1_imag": s.lambda1.imag, "abs_lambda1": abs(s.lambda1),
        "abs_lambda2": abs(s.lambda2), "abs_mu1": abs(s.mu1), "abs_mu2": abs(s.mu2),
        "gap_ratio": s.gap_ratio, "gap_diff": abs(s.mu1) - abs(s.mu2),
        "lambda1_is_complex": s.lambda1_is_complex,
        **_alignment_columns(s, pre, post, d), **_reference_columns(s.B, None, -1, None, None, d),
        "truncated": s.truncated,
        "n_computed": s.n_computed, "converged": s.converged,
    }
    return {c: row[c] for c in POWER_COLUMNS}
