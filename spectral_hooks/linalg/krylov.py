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
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Literal, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import OptionError, OptionTypeError
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
    validate,
    warn_unconverged,
    why,
)
from .materialize import materialised, pays, recheck
from .results import EigResult, EigState
from .schur_restart import final_check, inject, restart, same_set

if TYPE_CHECKING:
    from .operators import LinearOperator

__all__ = ["eigs", "probe_settled"]

logger: logging.Logger = logging.getLogger(__name__)
_STALL = 40  # restarts without convergence before the Krylov space is enlarged
_STALE = 3  # failed explicit checks in a row that do not halve the residual: unreachable


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


def probe_settled(st: EigState, kth: float) -> bool:
    """Has the probe's leading Ritz value settled (module doc)? ``kth``: the key of the
    checked k-th value. Reads only numbers ritz() has on the host (no sync)."""
    if st["lead"] is None:
        return True
    lead, est = st["lead"]
    if lead + PROBE_REACH * est < kth:
        return True
    return est <= PROBE_TOL * max(abs(lead), 1e-12 * st["scale"])


def _within(states: List[EigState], tol: float) -> List[bool]:
    """Is every fresh residual <= tol, for each of ``states``, in one host read."""
    return torch.stack([(st["resid"] <= tol).all() for st in states]).tolist()


def eigs(op: LinearOperator | Sequence[LinearOperator] | Tensor, k: int, *,
         which: str = "LM", tol: float = 1e-10, max_restarts: int = 1000,
         ncv: Optional[int] = None, v0: Optional[Tensor] = None, seed: int = 0,
         return_vectors: bool = True, block_size: Optional[int] = None,
         materialize: Union[bool, Literal["auto"], Tensor] = False,
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
    for n instead of ~400 columns), or the operators' matrices, already formed by the caller
    (``materialize.matrix_of``; shape [n, n], or [B, n, n] for a list of B): iterate on
    them, every returned pair checked with fresh products of the operator, as with True.
    Returns an :class:`EigResult` (module doc: guarantees).
    """
    batch = OpBatch(op, what="eigs")
    check_int("seed", seed, minimum=-2 ** 63, maximum=2 ** 64 - 1)  # torch.Generator's range
    given = materialize if isinstance(materialize, Tensor) else None
    if given is None and not (isinstance(materialize, bool) or (
            isinstance(materialize, str) and materialize == "auto")):
        raise OptionTypeError("materialize", materialize,
                              'True, False, "auto" (by cost) or the operators\' matrices')
    if given is not None and batch.ops is None:
        raise OptionError("materialize", "a matrix", "True, False or \"auto\": op is a dense "
                          "tensor already", hint="pass the matrix as op")
    m, bs = validate(batch, k, which, tol, ncv, max_restarts,
                     block_size_for(batch, block_size, device_path))
    gen = torch.Generator().manual_seed(int(seed))
    start = start_vectors(batch, v0, gen)
    if batch.ops is not None and (given is not None or materialize is True or (
            materialize == "auto" and block_size is None and pays(batch, m=m))):
        dense = materialised(batch, given)
        m, bs = validate(dense, k, which, tol, ncv, max_restarts,
                         block_size_for(dense, block_size, device_path))
        out, unconverged = _run(dense, k, which, tol, max_restarts, m, bs, start, gen)
        unconverged += recheck(batch, out, tol)
    else:
        out, unconverged = _run(batch, k, which, tol, max_restarts, m, bs, start, gen)
    warn_unconverged(unconverged, max_restarts)
    return assemble(batch, out, return_vectors)


def _run(batch: OpBatch, k: int, which: str, tol: float, max_restarts: int, m: int, bs: int,
         start: Tensor, gen: torch.Generator) -> Tuple[List[EigState], List[str]]:
    """The iteration for ``batch``: in lockstep, or member by member (``one_at_a_time``)."""
    if not one_at_a_time(batch):
        return _solve(batch, k, which, tol, max_restarts, m, bs, start, gen)
    out: List[EigState] = []
    unconverged: List[str] = []
    for b in range(batch.B):
        member = batch.member(b)
        got, reasons = _solve(member, k, which, tol, max_restarts, m, bs, start[b:b + 1], gen)
        out += got
        unconverged += reasons
        batch.counts[b] = member.counts[0]
    return out, unconverged


def _solve(batch: OpBatch, k: int, which: str, tol: float, max_restarts: int, m: int, bs: int,
           start: Tensor, gen: torch.Generator) -> Tuple[List[EigState], List[str]]:
    """The iteration for every member of ``batch`` in lockstep, from unit start vectors
    [B, n]; returns (one state dict per member, why each unconverged member ended)."""
    return _Lockstep(batch, k, which, tol, max_restarts, m, bs, start, gen).run()


@dataclass(eq=False)
class _Probe:
    """A verification probe in progress (module doc): the checked set it tests."""

    kw: int          # the size of the checked wanted set
    kth: float       # the key of its k-th value
    cycles: int = 0  # extra cycles while its leading Ritz value still moves


@dataclass(eq=False)
class _Member:
    """One operator's iteration state in a lockstep run."""

    b: int               # its index in the batch
    tol_int: float       # the Ritz tests' tolerance (tightened when fresh products refute them)
    p: int = 0           # basis columns multiplied so far
    done: bool = False
    restarts: int = 0
    result: Optional[EigState] = None      # the last checked (or dense) state: what eigs returns
    probe: Optional[_Probe] = None     # the current cycle is a verification probe
    rivalled: Optional[Tensor] = None  # a checked set a probe has challenged
    best: float = float("inf")         # best explicit residual of a check that failed
    stale: int = 0                     # failed checks in a row that did not halve it

    def unreachable(self, st: EigState) -> bool:
        """A failed explicit check: is tol out of reach (the attained residual stopped
        improving over _STALE tightenings of the internal tolerance, or that would go below
        rounding)?"""
        r = float(st["resid"].max())
        if r < 0.5 * self.best:
            self.best, self.stale = r, 0
        else:
            self.stale += 1
        return self.stale >= _STALE or self.tol_int / 10 < 10 * torch.finfo(torch.float64).eps

    def checked(self) -> EigState:
        """The member's result (set once its first check, or the dense eig, has run)."""
        assert self.result is not None, "a member ended without a result"
        return self.result


def _rival(st: EigState, probe: _Probe, which: str, tol: float) -> bool:
    """Does a Ritz value of the probe's space beat the checked k-th value outright, with a
    wanted Ritz vector reaching into the probe's block (ties, as among exact zeros, are no
    rival)? The probe's own Ritz values are unconverged after one short cycle, so their
    residual bounds say little; for a normal operator a rival proves a missed eigenvalue, as
    Ritz values lie in the convex hull of the deflated operator's spectrum."""
    kw = st["kw"]
    wanted = key(st["theta"][:kw], which)
    part = st["Y"][probe.kw:, :kw].abs().amax(dim=0)
    margin = 1e-8 * abs(probe.kth) if probe.kth else tol * st["scale"]
    return bool(((part > 1e-8) & (wanted > probe.kth + margin)).any())


class _Lockstep:
    """Restarted Krylov-Schur for every member of a batch in lockstep (module doc): the
    shared basis V [B, n, m + bs] and projected matrices Hb [B, m + bs, m], one
    :class:`_Member` per operator. A cycle: extend every running member's space, test the
    members whose cycle ended (and probes, mid-cycle), check the passed ones with fresh
    products, enlarge the space if a probe or a stall asks for it."""

    def __init__(self, batch: OpBatch, k: int, which: str, tol: float, max_restarts: int,
                 m: int, bs: int, start: Tensor, gen: torch.Generator) -> None:
        self.batch, self.k, self.which, self.tol = batch, k, which, tol
        self.max_restarts, self.m, self.bs, self.gen = max_restarts, m, bs, gen
        self.n, self.real = batch.shape[0], not batch.is_complex
        B, n, dev, dt = batch.B, self.n, batch.device, batch.wdtype
        self.V = torch.zeros(B, n, m + bs, dtype=dt, device=dev)
        self.Hb = torch.zeros(B, m + bs, m, dtype=dt, device=dev)
        self.V[:, :, 0] = start
        if bs > 1:  # the start block: v0 and bs - 1 random orthonormal columns
            Q = torch.linalg.qr(torch.cat([self.V[:, :, :1], self.randn(B, n, bs - 1)], 2)).Q
            self.V[:, :, :bs] = Q * torch.sgn(Q[:, :, :1].mH @ self.V[:, :, :1])  # v0 stays
        self.members = [_Member(b, float(tol)) for b in range(B)]
        self.unconverged: List[str] = []  # why each member that ended unconverged did
        self.grow = False  # this cycle asks for a wider space

    def randn(self, *shape: int) -> Tensor:
        """Gaussian entries from the run's generator, on the batch's device and dtype."""
        return torch.randn(*shape, generator=self.gen, dtype=torch.float64).to(
            self.batch.device, self.batch.wdtype)

    def running(self) -> List[_Member]:
        """The members not done yet."""
        return [mb for mb in self.members if not mb.done]

    def run(self) -> Tuple[List[EigState], List[str]]:
        """Iterate until every member is done; (each member's result, the reasons)."""
        if self.m > DENSE_SHARE * self.n:
            self.finish(self.members)
        while self.running():
            self.grow = False
            tested = self.expand()
            host = self.Hb.cpu() if tested else None  # every projected matrix in one copy
            checks = []
            for mb, size, end in tested:
                assert host is not None
                st = ritz(host[mb.b], size, self.bs, self.k, self.which, self.real, mb.tol_int,
                          device=self.batch.device)
                if self.test(mb, st, end):
                    checks.append(mb)
            if checks:
                self.check(checks)
            if self.grow and self.running():
                self.enlarge()
        return [mb.checked() for mb in self.members], self.unconverged

    def expand(self) -> List[Tuple[_Member, int, bool]]:
        """Extend every running member's space: to ncv columns, or in single-vector mode
        TEST_EVERY steps at a time (a probe is tested then: a small eig of H, no matvec, and
        ends as soon as it settles). Returns the members to test now: (member, its size, its
        cycle ended: the space is full, or invariant after a breakdown)."""
        running, bs, m = self.running(), self.bs, self.m
        t = min(m, min(mb.p for mb in running) + TEST_EVERY) if bs == 1 else m
        p = [mb.p for mb in self.members]
        size = extend(self.batch, self.V, self.Hb, p, [mb.done for mb in self.members], t, bs,
                      self.randn, stop_at=self.k + 2 if bs == 1 else 0)
        tested = []
        for mb in running:
            if bs == 1 and mb.p >= t:  # (a member ahead waits)
                continue
            mb.p = size[mb.b] if bs == 1 else p[mb.b]
            end = size[mb.b] >= m or size[mb.b] < t
            # mid-cycle tests are for probes only (see TEST_EVERY)
            if end or (mb.probe is not None and size[mb.b] >= self.k + 2):
                tested.append((mb, size[mb.b], end))
        return tested

    def test(self, mb: _Member, st: EigState, end: bool) -> bool:
        """The Ritz tests of one member (a probe's, mid-cycle too); True when its state is to
        be checked with fresh products, else it has restarted, or ended, or goes on."""
        passed = st["nconv"] == st["kw"] and st["gap_ok"]
        if mb.probe is not None:
            if self.judge_probe(mb, st, end):
                return False
        elif not passed and mb.restarts % _STALL == _STALL - 1:  # stagnation: widen too
            self.grow = True
        if passed or mb.restarts >= self.max_restarts:
            mb.result = st
            return True
        self.restart(mb, st)
        return False

    def judge_probe(self, mb: _Member, st: EigState, end: bool) -> bool:
        """A probe's verdict: True when it is over for this cycle (it goes on, restarted
        thick or mid-cycle, or its checked result stands); False when it saw a rival of the
        k-th value, and the member iterates on with the probe's vectors in its basis (and,
        single-vector mode, a wider space)."""
        probe, mb.probe = mb.probe, None
        assert probe is not None
        rival = _rival(st, probe, self.which, self.tol)
        same = st["kw"] == probe.kw
        if not end and (rival or not same or not probe_settled(st, probe.kth)):
            mb.probe = probe  # mid-cycle only a settled probe ends; a rival is judged at the
            return True       # end of the cycle
        if not rival and same:
            if probe_settled(st, probe.kth):
                mb.done = True  # the checked result from before the probe stands
                return True
            # the probe's leading Ritz value is still moving: a missed eigenvalue may be
            # climbing towards the k-th (a second copy of a semisimple one sits at the edge of
            # a cluster): restart thick, keeping the checked set and the probe's best vectors,
            # and look again
            probe.cycles += 1
            if probe.cycles >= PROBE_MAX_CYCLES:
                # still moving after PROBE_MAX_CYCLES: the space is too small to tell (ncv 12
                # on a Gaussian's clustered top: accepting here returned a wrong set,
                # converged); widen it and probe on
                self.grow, probe.cycles = True, 0
            mb.probe = probe
            self.restart(mb, st)
            return True
        self.grow = self.grow or self.bs == 1
        logger.debug("eigs: %s probe found a Ritz value beyond the k-th", self.batch.names[mb.b])
        return False

    def restart(self, mb: _Member, st: EigState, keep: Optional[int] = None) -> None:
        """Krylov-Schur restart of ``mb`` from its Ritz state ``st`` (schur_restart)."""
        mb.p = restart(mb.b, st, self.V, self.Hb, st["m"], self.bs, self.real, keep=keep)
        mb.restarts += 1

    def check(self, checks: List[_Member]) -> None:
        """Fresh products for the members whose Ritz tests passed (or whose restart budget
        ran out), and each one's next step."""
        states = {mb.b: mb.checked() for mb in checks}
        final_check(self.batch, self.V, list(states), states, self.real)
        for mb, met in zip(checks, _within(list(states.values()), self.tol)):
            self.after_check(mb, mb.checked(), met)

    def after_check(self, mb: _Member, st: EigState, met: bool) -> None:
        """One member after its check: done, a verification probe, the dense eig, or on
        with a tighter internal tolerance."""
        within_budget = mb.restarts < self.max_restarts
        ok = met and st["nconv"] == st["kw"] and st["gap_ok"]
        st["verified"] = st["converged"] = ok and within_budget
        if st["verified"] and same_set(st, mb.rivalled, self.tol):
            # a probe challenged this very set (as a multiset), the iteration went on with the
            # rival's vectors in its basis, and the rival did not converge into the top k: it
            # was a Ritz value of the non-normal deflated operator
            mb.done = True
        elif ok and within_budget:
            self.start_probe(mb, st)
        elif not within_budget:
            self.give_up(mb, st)
        elif mb.unreachable(st):
            # the explicit residual no longer improves as the internal tolerance is tightened
            # (rounding in the operator, or eigenvalues so ill-conditioned that Ritz vectors
            # wander): the dense eig where n allows, else end honestly with the residual
            # attained
            if self.n <= DENSE_MAX:
                self.finish([mb])
            else:
                st["stalled"] = True
                self.give_up(mb, st)
        else:  # estimates said converged, fresh matvecs disagree: tighten and go on
            mb.tol_int /= 10.0
            if logger.isEnabledFor(logging.DEBUG):  # (the read is a sync)
                logger.debug("eigs: %s explicit residual %.2e > tol; tightening to %.1e",
                             self.batch.names[mb.b], float(st["resid"].max()), mb.tol_int)
            self.restart(mb, st)

    def start_probe(self, mb: _Member, st: EigState) -> None:
        """Verification probe: keep only the checked wanted set (Q), restart from a fresh
        random vector orthogonal to it; the result stands unless the probe beats it."""
        kw = st["kw"]
        mb.p = restart(mb.b, st, self.V, self.Hb, st["m"], self.bs, self.real, keep=kw)
        inject(mb.b, self.V, self.Hb, kw, self.bs, self.randn)
        mb.probe = _Probe(kw, float(key(st["theta"], self.which)[kw - 1]))
        mb.rivalled = st["theta"][:kw].clone()
        mb.restarts += 1

    def give_up(self, mb: _Member, st: EigState) -> None:
        """End ``mb`` unconverged, saying why."""
        mb.done = True
        self.unconverged.append(why(self.batch.names[mb.b], st, self.tol, self.max_restarts,
                                    self.batch.own_dtype(mb.b)))

    def finish(self, members: List[_Member]) -> None:
        """End ``members`` with the dense eig of their materialised operators (dense.py)."""
        got = dense_members(self.batch, [mb.b for mb in members], self.k, self.which,
                            self.real, order)
        met = _within([got[mb.b] for mb in members], self.tol)
        for mb, ok in zip(members, met):
            st = mb.result = got[mb.b]
            mb.done = True
            st["verified"] = st["converged"] = ok
            if not ok:
                self.unconverged.append(why(self.batch.names[mb.b], st, self.tol,
                                            self.max_restarts, self.batch.own_dtype(mb.b)))

    def enlarge(self) -> None:
        """A failed probe means the Krylov space was too small to see the whole top of a
        clustered spectrum (the case where restarted Arnoldi converges to a wrong set):
        enlarge it, keeping every member's current decomposition; past DENSE_SHARE of n, the
        dense eig of the operator is cheaper (and bounded): switch to it."""
        n, m, bs = self.n, self.m, self.bs
        # at most n - bs: the residual block must stay orthogonal to the basis
        m2 = min(n - bs, m + max(m // 2, self.k))
        if m2 > DENSE_SHARE * n:
            logger.debug("eigs: Krylov space would reach %d of n=%d: dense eig", m2, n)
            self.finish(self.running())
            return
        logger.debug("eigs: Krylov space enlarged, ncv %d -> %d", m, m2)
        B, dt, dev = self.batch.B, self.V.dtype, self.V.device
        V2 = torch.zeros(B, n, m2 + bs, dtype=dt, device=dev)
        H2 = torch.zeros(B, m2 + bs, m2, dtype=dt, device=dev)
        V2[:, :, :m + bs] = self.V
        H2[:, :m + bs, :m] = self.Hb
        self.V, self.Hb, self.m = V2, H2, m2
