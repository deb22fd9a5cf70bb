"""Paper 1's idealised dynamics: attention without FFN, tokens L2-normalised (METRICS.md section 1).

Columns = tokens in the paper; here a token matrix is [n, d] (tokens as rows), so one layer is

    X  <-  N(X + sum_h A_h X (W_O^h W_V^h)^T),      N: every row scaled to unit L2 norm,

with A_h [n, n] the attention pattern of head h (row i: query i, weights over keys j). The
paper's idealisation is uniform attention, A_h = A = 1 1^T / n for every head (causal: row i
uniform over keys 0..i), and then the update is X + A X F^T with F = sum_h W_O^h W_V^h. With
bidirectional uniform attention the mean token takes one power-iteration step on I + F per
layer and the deviations from the mean shrink by 1/||(I + F) xbar|| (tests/metrics/
test_power_theory.py derives it), so tokens align with v_1 of I + F at the rate
max(|mu_2|, 1) / |mu_1| per layer (mu = 1 + lambda).

>>> F = torch.diag(torch.tensor([3.0, 1.0, 0.0]))
>>> X = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 1.0]])
>>> out = idealised_run(X, [F, F])
>>> [round(float(x[:, 0].abs().mean()), 4) for x in out]     # alignment with v_1 = e_1
[0.9428, 0.9961]
>>> pole_stats(torch.tensor([[1.0, 0.0], [-1.0, 0.1]]), torch.tensor([1.0, 0.0]))[1] > 0.99
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional, cast

import torch
from torch import Tensor

if TYPE_CHECKING:  # shape annotations only (jaxtyping is not a runtime dependency)
    from jaxtyping import Float

__all__ = [
    "uniform_attention", "normalise_tokens", "idealised_step", "idealised_run", "pole_stats",
    "oriented", "plane_angle_deg", "tan_ratio", "token_rate",
]


def _f64(x: Tensor) -> Tensor:
    return torch.as_tensor(x).detach().to("cpu", torch.float64)


def uniform_attention(n: int, *, causal: bool = False) -> Float[Tensor, "n n"]:
    """The paper's idealised pattern: row i uniform over all n keys, or over keys 0..i (causal).

    >>> uniform_attention(3, causal=True)[2].tolist()
    [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
    """
    if n < 1:
        raise ValueError(f"need at least one token, got n={n}")
    A = torch.ones(n, n, dtype=torch.float64)
    if causal:
        A = torch.tril(A)
    return A / A.sum(1, keepdim=True)


def normalise_tokens(X: Float[Tensor, "n d"]) -> Float[Tensor, "n d"]:
    """Every token (row) scaled to unit L2 norm, float64. A zero or non-finite token is an error
    (it has no direction to follow)."""
    X = _f64(X)
    if X.ndim != 2:
        raise ValueError(f"tokens must be [n, d], got shape {tuple(X.shape)}")
    if not torch.isfinite(X).all():
        raise ValueError("tokens contain NaN or Inf")
    norms = X.norm(dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("a token is zero: the normalised dynamics is undefined for it")
    return X / norms


def idealised_step(
    X: Float[Tensor, "n d"],
    F: Optional[Float[Tensor, "d d"]] = None,
    *,
    heads: Optional[tuple[Tensor, Tensor]] = None,
    A: Optional[Tensor] = None,
    causal: bool = False,
) -> Float[Tensor, "n d"]:
    """One layer of the idealised dynamics: N(X + sum_h A_h X (W_O^h W_V^h)^T), in float64.

    Give either ``F`` (one pattern for all heads: the update is X + A X F^T) or
    ``heads=(W_V [H, d_head, d], W_O [H, d, d_head])``. ``A``: None (uniform, causal or not),
    one pattern [n, n] shared by all heads, or per-head patterns [H, n, n] (needs ``heads``).
    """
    X = _f64(X)
    n, d = X.shape
    if (F is None) == (heads is None):
        raise ValueError("give exactly one of F and heads=(W_V, W_O)")
    A = uniform_attention(n, causal=causal) if A is None else _f64(A)
    if A.shape[-2:] != (n, n) or A.ndim not in (2, 3):
        raise ValueError(f"attention patterns must be [n, n] or [H, n, n] with n={n}, got {tuple(A.shape)}")
    if heads is None:
        if A.ndim == 3:
            raise ValueError("per-head patterns [H, n, n] need heads=(W_V, W_O), not F")
        assert F is not None  # exactly one of F and heads (checked above)
        F = _f64(F)
        if F.shape != (d, d):
            raise ValueError(f"F must be [{d}, {d}], got {tuple(F.shape)}")
        update = A @ X @ F.T
    else:
        W_V, W_O = _f64(heads[0]), _f64(heads[1])
        H = W_V.shape[0]
        if W_V.ndim != 3 or W_V.shape[2] != d or tuple(W_O.shape) != (H, d, W_V.shape[1]):
            raise ValueError(f"heads must be W_V [H, d_head, {d}] and W_O [H, {d}, d_head]; got "
                             f"{tuple(W_V.shape)}, {tuple(W_O.shape)}")
        if A.ndim == 2:
            A = A.expand(H, n, n)
        elif A.shape[0] != H:
            raise ValueError(f"{A.shape[0]} attention patterns for {H} heads")
        values = torch.einsum("hkd,nd->hnk", W_V, X)  # W_V^h x_j, per head
        mixed = torch.einsum("hij,hjk->hik", A, values)  # sum_j A_h[i, j] W_V^h x_j
        update = torch.einsum("hdk,hik->id", W_O, mixed)
    return normalise_tokens(X + update)


def idealised_run(
    X0: Float[Tensor, "n d"],
    Fs: Optional[Sequence[Tensor]] = None,
    *,
    heads: Optional[Sequence[tuple[Tensor, Tensor]]] = None,
    patterns: Optional[Sequence[Optional[Tensor]]] = None,
    causal: bool = False,
) -> list[Float[Tensor, "n d"]]:
    """The token matrix after each layer, starting from N(X0): one entry per layer matrix in
    ``Fs`` (or per (W_V, W_O) in ``heads``); ``patterns[t]`` is layer t's A (None: uniform)."""
    layers = Fs if Fs is not None else heads
    if layers is None or (Fs is not None and heads is not None):
        raise ValueError("give exactly one of Fs and heads")
    if patterns is not None and len(patterns) != len(layers):
        raise ValueError(f"{len(patterns)} patterns for {len(layers)} layers")
    X = normalise_tokens(X0)
    out = []
    for t, layer in enumerate(layers):
        A = None if patterns is None else patterns[t]
        X = (idealised_step(X, cast(Tensor, layer), A=A, causal=causal) if Fs is not None
             else idealised_step(X, heads=cast("tuple[Tensor, Tensor]", layer), A=A, causal=causal))
        out.append(X)
    return out


def oriented(v: Float[Tensor, " d"]) -> Float[Tensor, " d"]:
    """v scaled to unit norm with its largest-modulus entry positive (a fixed sign for +v_1)."""
    v = _f64(v)
    v = v / v.norm()
    return -v if float(v[v.abs().argmax()]) < 0 else v


def pole_stats(X: Float[Tensor, "n d"], v: Float[Tensor, " d"]) -> tuple[float, float]:
    """(frac_plus, bipolarity) of tokens X with respect to the line of v.

    c_i = cos(x_i, v); frac_plus = share of tokens with c_i > 0 (sign of v as given; see
    :func:`oriented`); bipolarity = 1 - |mean_i c_i| / mean_i |c_i| in [0, 1]: 0 when every
    token sits on the same side (unipolar consensus), 1 when the tokens split evenly, in weight,
    between +v and -v (bipolar consensus). NaN when all c_i = 0 or X has no tokens.
    """
    X, v = _f64(X), _f64(v)
    if X.ndim != 2 or v.shape != (X.shape[1],):
        raise ValueError(f"need X [n, d] and v [d]; got {tuple(X.shape)}, {tuple(v.shape)}")
    norms = X.norm(dim=1)
    keep = norms > 0
    if not bool(keep.any()) or float(v.norm()) == 0:
        return float("nan"), float("nan")
    c = (X[keep] @ v) / (norms[keep] * v.norm())
    frac = float((c > 0).double().mean())
    spread = float(c.abs().mean())
    return frac, (1.0 - abs(float(c.mean())) / spread) if spread > 0 else float("nan")


def plane_angle_deg(a: Float[Tensor, " d"], b: Float[Tensor, " d"], B: Float[Tensor, "d 2"]) -> float:
    """Unsigned angle in degrees (in [0, 180]) between the projections of a and b on the plane
    with orthonormal basis B: how far a step a -> b turned inside it. NaN if a projection is 0."""
    pa, pb = _f64(B).T @ _f64(a), _f64(B).T @ _f64(b)
    if float(pa.norm()) == 0 or float(pb.norm()) == 0:
        return float("nan")
    cross = float(pa[0] * pb[1] - pa[1] * pb[0])
    return math.degrees(abs(math.atan2(cross, float(pa @ pb))))


def _tan(x: Tensor, B: Tensor) -> float:
    inside = B.T @ x
    return float((x - B @ inside).norm()) / float(inside.norm()) if float(inside.norm()) > 0 \
        else float("inf")


def tan_ratio(a: Float[Tensor, " d"], b: Float[Tensor, " d"], B: Float[Tensor, "d r"]) -> float:
    """tan(angle(b, span B)) / tan(angle(a, span B)): the per-step contraction of the angle to a
    subspace (a power iteration gives |mu_2 / mu_1| asymptotically). NaN when a lies in span B
    (tan below 1e-12: the ratio is rounding noise) or a or b is orthogonal to it."""
    a, b, B = _f64(a), _f64(b), _f64(B)
    ta, tb = _tan(a, B), _tan(b, B)
    if ta < 1e-12 or math.isinf(ta) or math.isinf(tb):
        return float("nan")
    return tb / ta


def token_rate(mu1: complex, mu2: complex) -> float:
    """Predicted per-layer contraction of a token's angle to v_1 under bidirectional uniform
    attention: max(|mu_2|, 1) / |mu_1| (the mean converges at |mu_2/mu_1|, the deviations from
    it shrink by 1/|mu_1|; the slower one wins). NaN when mu_1 = 0 or mu_2 is NaN."""
    if abs(mu1) == 0 or math.isnan(abs(mu2)):
        return float("nan")
    return max(abs(mu2), 1.0) / abs(mu1)
