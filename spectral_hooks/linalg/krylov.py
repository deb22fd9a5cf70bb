"""Top-k eigenpairs of non-symmetric operators: restarted Arnoldi with Krylov-Schur restarts.

Example::

    >>> import torch
    >>> from spectral_hooks.linalg import eigs
    >>> A = torch.randn(200, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> res = eigs(A, 6)
    >>> bool(res.converged), res.values.shape[-1] in (6, 7)
    (True, True)

Method (Stewart 2001). The Krylov decomposition A V_m = V_m H_m + v_{m+1} h^T is extended by
Arnoldi steps with full re-orthogonalisation (two passes of classical Gram-Schmidt) in
float64/complex128. At a restart the wanted Ritz values are kept: for a real operator an
orthonormal *real* basis W of the invariant subspace of H_m spanned by the kept Ritz vectors
(conjugate pairs never split) replaces the Schur vectors, V <- V W, H <- W^T H W,
h <- W^T h. Converged wanted Ritz pairs are always kept (soft locking; the kept count grows with
the number converged, as in SLEPc). The iteration stops for an operator when

* every wanted Ritz pair has estimated residual |h^T y| <= tol |theta|, and
* the next Ritz value is separated from the k-th: it cannot, within its residual, belong to
  the top-k (or it has converged itself), and
* a final explicit check with fresh matvecs gives ||A x - theta x|| / |theta| <= tol for every
  returned pair (if not, the internal tolerance is tightened and the iteration continues),
* a verification probe (below) finds no Ritz value beyond the k-th.

Verification probe (against a silently wrong top-k). The checks above only concern Ritz
values the Krylov space has *seen*: on a clustered spectrum (e.g. 20 conjugate pairs within
1e-2 of the top modulus, k=8, ncv=24) restarted Arnoldi can converge to k true eigenvalues
that are not the top k, with the missed one never appearing as a Ritz value, and every test
passes. So a result that passed them is not final until a probe has passed: the basis is
restarted onto Q, the Schur basis of the checked wanted set only, the residual vector is
replaced by a random unit vector orthogonal to Q, and the coupling row (of norm <= the
converged residuals, ~tol |theta|) is dropped; one cycle of ncv - k Arnoldi steps,
re-orthogonalised against Q, then is a Krylov space of the deflated operator
(I - QQ^H) A (I - QQ^H), whose spectrum is the rest of A's. If no Ritz value of the combined
decomposition beats the k-th value (every wanted Ritz vector lies in Q), the checked result
is returned. Otherwise the probe found a rival: the iteration continues with the probe's
vectors in the basis and ncv enlarged (by max(ncv/2, k), up to n), and a new probe is needed
later. ncv is also enlarged after every 40 restarts without convergence (stagnation).
A probe lasts until its leading Ritz value (the first beyond the checked set) has settled
(thick restarts keep the checked set and the probe's best vectors); one still moving after
PROBE_MAX_CYCLES extra cycles means the space is too small to tell, so ncv is enlarged as
for a rival and the probe goes on (accepting there returned a wrong set as converged on 3 of
300 Gaussian 100 x 100 matrices at k = 4, ncv 12; past DENSE_SHARE of n the dense eig ends
it). Settled means its residual estimate r is below PROBE_TOL |theta|, or theta is so
far below the k-th value that it cannot reach it within PROBE_REACH residuals
(|theta| + PROBE_REACH r < |lambda_k|: the precision asked of it is then the gap's, not a
fixed one). A missed eigenvalue at the edge of a cluster (MiniLM layer 3's J - I: the second
copy of -1, next to values of modulus 0.98) climbs past the k-th value only after a few
cycles; on the way its leading Ritz value sits at 0.965 with r = 0.0165, which one residual
would already have written off (0.9816 vs 0.9808), two do not. In single-vector mode the
probe is tested every TEST_EVERY (8) Arnoldi steps and ends the moment its leading value
settles (a rival is still judged at the end of a cycle); cost: the steps until then, counted
in n_matvecs (a Llama d=1024 block Jacobian, k=16: ~70 of ~280; with the PROBE_TOL test
alone ~100 of 310).
Which test is safe: the probe's Ritz values are unconverged after one cycle, so a
residual-widened test (|theta'| + residual >= |lambda_k|) fires on almost every clustered
spectrum and would double the cost; the probe uses "a Ritz value beats |lambda_k|"
instead. For a normal operator that proves a missed eigenvalue (Ritz values lie in the convex
hull of the deflated spectrum), so it never fires falsely; for a non-normal one it may fire
without cause (costing matvecs, never correctness). What it cannot do: prove that nothing
was missed. An eigenvalue whose eigenvector is nearly orthogonal to both the original start
and the probe's random start, or that the probe approximates only from below |lambda_k|
until its leading value settles, can still be missed; the probe makes a silent miss require two independent
random Krylov spaces to fail, and it catches the exactly-blind start (tested).

Block mode (``block_size=b > 1``). The operator is applied to b columns at a time (one
``matmat``: for batched JVPs several times cheaper per column than b matvecs). The Krylov
decomposition keeps a residual *block* of b orthonormal columns: A V_m = V_m H_m + U R^T, U
orthonormal [n, b] and orthogonal to V_m, H_m banded below with bandwidth b (band Arnoldi,
Ruhe 1979: column j's product is orthogonalised against the first j + b basis vectors and
becomes vector j + b). Residual estimates are ||R^T y||, restarts and the verification probe
are the same with the residual block in place of the residual vector. For b = 1 this is the
method above, step for step. A block space needs more matvecs than a single-vector one for
the same accuracy, so the speed-up comes from cheaper columns only; the default ``ncv`` grows
with b (see :func:`eigs`). A block step makes no host sync (issue 24): the NaN / Inf test of
the products is read once per expansion, block Gram-Schmidt has no breakdown branch (a third
pass and QR turn a column QR made up from rounding into a direction off the basis, with the
coupling as computed), and the Ritz tests read their numbers in one sync per cycle (on an
accelerator from a host copy of the small projected matrix).

Device-aware defaults (issue 24). What an application costs decides the shape. On the CPU a
column costs about what it costs inside a block of up to 32 (a batched JVP of a Llama d=1024
block: 8 ms for one column, 29 ms for 2-32), and sequential steps are cheap, so the default is
the single-vector method, with a wider space than ARPACK's default, ncv = max(3k, 20,
min(6k, 96)): fewest applications, 278 on that operator against ARPACK ncv=64's 283-321,
probe and final check included (benchmarks/eigs_vs_arpack.py --llama). On an accelerator one
application of 32-64 columns costs about one column's kernel launches and one read of the
weights, and every sequential step and host sync is a launch train and a pipeline stall, so
the default is block Krylov with the operator's ``block_size`` hint (``eigs_parts.ACCEL_BLOCK`` = 32 without
one). ``block_size=`` and ``ncv=`` override either. eigs never forms the operator's matrix
unless asked (DESIGN: matrix-free): ``materialize=True`` or ``"auto"`` (``materialize.py``:
on the CPU n columns in 128-column products can cost less than a Krylov run's single ones).

Multiplicity, zeros, invariant subspaces (issue 12). A single Krylov space sees one copy of a
repeated eigenvalue; the probe sees the next (it is an eigenvalue of the deflated operator), and
a set a probe challenged is only accepted again as the same *multiset*. A breakdown (new vector
below 1e-13 ||A|| off the basis) is an exact invariant subspace: the cycle stops there once
k + 2 columns exist, its Ritz pairs are exact. Ritz values below 1e-12 ||A|| are exact zeros
(returned as 0, residual ||A x|| / ||A||), so a rank-deficient operator ends as soon as its
range is spanned. Bounded cost (``dense.py``): a basis that would pass n / 2 is replaced by a
dense eig of the materialised operator (n matvecs), checked with fresh matvecs; so is a run
whose explicit residual stops improving over three tightenings of the internal tolerance
(never below 10 eps), for n <= 2048; beyond, it ends with ``converged=False`` and the residual
attained.

Otherwise, after ``max_restarts``, ``converged`` is False and a warning says why; eigs never
raises on non-convergence. ``k`` must satisfy 1 <= k <= n - 2 (as in ARPACK); for the full
spectrum of a small matrix use ``torch.linalg.eig``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Literal, Optional, Sequence, Union

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import OptionTypeError
from .arnoldi import extend
from .batch import OpBatch
from .dense import DENSE_MAX, DENSE_SHARE, dense_members, one_at_a_time
from .eigs_parts import (
    assemble,
    block_size_for,
    key,
    order,
    ritz,
    start_vectors,
    unreachable,
    validate,
    warn_unconverged,
    why,
)
from .materialize import materialised, pays, recheck
from .results import EigResult
from .schur_restart import final_check, inject, restart, same_set

if TYPE_CHECKING:
    from .operators import LinearOperator

__all__ = ["eigs", "probe_settled"]

logger: logging.Logger = logging.getLogger(__name__)
_STALL = 40  # restarts without convergence before the Krylov space is enlarged


#: a probe ends when its leading Ritz value (the first beyond the checked set) has a residual
#: estimate r below PROBE_TOL |theta|, or |theta| + PROBE_REACH r is below the k-th value; after
#: PROBE_MAX_CYCLES extra cycles without either, the Krylov space is enlarged (module doc)
PROBE_TOL = 1e-3
PROBE_REACH = 2.0
PROBE_MAX_CYCLES = 8
#: single-vector mode: a probe's tests run every TEST_EVERY Arnoldi steps, not only at the end of
#: a cycle (it ends as soon as its leading Ritz value settles). The main iteration tests at the
#: end of a cycle only: on a strongly non-normal operator, mid-cycle "converged" estimates
#: that fresh matvecs then refute, and probe rivals seen in a part-built space, cost more than
#: the steps they save (measured with both: 1,855 vs 1,589 matvecs on tests/linalg's line
#: problem; and only 238 -> 221 on a Llama block Jacobian)
TEST_EVERY = 8


def probe_settled(st: dict, kth: float) -> bool:
    """Has the probe's leading Ritz value settled (module doc)? ``kth``: the key of the
    checked k-th value. Reads only numbers ritz() has on the host (no sync)."""
    if st["lead"] is None:
        return True
    lead, est = st["lead"]
    if lead + PROBE_REACH * est < kth:
        return True
    return est <= PROBE_TOL * max(abs(lead), 1e-12 * st["scale"])


def _within(out: list, members: List[int], tol: float) -> dict:
    """Member -> every fresh residual <= tol, for all ``members`` in one host read."""
    met = torch.stack([(out[b]["resid"] <= tol).all() for b in members]).tolist()
    return dict(zip(members, met))


def eigs(op: LinearOperator | Sequence[LinearOperator] | Tensor, k: int, *,
         which: str = "LM", tol: float = 1e-10, max_restarts: int = 1000,
         ncv: Optional[int] = None, v0: Optional[Tensor] = None, seed: int = 0,
         return_vectors: bool = True, block_size: Optional[int] = None,
         materialize: Union[bool, Literal["auto"]] = False,
         device_path: bool = False) -> EigResult:
    """Top-k eigenpairs of a square operator (or a batch of them, in lockstep).

    Example::

        >>> res = eigs(torch.randn(4, 100, 100, dtype=torch.float64), 5)  # a batch of 4
        >>> res.values.shape[0], res.converged.shape
        (4, torch.Size([4]))

    ``op``: a LinearOperator, a list of LinearOperators of one shape, or a dense tensor
    [..., n, n]. ``which``: "LM" (largest modulus), "LR" (largest real part) or "SM"
    (smallest modulus; slow without shift-invert). ``ncv``: Krylov subspace size (default
    max(3k, 20, min(6k, 96)), at most n; ARPACK's default is max(2k + 1, 20); a wider space
    needs fewer matvecs on a clustered top spectrum (a Llama d=1024 block Jacobian, k=16:
    430 at 48, 365 at 64, 310 at 96); in block mode max(3k, 20, 2k + 7b), and block mode
    falls back to b = 1 where that leaves no room for a block, ncv + b > n; a given
    ``ncv`` narrows the block to at most (ncv - k) / 2 and n - ncv columns; one below k + 8
    is raised to min(n, k + 8), so that the verification probe gets several steps). ``v0``: start
    vector [n] or [..., n]; random (``seed``) otherwise. ``block_size``: columns per operator
    application (block Krylov, see the module doc); default by device (module doc,
    "Device-aware defaults"): on the CPU 1, the classic method (fewest matvecs); on an
    accelerator the operators' ``block_size`` hint (batched-JVP operators carry 32), else
    ``eigs_parts.ACCEL_BLOCK``. ``device_path``: True takes the accelerator's default on any
    device, so a CPU run measures the code a GPU runs (a CPU proxy of a host-bound GPU).
    ``materialize``: False (default: matrix-free, the operator is only applied to Krylov
    vectors), True (iterate on its matrix, n columns in blocks, every returned pair
    then checked with fresh products of the operator) or "auto" (True on the CPU for batched
    operators at the default block size where the n columns cost less than a Krylov run
    would: ``materialize.py``; a GPT-2-small block Jacobian, k=16: 0.45 s instead of 1.5 s,
    for n instead of ~400 columns). Returns an :class:`EigResult` (module doc: guarantees).
    """
    batch = OpBatch(op, what="eigs")
    check_int("seed", seed, minimum=-2 ** 63, maximum=2 ** 64 - 1)  # torch.Generator's range
    if not (isinstance(materialize, bool) or (isinstance(materialize, str)
                                               and materialize == "auto")):
        raise OptionTypeError("materialize", materialize, 'True, False or "auto" (by cost)')
    m, bs = validate(batch, k, which, tol, ncv, max_restarts,
                     block_size_for(batch, block_size, device_path))
    gen = torch.Generator().manual_seed(int(seed))
    start = start_vectors(batch, v0, gen)
    if batch.ops is not None and (materialize is True or (
            materialize == "auto" and block_size is None and pays(batch, m=m))):
        dense = materialised(batch)
        m, bs = validate(dense, k, which, tol, ncv, max_restarts,
                         block_size_for(dense, block_size, device_path))
        out, unconverged = _run(dense, k, which, tol, max_restarts, m, bs, start, gen)
        unconverged += recheck(batch, out, tol)  # pyright: ignore[reportArgumentType]
    else:
        out, unconverged = _run(batch, k, which, tol, max_restarts, m, bs, start, gen)
    warn_unconverged(unconverged, max_restarts)
    return assemble(batch, out, return_vectors)  # pyright: ignore[reportArgumentType]


def _run(batch: OpBatch, k: int, which: str, tol: float, max_restarts: int, m: int, bs: int,
         start: Tensor, gen: torch.Generator) -> tuple:
    """The iteration for ``batch``: in lockstep, or member by member (``one_at_a_time``)."""
    if not one_at_a_time(batch):
        return _solve(batch, k, which, tol, max_restarts, m, bs, start, gen)
    out, unconverged = [], []
    for b in range(batch.B):
        member = batch.member(b)
        got, reasons = _solve(member, k, which, tol, max_restarts, m, bs, start[b:b + 1], gen)
        out += got
        unconverged += reasons
        batch.counts[b] = member.counts[0]
    return out, unconverged


def _solve(batch: OpBatch, k: int, which: str, tol: float, max_restarts: int, m: int, bs: int,
           start: Tensor, gen: torch.Generator) -> tuple:
    """The iteration for every member of ``batch`` in lockstep, from unit start vectors
    [B, n]; returns (one state dict per member, why each unconverged member ended)."""
    B, n, dev, dt = batch.B, batch.shape[0], batch.device, batch.wdtype
    real = not batch.is_complex

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dev, dt)

    V = torch.zeros(B, n, m + bs, dtype=dt, device=dev)
    Hb = torch.zeros(B, m + bs, m, dtype=dt, device=dev)
    V[:, :, 0] = start
    if bs > 1:  # the start block: v0 and bs - 1 random orthonormal columns
        Q = torch.linalg.qr(torch.cat([V[:, :, :1], randn(B, n, bs - 1)], 2)).Q
        V[:, :, :bs] = Q * torch.sgn(Q[:, :, :1].mH @ V[:, :, :1])  # column 0 stays v0

    p = [0] * B
    done = [False] * B
    restarts = [0] * B
    tol_int = [float(tol)] * B
    out: List[Optional[dict]] = [None] * B
    probing = [False] * B   # the current cycle is a verification probe (see module doc)
    kw_prev = [0] * B       # size of the checked wanted set the probe is testing
    probe_cycles = [0] * B  # extra cycles of the current probe
    kth_prev = [0.0] * B    # and the key of its k-th value
    rivalled: List[Optional[Tensor]] = [None] * B  # a checked set a probe has challenged
    best = [float("inf")] * B  # best explicit residual of a check that failed
    stale = [0] * B            # failed checks in a row that did not halve it
    unconverged: List[str] = []  # why each member that ended unconverged did

    def finish(members: List[int]) -> None:  # dense eig of the materialised operators
        dense_members(batch, members, out, k, which, real, order)  # pyright: ignore[reportArgumentType]
        met = _within(out, members, tol)
        for b in members:
            st, done[b] = out[b], True
            st["verified"] = st["converged"] = met[b]  # pyright: ignore[reportOptionalSubscript]
            if not st["converged"]:  # pyright: ignore[reportOptionalSubscript]
                unconverged.append(why(batch.names[b], st, tol, max_restarts, batch.own_dtype(b)))  # pyright: ignore[reportArgumentType]

    if m > DENSE_SHARE * n:
        finish(list(range(B)))
    every = TEST_EVERY if bs == 1 else 0
    while not all(done):
        # single-vector mode extends TEST_EVERY steps at a time: a probe is tested then (a
        # small eig of H, no matvec) and ends as soon as it settles
        t = min(m, min(p[b] for b in range(B) if not done[b]) + every) if every else m
        before = list(p)
        size = extend(batch, V, Hb, p, done, t, bs, randn, stop_at=k + 2 if bs == 1 else 0)
        checks = []
        grow = False
        host = None
        for b in range(B):
            if done[b] or (bs == 1 and before[b] >= t):  # (a member ahead waits)
                continue
            end = size[b] >= m or size[b] < t  # the space is full, or invariant (breakdown)
            if bs == 1:
                p[b] = size[b]
            if not end and (not probing[b] or size[b] < k + 2):
                continue  # mid-cycle tests are for probes only (see TEST_EVERY)
            if host is None:  # every member's projected matrix in one copy a cycle
                host = Hb.cpu()
            st = ritz(host[b], size[b], bs, k, which, real, tol_int[b], device=dev)
            theta, Y, kw = st["theta"], st["Y"], st["kw"]
            passed = st["nconv"] == kw and st["gap_ok"]
            if probing[b]:
                probing[b] = False
                # The probe's own Ritz values are unconverged after one short cycle, so their
                # residual bounds say little; what counts is whether one of them beats the
                # checked k-th value outright (ties, as among exact zeros, are no rival): then
                # a wanted Ritz vector has a component in the probe block (for a normal
                # operator this proves a missed eigenvalue, as Ritz values lie in the convex
                # hull of the deflated operator's spectrum).
                wanted = key(theta[:kw], which)
                part = Y[kw_prev[b]:, :kw].abs().amax(dim=0)
                margin = 1e-8 * abs(kth_prev[b]) if kth_prev[b] else tol * st["scale"]
                rival = bool(((part > 1e-8) & (wanted > kth_prev[b] + margin)).any())
                if not end and (rival or kw != kw_prev[b]
                                or not probe_settled(st, kth_prev[b])):
                    probing[b] = True  # mid-cycle only a settled probe ends; a rival is
                    continue           # judged at the end of the cycle, as before
                if not rival and kw == kw_prev[b]:
                    if probe_settled(st, kth_prev[b]):
                        done[b] = True  # the checked result from before the probe stands
                        continue
                    # the probe's leading Ritz value is still moving: a missed eigenvalue
                    # may be climbing towards the k-th (a second copy of a semisimple one
                    # sits at the edge of a cluster): restart thick, keeping the checked set
                    # and the probe's best vectors, and look again
                    probe_cycles[b] += 1
                    if probe_cycles[b] >= PROBE_MAX_CYCLES:
                        # still moving after PROBE_MAX_CYCLES: the space is too small to tell
                        # (ncv 12 on a Gaussian's clustered top: accepting here returned a
                        # wrong set, converged); widen it and probe on
                        grow, probe_cycles[b] = True, 0
                    probing[b] = True
                    restart(b, st, V, Hb, p, st["m"], bs, real)
                    restarts[b] += 1
                    continue
                # the probe saw a rival of the k-th value: iterate on with the probe's vectors
                # in the basis (and, single-vector mode, a wider space)
                grow = grow or bs == 1
                logger.debug("eigs: %s probe found a Ritz value beyond the k-th",
                             batch.names[b])
            elif not passed and restarts[b] % _STALL == _STALL - 1:  # stagnation: widen too
                grow = True
            if passed or restarts[b] >= max_restarts:
                checks.append(b)
                out[b] = st
            else:
                restart(b, st, V, Hb, p, st["m"], bs, real)
                restarts[b] += 1
        if checks:
            final_check(batch, V, checks, out, real)  # pyright: ignore[reportArgumentType]
            met = _within(out, checks, tol)
            for b in checks:
                st = out[b]
                ok = met[b] and st["nconv"] == st["kw"] and st["gap_ok"]
                st["verified"] = ok and restarts[b] < max_restarts
                st["converged"] = st["verified"]
                if st["verified"] and same_set(st, rivalled[b], tol):
                    # a probe challenged this very set (as a multiset), the iteration went on
                    # with the rival's vectors in its basis, and the rival did not converge
                    # into the top k: it was a Ritz value of the non-normal deflated operator
                    done[b] = True
                elif ok and restarts[b] < max_restarts:
                    # probe: keep only the checked wanted set (Q), restart from a fresh random
                    # vector orthogonal to it; the result stands unless the probe beats it
                    restart(b, st, V, Hb, p, st["m"], bs, real, keep=st["kw"])
                    inject(b, V, Hb, st["kw"], bs, randn)
                    probing[b], kw_prev[b], probe_cycles[b] = True, st["kw"], 0
                    kth_prev[b] = float(key(st["theta"], which)[st["kw"] - 1])
                    rivalled[b] = st["theta"][:st["kw"]].clone()
                    restarts[b] += 1
                elif restarts[b] >= max_restarts:
                    done[b] = True
                    unconverged.append(why(batch.names[b], st, tol, max_restarts, batch.own_dtype(b)))
                elif unreachable(b, st, best, stale, tol_int):
                    # the explicit residual no longer improves as the internal tolerance is
                    # tightened (rounding in the operator, or eigenvalues so ill-conditioned
                    # that Ritz vectors wander): the dense eig where n allows, else end
                    # honestly with the residual attained
                    if n <= DENSE_MAX:
                        finish([b])
                    else:
                        done[b], st["stalled"] = True, True
                        unconverged.append(why(batch.names[b], st, tol, max_restarts, batch.own_dtype(b)))
                else:  # estimates said converged, fresh matvecs disagree: tighten and go on
                    tol_int[b] /= 10.0
                    if logger.isEnabledFor(logging.DEBUG):  # (the read is a sync)
                        logger.debug("eigs: %s explicit residual %.2e > tol; tightening to "
                                     "%.1e", batch.names[b], float(st["resid"].max()),
                                     tol_int[b])
                    restart(b, st, V, Hb, p, st["m"], bs, real)
                    restarts[b] += 1
        if grow and not all(done):
            # A failed probe means the Krylov space was too small to see the whole top of a
            # clustered spectrum (the case where restarted Arnoldi converges to a wrong set):
            # enlarge it, keeping every member's current decomposition; past DENSE_SHARE of
            # n, the dense eig of the operator is cheaper (and bounded): switch to it.
            # at most n - bs: the residual block must stay orthogonal to the basis
            m2 = min(n - bs, m + max(m // 2, k))
            if m2 > DENSE_SHARE * n:
                logger.debug("eigs: Krylov space would reach %d of n=%d: dense eig", m2, n)
                finish([b for b in range(B) if not done[b]])
                continue
            logger.debug("eigs: Krylov space enlarged, ncv %d -> %d", m, m2)
            V2 = torch.zeros(B, n, m2 + bs, dtype=dt, device=dev)
            H2 = torch.zeros(B, m2 + bs, m2, dtype=dt, device=dev)
            V2[:, :, :m + bs] = V
            H2[:, :m + bs, :m] = Hb
            V, Hb, m = V2, H2, m2
    return out, unconverged
