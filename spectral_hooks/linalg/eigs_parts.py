"""Pieces of :func:`~.krylov.eigs` (internal): Ritz pairs and their tests, stop rules, result.

Example::

    >>> import torch
    >>> order(torch.tensor([1 + 0j, -3 + 0j, 2j, -2j]), "LM").tolist()
    [1, 2, 3, 0]
"""

from __future__ import annotations

import logging
import warnings
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..checks import check_float, check_has_data, check_int
from ..errors import ConvergenceWarning, OptionError
from .batch import OpBatch
from .results import EigResult, EigState
from .schur_restart import ZETA

logger: logging.Logger = logging.getLogger(__name__)
_EPS = torch.finfo(torch.float64).eps


def start_vectors(batch: OpBatch, v0: Optional[Tensor], gen: torch.Generator) -> Tensor:
    """Unit start vectors [B, n]: ``v0`` (broadcast over the batch) or random from ``gen``."""
    B, n, dev, dt = batch.B, batch.shape[0], batch.device, batch.wdtype
    if v0 is None:
        start = torch.randn(B, n, generator=gen, dtype=torch.float64).to(dev, dt)
    else:
        if not isinstance(v0, Tensor) or v0.shape[-1] != n:
            what = tuple(v0.shape) if isinstance(v0, Tensor) else type(v0).__name__
            raise OptionError("v0", what, f"a tensor [..., {n}]")
        check_has_data("v0", v0)
        try:
            start = v0.to(dev, dt).expand(*batch.batch_shape, n).reshape(B, n).clone()
        except RuntimeError:
            raise OptionError("v0", tuple(v0.shape), f"a tensor [{n}] or one that broadcasts to "
                              f"the batch {[*batch.batch_shape, n]}") from None
        if not bool(torch.isfinite(start).all()):
            raise OptionError("v0", "a vector with NaN or Inf", "a finite start vector")
    norms = torch.linalg.vector_norm(start, dim=1, keepdim=True)
    if not bool((norms > 0).all()):
        raise OptionError("v0", "a zero vector", "a non-zero start vector")
    return start / norms


def order(theta: Tensor, which: str) -> Tensor:
    """Permutation sorting Ritz values by ``which``, conjugate pairs adjacent, +imag first.

    The keys are computed from (re, |im|), so the two members of a pair get bitwise equal
    keys (``Tensor.abs`` of a complex tensor need not: its vectorised and scalar lanes round
    differently), and each +imag value is followed by its conjugate even where several pairs
    tie (a permutation matrix's i, i, -i, -i).
    """
    re, im = theta.real, theta.imag.abs()
    scale = torch.maximum(re.abs().amax(), im.amax()).clamp(min=torch.finfo(re.dtype).tiny) \
        if theta.numel() else re.new_ones(())
    r, i = re / scale, im / scale
    mod = torch.sqrt(r * r + i * i)  # rounded alike in every lane (no complex abs)
    primary = {"LM": -mod, "LR": -re, "SM": mod}[which]
    idx = torch.arange(theta.shape[0], device=theta.device)
    for key in (-theta.imag, -re, -im, primary):  # least significant first, stable sorts
        idx = idx[torch.sort(key[idx], stable=True).indices]
    return _pairs_adjacent(theta, idx)


def _pairs_adjacent(theta: Tensor, idx: Tensor) -> Tensor:
    """``idx`` with each +imag value's exact conjugate moved right after it (one host read;
    a real matrix's eig returns its pairs as exact conjugates)."""
    values = theta[idx].tolist()
    perm = idx.tolist()
    taken = [False] * len(perm)
    out = []
    for a, v in enumerate(values):
        if taken[a]:
            continue
        taken[a] = True
        out.append(perm[a])
        if v.imag > 0:
            partner = next((b for b in range(a + 1, len(values))
                            if not taken[b] and values[b] == v.conjugate()), None)
            if partner is not None:
                taken[partner] = True
                out.append(perm[partner])
    return torch.tensor(out, dtype=idx.dtype, device=idx.device)


def key(theta: Tensor, which: str) -> Tensor:
    """The sort key of ``which`` for Ritz values ``theta``: larger is wanted first
    ("LM": modulus, "LR": real part, "SM": minus the modulus).
    """
    return {"LM": theta.abs(), "LR": theta.real, "SM": -theta.abs()}[which]


def ritz(Hb: Tensor, s: int, bs: int, k: int, which: str, real: bool, tol: float,
         device: Optional[torch.device] = None) -> EigState:
    """Ritz pairs of one member's space of s columns, sorted, with their convergence tests.

    A pair converges when its residual estimate ||R^T y|| <= tol |theta| (|theta| clamped to
    eps^(2/3) ||H||, as ARPACK); an exact zero (|theta| <= ZETA ||A||, e.g. the null space of
    a rank-deficient operator) when ||R^T y|| <= tol ||A||. The k-th value is separated when
    the next one is converged, cannot reach it within its residual, or both are exact zeros.
    """
    dev = Hb.device if device is None else device
    # the small projected problem is solved on the host: one copy (one sync, none where the
    # caller passes a host copy of every member's matrix) instead of the device eig's own host
    # round trips (it runs on the CPU anyway, MAGMA geev)
    Hb = Hb[:s + bs, :s].cpu()
    H, R = Hb[:s, :s], Hb[s:s + bs, :s]
    theta, Y = torch.linalg.eig(H)
    est = torch.linalg.vector_norm(R.to(Y.dtype) @ Y, dim=0)
    idx = order(theta, which)
    theta, Y, est = theta[idx], Y[:, idx], est[idx]
    # every number the tests need, read in ONE host sync (issue 24: each is a GPU stall)
    scale_t = torch.linalg.vector_norm(Hb[:s + bs, :s], dim=0).max()
    floor_t = _EPS ** (2 / 3) * torch.linalg.matrix_norm(H)
    zero_t = theta.abs() <= ZETA * scale_t
    denom = torch.where(zero_t, scale_t.to(est.dtype).expand_as(est),
                        torch.maximum(theta.abs(), floor_t))
    conv_t = est <= tol * denom
    kv_t = key(theta, which)
    lo = k - 1
    host = torch.cat([conv_t.to(est.dtype), theta.imag, kv_t[lo:lo + 3], est[lo:lo + 3],
                      zero_t[lo:lo + 3].to(est.dtype), scale_t.reshape(1).to(est.dtype)]).tolist()
    conv = [bool(c) for c in host[:s]]
    imag = host[s:2 * s]
    kv, e3, z3 = host[2 * s:2 * s + 3], host[2 * s + 3:2 * s + 6], host[2 * s + 6:2 * s + 9]
    scale = host[-1]
    kw = k + 1 if (real and imag[k - 1] > 0) else k
    i = kw - lo  # kw and kw - 1 in the three values read from k - 1 on
    gap_ok = bool(conv[kw] or kv[i] + e3[i] < kv[i - 1]
                  or (which == "LM" and z3[i - 1] and z3[i]))
    lead = (kv[i], e3[i]) if i < len(kv) else None  # the first value beyond the wanted set
    # host to device without a sync (a blocking copy would drain the device's queue)
    return dict(theta=theta.to(dev, non_blocking=True), Y=Y.to(dev, non_blocking=True),
                est=est.to(dev, non_blocking=True), kw=kw, gap_ok=gap_ok,
                nconv=sum(conv[:kw]), m=s, scale=scale, imag=imag, lead=lead)


def below_precision(dtype: torch.dtype, tol: float) -> Optional[str]:
    """Why an operator of ``dtype`` may miss ``tol``: its own rounding, where tol is near or
    below it (None otherwise)."""
    eps = torch.finfo(dtype).eps
    if tol >= 1e3 * eps:
        return None
    return (f"tol={tol:g} is near or below what a {dtype} operator computes (eps {eps:.1e}): "
            f"ask for tol >= {1e3 * eps:.0e}, or give a float64 operator")


def why(name: str, st: EigState, tol: float, max_restarts: int,
        dtype: torch.dtype = torch.float64) -> str:
    """Why operator ``name`` (of ``dtype``) did not converge: its unmet criteria, in one line
    for the convergence warning.
    """
    why = []
    if st["nconv"] < st["kw"]:
        why.append(f"only {st['nconv']} of {st['kw']} Ritz pairs reached tol={tol:g}")
    if not bool((st["resid"] <= tol).all()):
        why.append(f"max explicit residual {float(st['resid'].max()):.2e} > tol={tol:g}")
        hint = below_precision(dtype, tol)
        if hint:
            why.append(hint)
    if not st["gap_ok"]:
        why.append("the k-th Ritz value is not separated from the next one")
    if st.get("stalled"):
        why.append("the explicit residual stopped improving: rounding in the operator makes "
                   "tol unreachable (the residual attained is returned)")
    elif st.get("dense"):
        why.append("dense eig of the materialised operator")
    elif not st.get("verified", True):
        why.append("no verification probe (fresh random start, deflated) has passed")
    return f"{name}: " + ("; ".join(why) or "restart budget exhausted")


def warn_unconverged(reasons: List[str], max_restarts: int) -> None:
    """One ConvergenceWarning per eigs call, naming every unconverged operator."""
    if reasons:
        message = (f"eigs did not converge (max_restarts={max_restarts}) for "
                   f"{len(reasons)} operator(s): " + " | ".join(reasons))
        logger.warning("%s", message)
        warnings.warn(message, ConvergenceWarning, stacklevel=3)


def assemble(batch: OpBatch, out: List[EigState], return_vectors: bool) -> EigResult:
    """The :class:`EigResult` of a batch from each operator's final state (values,
    residuals and vectors padded with NaN beyond each operator's wanted count).
    """
    B, n, dev = batch.B, batch.shape[0], batch.device
    K = max(st["kw"] for st in out)
    nan = float("nan")
    vals = torch.full((B, K), complex(nan, nan), dtype=torch.complex128, device=dev)
    res = torch.full((B, K), nan, dtype=torch.float64, device=dev)
    vecs = torch.full((B, n, K), complex(nan, nan), dtype=torch.complex128, device=dev) \
        if return_vectors else None
    for b, st in enumerate(out):
        kw = st["kw"]
        vals[b, :kw] = st["theta"][:kw]
        res[b, :kw] = st["resid"]
        if vecs is not None:
            vecs[b, :, :kw] = st["x"]
    conv = torch.tensor([st["converged"] for st in out], device=dev)
    bs = batch.batch_shape
    return EigResult(
        values=vals.reshape(*bs, K),
        vectors=None if vecs is None else vecs.reshape(*bs, n, K),
        residuals=res.reshape(*bs, K),
        converged=conv.reshape(bs),
        n_matvecs=max(batch.counts),
    )


# ----------------------------------------------------------------------------------------------
# eigs' options: the device-aware block size and the subspace size (see krylov.py's docstring)

_WHICH = ("LM", "LR", "SM")
#: single-vector mode: the default ncv is max(3k, 20, min(6k, NCV_WIDE)) (at most n)
NCV_WIDE = 96


#: block width eigs uses on an accelerator (any device but the CPU) for an operator without a
#: ``block_size`` hint (dense tensors): there a matmul of 32 columns costs about one column's
#: kernel launches and one column's read of the matrix
ACCEL_BLOCK = 32


def block_size_for(batch: OpBatch, block_size: Optional[int], device_path: bool = False) -> int:
    """Columns per operator application: the device-aware default of :func:`eigs` (see its
    docstring), or ``block_size`` as given. ``device_path``: the accelerator's default on any
    device (so a CPU run measures the code a GPU runs)."""
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise OptionError("block_size", block_size, "a positive int or None")
        return block_size
    if batch.device.type == "cpu" and not device_path:
        return 1
    hints = [o.block_size for o in (batch.ops or [])]
    return min(hints) if hints and all(h is not None for h in hints) else ACCEL_BLOCK  # pyright: ignore[reportArgumentType]


#: the least room (columns) beyond the k wanted a Krylov space gets, so that the verification
#: probe has several Arnoldi steps: a given ``ncv`` below k + PROBE_ROOM is raised to it
PROBE_ROOM = 8


def validate(batch: OpBatch, k: int, which: str, tol: float, ncv: Optional[int],
              max_restarts: int, bs: int) -> Tuple[int, int]:
    """Check eigs' options against the batch; raise :class:`OptionError` for a bad one.

    Returns:
        ``(ncv, block_size)``: the subspace size (default chosen here when ``ncv`` is None)
        and the block width that fits it.
    """
    m, n = batch.shape
    if m != n:
        raise OptionError("op", f"an operator of shape {batch.shape}", "a square operator "
                          "(eigs needs one; svds takes rectangular ones)")
    check_int("k", k)
    if not 1 <= k <= n - 2:
        raise OptionError("k", k, f"an int with 1 <= k <= n - 2 = {n - 2}",
                          hint="for the full spectrum use dense torch.linalg.eig")
    if which not in _WHICH:
        raise OptionError("which", which, f"one of {_WHICH}")
    check_float("tol", tol, above=0.0)
    check_int("ncv", ncv, allow_none=True)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise OptionError("max_restarts", max_restarts, "an int >= 0")
    if ncv is None:
        ncv = max(3 * k, 20, 2 * k + 7 * bs) if bs > 1 else 0
        if bs == 1 or ncv + bs > n:  # no room for a block space: the classic method
            bs, ncv = 1, min(n, max(3 * k, 20, min(6 * k, NCV_WIDE)))
    if not (k + 2 <= ncv <= n):
        raise OptionError("ncv", ncv, f"an int with k + 2 = {k + 2} <= ncv <= n = {n}")
    # the verification probe runs in the room beyond the wanted set (k or k + 1 columns): with
    # one or two Arnoldi steps it missed eigenvalues and let wrong sets stand converged (15 of
    # 2,200 Gaussian runs at ncv = k + 2 .. k + 5), so a smaller ncv works at k + PROBE_ROOM
    ncv = max(ncv, min(n, k + PROBE_ROOM))
    # a block wider than the room beyond the wanted set leaves the space no Krylov depth (the
    # block, not its products, fills it) and the probe nothing to check with: found wrong
    # top-k sets reported converged (block >= ncv), so at most (ncv - k) / 2 columns
    return ncv, max(1, min(bs, n - ncv, (ncv - k) // 2))
