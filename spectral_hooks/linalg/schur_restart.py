"""Krylov-Schur restarts and the explicit residual check of :func:`~.krylov.eigs` (internal).

See the module doc of :mod:`spectral_hooks.linalg.krylov` for the method these steps implement.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Mapping, Optional

import torch
from torch import Tensor

from .batch import OpBatch
from .results import EigState

logger: logging.Logger = logging.getLogger(__name__)
_KEEP = 0.5  # share of the unconverged part of the space kept at a restart (tuned: 0.3-0.85)
ZETA = 1e-12  # |theta| <= ZETA ||A||: an exact zero (rounding allows no relative accuracy)


def _real_basis(Y: Tensor, theta: Tensor, imag: Optional[list] = None) -> Tensor:
    """Real columns spanning the (conjugation-closed) span of complex eigenvectors Y
    (``imag``: theta.imag as a host list, when the caller has read it already)."""
    if imag is None:
        imag = theta.imag.tolist()  # one host sync, not one per column
    s = Y.shape[1]
    cols = []  # Re y_j for a real value or the first of a pair, then Im y_j for the latter
    for j, t in enumerate(imag):
        if t >= 0:
            cols.append(j)
        if t > 0:
            cols.append(s + j)
    return torch.cat([Y.real, Y.imag], dim=1)[:, cols]


def restart(b: int, st: EigState, V: Tensor, Hb: Tensor, m: int, bs: int, real: bool,
            keep: Optional[int] = None) -> int:
    """Krylov-Schur restart of member b onto the invariant subspace of the kept Ritz values
    (the residual block, vectors m .. m + bs - 1, moves to keep .. keep + bs - 1); returns
    the kept size (the member's columns now multiplied)."""
    theta, Y, nconv, kw = st["theta"], st["Y"], st["nconv"], st["kw"]
    if keep is None:
        keep = max(kw, nconv + max(1, int((m - nconv) * _KEEP)))
        keep = min(keep, m - 1)  # pyright: ignore[reportArgumentType]
    imag = st.get("imag")  # read by ritz() with its other numbers: no sync here
    if imag is None:
        imag = theta.imag.tolist()
    if real and imag[keep - 1] > 0:  # never split a conjugate pair
        keep = keep + 1 if keep + 1 <= m - 1 else keep - 1
    X = _real_basis(Y[:, :keep], theta[:keep], imag[:keep]) if real else Y[:, :keep]
    W = torch.linalg.qr(X.to(V.dtype)).Q
    H, R = Hb[b, :m, :m].clone(), Hb[b, m:m + bs, :m].clone()
    S = W.mH @ H @ W
    if logger.isEnabledFor(logging.DEBUG):
        err = torch.linalg.matrix_norm(H @ W - W @ S) / torch.linalg.matrix_norm(H)
        logger.debug("eigs restart: keep %d of %d, invariance error %.1e", keep, m, float(err))
    residual = V[b, :, m:m + bs].clone()
    V[b, :, :keep] = V[b, :, :m] @ W
    V[b, :, keep:keep + bs] = residual
    V[b, :, keep + bs:] = 0
    Hb[b] = 0
    Hb[b, :keep, :keep] = S
    Hb[b, keep:keep + bs, :keep] = R @ W
    return keep


def inject(b: int, V: Tensor, Hb: Tensor, kw: int, bs: int,
           randn: Callable[..., Tensor]) -> None:
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


def same_set(st: EigState, previous: Optional[Tensor], tol: float) -> bool:
    """The checked wanted values equal a previously checked set *as multisets*: each previous
    value is matched once (so {1, 1, 1, 0.5} is not the same set as {1, 1, 0.5, 0.45})."""
    if previous is None or previous.shape[0] != st["kw"]:
        return False
    theta = st["theta"][:st["kw"]].tolist()
    free = previous.tolist()
    for t in theta:
        d = [min(abs(t - c), abs(t - c.conjugate())) for c in free]
        j = min(range(len(d)), key=d.__getitem__)
        if d[j] > max(min(1e3 * tol, 1e-3) * abs(t), ZETA * st.get("scale", 0.0)):
            return False
        free.pop(j)
    return True


def final_check(batch: OpBatch, V: Tensor, members: List[int], out: Mapping[int, EigState],
                real: bool) -> None:
    """Residuals of the wanted Ritz pairs of each member (its space: st["m"] columns)."""
    for b in members:
        st = out[b]
        Y = st["Y"][:, :st["kw"]]
        x = V[b, :, :st["m"]].to(Y.dtype) @ Y
        st["x"] = x / torch.linalg.vector_norm(x, dim=0, keepdim=True)
    fresh_residuals(batch, members, out, real)


def fresh_residuals(batch: OpBatch, members: List[int], out: Mapping[int, EigState], real: bool,
                    *, width: int = 0) -> None:
    """st["resid"] = ||A x - theta x|| / |theta| with fresh matvecs, for unit vectors st["x"]
    (``out[b]``: member b's state, for each of ``members``);
    an exact zero (|theta| <= ZETA ||A||) becomes 0 and its residual is ||A x|| / ||A||.
    ``width``: apply at least that many columns (zero-padded), e.g. the width whose batched
    product the operators have already built."""
    B, n = batch.B, batch.shape[0]
    # every member's checked values on the host in one read (their imaginary parts decide
    # which columns a conjugate pair shares)
    flat = torch.cat([out[b]["theta"][:out[b]["kw"]] for b in members]).tolist()
    values, at = {}, 0
    for b in members:
        values[b], at = flat[at:at + out[b]["kw"]], at + out[b]["kw"]
    cols = {}
    for b in members:
        st = out[b]
        theta, x = st["theta"][:st["kw"]], st["x"]
        # a conjugate pair shares A Re x, A Im x
        cols[b] = _real_basis(x, theta, [t.imag for t in values[b]]) if real else x
    c = max(width, *(X.shape[1] for X in cols.values()))
    X = torch.zeros(B, n, c, dtype=batch.wdtype, device=batch.device)
    for b, Xb in cols.items():
        X[b, :, :Xb.shape[1]] = Xb.to(X.dtype)
    AX = batch.apply(X, [b in cols for b in range(B)])
    for b in members:
        st = out[b]
        theta, x = st["theta"][:st["kw"]], st["x"]
        if real:
            Ax, j = [], 0
            for t in values[b]:
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
        # ||A|| bounded below by the products' norms, on the device (no read)
        scale = torch.linalg.vector_norm(Ax, dim=0).max().clamp(min=st["scale"])
        zero = theta.abs() <= ZETA * scale
        theta = torch.where(zero, torch.zeros_like(theta), theta)
        st["theta"] = torch.cat([theta, st["theta"][st["kw"]:]])
        st.pop("imag", None)  # exact zeros changed theta: a later restart reads it afresh
        # relative before the norm: the squares of a tiny operator's residuals underflow (every
        # check passed at 1e-170); an exact zero is measured against ||A|| (the zero operator:
        # 0). Where the products' squares overflow (||A|| ~ 1e160 and up) the Krylov norms did
        # too, so the result stays unconverged (inf) rather than checked in other units
        denom = torch.where(zero, scale.expand_as(theta.real), theta.abs()).clamp(min=1e-300)
        diff = Ax - x * theta
        r = torch.linalg.vector_norm(diff / denom.to(x.dtype), dim=0)
        fits = torch.isfinite(scale) & torch.isfinite(torch.linalg.vector_norm(diff, dim=0))
        st["resid"] = torch.where(fits, r, torch.full_like(r, float("inf")))
