"""Top-k singular triplets: Lanczos bidiagonalisation with thick restarts, or randomized SVD.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import svds
    >>> A = torch.randn(300, 200, dtype=torch.float64)
    >>> res = svds(A, 5)
    >>> torch.allclose(res.S, torch.linalg.svdvals(A)[:5])
    True

``method="lanczos"`` (default): block Golub-Kahan-Lanczos bidiagonalisation with full
re-orthogonalisation and thick restarts (issue 37; Baglama & Reichel 2005 for one column). A
step applies A to a block V_j of b columns and A^H to the new left block U_j: AV_j = A V_j
orthogonalised against U (three passes of block Gram-Schmidt, each with a QR:
:func:`orthonormal_block`) gives U_j, A^H U_j against V gives V_{j+1}. The projected matrix
U^H (A V) of the m-column space (two-sided Rayleigh-Ritz) is formed from the stored products
and its SVD taken on the host (one copy a cycle on an accelerator); after a cycle the top r
Ritz triplets are kept (m - r a multiple of b) and the expansion continues from the residual
block. Ritz triplet i has A v_i = s_i u_i exactly in the decomposition, and its other residual
||A^H u_i - s_i v_i|| = ||(I - V V^H) A^H U_last p_i||; when every one of the top k is <=
tol * s_1 it is checked with fresh products (A v - s u and A^H u - s v, two applications of k
columns) and ``converged`` needs that check (an estimate it refutes tightens the internal
tolerance). No host sync inside an expansion (no breakdown branch: a direction the operator
does not reach is replaced inside :func:`orthonormal_block`); per cycle one read of every
member's flags (NaN / Inf in a product reach the projected matrix and raise there, naming the
operator), members that converged are masked out of the products. ``block_size``: b, by
default the operators' ``block_size`` hint (batched-JVP operators carry one) or BLOCK (8),
at most k; halved until a block space fits (m + b <= n), b = 1 is the single-vector method,
which is also the default where an application costs FLOPs, not dispatch (the CPU from width
``cost.CPU_FLOP_BOUND_N``: :mod:`~spectral_hooks.linalg.cost`; ``device_path=True`` takes
the accelerator's default on any device).
``ncv``: m (rounded up to a multiple of b; default max(4k, 20, k + 4b); where twice
max(2k + 1, 20) reaches min(m, n), the whole space, exact in one pass). A wide operator
(m < n) is bidiagonalised through its tall adjoint.
Verification probe (against missed copies). A Krylov space from b start vectors holds at most b
copies of a singular value *repeated exactly* (as 1 is in I + low rank); rounding brings the
rest in slowly, so with b < k a converged result could hold one copy and the next distinct
values, every residual check passing (100 x 100, 33 copies of the top value, k = 8 to 20, one
column a step). So where b < k and the space is a part of the whole, a converged result is
probed: Golub-Kahan on A (I - V V^H) (V: the right vectors found) from a fresh random block,
until its leading Ritz value theta settles, with ``eigs``' thresholds (residual estimate r <=
PROBE_TOL theta, theta + PROBE_REACH r below the k-th value found, or PROBE_MAX_CYCLES
cycles). A Ritz value is a lower bound of the deflated operator's top, so theta above the k-th
value (by more than the found values' error) proves a miss: that member is solved again on the
complement of what it found, the block twice as wide (up to k; the whole space where the
complement is too small for a part of it), the top k of both sets kept, and probed again; after
PROBE_ROUNDS rounds a result still challenged is unconverged. With b >= k no probe runs: every
value's first k copies are within reach of the start block. Cost, where it runs (Gaussian
matrices, whose top values crowd, the hardest case for the settling test): 20-32% more
products.
On the d=128 proxy's block Jacobian (k = 16, b = 16): 40 sequential applications and 9 host
reads a call, against 156 and 319 one column a step (benchmarks/results/launch_budget.md).
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
from typing import TYPE_CHECKING, Optional, Sequence, Union

import torch
from torch import Tensor

from ..checks import check_float, check_int
from ..errors import ConvergenceWarning, OptionError
from .arnoldi import revive_lost
from .batch import OpBatch
from .cost import flop_bound
from .eigs_parts import below_precision
from .krylov import PROBE_MAX_CYCLES, PROBE_REACH, PROBE_TOL
from .results import SvdResult

if TYPE_CHECKING:
    from .operators import LinearOperator

__all__ = ["svds"]

logger: logging.Logger = logging.getLogger(__name__)
SVD_METHODS = ("lanczos", "randomized")
#: block width of ``method="lanczos"`` for operators without a ``block_size`` hint (at most k)
BLOCK = 8
_EPS = torch.finfo(torch.float64).eps
#: rounds of (probe, solve on the complement) before a result still challenged is reported
#: unconverged (module doc)
PROBE_ROUNDS = 6


def svds(op: LinearOperator | Sequence[LinearOperator] | Tensor, k: int, *,
         method: str = "lanczos", n_oversamples: int = 10, n_iter: int = 4,
         tol: float = 1e-10, ncv: Optional[int] = None, max_restarts: int = 500, seed: int = 0,
         return_vectors: bool = True, block_size: Optional[int] = None,
         device_path: bool = False) -> SvdResult:
    """Top-k singular triplets of an m x n operator (or a batch [..., m, n] / list).

    Example::

        >>> res = svds(torch.randn(3, 80, 60, dtype=torch.float64), 4, method="randomized")
        >>> res.S.shape, res.U.shape, res.Vh.shape
        (torch.Size([3, 4]), torch.Size([3, 80, 4]), torch.Size([3, 4, 60]))

    Options: module doc. ``device_path``: True takes the accelerator's default block width on
    any device (so a CPU run measures the code a GPU runs).
    """
    batch = OpBatch(op, what="svds")
    batch.need_adjoint()
    mr, n = batch.shape
    check_int("k", k)
    check_int("seed", seed, minimum=-2 ** 63, maximum=2 ** 64 - 1)  # torch.Generator's range
    check_int("n_iter", n_iter, minimum=0)
    check_int("n_oversamples", n_oversamples, minimum=0)
    check_int("max_restarts", max_restarts, minimum=0)
    if not (1 <= k <= min(mr, n)):
        raise OptionError("k", k, f"an int with 1 <= k <= min(m, n) = {min(mr, n)}")
    if method not in SVD_METHODS:
        raise OptionError("method", method, f"one of {SVD_METHODS}")
    check_float("tol", tol, above=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    if method == "randomized":
        U, S, V, conv = _randomized(batch, k, n_oversamples, n_iter, tol, gen)
    elif mr < n:  # wide: bidiagonalise the tall A^H, whose right space m columns can fill
        V, S, U, conv = _verified(_Adjoint(batch), k, ncv, block_size, max_restarts, tol, gen,
                                  device_path)
    else:
        U, S, V, conv = _verified(batch, k, ncv, block_size, max_restarts, tol, gen,
                                  device_path)
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
    s1 = S[:, :1].clamp(min=1e-300).unsqueeze(1).to(AV.dtype)  # relative before the norm
    res = torch.linalg.vector_norm((AV - U * S.unsqueeze(1)) / s1, dim=1)
    conv = (res <= tol).all(dim=1)
    if not bool(conv.all()):
        logger.info("svds(randomized): max residual %.2e > tol * s_1", float(res.max()))
    return U, S, V, conv


class _Adjoint:
    """A batch's adjoints A^H as the batch :func:`_lanczos` reads. Golub-Kahan starts its
    right block in the operator's column space; for a wide A (m < n) that is R^n, which the
    m-dimensional left space cannot fill, so its Ritz triplets never become exact and a
    restart keeps up to m of the n directions. On A^H the start lies in R^m, and
    ``ncv = m`` spans it."""

    def __init__(self, batch: OpBatch) -> None:
        self._batch = batch
        self.B, self.wdtype, self.device, self.ops = batch.B, batch.wdtype, batch.device, batch.ops
        self.shape = batch.shape[::-1]

    def apply(self, X: Tensor, mask: Sequence[bool], *, adjoint: bool = False,
              check: bool = True) -> Tensor:
        return self._batch.apply(X, mask, adjoint=not adjoint, check=check)

    def nonfinite(self, b: int, adjoint: bool = False) -> FloatingPointError:
        return self._batch.nonfinite(b, not adjoint)


class _Deflated:
    """A batch on the complement of orthonormal right vectors W [B, n, k]: A (I - W W^H), and
    its adjoint (I - W W^H) A^H. Where W holds singular vectors of A, its singular values
    are the rest of A's (and zeros)."""

    def __init__(self, batch: _Batch, W: Tensor) -> None:
        self._batch, self._W = batch, W
        self.B, self.wdtype, self.device, self.ops = batch.B, batch.wdtype, batch.device, batch.ops
        self.shape = batch.shape

    def _off(self, X: Tensor) -> Tensor:
        for _ in range(2):
            X = X - self._W @ (self._W.mH @ X)
        return X

    def apply(self, X: Tensor, mask: Sequence[bool], *, adjoint: bool = False,
              check: bool = True) -> Tensor:
        if adjoint:
            return self._off(self._batch.apply(X, mask, adjoint=True, check=check))
        return self._batch.apply(self._off(X), mask, check=check)

    def nonfinite(self, b: int, adjoint: bool = False) -> FloatingPointError:
        return self._batch.nonfinite(b, adjoint)


#: what the Lanczos steps apply: the operators, their adjoints (a wide batch), or either on
#: the complement of vectors found (the probe)
_Batch = Union[OpBatch, _Adjoint, _Deflated]


def orthonormal_block(Q: Tensor, W: Tensor) -> Tensor:
    """Orthonormal columns orthogonal to Q [B, n, j] (orthonormal) whose span holds W [B, n, c]'s
    part off Q, without a host sync: three passes of block Gram-Schmidt, each followed by a QR.

    Where W has no part off Q in some direction (an invariant subspace, a rank-deficient
    operator), the QR makes a column up from rounding (:func:`~.arnoldi.revive_lost` where it
    vanishes); the next pass turns it into a direction off Q. So the result is always c
    orthonormal columns orthogonal to Q (c <= n - j), with no breakdown branch read on the
    host.

    Example::

        >>> Q = torch.linalg.qr(torch.randn(1, 50, 5, dtype=torch.float64)).Q
        >>> X = orthonormal_block(Q, torch.cat([Q[:, :, :2], torch.randn(1, 50, 2,
        ...                                     dtype=torch.float64)], 2))  # 2 columns in Q
        >>> float((Q.mH @ X).abs().max()) < 1e-12, float((X.mH @ X - torch.eye(4)).abs().max()) < 1e-12
        (True, True)
    """
    size = W.abs().amax(-2, keepdim=True)
    for i in range(3):
        if Q.shape[-1]:
            W = W - Q @ (Q.mH @ W)
            if i < 2:  # the second catches columns QR made up for W's own dependencies
                W = revive_lost(W, size if i == 0 else torch.ones_like(size))
        W = torch.linalg.qr(W).Q
    return W


def _default_block(batch: _Batch, k: int, device_path: bool = False) -> int:
    """Columns per application: 1 where an application costs FLOPs (``cost.flop_bound``: the
    CPU at a large width), else the operators' ``block_size`` hint (batched-JVP operators carry
    one) capped at k, else min(k, BLOCK)."""
    if flop_bound(batch.shape[1], batch.device, device_path=device_path):
        return 1
    hints = [o.block_size for o in (batch.ops or [])]
    if hints and all(h is not None for h in hints):
        return max(1, min(k, min(hints)))  # pyright: ignore[reportArgumentType]
    return max(1, min(k, BLOCK))


def _shape(batch: _Batch, k: int, ncv: Optional[int], block_size: Optional[int],
           device_path: bool = False) -> tuple:
    """(b, m, r): block width, subspace size (a multiple of b) and the size kept at a restart
    (m - r a multiple of b, r >= k). The default subspace, max(4k, 20, k + 4b), gives a cycle
    at least two block steps (measured on the d=128 proxy's block Jacobian, k = 16, b = 16:
    m = 48 took 33 cycles, 80 took 8). A block that leaves no room (m + b > n or m > m_rows)
    is halved until one fits, down to b = 1, the single-vector method. A small problem
    (2 max(2k + 1, 20) >= min(m, n), default ncv) takes the whole space: exact in one pass."""
    mr, n = batch.shape
    dmin = min(mr, n)
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(
            block_size, int) or block_size < 1):
        raise OptionError("block_size", block_size, "a positive int or None")
    if ncv is not None:
        check_int("ncv", ncv)
        if not (k < ncv <= dmin or k == ncv == dmin):  # ncv = k leaves no room to expand
            raise OptionError("ncv", ncv, f"an int with k = {k} < ncv <= min(m, n) = {dmin} "
                              "(or ncv = k = min(m, n))")
    b = _default_block(batch, k, device_path) if block_size is None else block_size
    if ncv is None and 2 * max(2 * k + 1, 20) >= dmin:
        # a small problem: the whole space, exact in one pass (a part of over half of it found
        # 7 of 10 copies of a repeated top value, 30 x 120, k = 8, converged=True), in the
        # widest block up to b that divides it
        while b > 1 and (dmin % b or dmin < k + b):
            b -= 1
        r = dmin - b * max(1, (dmin - k) // (2 * b)) if b > 1 else max(k, dmin - 1)
        return b, dmin, max(k, r)
    while b > 1:  # the widest block up to b that leaves room for a block space
        m0 = max(4 * k, 20, k + 4 * b) if ncv is None else ncv
        m = b * -(-m0 // b)
        if m >= k + b and m + b <= n and m <= mr:
            r = m - b * max(1, (m - k) // (2 * b))
            return b, m, r
        b //= 2
    m = min(dmin, max(2 * k + 1, 20)) if ncv is None else ncv
    return 1, m, max(k, min(m - 1, k + (m - k) // 2))


def _verified(batch: _Batch, k: int, ncv: Optional[int], block_size: Optional[int],
              max_restarts: int, tol: float, gen, device_path: bool = False):
    """:func:`_lanczos`, then, where it worked in a part of the space, the probe (module doc)
    until it finds no rival: a member whose probe sees a singular value above its k-th is
    solved again on the complement of what it found, the block twice as wide, and keeps the
    top k of both sets. Returns U, S, V and ``converged`` (a tensor on the device)."""
    U, S, V, conv, resid = _lanczos(batch, k, ncv, block_size, max_restarts, tol, gen,
                                    device_path)
    b, m, _ = _shape(batch, k, ncv, block_size, device_path)
    if b < k and m < batch.shape[1]:  # a part of the space, fewer start vectors than k
        width = b
        for rounds in range(PROBE_ROUNDS + 1):
            rival = _probe(batch, S, V, b, tol, gen, conv)
            if not any(rival):
                break
            if rounds == PROBE_ROUNDS:  # still challenged: say so
                conv = [c and not r for c, r in zip(conv, rival)]
                break
            width = min(k, 2 * width)
            U, S, V, conv, resid = _solve_the_rest(batch, (U, S, V, conv, resid), rival, k,
                                                   ncv, width, max_restarts, tol, gen)
    if not all(conv):
        message = (f"svds(lanczos) did not converge after max_restarts={max_restarts}: max "
                   f"residual {max(resid):.2e} > tol={tol:g} (relative to s_1)")
        coarsest = max((o.dtype for o in batch.ops or []), key=lambda d: torch.finfo(d).eps,
                       default=torch.float64)
        hint = below_precision(coarsest, tol)
        message += f"; {hint}" if hint else ""
        logger.warning("%s", message)
        warnings.warn(message, ConvergenceWarning, stacklevel=4)
    return U, S, V, torch.tensor(conv, device=batch.device)


def _probe(batch: _Batch, S: Tensor, V: Tensor, b: int, tol: float, gen,
           members: list) -> list:
    """The verification probe (module doc) for each member: block Golub-Kahan on
    A (I - V V^H) from a random block of b columns, until its leading Ritz value settles
    (the thresholds of ``eigs``' probe). True where that value beats the k-th found, by more
    than the found values' error: a singular value was missed. One host read a cycle."""
    B, (mr, n), dt, dev = batch.B, batch.shape, batch.wdtype, batch.device
    k = V.shape[-1]
    room = n - k  # the complement's dimension
    m = b * -(-max(20, 3 * b) // b)
    if m + b > room:  # a small complement: all of it, one column a step (exact)
        b, m = 1, room
    r = m - b * max(1, (m - 1) // (2 * b))
    defl = _Deflated(batch, V)
    Vp = torch.zeros(B, n, m + b, dtype=dt, device=dev)
    Up = torch.zeros(B, mr, m, dtype=dt, device=dev)
    AVp = torch.zeros(B, mr, m, dtype=dt, device=dev)
    start = torch.randn(B, n, b, generator=gen, dtype=torch.float64).to(dev, dt)
    Vp[:, :, :b] = orthonormal_block(V, start)
    kth, s1 = S[:, k - 1].tolist(), S[:, 0].tolist()
    running, rival = list(members), [False] * B
    cycles, p = 0, 0
    while True:
        Zperp = _expand(defl, Vp, Up, AVp, p, m, b, running)
        P, _, Q, flags, lead = _project(Up, AVp, Zperp, m, b, 1, [1.0] * B)
        for j in range(B):
            if not running[j]:
                continue
            if not flags[j][1]:
                raise batch.nonfinite(j)
            theta, est = lead[j]
            if theta > kth[j] * (1 + 1e-8) + 10 * tol * s1[j]:
                rival[j], running[j] = True, False
            elif (cycles >= PROBE_MAX_CYCLES or theta + PROBE_REACH * est < kth[j]
                  or est <= PROBE_TOL * theta):
                running[j] = False
        if not any(running):
            return rival
        _restart(Vp, Up, AVp, P, Q, m, r, b)
        cycles, p = cycles + 1, r


def _solve_the_rest(batch: _Batch, found: tuple, rival: list, k: int, ncv: Optional[int],
                    width: int, max_restarts: int, tol: float, gen) -> tuple:
    """For the ``rival`` members: the top k of A on the complement of the found right vectors
    (the whole space where that complement is too small for a part of it), merged with the
    found set: its top k."""
    U, S, V, conv, resid = found
    mr, n = batch.shape
    b, m, _ = _shape(batch, k, ncv, width)
    if m + b > n - k:
        U2, S2, V2, conv2, resid2 = _lanczos(batch, k, min(mr, n), None, max_restarts, tol,
                                             gen, members=rival)
        pick = torch.arange(k, device=S.device).expand(batch.B, k) + k  # the new set only
    else:
        U2, S2, V2, conv2, resid2 = _lanczos(_Deflated(batch, V), k, ncv, width,
                                             max_restarts, tol, gen, members=rival)
        pick = torch.argsort(torch.cat([S, S2], 1), dim=1, descending=True, stable=True)[:, :k]
    take = torch.tensor(rival, device=S.device)

    def merged(old: Tensor, new: Tensor) -> Tensor:
        both = torch.cat([old, new], -1)
        index = pick.unsqueeze(1).expand(-1, both.shape[1], -1) if both.dim() == 3 else pick
        chosen = torch.gather(both, -1, index)
        return torch.where(take.view(-1, *([1] * (old.dim() - 1))), chosen, old)

    conv = [c2 if r else c for c, c2, r in zip(conv, conv2, rival)]
    resid = [r2 if r else r1 for r1, r2, r in zip(resid, resid2, rival)]
    return merged(U, U2), merged(S, S2), merged(V, V2), conv, resid


def _lanczos(batch: _Batch, k: int, ncv: Optional[int], block_size: Optional[int],
             max_restarts: int, tol: float, gen, device_path: bool = False,
             members: Optional[list] = None):
    """Block Golub-Kahan-Lanczos bidiagonalisation with thick restarts (module doc), for the
    ``members`` of the batch (default all). Returns U, S, V, converged and the largest fresh
    residual per member (host lists)."""
    B, (mr, n), dt, dev = batch.B, batch.shape, batch.wdtype, batch.device
    b, m, r = _shape(batch, k, ncv, block_size, device_path)
    full = m >= n  # the right space spans R^n: its Ritz triplets are exact
    V = torch.zeros(B, n, m + b, dtype=dt, device=dev)
    U = torch.zeros(B, mr, m, dtype=dt, device=dev)
    AV = torch.zeros(B, mr, m, dtype=dt, device=dev)
    start = torch.randn(B, n, b, generator=gen, dtype=torch.float64).to(dev, dt)
    V[:, :, :b] = torch.linalg.qr(start).Q
    running = [True] * B if members is None else list(members)
    tol_int = [float(tol)] * B
    restarts = [0] * B
    outU = torch.zeros(B, mr, k, dtype=dt, device=dev)
    outV = torch.zeros(B, n, k, dtype=dt, device=dev)
    outS = torch.zeros(B, k, dtype=torch.float64, device=dev)
    resid = [float("inf")] * B
    conv = [False] * B
    p = 0
    while True:
        Zperp = _expand(batch, V, U, AV, p, m, b, running)
        P, S, Q, flags, _ = _project(U, AV, Zperp, m, b, k, tol_int)
        for j, (_, fin) in enumerate(flags):
            if running[j] and not fin:
                raise batch.nonfinite(j)
        check = [running[j] and (flags[j][0] or full or restarts[j] >= max_restarts)
                 for j in range(B)]
        if any(check):
            Uk = U @ P[:, :, :k]
            Vk = V[:, :, :m] @ Q[:, :, :k]
            Sk = S[:, :k]
            res = _fresh_residuals(batch, Uk, Sk, Vk, check)
            for j, rj in enumerate(res.tolist()):
                if not check[j]:
                    continue
                passed = rj <= tol
                if passed or full or restarts[j] >= max_restarts or tol_int[j] / 10 < 10 * _EPS:
                    outU[j], outV[j], outS[j] = Uk[j], Vk[j], Sk[j].to(torch.float64)
                    resid[j], conv[j], running[j] = rj, passed, False
                else:  # the estimates said converged, fresh products disagree: tighten
                    tol_int[j] /= 10.0
        if not any(running):
            break
        _restart(V, U, AV, P, Q, m, r, b)
        for j in range(B):
            restarts[j] += running[j]
        p = r
    return outU, outS, outV, conv, resid


def _expand(batch: _Batch, V: Tensor, U: Tensor, AV: Tensor, p: int, m: int, b: int,
            running: list) -> Tensor:
    """Block steps j = p, p + b, .. < m: AV_j = A V_j, U_j = orth(AV_j off U), V_{j+b} =
    orth(A^H U_j off V). No host sync (NaN / Inf reach the projected matrix and the estimates,
    read once per cycle). Returns the last (I - V V^H) A^H U_j [B, n, b]."""
    Zperp = V[:, :, :0]
    for j in range(p, m, b):
        W = batch.apply(V[:, :, j:j + b], running, check=False)
        AV[:, :, j:j + b] = W
        U[:, :, j:j + b] = orthonormal_block(U[:, :, :j], W)
        Z = batch.apply(U[:, :, j:j + b], running, adjoint=True, check=False)
        Vj = V[:, :, :j + b]
        for _ in range(2):
            Z = Z - Vj @ (Vj.mH @ Z)
        Zperp = Z
        V[:, :, j + b:j + 2 * b] = orthonormal_block(Vj, Z)
    return Zperp


def _project(U: Tensor, AV: Tensor, Zperp: Tensor, m: int, b: int, k: int,
             tol_int: list) -> tuple:
    """SVD of the projected matrix U^H A V (two-sided Rayleigh-Ritz) and the convergence tests,
    on the host: one copy a cycle for the whole batch (of U^H A V and the last residual block;
    on an accelerator a small SVD is slow and each read a sync). Returns P, S, Q (on the
    device), per member [every estimate <= tol_int s_1, finite] and (s_1, its estimate) as
    host lists.

    Residual estimates: ||A^H u_i - s_i v_i|| = ||(I - V V^H) A^H U_last P[last, i]|| (A v_i =
    s_i u_i holds in the decomposition). NaN / Inf in a product reach U^H A V or the residual
    block; such a member's matrix is zeroed for the SVD and reported not finite."""
    Bm = U.mH @ AV
    B, n = Bm.shape[0], Zperp.shape[1]
    both = torch.cat([Bm.reshape(B, -1), Zperp.reshape(B, -1)], 1).cpu()  # the one copy
    finite = torch.isfinite(both).all(1)
    both = torch.where(finite[:, None], both, 0)
    # each member at a power-of-two scale (exact) near 1: the estimates' squares can neither
    # underflow nor overflow however small or large the operator
    scale = torch.exp2(torch.floor(torch.log2(both.abs().amax(1).clamp(min=1e-300))))[:, None]
    both = both / scale
    host, Zh = both[:, :m * m].reshape(B, m, m), both[:, m * m:].reshape(B, n, b)
    P, S, Qh = torch.linalg.svd(host)
    est = torch.linalg.vector_norm(Zh @ P[:, m - b:m, :k], dim=1)  # [B, k]
    tol_s1 = torch.tensor(tol_int, dtype=S.dtype)[:, None] * S[:, :1].clamp(min=1e-300)
    S = S * scale.to(S.dtype)
    host = torch.stack([(est <= tol_s1).all(1).to(S.dtype), finite.to(S.dtype), S[:, 0],
                        est[:, 0] * scale[:, 0].to(S.dtype)], 1).tolist()  # host: no sync
    flags = [(bool(h[0]), bool(h[1])) for h in host]
    lead = [(h[2], h[3]) for h in host]
    dev = Bm.device  # host to device without a sync
    return (P.to(dev, non_blocking=True), S.to(dev, non_blocking=True),
            Qh.mH.to(dev, non_blocking=True), flags, lead)


def _restart(V: Tensor, U: Tensor, AV: Tensor, P: Tensor, Q: Tensor, m: int, r: int,
             b: int) -> None:
    """Thick restart onto the top r Ritz triplets; the residual block V_{m..m+b} follows them."""
    V[:, :, :r] = V[:, :, :m] @ Q[:, :, :r]
    V[:, :, r:r + b] = V[:, :, m:m + b].clone()
    V[:, :, r + b:] = 0
    AV[:, :, :r] = AV @ Q[:, :, :r]
    U[:, :, :r] = U @ P[:, :, :r]
    U[:, :, r:] = 0
    AV[:, :, r:] = 0


def _fresh_residuals(batch: _Batch, Uk: Tensor, Sk: Tensor, Vk: Tensor, mask: list) -> Tensor:
    """max_i max(||A v_i - s_i u_i||, ||A^H u_i - s_i v_i||) / s_1 per member, from fresh
    products (two applications of k columns); +inf for members not in ``mask``."""
    s = Sk.to(Uk.dtype).unsqueeze(1)
    # relative before the norm: squares of an operator's scale can under/overflow (at 1e-170
    # every residual read 0, a wrong spectrum converged)
    s1 = Sk[:, :1].clamp(min=1e-300).unsqueeze(1).to(Uk.dtype)
    left = torch.linalg.vector_norm((batch.apply(Vk, mask, check=False) - Uk * s) / s1, dim=1)
    right = torch.linalg.vector_norm(
        (batch.apply(Uk, mask, adjoint=True, check=False) - Vk * s) / s1, dim=1)
    r = torch.maximum(left, right).amax(1)
    r = torch.where(torch.isfinite(r), r, torch.full_like(r, float("inf")))
    keep = torch.tensor(mask).to(r.device, non_blocking=True)
    return torch.where(keep, r, torch.full_like(r, float("inf")))
