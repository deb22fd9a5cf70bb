"""Krylov-Schur restarts and the explicit residual check of :func:`~.krylov.eigs` (internal).

See the module doc of :mod:`spectral_hooks.linalg.krylov` for the method these steps implement.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import torch
from torch import Tensor

from ._batch import OpBatch

logger = logging.getLogger("spectral_hooks.linalg.krylov")
_KEEP = 0.5  # share of the unconverged part of the space kept at a restart (tuned: 0.3-0.85)


def _real_basis(Y: Tensor, theta: Tensor) -> Tensor:
    """Real columns spanning the (conjugation-closed) span of complex eigenvectors Y."""
    cols = []
    for j in range(Y.shape[1]):
        if theta[j].imag == 0:
            cols.append(Y[:, j].real)
        elif theta[j].imag > 0:
            cols += [Y[:, j].real, Y[:, j].imag]
    return torch.stack(cols, dim=1)


def restart(b: int, st: dict, V: Tensor, Hb: Tensor, p: List[int], m: int, bs: int,
             real: bool, keep: Optional[int] = None) -> None:
    """Krylov-Schur restart of member b onto the invariant subspace of the kept Ritz values
    (the residual block, vectors m .. m + bs - 1, moves to keep .. keep + bs - 1)."""
    theta, Y, nconv, kw = st["theta"], st["Y"], st["nconv"], st["kw"]
    if keep is None:
        keep = max(kw, nconv + max(1, int((m - nconv) * _KEEP)))
        keep = min(keep, m - 1)
    if real and theta[keep - 1].imag > 0:  # never split a conjugate pair
        keep = keep + 1 if keep + 1 <= m - 1 else keep - 1
    X = _real_basis(Y[:, :keep], theta[:keep]) if real else Y[:, :keep]
    W = torch.linalg.qr(X.to(V.dtype)).Q
    H, R = Hb[b, :m, :m].clone(), Hb[b, m:, :m].clone()
    S = W.mH @ H @ W
    if logger.isEnabledFor(logging.DEBUG):
        err = torch.linalg.matrix_norm(H @ W - W @ S) / torch.linalg.matrix_norm(H)
        logger.debug("eigs restart: keep %d of %d, invariance error %.1e", keep, m, float(err))
    residual = V[b, :, m:].clone()
    V[b, :, :keep] = V[b, :, :m] @ W
    V[b, :, keep:keep + bs] = residual
    V[b, :, keep + bs:] = 0
    Hb[b] = 0
    Hb[b, :keep, :keep] = S
    Hb[b, keep:keep + bs, :keep] = R @ W
    p[b] = keep


def inject(b: int, V: Tensor, Hb: Tensor, kw: int, bs: int, randn) -> None:
    """Replace the residual vector (block) of member b's kept Krylov-Schur basis by random
    orthonormal vectors orthogonal to it, and drop the coupling rows (its norm is the converged Ritz pairs'
    residual, <= tol |theta|). The next Arnoldi steps then build a Krylov space of the deflated
    operator (I - QQ^H) A (I - QQ^H) from a fresh start, re-orthogonalised against Q."""
    Q = V[b, :, :kw]
    r = randn(V.shape[1], bs)
    for _ in range(2):
        r = r - Q @ (Q.mH @ r)
    V[b, :, kw:kw + bs] = torch.linalg.qr(r).Q
    Hb[b, kw:kw + bs, :kw] = 0


def same_set(st: dict, previous: Optional[Tensor], tol: float) -> bool:
    """The checked wanted values equal a previously checked set (conjugate-invariant)."""
    if previous is None or previous.shape[0] != st["kw"]:
        return False
    theta = st["theta"][:st["kw"]]
    cand = torch.cat([previous, previous.conj()])
    dist = (theta[:, None] - cand[None, :]).abs().min(dim=1).values
    return bool((dist <= min(1e3 * tol, 1e-3) * theta.abs()).all())


def final_check(batch: OpBatch, V: Tensor, members: List[int], out: List[dict], m: int,
                 real: bool) -> None:
    """Residuals ||A x - theta x|| / |theta| of the wanted Ritz pairs, with fresh matvecs."""
    B, n = batch.B, batch.shape[0]
    cols = {}
    for b in members:
        st = out[b]
        theta, Y = st["theta"][:st["kw"]], st["Y"][:, :st["kw"]]
        x = V[b, :, :m].to(Y.dtype) @ Y
        x = x / torch.linalg.vector_norm(x, dim=0, keepdim=True)
        st["x"] = x
        if real:  # conjugate pairs share a matvec pair: A Re x, A Im x
            cols[b] = _real_basis(x, theta)
        else:
            cols[b] = x
    c = max(X.shape[1] for X in cols.values())
    X = torch.zeros(B, n, c, dtype=V.dtype, device=V.device)
    for b, Xb in cols.items():
        X[b, :, :Xb.shape[1]] = Xb
    AX = batch.apply(X, [b in cols for b in range(B)])
    for b in members:
        st = out[b]
        theta, x = st["theta"][:st["kw"]], st["x"]
        if real:
            Ax, j = [], 0
            for t in theta.tolist():
                if t.imag == 0:
                    Ax.append(AX[b, :, j].to(x.dtype))
                    j += 1
                elif t.imag > 0:
                    z = torch.complex(AX[b, :, j], AX[b, :, j + 1])
                    Ax += [z, z.conj()]
                    j += 2
            Ax = torch.stack(Ax, dim=1)
        else:
            Ax = AX[b, :, :x.shape[1]]
        r = torch.linalg.vector_norm(Ax - x * theta, dim=0)
        st["resid"] = r / theta.abs().clamp(min=1e-300)
