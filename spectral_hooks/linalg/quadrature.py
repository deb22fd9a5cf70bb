"""Lanczos quadrature: the Gauss rule of a symmetric operator's spectral measure seen from a
block of start vectors, the engine of stochastic Lanczos quadrature (SLQ).

    >>> A = torch.diag(torch.tensor([3.0, 1.0, 0.5, 0.0], dtype=torch.float64))
    >>> Z = torch.ones(4, 1, dtype=torch.float64)
    >>> rule, = lanczos_quadrature(lambda X: A @ X, Z, steps=4)
    >>> [round(t, 9) for t in rule.nodes.tolist()], [round(x, 9) for x in rule.weights.tolist()]
    ([0.0, 0.5, 1.0, 3.0], [0.25, 0.25, 0.25, 0.25])
    >>> rule.exact
    True

For each column z of Z, ``steps`` Lanczos steps on ``apply`` from z / ||z|| (full
reorthogonalisation, twice, Kahan-Parlett) give a tridiagonal T = U diag(theta) U^T; the Ritz
values theta and the weights U[0, :]^2 are the nodes and weights of the Gauss rule, so
z^T f(A) z ~ ||z||^2 sum_j w_j f(theta_j), exact for polynomials of degree < 2 steps and for
every f once the Krylov space is exhausted (``exact``).

``rule.radau(end)`` is the Gauss-Radau rule of the same steps with one node prescribed at
``end``, a bound of the spectrum below it (Golub and Meurant, "Matrices, Moments and
Quadrature", 2010, ch. 6): where f's derivatives of every even order are negative and of every
odd order positive on the spectrum (f = sqrt on [0, inf)), the Gauss rule overestimates the
integral and Gauss-Radau at the spectrum's lower end underestimates it, so the two bracket it.

Shaped for an accelerator: the columns advance together in one block, the basis is allocated
once on Z's device, a column whose Krylov space is exhausted (breakdown) is masked rather than
dropped, and the host reads the state only every ``check_every`` steps (whether any column is
still alive) and once at the end (the tridiagonal matrices, solved on the host).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..errors import OptionError
from .batch import OpBatch
from .operators import LinearOperator

__all__ = ["lanczos_quadrature", "gram_quadrature", "GaussRule"]

#: steps between the host's reads of whether a column is still alive: a column that broke down
#: costs at most this many idle steps; a column alive to the end costs none
CHECK_EVERY = 8
#: a column breaks down where beta <= BREAKDOWN x the largest |alpha| of its steps
BREAKDOWN = 1e-10
#: a Gauss node within this fraction of the largest node from the prescribed end already sits
#: at it: the Gauss rule is then the Gauss-Radau rule (and the bordered system is singular)
AT_END = 1e-13


@dataclass(frozen=True)
class GaussRule:
    """One start vector's Gauss rule: ``nodes`` (Ritz values, ascending) and ``weights``
    (U[0, :]^2, summing to 1) of its m Lanczos steps, whose coefficients it keeps (``alphas``
    [m], ``betas`` [m]: betas[m - 1] couples the next, unbuilt step). ``exact``: the Krylov
    space was exhausted, and the rule is exact for every function."""

    nodes: Tensor
    weights: Tensor
    exact: bool
    alphas: Tensor
    betas: Tensor

    def radau(self, end: float = 0.0) -> tuple[Tensor, Tensor]:
        """(nodes, weights) of the Gauss-Radau rule with a node prescribed at ``end``, a bound
        of the spectrum below every node: the tridiagonal bordered by betas[m - 1] and
        end + delta_m, where (T - end I) delta = betas[m - 1]^2 e_m (Golub-Meurant). The Gauss
        rule itself where it is exact or already has a node at ``end``."""
        T = _tridiagonal(self.alphas, self.betas)
        theta, U = torch.linalg.eigh(T)
        m = theta.numel()
        gap, scale = float(theta[0]) - end, AT_END * float(theta.abs().max().clamp(min=1e-300))
        if gap < -scale:
            raise OptionError("end", end, f"a bound of the spectrum at or below the smallest "
                              f"node, {float(theta[0]):.6g}", hint="GaussRule.radau")
        if self.exact or gap <= scale:
            return self.nodes, self.weights
        b = self.betas[m - 1]
        delta = b ** 2 * float((U[m - 1] ** 2 / (theta - end)).sum())
        bordered = torch.zeros(m + 1, m + 1, dtype=T.dtype)
        bordered[:m, :m] = T
        bordered[m, m - 1] = bordered[m - 1, m] = b
        bordered[m, m] = end + delta
        nodes, V = torch.linalg.eigh(bordered)
        return nodes.clamp(min=end), V[0] ** 2


def lanczos_quadrature(apply: Callable[[Tensor], Tensor], Z: Tensor, steps: int, *,
                       check_every: int = CHECK_EVERY,
                       nonfinite: Optional[Callable[[], Exception]] = None
                       ) -> list[GaussRule]:
    """Per column of ``Z`` [d, s] (float64, any device): the :class:`GaussRule` of ``steps``
    Lanczos steps on the symmetric map ``apply`` ([d, s] -> [d, s], on Z's device), on the
    host. ``exact``: the column's Krylov space was exhausted (breakdown, or d steps), so its
    quadrature is exact for every function. ``nonfinite``: the error to raise
    where a product holds NaN or Inf, tested on the device every step and read with the
    breakdown check (None: ``apply`` tests its products itself)."""
    d, s = Z.shape
    device = Z.device
    basis = torch.zeros(steps + 1, d, s, dtype=torch.float64, device=device)
    basis[0] = Z / Z.norm(dim=0, keepdim=True)
    alphas = torch.zeros(steps, s, dtype=torch.float64, device=device)
    betas = torch.zeros(steps, s, dtype=torch.float64, device=device)
    alive = torch.ones(s, dtype=torch.bool, device=device)
    lengths = torch.full((s,), steps, dtype=torch.long, device=device)
    scale = torch.zeros(s, dtype=torch.float64, device=device)
    finite = torch.ones((), dtype=torch.bool, device=device)
    done = 0
    for j in range(steps):
        Q = basis[j]
        W = apply(Q)
        if nonfinite is not None:
            finite = finite & torch.isfinite(W).all()
        a = (Q * W).sum(0)
        W = W - a * Q
        if j:
            W = W - betas[j - 1] * basis[j - 1]
        span = basis[:j + 1]  # [j+1, d, s]
        for _ in range(2):  # twice is enough (Kahan-Parlett)
            W = W - torch.einsum("jds,js->ds", span, torch.einsum("jds,ds->js", span, W))
        b = W.norm(dim=0)
        alphas[j] = a
        scale = torch.maximum(scale, a.abs())
        stop = alive & (b <= BREAKDOWN * scale.clamp(min=1e-300))
        lengths = torch.where(stop, j + 1, lengths)
        alive = alive & ~stop
        betas[j] = torch.where(alive, b, torch.zeros_like(b))
        done = j + 1
        if j == steps - 1:
            break
        if done % check_every == 0:
            any_alive, all_finite = torch.stack([alive.any(), finite]).tolist()  # one read
            if not all_finite or not any_alive:
                break
        basis[j + 1] = torch.where(alive, W / b.clamp(min=1e-300), torch.zeros_like(W))
    if nonfinite is not None and not bool(finite):
        raise nonfinite()
    # (every column that ran to the end has its full length; the others stopped by `done`)
    A, B = alphas[:done].cpu(), betas[:done].cpu()
    out = []
    for c, m in enumerate(lengths.tolist()):
        theta, U = torch.linalg.eigh(_tridiagonal(A[:m, c], B[:m, c]))
        out.append(GaussRule(theta.clamp(min=0.0), U[0] ** 2, m < steps or m >= d, A[:m, c],
                             B[:m, c]))
    return out


def gram_quadrature(operators: Sequence[LinearOperator], probes: Sequence[Tensor], steps: int,
                    *, what: str = "gram_quadrature") -> list[list[GaussRule]]:
    """Per operator P_i (one shape [m, d], each with an adjoint) and each column of its
    ``probes[i]`` [d, s] (float64): the :class:`GaussRule` of ``steps`` Lanczos steps on
    P_i^H P_i, all of them in lockstep (:func:`lanczos_quadrature` on every column at once: a
    step is one product of the batch and one of its adjoint; operators of one
    :class:`~spectral_hooks.linalg.protocols.BatchGroup`, e.g. a
    :class:`~spectral_hooks.linalg.ChainProducts`, are applied together). A NaN / Inf product
    raises the operators' own error (naming the part at fault) or a FloatingPointError
    naming them.

    >>> import torch
    >>> from spectral_hooks.linalg import DenseOperator
    >>> P = torch.diag(torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64))
    >>> rules = gram_quadrature([DenseOperator(P)], [torch.ones(3, 1, dtype=torch.float64)], 3)
    >>> (rule,) = rules.pop()  # P's rules: one per probe column
    >>> [round(float(x), 12) for x in rule.nodes], rule.exact
    ([0.0, 1.0, 9.0], True)
    """
    if len(probes) != len(operators) or not operators:
        raise ValueError(f"{what}: {len(probes)} probe blocks for {len(operators)} operators")
    batch = OpBatch(list(operators), what=what)
    batch.need_adjoint()
    d, B = batch.shape[1], batch.B
    widths = {int(Z.shape[1]) for Z in probes}
    if len(widths) != 1 or any(Z.shape[0] != d for Z in probes):
        raise ValueError(f"{what}: every probe block must be [{d}, s] with one s, got "
                         f"{[tuple(Z.shape) for Z in probes]}")
    s = widths.pop()
    every = [True] * B

    def apply(X: Tensor) -> Tensor:  # on the operators' device: no host copy a step
        Xb = X.reshape(d, B, s).permute(1, 0, 2)
        Y = batch.apply(Xb, every, check=False)
        W = batch.apply(Y, every, adjoint=True, check=False)
        return W.real.permute(1, 0, 2).reshape(d, B * s).to(torch.float64)

    def nonfinite() -> Exception:
        for op in operators:  # the operators' own tests name the part at fault
            op.caller_checks_finite = False
            err = op.nonfinite_error()
            if err is not None:
                return err
        return FloatingPointError(f"{what}: a product of {batch.names} (or of an adjoint) "
                                  "holds NaN or Inf")

    Z = torch.cat([Zi.to(torch.float64) for Zi in probes], dim=1)  # [d, B s]: block i, P_i's
    norms = Z.norm(dim=0)  # (probes are drawn on the host: no sync)
    bad = ~(torch.isfinite(norms) & (norms > 0))
    if bool(bad.any()):
        i, c = divmod(int(bad.nonzero()[0, 0]), s)
        raise ValueError(f"{what}: probes[{i}] column {c} is "
                         f"{'zero' if norms[i * s + c] == 0 else 'not finite'}; a quadrature "
                         "starts from a nonzero, finite vector")
    with contextlib.ExitStack() as stack:  # the quadrature tests the products on the device
        for op in operators:
            stack.enter_context(op.checked_by_caller())
        rules = lanczos_quadrature(apply, Z.to(batch.device), steps, nonfinite=nonfinite)
    return [rules[i * s:(i + 1) * s] for i in range(B)]


def _tridiagonal(alphas: Tensor, betas: Tensor) -> Tensor:
    """The Lanczos tridiagonal of the steps (betas' last entry, the next step's, left out)."""
    b = betas[:-1]
    return torch.diag(alphas) + torch.diag(b, 1) + torch.diag(b, -1)
