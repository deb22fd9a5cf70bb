"""Top-k singular triplets: Lanczos bidiagonalisation with thick restarts, or randomized SVD.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import svds
    >>> A = torch.randn(300, 200, dtype=torch.float64)
    >>> res = svds(A, 5)
    >>> torch.allclose(res.S, torch.linalg.svdvals(A)[:5])
    True

``method="lanczos"`` (default): Golub-Kahan-Lanczos bidiagonalisation with full
re-orthogonalisation (two classical Gram-Schmidt passes) and thick restarts (Baglama &
Reichel 2005): after ``ncv`` steps the top ``(ncv + k) // 2`` Ritz triplets are kept and the
bidiagonalisation continues from the residual. A triplet has converged when
||A^H u - s v|| = beta |p_m| <= tol * s_1 (A v = s u holds exactly in the decomposition).
``method="randomized"``: Halko, Martinsson & Tropp (2011) range finder with ``n_iter`` power
iterations and ``n_oversamples`` extra columns; ``converged`` then reports whether the explicit
residuals ||A v - s u|| (k extra matvecs) are <= tol * s_1 — with the default tol it usually
is not, and that is logged at INFO level only, as randomized SVD is approximate by design
(an unconverged Lanczos run emits a :class:`~spectral_hooks.errors.ConvergenceWarning`).
Both work in float64 / complex128 and need the adjoint (``rmatvec``/``rmatmat``).
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import ConvergenceWarning, OptionError
from ._batch import OpBatch
from .results import SvdResult

if TYPE_CHECKING:
    from .operators import LinearOperator

__all__ = ["svds"]

logger: logging.Logger = logging.getLogger(__name__)
METHODS = ("lanczos", "randomized")


def _orth(Q: Tensor, w: Tensor):
    """Two passes of classical Gram-Schmidt of w [B, n] against columns of Q [B, n, j]."""
    if Q.shape[-1] == 0:
        return w, torch.zeros(w.shape[0], 0, dtype=w.dtype, device=w.device)
    c = (Q.mH @ w.unsqueeze(2)).squeeze(2)
    w = w - (Q @ c.unsqueeze(2)).squeeze(2)
    c2 = (Q.mH @ w.unsqueeze(2)).squeeze(2)
    return w - (Q @ c2.unsqueeze(2)).squeeze(2), c + c2


def _normalize(w: Tensor, Q: Tensor, ref: Tensor, gen, full: bool):
    """w / ||w||, or a random unit vector orthogonal to Q where w broke down (norm 0 then)."""
    nrm = torch.linalg.vector_norm(w, dim=1)
    broke = nrm <= 1e-13 * ref.clamp(min=1e-300)
    if bool(broke.any()):
        if full:  # no room for another orthogonal direction
            r = torch.zeros_like(w)
        else:
            r = torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w.device, w.dtype)
            r, _ = _orth(Q, r)
            r, _ = _orth(Q, r)
            r = r / torch.linalg.vector_norm(r, dim=1, keepdim=True)
        w = torch.where(broke.unsqueeze(1), r, w / nrm.clamp(min=1e-300).unsqueeze(1))
        nrm = torch.where(broke, torch.zeros_like(nrm), nrm)
    else:
        w = w / nrm.unsqueeze(1)
    return w, nrm


def svds(op: LinearOperator | Sequence[LinearOperator] | Tensor, k: int, *,
         method: str = "lanczos", n_oversamples: int = 10, n_iter: int = 4,
         tol: float = 1e-10, ncv: Optional[int] = None, max_restarts: int = 500, seed: int = 0,
         return_vectors: bool = True) -> SvdResult:
    """Top-k singular triplets of an m x n operator (or a batch [..., m, n] / list).

    Example::

        >>> res = svds(torch.randn(3, 80, 60, dtype=torch.float64), 4, method="randomized")
        >>> res.S.shape, res.U.shape, res.Vh.shape
        (torch.Size([3, 4]), torch.Size([3, 80, 4]), torch.Size([3, 4, 60]))
    """
    batch = OpBatch(op, what="svds")
    batch.need_adjoint()
    mr, n = batch.shape
    check_int("k", k)
    check_int("seed", seed)
    check_int("n_iter", n_iter, minimum=0)
    check_int("n_oversamples", n_oversamples, minimum=0)
    if not (1 <= k <= min(mr, n)):
        raise OptionError("k", k, f"an int with 1 <= k <= min(m, n) = {min(mr, n)}")
    if method not in METHODS:
        raise OptionError("method", method, f"one of {METHODS}")
    if not (tol > 0):
        raise OptionError("tol", tol, "a float > 0")
    gen = torch.Generator().manual_seed(int(seed))
    if method == "randomized":
        U, S, V, conv = _randomized(batch, k, n_oversamples, n_iter, tol, gen)
    else:
        U, S, V, conv = _lanczos(batch, k, ncv, max_restarts, tol, gen)
    bs = batch.batch_shape
    return SvdResult(
        U=U.reshape(*bs, mr, k) if return_vectors else None,
        S=S.reshape(*bs, k),
        Vh=V.mH.reshape(*bs, k, n) if return_vectors else None,
        n_matvecs=max(batch.counts),
        converged=conv.reshape(bs),
    )


def _randomized(batch: OpBatch, k: int, p: int, n_iter: int, tol: float, gen):
    for option, value in (("n_oversamples", p), ("n_iter", n_iter)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OptionError(option, value, "an int >= 0")
    B, (mr, n), dt, dev = batch.B, batch.shape, batch.wdtype, batch.device
    ell = min(k + p, mr, n)
    mask = [True] * B
    Om = torch.randn(B, n, ell, generator=gen, dtype=torch.float64).to(dev, dt)
    Q = torch.linalg.qr(batch.apply(Om, mask)).Q
    for _ in range(n_iter):
        Z = torch.linalg.qr(batch.apply(Q, mask, adjoint=True)).Q
        Q = torch.linalg.qr(batch.apply(Z, mask)).Q
    Bt = batch.apply(Q, mask, adjoint=True)  # A^H Q = (Q^H A)^H, [B, n, ell]
    Ub, S, Vh = torch.linalg.svd(Bt.mH, full_matrices=False)
    U, S, V = Q @ Ub[:, :, :k], S[:, :k], Vh[:, :k, :].mH
    AV = batch.apply(V, mask)
    res = torch.linalg.vector_norm(AV - U * S.unsqueeze(1), dim=1)
    conv = (res <= tol * S[:, :1].clamp(min=1e-300)).all(dim=1)
    if not bool(conv.all()):
        logger.info("svds(randomized): max residual %.2e > tol * s_1", float(
            (res / S[:, :1].clamp(min=1e-300)).max()))
    return U, S, V, conv


def _lanczos(batch: OpBatch, k: int, ncv: Optional[int], max_restarts: int, tol: float, gen):
    B, (mr, n), dt, dev = batch.B, batch.shape, batch.wdtype, batch.device
    dmin = min(mr, n)
    m = min(dmin, max(2 * k + 1, 20)) if ncv is None else int(ncv)
    if not (k <= m <= dmin):
        raise OptionError("ncv", ncv, f"an int with k = {k} <= ncv <= min(m, n) = {dmin}")
    mask = [True] * B
    V = torch.zeros(B, n, m + 1, dtype=dt, device=dev)
    U = torch.zeros(B, mr, m, dtype=dt, device=dev)
    Bm = torch.zeros(B, m, m, dtype=dt, device=dev)
    v = torch.randn(B, n, generator=gen, dtype=torch.float64).to(dev, dt)
    V[:, :, 0] = v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
    p, restarts = 0, 0
    while True:
        for j in range(p, m):
            w = batch.apply(V[:, :, j:j + 1], mask)[:, :, 0]
            ref = torch.linalg.vector_norm(w, dim=1)
            w, c = _orth(U[:, :, :j], w)
            w, alpha = _normalize(w, U[:, :, :j], ref, gen, full=j >= mr)
            U[:, :, j] = w
            Bm[:, :j, j] = c
            Bm[:, j, j] = alpha.to(dt)
            r = batch.apply(U[:, :, j:j + 1], mask, adjoint=True)[:, :, 0]
            ref = torch.linalg.vector_norm(r, dim=1)
            r, _ = _orth(V[:, :, :j + 1], r)
            r, beta = _normalize(r, V[:, :, :j + 1], ref, gen, full=j + 1 >= n)
            V[:, :, j + 1] = r
        P, S, Qh = torch.linalg.svd(Bm)
        res = (beta.unsqueeze(1) * P[:, m - 1, :].abs())[:, :k]
        conv = (res <= tol * S[:, :1].clamp(min=1e-300)).all(dim=1)
        if bool(conv.all()) or restarts >= max_restarts or m == dmin:
            break
        p = min(m - 1, k + (m - k) // 2)
        Q = Qh.mH
        V[:, :, :p] = V[:, :, :m] @ Q[:, :, :p]
        V[:, :, p] = V[:, :, m]
        U[:, :, :p] = U @ P[:, :, :p]
        Bm.zero_()
        Bm[:, torch.arange(p), torch.arange(p)] = S[:, :p].to(dt)
        restarts += 1
    if not bool(conv.all()):
        message = (f"svds(lanczos) did not converge after max_restarts={max_restarts}: max "
                   f"residual {float((res / S[:, :1].clamp(min=1e-300)).max()):.2e} > "
                   f"tol={tol:g} (relative to s_1)")
        logger.warning("%s", message)
        warnings.warn(message, ConvergenceWarning, stacklevel=3)
    Uk = U @ P[:, :, :k]
    Vk = V[:, :, :m] @ Qh.mH[:, :, :k]
    return Uk, S[:, :k], Vk, conv
