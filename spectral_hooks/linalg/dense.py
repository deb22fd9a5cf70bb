"""The dense end of :func:`~.krylov.eigs`: materialise the operator and take its full eig.

Example (internal; eigs calls it)::

    >>> import torch
    >>> from spectral_hooks.linalg import eigs
    >>> A = torch.randn(30, 30, dtype=torch.float64)
    >>> eigs(A, 12).n_matvecs >= 30  # ncv 36 > n / 2: cheaper done densely
    True

A Krylov basis of m vectors costs m matvecs a cycle and O(n m^2) to keep orthogonal; once m
would pass ``n / 2`` (``DENSE_SHARE``), n matvecs (the operator applied to the identity, in
chunks) and one dense eig (backward stable: its eigenvalues are those of a matrix within
~eps ||A|| of the operator, which is all rounding allows on a strongly non-normal operator) are
cheaper and bounded. The same switch ends a run whose explicit residual stops improving above
tol (eigenvalues too ill-conditioned for Ritz vectors to settle), up to n = ``DENSE_MAX``;
beyond, that run ends with ``converged=False`` and the residual attained. The returned pairs
are still checked with fresh matvecs, so an operator that is not linear to working precision
(a float32 norm inside a float64 block) ends with ``converged=False`` and its attained
residual.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch
from torch import Tensor

from .batch import OpBatch
from .results import EigState
from .schur_restart import fresh_residuals

DENSE_SHARE = 0.5  # a basis of more than this share of n is done densely
DENSE_MAX = 2048   # largest n densified when the residual stalls above tol (n matvecs)
_CHUNK = 64        # identity columns per application when materialising
#: a CPU batch at least this large (dense, or operators in no batch group) is solved one member
#: at a time
ONE_AT_A_TIME_N = 256


def one_at_a_time(batch: OpBatch) -> bool:
    """Solve a CPU batch member by member rather than in lockstep when n >= ONE_AT_A_TIME_N
    and no operators share a batch group (a dense tensor, or a list of operators each applied
    on its own). Lockstep shares nothing there (the products are per-member calls already) and
    its steps cycle through all B operators, evicting each from the cache before its next
    product; one member's matrix (n^2 doubles) stays cached through its run, and a member alone
    takes the single-operator Arnoldi loop (``arnoldi.py``). Measured (B = 6, k = 16,
    clustered spectra, one thread, median wall s of 3, 2026-12-06, a tensor / a list of
    DenseOperators): n = 768 lockstep 2.38 / 2.75 vs one at a time 1.20 / 1.24; n = 512
    1.19 / 1.31 vs 0.75 / 0.71; n = 256 0.47 / 0.48 vs 0.41 / 0.40; n = 128 0.065 / 0.091 vs
    0.073 / 0.094 (there the per-step Python work that lockstep shares outweighs the cache)."""
    if batch.B < 2 or batch.device.type != "cpu" or batch.shape[0] < ONE_AT_A_TIME_N:
        return False
    if batch.dense is not None:
        return True
    ops = batch.ops or []  # a member alone works in its own precision: no real/complex mix
    return not batch.grouped() and len({o.dtype.is_complex for o in ops}) == 1


def matrices(batch: OpBatch, mask: List[bool], width: int = _CHUNK) -> Tensor:
    """[B, n, n]: the masked members' operators applied to the identity, ``width`` columns
    an application (other members' rows are zero)."""
    n = batch.shape[0]
    A = torch.zeros(batch.B, n, n, dtype=batch.wdtype, device=batch.device)
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        E = torch.zeros(batch.B, n, c1 - c0, dtype=batch.wdtype, device=batch.device)
        E[:, c0:c1, :] = torch.eye(c1 - c0, dtype=batch.wdtype, device=batch.device)
        A[:, :, c0:c1] = batch.apply(E, mask)
    return A


def dense_members(batch: OpBatch, members: List[int], k: int, which: str, real: bool,
                  order: Callable[[Tensor, str], Tensor]) -> Dict[int, EigState]:
    """Each member's state (member b -> its dict) from a dense eig of its materialised
    operator, checked with fresh products."""
    A = matrices(batch, [b in members for b in range(batch.B)])
    rows = torch.tensor(members, device=A.device)
    theta, Y = torch.linalg.eig(A[rows])  # one batched eig of every member's matrix
    scales = torch.linalg.vector_norm(A[rows], dim=1).amax(dim=1)
    got = []
    out: Dict[int, EigState] = {}
    for i in range(len(members)):
        idx = order(theta[i], which)
        got.append((theta[i][idx], Y[i][:, idx]))
    # every number read on the host in one read: the k-th value's sign of imag, ||A||
    host = torch.stack([torch.stack([t[k - 1].imag for t, _ in got]).to(scales.dtype),
                        scales]).tolist()
    for i, b in enumerate(members):
        th, Yb = got[i]
        kw = k + 1 if (real and host[0][i] > 0) else k
        x = Yb[:, :kw] / torch.linalg.vector_norm(Yb[:, :kw], dim=0, keepdim=True)
        out[b] = dict(theta=th, x=x, kw=kw, nconv=kw, gap_ok=True, dense=True,
                      scale=host[1][i])
    fresh_residuals(batch, members, out, real)
    return out
