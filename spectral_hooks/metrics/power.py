"""Power-method view of a layer (METRICS.md section 1): spectrum of F, alignment, rho, consensus.

Pure functions of tensors: ``F`` is the stack of layer matrices [L, d, d] (column convention,
x -> F x) and the residual states are token matrices [N, d] with padding already removed.
All numerics run in float64 (complex128 for eigenpairs) whatever the input dtype.

The spectrum machinery (:class:`~spectral_hooks.metrics.spectrum.LayerSpectrum`,
:func:`~spectral_hooks.metrics.spectrum.spectrum`, the dense, factored and top-k Krylov paths and
the spectrum cache shared by the tables) lives in :mod:`spectral_hooks.metrics.spectrum`.

>>> F = torch.diag(torch.tensor([3.0, 1.0, 0.5]))
>>> table = power_table(F[None], [torch.eye(3)], [torch.eye(3)])
>>> list(table.columns[:4])
['layer', 'iterate', 'lambda1_real', 'lambda1_imag']

Spectra (dense or, above ``dense_limit``, top-k Krylov) and their per-matrix cache live in
:mod:`spectral_hooks.metrics.spectrum`; see its docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spectral_hooks.linalg.ranks import effective_rank
from spectral_hooks.metrics.nulls import gamma_null, rho_test
from spectral_hooks.metrics.spectrum import (
    SPECTRUM_DENSE_MAX_D,
    TOP_K,
    LayerSpectrum,
    check_iterate,
    check_spectrum_options,
    checked_matrices,
    layer_spectra,
    power_threads,
)

if TYPE_CHECKING:  # shape annotations only (jaxtyping is not a runtime dependency)
    from jaxtyping import Float

__all__ = [
    "Consensus",
    "alignment",
    "consensus",
    "power_table",
    "spectra_table",
    "subspace_cos",
    "POWER_TABLE_COLUMNS",
]

POWER_TABLE_COLUMNS = (
    "layer", "iterate", "lambda1_real", "lambda1_imag", "abs_lambda1", "abs_lambda2", "abs_mu1", "abs_mu2",
    "gap_ratio", "gap_diff", "lambda1_is_complex", "subspace_dim", "gamma_in", "gamma", "gamma_null", "lift",
    "gamma2_dim", "gamma2_in", "gamma2", "gamma2_null", "rho", "rho_pvalue", "n_tokens",
    "mean_cos", "collapse_residual", "erank", "ref_layer", "gamma_ref", "gamma_ref_null",
    "subspace_cos_ref", "truncated", "n_computed", "converged",
)  # fmt: skip

#: the columns that compare a layer with a fixed reference layer
REFERENCE_COLUMNS = ("ref_layer", "gamma_ref", "gamma_ref_null", "subspace_cos_ref")
#: the columns that exist only when a direction u is given (``power_table(direction=u)``)
DIRECTION_COLUMNS = ("gamma_u",)


def power_columns(*, direction: bool = False) -> tuple[str, ...]:
    """The power table's columns, in order: :data:`POWER_TABLE_COLUMNS`, with :data:`DIRECTION_COLUMNS`
    after the reference columns when a direction is given.

        >>> power_columns(direction=True)[-5:]
        ('subspace_cos_ref', 'gamma_u', 'truncated', 'n_computed', 'converged')
    """
    if not direction:
        return POWER_TABLE_COLUMNS
    at = POWER_TABLE_COLUMNS.index("subspace_cos_ref") + 1
    return POWER_TABLE_COLUMNS[:at] + DIRECTION_COLUMNS + POWER_TABLE_COLUMNS[at:]


# --------------------------------------------------------------------------- alignment


def alignment(X: Float[Tensor, "*batch d"], B: Float[Tensor, "d r"]) -> Float[Tensor, " *batch"]:
    """a(x; B) = ||B^T x|| / ||x|| in [0, 1], per token, in float64.

    >>> alignment(torch.tensor([[3.0, 4.0], [0.0, 0.0]]), torch.tensor([[1.0], [0.0]]))
    tensor([0.6000, 0.0000], dtype=torch.float64)

    B must have orthonormal columns (a [d] vector is taken as [d, 1] and must be unit).
    Rule for zero tokens: a token with ||x|| = 0 has alignment 0 (no direction, no alignment),
    so the result never contains NaN for finite input.
    """
    X = torch.as_tensor(X).detach().to("cpu", torch.float64)
    B = torch.as_tensor(B).detach().to("cpu", torch.float64)
    if B.ndim == 1:
        B = B[:, None]
    if B.ndim != 2 or X.ndim < 1 or X.shape[-1] != B.shape[0]:
        raise ValueError(f"need X [..., d] and B [d, r]; got X {tuple(X.shape)}, B {tuple(B.shape)}")
    gram = B.T @ B
    if not torch.allclose(gram, torch.eye(B.shape[1], dtype=torch.float64), atol=1e-6):
        raise ValueError("B must have orthonormal columns")
    num = (X @ B).norm(dim=-1)
    den = X.norm(dim=-1)
    a = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return a.clamp(0.0, 1.0)


def subspace_cos(A: Float[Tensor, "d r"], B: Float[Tensor, "d s"]) -> float:
    """Cosine of the smallest principal angle between span(A) and span(B) (orthonormal bases):
    the largest singular value of A^T B, in [0, 1]; 1 when the subspaces share a direction.

    >>> subspace_cos(torch.eye(3)[:, :1], torch.eye(3)[:, 1:])
    0.0
    """
    A = torch.as_tensor(A).detach().to("cpu", torch.float64)
    B = torch.as_tensor(B).detach().to("cpu", torch.float64)
    return min(1.0, float(torch.linalg.svdvals(A.T @ B).max()))


def unit_direction(u: Tensor, d: int) -> Float[Tensor, " d"]:
    """u as a float64 unit vector of length d (ValueError for a wrong length, zero or non-finite)."""
    u = torch.as_tensor(u).detach().to("cpu", torch.float64).reshape(-1)
    if u.numel() != d or not bool(torch.isfinite(u).all()) or float(u.norm()) == 0:
        raise ValueError(f"direction must be a finite non-zero vector of length {d}, got "
                         f"{u.numel()} entries")
    return u / u.norm()


# --------------------------------------------------------------------------- consensus


@dataclass(frozen=True)
class Consensus:
    """How far a token matrix has collapsed. See :func:`consensus`."""

    mean_cos: float
    collapse_residual: float
    erank: float


def singular_values(X: Tensor) -> Tensor:
    """The singular values of X [n, d], descending: those of the triangle R of X's thin QR
    (of X^T where n < d), square min(n, d), where X is at least twice as long one way as
    the other (the same values: an orthogonal factor changes none; LAPACK's SVD of the whole
    wide matrix costs ~4x more at 128 x 2048), else ``torch.linalg.svdvals(X)``.

        >>> singular_values(torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0]]))
        tensor([3.])
    """
    n, d = X.shape
    if max(n, d) >= 2 * min(n, d):
        X = torch.linalg.qr(X.T if n < d else X, mode="r").R
    return torch.linalg.svdvals(X)


def _effective_rank(s: Tensor) -> float:
    """Roy-Vetterli effective rank (linalg.ranks) of singular values s; NaN (not 0) if all are zero."""
    return float(effective_rank(s)) if float(s.sum()) > 0 else float("nan")


def consensus(X: Float[Tensor, "n d"]) -> Consensus:
    """Mean pairwise cosine (i != j), rank-collapse residual and effective rank of tokens X.

    >>> c = consensus(torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]))
    >>> c.mean_cos, c.erank
    (1.0, 1.0)

    mean_cos = (||sum_i u_i||^2 - sum_i ||u_i||^2) / (n (n - 1)), u_i = x_i / ||x_i|| (zero
    tokens have u_i = 0, i.e. cosine 0 with everything); O(n d), no n x n matrix. NaN if n < 2.
    collapse_residual = ||X - 1 xbar^T||_F / ||X||_F (NaN if X = 0).
    erank = Roy-Vetterli effective rank of X's singular values (NaN if X = 0).
    """
    X = torch.as_tensor(X).detach().to("cpu", torch.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be [n, d], got shape {tuple(X.shape)}")
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or Inf")
    n = X.shape[0]
    norms = X.norm(dim=1, keepdim=True)
    U = torch.where(norms > 0, X / torch.where(norms > 0, norms, 1.0), 0.0)
    if n >= 2:
        mean_cos = float((U.sum(0).square().sum() - U.square().sum()) / (n * (n - 1)))
    else:
        mean_cos = float("nan")
    total = float(X.norm())
    resid = float((X - X.mean(0, keepdim=True)).norm()) / total if total > 0 else float("nan")
    erank = _effective_rank(singular_values(X)) if X.numel() else float("nan")
    return Consensus(mean_cos, resid, erank)


# --------------------------------------------------------------------------- tables


def _layer_indices(L: int, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(L))
    out = []
    for t in layers:
        t = int(t)
        if not -L <= t < L:
            raise ValueError(f"layer {t} out of range for {L} layers")
        out.append(t % L)
    return out


def _tokens(states: Sequence[Tensor | None] | None, t: int, L: int, d: int, name: str) -> Tensor | None:
    if states is None:
        return None
    if len(states) != L:
        raise ValueError(f"{name} must have one entry per layer ({L}), got {len(states)}")
    X = states[t]
    if X is None:
        return None
    X = torch.as_tensor(X).detach().to("cpu", torch.float64)
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"{name}[{t}] must be [N, {d}] (padding removed), got {tuple(X.shape)}")
    return X


def _mean(a: Tensor | None) -> float:
    return float(a.mean()) if a is not None and a.numel() else float("nan")


def _alignment_columns(s: LayerSpectrum, pre: Tensor | None, post: Tensor | None, d: int) -> dict:
    if pre is not None and post is not None and pre.shape[0] != post.shape[0]:
        raise ValueError(f"resid_pre and resid_post hold different token counts: {pre.shape[0]} vs {post.shape[0]}")
    r1, r2 = s.B.shape[1], s.B2.shape[1]
    a_in = alignment(pre, s.B) if pre is not None else None
    a_out = alignment(post, s.B) if post is not None else None
    g_null, g2_null = gamma_null(d, r1), gamma_null(d, r2)
    rho, p = rho_test(a_in, a_out) if a_in is not None and a_out is not None else (float("nan"),) * 2
    gamma = _mean(a_out)
    cons = consensus(post) if post is not None else Consensus(*(float("nan"),) * 3)
    n_tok = post.shape[0] if post is not None else (pre.shape[0] if pre is not None else 0)
    return {
        "subspace_dim": r1, "gamma_in": _mean(a_in), "gamma": gamma, "gamma_null": g_null,
        "lift": gamma / g_null, "gamma2_dim": r2,
        "gamma2_in": _mean(alignment(pre, s.B2)) if pre is not None else float("nan"),
        "gamma2": _mean(alignment(post, s.B2)) if post is not None else float("nan"),
        "gamma2_null": g2_null, "rho": rho, "rho_pvalue": p, "n_tokens": n_tok,
        "mean_cos": cons.mean_cos, "collapse_residual": cons.collapse_residual, "erank": cons.erank,
    }  # fmt: skip


def _reference_columns(B: Tensor, reference: tuple[int, Tensor] | None, post: Tensor | None,
                       d: int) -> dict:
    """The columns of ``REFERENCE_COLUMNS`` (NaN, ref_layer -1, without a reference)."""
    nan = float("nan")
    if reference is None:
        return {"ref_layer": -1, "gamma_ref": nan, "gamma_ref_null": nan, "subspace_cos_ref": nan}
    r, B_r = reference
    return {
        "ref_layer": r,
        "gamma_ref": _mean(alignment(post, B_r)) if post is not None else nan,
        "gamma_ref_null": gamma_null(d, B_r.shape[1]),
        "subspace_cos_ref": subspace_cos(B, B_r),
    }


def power_row(s: LayerSpectrum, pre: Tensor | None, post: Tensor | None, *, layer: int,
              reference: tuple[int, Tensor] | None = None, direction: Tensor | None = None
              ) -> dict:
    """One row of :func:`power_table` (its columns, in order) from layer ``layer``'s spectrum
    and its tokens [N, d] entering / leaving it (float64 CPU; either may be None: NaN columns).

        >>> from spectral_hooks.metrics.spectrum import spectrum
        >>> row = power_row(spectrum(torch.diag(torch.tensor([2.0, 0.5]))), None, None, layer=0)
        >>> row["abs_lambda1"], row["gap_ratio"], "gamma_u" in row
        (2.0, 0.25, False)

    ``reference``: (r, B_r), the reference layer and its principal basis (None: ``ref_layer``
    -1, the other reference columns NaN); ``direction``: a unit vector u [d] (column
    ``gamma_u``, only then). The power view of ``analyze()`` and the training events both
    build their rows here.
    """
    d = s.B.shape[0]
    row = {
        "layer": layer, "iterate": s.iterate, "lambda1_real": s.lambda1.real,
        "lambda1_imag": s.lambda1.imag, "abs_lambda1": abs(s.lambda1), "abs_lambda2": abs(s.lambda2),
        "abs_mu1": abs(s.mu1), "abs_mu2": abs(s.mu2), "gap_ratio": s.gap_ratio,
        "gap_diff": abs(s.mu1) - abs(s.mu2), "lambda1_is_complex": s.lambda1_is_complex,
        **_alignment_columns(s, pre, post, d), **_reference_columns(s.B, reference, post, d),
        "truncated": s.truncated, "n_computed": s.n_computed, "converged": s.converged,
    }  # fmt: skip
    if direction is not None:
        row["gamma_u"] = _mean(alignment(post, direction)) if post is not None else float("nan")
    return {c: row[c] for c in power_columns(direction=direction is not None)}


def power_table(
    F: Float[Tensor, "L d d"],
    resid_pre: Sequence[Float[Tensor, "N d"] | None] | None = None,
    resid_post: Sequence[Float[Tensor, "N d"] | None] | None = None,
    *,
    iterate: str = "F",
    layers: Sequence[int] | None = None,
    real_tol: float = 1e-9,
    dense_limit: int = SPECTRUM_DENSE_MAX_D,
    top_k: int = TOP_K,
    reference_layer: int | None = None,
    direction: Tensor | None = None,
) -> pd.DataFrame:
    """One row per layer t: spectrum of F_t and how layer t's tokens align with its principal subspace.

    >>> F = torch.diag(torch.tensor([2.0, 0.5]))[None]
    >>> power_table(F).loc[0, ["abs_lambda1", "gap_ratio", "gamma_null"]].round(4).tolist()
    [2.0, 0.25, 0.6366]

    resid_pre[t], resid_post[t]: [N_t, d] tokens entering / leaving layer t (the same N_t tokens,
    flattened, padding removed); either list, or any entry, may be None: the columns that need it
    are NaN, so the table also works from weights alone. ``layers`` picks a subset (negative ok).
    Columns (``POWER_TABLE_COLUMNS``), per METRICS.md section 1:
      layer, iterate, lambda1_real, lambda1_imag, abs_lambda1, abs_lambda2 (eigenvalues of F),
      abs_mu1, abs_mu2 (of the ordering quantity; = abs_lambda* for "F"), gap_ratio = abs_mu2 /
      abs_mu1, gap_diff = abs_mu1 - abs_mu2, lambda1_is_complex, subspace_dim (1 or 2),
      gamma_in / gamma (mean alignment of the input / output tokens with B_t), gamma_null,
      lift = gamma / gamma_null, gamma2_dim (2..4),
      gamma2_in, gamma2, gamma2_null (same with B2_t), rho, rho_pvalue (tokens whose alignment
      grew; exact binomial), n_tokens, and mean_cos, collapse_residual, erank of the output tokens,
      ref_layer (``reference_layer``, default the stack's last layer L - 1), gamma_ref (mean alignment
      of the output tokens with B_r of that one fixed layer: a single global eigenvector would
      keep it high at every depth), gamma_ref_null (gamma_null for B_r's dimension),
      subspace_cos_ref (cosine of the smallest principal angle between B_t and B_r),
      then truncated (top-k spectrum, d > dense_limit), n_computed (eigenvalues computed: d, or
      about top_k) and converged (False only when the Krylov solver did not converge).
    With a ``direction`` u [d] (e.g. a steering direction) a column ``gamma_u`` (mean |cos| of
    the output tokens with u) follows subspace_cos_ref; without one there is no such column.
    dense_limit, top_k: see :func:`spectrum`. Spectra are shared with :func:`spectra_table`
    through the module cache (same F tensor object, unchanged, same options: computed once).
    """
    check_iterate(iterate)
    check_spectrum_options(dense_limit, top_k)
    F_in = F
    F = checked_matrices(F)
    if F.ndim != 3:
        raise ValueError(f"F must be [L, d, d], got shape {tuple(F.shape)}")
    L, d = F.shape[0], F.shape[-1]
    idx = _layer_indices(L, layers)
    u = unit_direction(direction, d) if direction is not None else None
    r = _layer_indices(L, [reference_layer])[0] if reference_layer is not None else L - 1
    spectra = layer_spectra(F_in, F, idx, iterate, real_tol, dense_limit, top_k)
    B_r = (spectra[idx.index(r)] if r in idx else
           layer_spectra(F_in, F, [r], iterate, real_tol, dense_limit, top_k)[0]).B
    reference = (r, B_r)
    with power_threads():  # small products and SVDs of the tokens: one thread (see spectrum)
        rows = [power_row(s, _tokens(resid_pre, t, L, d, "resid_pre"),
                          _tokens(resid_post, t, L, d, "resid_post"), layer=t,
                          reference=reference, direction=u) for t, s in zip(idx, spectra)]
    return pd.DataFrame(rows, columns=list(power_columns(direction=u is not None)))


#: the columns of :func:`spectra_table`
SPECTRA_COLUMNS = ("source", "layer", "position", "index", "real", "imag", "abs", "truncated",
                   "converged")


def spectra_table(
    F: Float[Tensor, "*L d d"], *, iterate: str = "F", real_tol: float = 1e-9,
    dense_limit: int = SPECTRUM_DENSE_MAX_D, top_k: int = TOP_K, layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Every eigenvalue of every layer matrix, long format, for plotting in the complex plane.

    >>> spectra_table(torch.eye(2)[None]).columns.tolist()
    ['source', 'layer', 'position', 'index', 'real', 'imag', 'abs', 'truncated', 'converged']

    One row per (layer, eigenvalue): source = "F", position = -1 (not a token position),
    index = rank in the ``iterate`` ordering (0 = lambda1), real / imag / abs of lambda (of F),
    truncated (the layer's spectrum holds only its top-k eigenvalues: d > dense_limit) and
    converged (False only when the Krylov solver did not converge), see :func:`spectrum`.
    Shares computed spectra with :func:`power_table` (same F tensor object and options).
    ``layers``: only these layers (default all; negative ok).
    """
    check_iterate(iterate)
    check_spectrum_options(dense_limit, top_k)
    F_in = F
    F = checked_matrices(F)
    if F.ndim == 2:
        F = F[None]
    frames = []
    idx = _layer_indices(F.shape[0], layers)
    spectra = layer_spectra(F_in, F, idx, iterate, real_tol, dense_limit, top_k)
    for t, s in zip(idx, spectra):
        vals = s.eigenvalues
        frames.append(pd.DataFrame({
            "source": "F", "layer": t, "position": -1, "index": np.arange(vals.numel()),
            "real": vals.real.numpy(), "imag": vals.imag.numpy(), "abs": vals.abs().numpy(),
            "truncated": s.truncated, "converged": s.converged,
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True)
