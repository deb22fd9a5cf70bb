"""Arnoldi expansion of a (batch of) Krylov decomposition(s), used by :mod:`krylov`.

State per member b: an orthonormal basis V[b] [n, m + bs] whose first p_b columns have been
multiplied, and Hb[b] [m + bs, m] with A V[:, :p] = V[:, :p + bs] Hb[:p + bs, :p]. ``extend``
multiplies columns p_b .. m-1: one at a time (bs = 1, classic Arnoldi with two classical
Gram-Schmidt passes), or bs at a time (band Arnoldi: column j's product becomes basis vector
j + bs).
"""

from __future__ import annotations

from typing import Callable, List, Tuple

import torch
from torch import Tensor

from .batch import OpBatch

__all__ = ["extend", "orthonormalise_chunk", "revive_lost"]

#: a column's part off a basis at most this many eps of the column is rounding: a lost column
LOST = 64


def revive_lost(P: Tensor, size: Tensor) -> Tensor:
    """P [..., n, c]: columns' parts off an orthonormal basis; ``size`` [..., 1, c]: the
    columns' largest entries before. Where a part is at rounding level (<= LOST eps of its
    column, or zero), a generic direction at that level is added, so the QR that follows makes
    up a direction that the next Gram-Schmidt pass can take off the basis. QR's own made-up
    column for an exact zero is a unit vector e_i, which can lie in the basis: then every pass
    returned e_i again, a "new" basis vector inside the old basis (3 x 3 rank-1 factors in a
    lockstep chain: svds' U lost orthogonality, 0.6% off, unconverged). No host sync.

    Example::

        >>> Q = torch.eye(3, dtype=torch.float64)[:, :2]   # e_1, e_2
        >>> P = torch.zeros(3, 1, dtype=torch.float64)     # a product with no part off Q
        >>> X = torch.linalg.qr(revive_lost(P, torch.ones(1, 1, dtype=torch.float64))).Q
        >>> X = torch.linalg.qr(X - Q @ (Q.mH @ X)).Q
        >>> round(abs(float(X[2, 0])), 12)                  # e_3, not e_1
        1.0
    """
    real = P.real.dtype if P.is_complex() else P.dtype
    floor = (size * (LOST * torch.finfo(real).eps)).clamp(min=1e-290)
    lost = P.abs().amax(-2, keepdim=True) <= floor  # (max-abs: no square to overflow)
    G = _generic(*P.shape[-2:]).to(P.device, real, non_blocking=True)
    return torch.where(lost, P + floor * G, P)


def _generic(n: int, c: int) -> Tensor:
    """n x c columns in no particular subspace, entries in [-1, 1]: cos(a t^2 + b t) of the
    entries' index t with irrational a, b (a fixed quasi-random pattern). Built on the host in
    five small CPU ops (one copy a use on an accelerator, no device kernels); not cached: the
    package keeps no module-level caches."""
    t = torch.arange(1, n * c + 1, dtype=torch.float64).view(n, c)
    return torch.cos(torch.addcmul(0.7548776662466927 * t, t, t, value=0.5698402909980532))


def extend(batch: OpBatch, V: Tensor, Hb: Tensor, p: List[int], done: List[bool], m: int,
           bs: int, randn: Callable[..., Tensor], stop_at: int = 0) -> List[int]:
    """Arnoldi steps j = p_b .. m-1 for every member still running (masked lockstep).

    A breakdown (the new vector's part orthogonal to the basis is below 1e-13 ||A||: an exact
    invariant subspace, e.g. the range of a rank-deficient operator) continues with a random
    orthogonal vector and a zero coupling. Single-vector mode with ``stop_at`` > 0: a member
    whose breakdown leaves it with at least ``stop_at`` columns stops there (its Ritz pairs are
    exact); returns each member's size (m, or the size where it stopped).

    One host sync per step (the breakdown / non-finite test); ||A|| is bounded below by a
    running maximum of the product norms ||A v_i|| (the column norms of Hb)."""
    if bs > 1:
        _extend_block(batch, V, Hb, p, done, m, bs, randn)
        return [m] * len(p)
    if len(p) == 1:
        return [_extend_one(batch, V[0], Hb[0], p[0], done[0], m, randn, stop_at)]
    active = [not d for d in done]
    size = [m] * len(p)
    j0 = min(pb for pb, a in zip(p, active) if a)
    norm_lower = torch.linalg.vector_norm(Hb, dim=1).amax(dim=1)  # [B]: largest ||A v_i||
    for j in range(j0, m):
        mask = [a and j >= pb for a, pb in zip(active, p)]
        if not any(mask):
            continue
        product = batch.apply(V[:, :, j:j + 1], mask, check=False)  # [B, n, 1]
        norm_lower = torch.maximum(norm_lower, torch.linalg.vector_norm(product, dim=(1, 2)))
        Vj = V[:, :, :j + 1]
        c = Vj.mH @ product  # two passes of classical Gram-Schmidt
        w = torch.baddbmm(product, Vj, c, alpha=-1)
        c2 = Vj.mH @ w
        w = torch.baddbmm(w, Vj, c2, alpha=-1)
        c = (c + c2)[:, :, 0]
        w = w[:, :, 0]
        beta = torch.linalg.vector_norm(w, dim=1)
        threshold = 1e-13 * norm_lower.clamp(min=1e-300)
        unusual = ~(beta > threshold)  # a breakdown, or a NaN / Inf from the operator
        if not all(mask):
            unusual &= torch.tensor(mask, device=V.device)
        broke = None
        if bool(unusual.any()):
            batch.check_finite(product, mask)  # raises, naming the operator
            broke = beta <= threshold
            r = _off_basis(Vj, randn(*w.shape))  # invariant subspace: a random new direction
            w = torch.where(broke.unsqueeze(1), r, w / beta.clamp(min=1e-300).unsqueeze(1))
            beta = torch.where(broke, torch.zeros_like(beta), beta)
        else:
            w = w / beta.unsqueeze(1)
        if all(mask):  # the usual case (one operator, or a batch in step): plain stores
            Hb[:, :j + 1, j] = c
            Hb[:, j + 1, j] = beta.to(Hb.dtype)
            V[:, :, j + 1] = w
        else:
            keep = torch.tensor(mask, device=V.device)
            Hb[:, :j + 1, j] = torch.where(keep.unsqueeze(1), c, Hb[:, :j + 1, j])
            Hb[:, j + 1, j] = torch.where(keep, beta.to(Hb.dtype), Hb[:, j + 1, j])
            V[:, :, j + 1] = torch.where(keep.unsqueeze(1), w, V[:, :, j + 1])
        if stop_at and j + 1 < m and broke is not None:
            for b, (mk, br) in enumerate(zip(mask, broke.tolist())):
                if mk and br and j + 1 >= stop_at:
                    active[b], size[b] = False, j + 1
    return size


def _extend_one(batch: OpBatch, V: Tensor, Hb: Tensor, p: int, done: bool, m: int,
                randn: Callable[..., Tensor], stop_at: int) -> int:
    """:func:`extend` for a batch of one operator, single-vector: the same steps with the
    fewest tensor operations. On a dense 768^2 matrix the batched loop's Python and small ops
    cost ~0.3 ms a step against a 0.1 ms gemv (benchmarks/eigs_vs_arpack.py): here the
    Gram-Schmidt products are gemvs on views of the basis, the new vector stays contiguous for
    the next product, and the breakdown / non-finite test reads two numbers in one host read."""
    if done or p >= m:
        return m
    n = V.shape[0]
    norm_lower = float(torch.linalg.vector_norm(Hb, dim=0).max())  # largest ||A v_i|| so far
    x = V[:, p].contiguous()
    for j in range(p, m):
        product = batch.apply(x.view(1, n, 1), [True], check=False)[0, :, 0]
        Vj = V[:, :j + 1]
        VjH = Vj.mH
        c = VjH @ product  # two passes of classical Gram-Schmidt
        w = torch.addmv(product, Vj, c, alpha=-1)
        c2 = VjH @ w
        w = torch.addmv(w, Vj, c2, alpha=-1)
        beta_t = torch.linalg.vector_norm(w)
        beta, norm = torch.stack((beta_t, torch.linalg.vector_norm(product))).tolist()
        norm_lower = norm if not norm <= norm_lower else norm_lower  # (NaN propagates)
        broke = not beta > 1e-13 * max(norm_lower, 1e-300)  # or a NaN / Inf
        if broke:
            batch.check_finite(product.view(1, n, 1), [True])  # raises, naming the operator
            # invariant subspace: continue with a random direction, coupling zero
            w, beta_t = _off_basis(Vj, randn(1, n)[0]), torch.zeros_like(beta_t)
        else:
            w = w / beta_t
        Hb[:j + 1, j] = c + c2
        Hb[j + 1, j] = beta_t
        V[:, j + 1] = w
        x = w
        if broke and stop_at and j + 1 < m and j + 1 >= stop_at:
            return j + 1
    return m


def _off_basis(Vj: Tensor, r: Tensor) -> Tensor:
    """r [..., n] made orthogonal to the columns of Vj [..., n, j] (two classical
    Gram-Schmidt passes) and normalised: the new direction after a breakdown."""
    for _ in range(2):
        r = r - (Vj @ (Vj.mH @ r.unsqueeze(-1))).squeeze(-1)
    return r / torch.linalg.vector_norm(r, dim=-1, keepdim=True)


def _extend_block(batch: OpBatch, V: Tensor, Hb: Tensor, p: List[int], done: List[bool],
                  m: int, bs: int, randn: Callable[..., Tensor]) -> None:
    """Band Arnoldi up to m columns, bs products per operator application.

    Column j's product is orthogonalised against basis vectors 0 .. j + bs - 1 and becomes
    vector j + bs: per chunk of c columns starting at j, two block Gram-Schmidt passes
    against vectors 0 .. j + bs - 1 and a QR (:func:`orthonormalise_chunk`).

    No host sync per step (issue 24: on a GPU each is a pipeline stall): the NaN / Inf test of
    the products is one test of Hb, read once at the end of the expansion (then it raises,
    naming the operator, as a per-step test would have).
    """
    members = [(V[b], Hb[b]) for b in range(V.shape[0])]
    while True:
        run = [not d and pb < m for d, pb in zip(done, p)]
        if not any(run):
            break
        c = max(min(bs, m - pb) for pb, r in zip(p, run) if r)
        if all(run) and len(set(p)) == 1:  # the usual case: one slice, no per-member copies
            X = V[:, :, p[0]:p[0] + c]
        else:
            X = torch.zeros(V.shape[0], V.shape[1], c, dtype=V.dtype, device=V.device)
            for b in range(V.shape[0]):
                if run[b]:
                    X[b] = V[b, :, p[b]:p[b] + c]  # columns < p_b + bs exist
        AX = batch.apply(X, run, check=False)
        for b in range(V.shape[0]):
            if run[b]:
                cb = min(bs, m - p[b])
                orthonormalise_chunk(members[b], p[b], cb, bs,
                                      AX[b] if cb == c else AX[b, :, :cb])
                p[b] += cb
    # NaN / Inf in a product reaches its column of Hb (every entry of O^H W is a sum over all
    # of the column's entries), so one test of Hb replaces a test per application
    finite = torch.isfinite(Hb).flatten(1).all(dim=1)
    if not bool(finite.all()):  # one sync per expansion
        raise batch.nonfinite((~finite).tolist().index(True))


def orthonormalise_chunk(member: Tuple[Tensor, Tensor], j: int, c: int, bs: int, W: Tensor) -> None:
    """Place the products W = A V[:, j:j+c] as basis vectors j+bs .. j+bs+c-1 (block
    Gram-Schmidt twice against vectors 0 .. j+bs-1, each pass followed by a QR), without a
    host sync.

    A product (nearly) in the span of the basis (an invariant subspace, e.g. the range of a
    rank-deficient operator) leaves a column of Q1 made up from rounding (:func:`revive_lost`
    where it vanishes); a third
    Gram-Schmidt pass and QR on Q2 make it an orthonormal direction off the basis, and its
    coupling (the diagonal of R, below rounding) stays as computed: continuing with it is the
    random restart of a breakdown, with no branch on the host. W = O C + Q3 R exactly as
    computed (C and R gather the three passes)."""
    V, Hb = member  # (V[b], Hb[b])
    top = j + bs
    O = V[:, :top]
    OH = O.mH
    if W.dtype != V.dtype:
        W = W.to(V.dtype)
    C1 = OH @ W
    size = W.abs().amax(0, keepdim=True)
    Q1, R1 = torch.linalg.qr(revive_lost(torch.addmm(W, O, C1, alpha=-1), size))
    C2 = OH @ Q1  # (a second revival catches columns QR made up for W's own dependencies)
    Q2, R2 = torch.linalg.qr(revive_lost(torch.addmm(Q1, O, C2, alpha=-1), torch.ones_like(size)))
    C3 = OH @ Q2
    Q3, R3 = torch.linalg.qr(torch.addmm(Q2, O, C3, alpha=-1))
    R21 = R2 @ R1
    V[:, top:top + c] = Q3
    Hb[:top + c, j:j + c] = torch.cat([torch.addmm(torch.addmm(C1, C2, R1), C3, R21), R3 @ R21])
