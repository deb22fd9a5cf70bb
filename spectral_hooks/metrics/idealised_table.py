"""Predicted (idealised dynamics) vs observed tokens, per layer: the ``idealised`` table.

The prediction runs :func:`~spectral_hooks.metrics.idealised.idealised_run` through the model's
own layer matrices from the tokens that entered the first layer, sequence by sequence (attention
mixes tokens of one sequence only); the observation is what the model's residual stream held.

>>> F = torch.diag(torch.tensor([3.0, 1.0, 0.0]))[None].repeat(2, 1, 1)
>>> X0 = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 1.0]])
>>> t = idealised_table(F, [X0])
>>> t["gamma_pred"].round(4).tolist(), t["predicted_rate"].round(4).tolist()
([0.9428, 0.9961], [0.5, 0.5])
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Sequence
from typing import Optional

import pandas as pd
import torch
from torch import Tensor

from spectral_hooks.metrics.idealised import (
    idealised_step,
    normalise_tokens,
    oriented,
    plane_angle_deg,
    pole_stats,
    tan_ratio,
    token_rate,
)
from spectral_hooks.metrics.nulls import gamma_null
from spectral_hooks.metrics.power import alignment, consensus
from spectral_hooks.metrics.shared_weights import line_angle_deg, subspace_angle_deg
from spectral_hooks.metrics.spectrum import (
    SPECTRUM_DENSE_MAX_D,
    TOP_K,
    checked_matrices,
    layer_spectra,
)

__all__ = ["idealised_table", "IDEALISED_COLUMNS"]

IDEALISED_COLUMNS = (
    "layer", "attention", "iterate", "n_tokens", "n_sequences", "gamma_pred", "gamma_obs",
    "gamma_null", "mean_cos_pred", "mean_cos_obs", "consensus_angle_deg",
    "angle_pred_principal_deg", "angle_obs_principal_deg", "predicted_rate", "token_rate",
    "rate_pred", "rate_obs", "frac_plus_pred", "frac_plus_obs", "bipolarity_pred",
    "bipolarity_obs", "lambda1_is_complex", "rotation_theory_deg", "rotation_pred_deg",
    "rotation_obs_deg",
)  # fmt: skip

_NAN = float("nan")


def _flat(states: Optional[Sequence[Optional[Tensor]]], t: int, d: int, n: int, name: str
          ) -> Optional[Tensor]:
    if states is None or states[t] is None:
        return None
    X = torch.as_tensor(states[t]).detach().to("cpu", torch.float64)
    if X.ndim != 2 or X.shape != (n, d):
        raise ValueError(f"{name}[{t}] must be [{n}, {d}] (the tokens the prediction starts from, "
                         f"in the same order), got {tuple(X.shape)}")
    return X


def _mean_direction_columns(B: Tensor, p_in: Tensor, p_out: Tensor, o_in: Optional[Tensor],
                            o_out: Optional[Tensor], complex_pair: bool) -> dict:
    m_in, m_out = p_in.mean(0), p_out.mean(0)
    mo_in = o_in.mean(0) if o_in is not None else None
    mo_out = o_out.mean(0) if o_out is not None else None
    plane = B if complex_pair else None
    return {
        "consensus_angle_deg": line_angle_deg(m_out, mo_out) if mo_out is not None else _NAN,
        "angle_pred_principal_deg": subspace_angle_deg(m_out, B),
        "angle_obs_principal_deg": subspace_angle_deg(mo_out, B) if mo_out is not None else _NAN,
        "rate_pred": tan_ratio(m_in, m_out, B),
        "rate_obs": tan_ratio(mo_in, mo_out, B) if mo_in is not None and mo_out is not None
        else _NAN,
        "rotation_pred_deg": plane_angle_deg(m_in, m_out, plane) if plane is not None else _NAN,
        "rotation_obs_deg": plane_angle_deg(mo_in, mo_out, plane)
        if plane is not None and mo_in is not None and mo_out is not None else _NAN,
    }


def _pole_columns(B: Tensor, pred: Tensor, obs: Optional[Tensor]) -> dict:
    if B.shape[1] != 1:
        return {"frac_plus_pred": _NAN, "frac_plus_obs": _NAN, "bipolarity_pred": _NAN,
                "bipolarity_obs": _NAN}
    v = oriented(B[:, 0])
    fp, bp = pole_stats(pred, v)
    fo, bo = pole_stats(obs, v) if obs is not None else (_NAN, _NAN)
    return {"frac_plus_pred": fp, "frac_plus_obs": fo, "bipolarity_pred": bp, "bipolarity_obs": bo}


def idealised_table(
    F: Tensor,
    start: Sequence[Tensor],
    resid_pre: Optional[Sequence[Optional[Tensor]]] = None,
    resid_post: Optional[Sequence[Optional[Tensor]]] = None,
    *,
    first: int = 0,
    layers: Optional[Sequence[int]] = None,
    iterate: str = "I+F",
    causal: bool = False,
    heads: Optional[Sequence[tuple[Tensor, Tensor]]] = None,
    patterns: Optional[Sequence[Sequence[Tensor]]] = None,
    real_tol: float = 1e-9,
) -> pd.DataFrame:
    """One row per layer t >= ``first``: the idealised prediction against the observed tokens.

    F: [L, d, d] layer matrices. start: per sequence, the tokens [n_s, d] entering layer
    ``first`` (padding removed); the prediction starts from them, L2-normalised.
    resid_pre[t], resid_post[t]: the observed tokens entering / leaving layer t, all sequences
    flattened in the order of ``start`` ([sum n_s, d]; None entries allowed: those columns NaN).
    causal: uniform attention over keys 0..i instead of all keys. heads: per layer (W_V, W_O)
    (needed with ``patterns``: per layer, per sequence, head patterns [H, n_s, n_s], e.g. the
    recorded attention probabilities); otherwise uniform attention shared by all heads.
    ``layers``: the rows to keep (the dynamics always runs through every layer from ``first``).
    Columns (``IDEALISED_COLUMNS``; docs/metrics.md#idealised). One ordering for the whole
    table, named in its ``iterate`` column: B_t, lambda_1, lambda_2 (and so the rates, the
    rotation angle and the poles) are the leading modes of F_t in the ``iterate`` ordering, and
    mu_k = 1 + lambda_k. "I+F" (the default) is the matrix the dynamics iterates: the rates are
    its convergence rates. With "F", B_t is the power table's (gamma_obs is its gamma) and the
    theory columns describe F's two leading modes under I + F: where those are not I + F's
    leading modes (lambda_1 near -2, say) predicted_rate can exceed 1.
    """
    if iterate not in ("F", "I+F"):
        raise ValueError(f"iterate must be 'F' or 'I+F', got {iterate!r}")
    F_in, F = F, checked_matrices(F)
    if F.ndim != 3:
        raise ValueError(f"F must be [L, d, d], got shape {tuple(F.shape)}")
    L, d = F.shape[0], F.shape[-1]
    if not 0 <= first < L:
        raise ValueError(f"first={first} is not a layer of a {L}-layer stack")
    if not start:
        raise ValueError("start holds no sequence")
    if patterns is not None and heads is None:
        raise ValueError("recorded attention patterns need the per-head weights (heads=...)")
    X = [normalise_tokens(x) for x in start]
    if any(x.shape[1] != d for x in X):
        raise ValueError(f"start tokens must be [n_s, {d}]")
    n = sum(x.shape[0] for x in X)
    keep = sorted(set(range(first, L)) if layers is None else {int(t) % L for t in layers})
    # spectra through the cache power_table uses (the same F object: computed once); one
    # ordering for every spectral column (B_t, rates, rotation, poles)
    spectra = dict(zip(keep, layer_spectra(F_in, F, keep, iterate, real_tol, SPECTRUM_DENSE_MAX_D, TOP_K)))
    rows = []
    for t in range(first, L):
        p_in = torch.cat(X)
        X = [idealised_step(x, None if heads is not None else F[t],
                            heads=heads[t] if heads is not None else None,
                            A=patterns[t][s] if patterns is not None else None, causal=causal)
             for s, x in enumerate(X)]
        if t not in keep:
            continue
        pred = torch.cat(X)
        o_in, o_out = (_flat(resid_pre, t, d, n, "resid_pre"),
                       _flat(resid_post, t, d, n, "resid_post"))
        s = spectra[t]
        B, mu1, mu2 = s.B, 1 + s.lambda1, 1 + s.lambda2
        rows.append({
            "layer": t, "attention": "recorded" if patterns is not None else "uniform",
            "iterate": iterate, "n_tokens": n, "n_sequences": len(X),
            "gamma_pred": float(alignment(pred, B).mean()),
            "gamma_obs": float(alignment(o_out, B).mean()) if o_out is not None else _NAN,
            "gamma_null": gamma_null(d, B.shape[1]),
            "mean_cos_pred": consensus(pred).mean_cos,
            "mean_cos_obs": consensus(o_out).mean_cos if o_out is not None else _NAN,
            "predicted_rate": abs(mu2) / abs(mu1) if abs(mu1) > 0 else _NAN,
            "token_rate": token_rate(mu1, mu2),
            "lambda1_is_complex": s.lambda1_is_complex,
            "rotation_theory_deg": math.degrees(abs(cmath.phase(mu1)))
            if s.lambda1_is_complex else _NAN,
            **_mean_direction_columns(B, p_in, pred, o_in, o_out, s.lambda1_is_complex),
            **_pole_columns(B, pred, o_out),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(IDEALISED_COLUMNS))
