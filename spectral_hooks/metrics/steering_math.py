"""Rank-1 steering edit of an attention output projection (METRICS.md section 1), pure math.

Weights in, weight delta out; applying / reverting it on a model is ``spectral_hooks.steering``.

>>> _ = torch.manual_seed(0);  H, dh, d = 2, 2, 4
>>> W_V, W_O = torch.randn(H, dh, d), torch.randn(H, d, dh)
>>> e = rank1_output_edit(W_V, W_O, torch.tensor([1.0, 0.0, 0.0, 0.0]), gap=0.1)
>>> e.gap_after <= 0.1, e.lambda1_after.real > 0, e.reachable_fraction
(True, True, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from spectral_hooks.errors import OptionError
from spectral_hooks.linalg import LowRankOperator, merge_shared_factors
from spectral_hooks.linalg.lowrank import shared_value_groups
from spectral_hooks.metrics.spectrum import layer_spectrum

if TYPE_CHECKING:  # shape annotations only (jaxtyping is not a runtime dependency)
    from jaxtyping import Float

__all__ = ["Rank1Edit", "rank1_output_edit", "stack_value_output"]


@dataclass(frozen=True)
class Rank1Edit:
    """Result of :func:`rank1_output_edit` (float64 tensors; cast before adding to model weights).

    delta_W_O: [H, d, d_head], add to W_O (per-head output projections, column convention).
    alpha: edit strength. w: [H * d_head], the stacked row vector with W_V_stack^T w = u_r.
    u: [d] the unit direction; u_reachable: [d] its projection on the row space of W_V_stack.
    reachable_fraction = ||u_r|| / ||u||; F' = F + alpha u u_r^T.
    lambda1_*, gap_* (= |lambda2| / |lambda1|, "F" ordering), eigvec_cos_* = |cos(v1, u)|
    (v1 the leading eigenvector; for a complex lambda1, the alignment of u with its real plane).
    residual_gap_* = |1 + lambda2| / |1 + lambda1| ("I+F" ordering: the residual update
    x + F x the layer applies to the stream).
    """

    delta_W_O: Float[Tensor, "H d d_head"]
    alpha: float
    w: Float[Tensor, " Hd_head"]
    u: Float[Tensor, " d"]
    u_reachable: Float[Tensor, " d"]
    reachable_fraction: float
    lambda1_before: complex
    lambda1_after: complex
    gap_before: float
    gap_after: float
    eigvec_cos_before: float
    eigvec_cos_after: float
    residual_gap_before: float
    residual_gap_after: float


def stack_value_output(
    W_V: Float[Tensor, "H d_head d"], W_O: Float[Tensor, "H d d_head"]
) -> tuple[Float[Tensor, "Hd_head d"], Float[Tensor, "d Hd_head"]]:
    """Stack per-head maps into V [(H d_head), d] and O [d, (H d_head)] (float64), F = O V.

    >>> V, O = stack_value_output(torch.ones(2, 3, 5), torch.ones(2, 5, 3))
    >>> tuple(V.shape), tuple(O.shape)
    ((6, 5), (5, 6))
    """
    if W_V.ndim != 3 or W_O.ndim != 3:
        shapes = f"{tuple(W_V.shape)}, {tuple(W_O.shape)}"
        raise ValueError(f"W_V must be [H, d_head, d] and W_O [H, d, d_head], got {shapes}")
    H, dh, d = W_V.shape
    if tuple(W_O.shape) != (H, d, dh):
        raise ValueError(f"W_O must be [H, d, d_head] = {(H, d, dh)}, got {tuple(W_O.shape)}")
    V = W_V.detach().to("cpu", torch.float64).reshape(H * dh, d)
    O = W_O.detach().to("cpu", torch.float64).permute(1, 0, 2).reshape(d, H * dh)
    if not (torch.isfinite(V).all() and torch.isfinite(O).all()):
        raise ValueError("W_V / W_O contain NaN or Inf")
    return V, O


@dataclass(frozen=True)
class _Map:
    """shift I + F: F = A B from thin factors (A [d, r], B [r, d], r + 2 < d: grouped-query
    heads merged), its spectrum from the r x r matrix B A; or F dense (B None, A = shift I + F)."""

    A: Tensor
    B: Optional[Tensor] = None
    shift: float = 0.0

    def plus_identity(self) -> "_Map":
        if self.B is None:
            return _Map(self.A + torch.eye(len(self.A), dtype=self.A.dtype))
        return _Map(self.A, self.B, self.shift + 1.0)

    def edited(self, alpha: float, u: Tensor, u_r: Tensor) -> "_Map":
        """shift I + F + alpha u u_r^T (one more column and row of the factors)."""
        if self.B is None:
            return _Map(self.A + alpha * torch.outer(u, u_r))
        return _Map(torch.cat([self.A, alpha * u[:, None]], 1),
                    torch.cat([self.B, u_r[None]], 0), self.shift)

    def dense(self) -> Tensor:
        if self.B is None:
            return self.A
        return self.A @ self.B + self.shift * torch.eye(len(self.A), dtype=self.A.dtype)

    def eig(self) -> tuple[Tensor, Tensor]:
        """Every eigenvalue [d] (the r of B A + shift first, then d - r times shift) and the
        eigenvectors of B A [r, r] (factored only)."""
        assert self.B is not None
        small, Y = torch.linalg.eig(self.B @ self.A)
        rest = torch.zeros(len(self.A) - len(small), dtype=small.dtype)
        return torch.cat([small, rest]) + self.shift, Y


def _leading(m: _Map, u: Tensor, iterate: str = "F") -> tuple[complex, float, float]:
    """lambda1, gap ratio and |cos(v1, u)| of F (unshifted ``m``; ``iterate`` ordering,
    conjugate-aware), every eigenvalue exact (factored: from B A)."""
    F = m.A if m.B is None else LowRankOperator(m.A, m.B)
    s = layer_spectrum(F, iterate, 1e-9, vectors=False, factored_max=len(m.A))
    return s.lambda1, s.gap_ratio, float((s.B.T @ u).norm())


def _ok(m: _Map, u: Tensor, gap: float, min_cos: float) -> bool:
    """Target test of the matrix ``m``: lambda1 real and positive, |lambda2| <= gap lambda1 and
    |cos(v1, u)| >= min_cos. Factored: v1 = A y from B A's eigenvector y (exact)."""
    if m.B is None:
        return _ok_dense(m.A, u, gap, min_cos)
    vals, Y = m.eig()
    mods = vals.abs()
    order = torch.argsort(mods, descending=True)
    first = int(order[0])
    lam1 = vals[first]
    if not (abs(float(lam1.imag)) <= 1e-9 * float(mods[first]) and float(lam1.real) > 0):
        return False
    if float(mods[order[1]]) > gap * float(lam1.real):
        return False
    if first >= Y.shape[1]:  # lambda1 = shift, from the null space of B (only when gap >= 1)
        return _ok_dense(m.dense(), u, gap, min_cos)
    v = m.A.to(torch.complex128) @ Y[:, first]
    return float((v.conj() @ u.to(torch.complex128)).abs() / torch.linalg.vector_norm(v)) \
        >= min_cos


def _ok_dense(F: Tensor, u: Tensor, gap: float, min_cos: float) -> bool:
    """Target test with eigenvalues only (no eigenvectors): one LU inverse-iteration for v1."""
    vals = torch.linalg.eigvals(F)
    mods = vals.abs()
    order = torch.argsort(mods, descending=True)
    lam1 = vals[order[0]]
    if not (abs(float(lam1.imag)) <= 1e-9 * float(mods[order[0]]) and float(lam1.real) > 0):
        return False
    if len(vals) > 1 and float(mods[order[1]]) > gap * float(lam1.real):
        return False
    shift = float(lam1.real) * (1 + 1e-10)
    lu = torch.linalg.lu_factor(F - shift * torch.eye(len(F), dtype=F.dtype))
    v = u[:, None]
    for _ in range(2):  # inverse iteration from u; converges in one step when the gap is small
        v = torch.linalg.lu_solve(*lu, v)
        v = v / v.norm()
    return abs(float(v[:, 0] @ u)) >= min_cos


def _search_alpha(m: _Map, u: Tensor, u_r: Tensor, gap: float, min_cos: float, rtol: float) -> float:
    """Smallest alpha >= 0 (to rtol) with m + alpha u u_r^T meeting the target; see rank1_output_edit."""
    ok = lambda a: _ok(m.edited(a, u, u_r), u, gap, min_cos)  # noqa: E731
    if ok(0.0):
        return 0.0
    vals = torch.linalg.eigvals(m.A) if m.B is None else m.eig()[0]
    scale = float(vals.abs().max()) or float(m.dense().norm()) or 1.0
    lo, hi = 0.0, scale / (gap * float(u_r @ u_r))  # lambda1 ~ alpha |u_r|^2, the rest ~ scale
    if ok(hi):
        while hi * 0.5 > 0 and ok(hi * 0.5):
            hi *= 0.5
        lo = hi * 0.5
    else:
        for _ in range(200):
            lo, hi = hi, 2 * hi
            if ok(hi):
                break
        else:  # pragma: no cover - the target always holds for large alpha when u_r != 0
            raise RuntimeError("no alpha reaches the target")
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _alpha_for_both(m: _Map, u: Tensor, u_r: Tensor, gap: float, min_cos: float,
                    rtol: float) -> float:
    """Smallest alpha (to rtol) meeting the target for F' and for I + F' (see below)."""
    alpha = max(_search_alpha(m, u, u_r, gap, min_cos, rtol),
                _search_alpha(m.plus_identity(), u, u_r, gap, min_cos, rtol))
    for _ in range(60):  # both hold beyond the larger bracket end unless a target is non-monotone
        if _ok(m.edited(alpha, u, u_r), u, gap, min_cos) and _ok(
                m.plus_identity().edited(alpha, u, u_r), u, gap, min_cos):
            return alpha
        alpha *= 2
    raise RuntimeError("no alpha reaches the target")  # pragma: no cover


def _layer_map(V: Tensor, O: Tensor, H: int, u: Tensor) -> tuple[_Map, Tensor]:
    """(F = O V as a _Map, w): w the minimum-norm solution of V^T w = u_r, u_r the projection
    of u on V's row space. Heads sharing their W_V (groups g of size n_g) are merged
    (``linalg.merge_shared_factors``): F = O_g V_g and, as V = E V_g with E^T E = diag(n_g),
    w = E diag(1/n_g) z with z = D pinv(V_g^T D) u, D = diag(sqrt(n_g)) (the same w as
    pinv(V^T) u, from a d x r instead of a d x H d_head pseudo-inverse)."""
    d, dh = V.shape[1], V.shape[0] // H
    W_V = V.reshape(H, dh, d)
    owner, firsts = shared_value_groups(W_V)
    r = len(firsts) * dh
    if r + 2 >= d:  # nothing to gain: dense F
        return _Map(O @ V), torch.linalg.pinv(V.T) @ u
    O_g, V_g = merge_shared_factors(O.reshape(d, H, dh).transpose(0, 1), W_V,
                                    groups=(owner, firsts))
    sizes = torch.bincount(torch.tensor(owner), minlength=len(firsts)).to(torch.float64)
    root = sizes.sqrt().repeat_interleave(dh)
    z = root * (torch.linalg.pinv(V_g.T * root[None, :]) @ u)
    w = (z / sizes.repeat_interleave(dh)).reshape(len(firsts), dh)[owner].reshape(H * dh)
    return _Map(O_g, V_g), w


def rank1_output_edit(
    W_V: Float[Tensor, "H d_head d"],
    W_O: Float[Tensor, "H d d_head"],
    u: Float[Tensor, " d"],
    *,
    alpha: float | None = None,
    gap: float = 0.1,
    min_cos: float = 0.9,
    rtol: float = 1e-2,
) -> Rank1Edit:
    """Edit W_O' = W_O + alpha u w^T so that F' = F + alpha u u_r^T pulls tokens toward u.

    W_V: per-head value maps [H, d_head, d] (for GQA, expanded: head h carries its kv group's
    block); W_O: per-head output maps [H, d, d_head]; F = sum_h W_O[h] W_V[h]. u is normalised.
    Stacking V [(H d_head), d], O [d, (H d_head)], w is the minimum-norm least-squares solution of
    V^T w = u; V^T w = u_r is the projection of u on V's row space (all of u for a full-rank
    multi-head layer; only part of it under GQA, see ``reachable_fraction``), and then
    F' = (O + alpha u w^T) V = F + alpha u u_r^T.

    alpha=None picks the smallest alpha >= 0 for which, for F' and for I + F' alike, lambda1 is
    real and positive, |lambda2| / |lambda1| <= gap and |cos(v1, u)| >= min_cos. F' is the
    attention map; I + F' is the update x + F' x the layer applies to the residual stream, whose
    gap is what decides how far the layer's output turns toward u (with F' alone, gap=0.01 on a
    tiny GPT-2 leaves resid_post at |cos| ~0.6 with u; with both, ~1.0). Per matrix a bracket is found by
    halving / doubling from rho(F) / (gap ||u_r||^2) (the target always holds for large alpha: one
    eigenvalue grows like alpha ||u_r||^2 with eigenvector -> u, the rest stay bounded), then bisection to
    relative width rtol on the assumption that the target is monotone in alpha; the larger of
    the two upper ends is returned (doubled until both targets hold), so it meets both. Each step is one dense float64
    ``eigvals`` (plus one LU inverse iteration for v1 when the eigenvalue tests pass); about ten
    steps in all, so O(10 d^3): fine up to d ~ 2048 on a CPU, slow beyond. Where heads share
    their W_V (grouped-query attention: r = distinct W_V x d_head, r + 2 < d), F' = [O_g, alpha u]
    [V_g; u_r^T] with the shared heads merged, and every step is instead the exact eig of the
    (r + 1) x (r + 1) matrix [V_g; u_r^T] [O_g, alpha u] (v1 = [O_g, alpha u] y): O(10 r^3).
    Raises ValueError for a zero / non-finite / wrong-length u, bad shapes, gap <= 0, or a u with
    no reachable part.
    """
    V, O = stack_value_output(W_V, W_O)
    H, dh, d = W_V.shape
    u = torch.as_tensor(u).detach().to("cpu", torch.float64)
    if u.shape != (d,):
        raise OptionError("direction", f"a tensor of shape {tuple(u.shape)}",
                          f"a vector of shape ({d},)")
    if not torch.isfinite(u).all() or float(u.norm()) == 0:
        raise OptionError("direction", "a zero or non-finite vector", "a finite, non-zero vector")
    if not gap > 0:
        raise OptionError("gap", gap, "a float > 0")
    if not 0 <= min_cos <= 1:
        raise OptionError("min_cos", min_cos, "a float in [0, 1]")
    u = u / u.norm()
    m, w = _layer_map(V, O, H, u)
    u_r = V.T @ w
    frac = min(1.0, float(u_r.norm()))
    if frac <= 1e-12:
        raise ValueError("direction is orthogonal to the value row space: no rank-1 output edit can reach it")
    if alpha is None:
        alpha = _alpha_for_both(m, u, u_r, gap, min_cos, rtol)
    elif not torch.isfinite(torch.tensor(float(alpha))):
        raise OptionError("alpha", alpha, "a finite float or None")
    alpha = float(alpha)
    delta = alpha * torch.einsum("i,hj->hij", u, w.reshape(H, dh))
    edited = m.edited(alpha, u, u_r)
    before, after = _leading(m, u), _leading(edited, u)
    res_before, res_after = _leading(m, u, "I+F")[1], _leading(edited, u, "I+F")[1]
    return Rank1Edit(delta, alpha, w, u, u_r, frac, before[0], after[0], before[1], after[1],
                     before[2], after[2], res_before, res_after)
