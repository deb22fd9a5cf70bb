"""Shared-weight (ALBERT) analysis: one F applied at every layer (METRICS.md section 1).

Without its FFN and with uniform attention, a normalised residual layer maps the mean token
direction m to (I + F) m / ||(I + F) m||: the power iteration on I + F. This module runs that
iteration from the recorded mean input token and compares it, layer by layer, with the mean
output token the recording shows.

>>> F = torch.diag(torch.tensor([3.0, 1.0, 0.0]))
>>> X0 = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, -1.0]])
>>> outs = [X0 @ torch.diag(torch.tensor([4.0, 2.0, 1.0])) ** (t + 1) for t in range(3)]
>>> shared_weight_table(F, outs, X0)["angle_pred_obs_deg"].round(9).tolist()
[0.0, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor

from spectral_hooks.metrics.spectrum import checked_matrices, layer_spectrum

if TYPE_CHECKING:  # shape annotations only (jaxtyping is not a runtime dependency)
    from jaxtyping import Float

__all__ = ["shared_weight_table", "line_angle_deg", "subspace_angle_deg", "SHARED_WEIGHT_COLUMNS"]

SHARED_WEIGHT_COLUMNS = (
    "layer", "angle_pred_obs_deg", "predicted_rate", "angle_obs_principal_deg",
    "angle_pred_principal_deg", "abs_mu1", "abs_mu2", "mu1_is_complex", "n_tokens",
)  # fmt: skip


def line_angle_deg(a: Float[Tensor, " d"], b: Float[Tensor, " d"]) -> float:
    """Angle in degrees between the lines spanned by a and b (sign-invariant, in [0, 90]).

    >>> round(line_angle_deg(torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])), 9)
    45.0

    Computed as atan2(|sin|, |cos|), accurate for tiny angles. NaN if either vector is zero.
    """
    a, b = a.to(torch.float64), b.to(torch.float64)
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return float("nan")
    a, b = a / na, b / nb
    c = float(a @ b)
    return math.degrees(math.atan2(float((a - c * b).norm()), abs(c)))


def subspace_angle_deg(x: Float[Tensor, " d"], B: Float[Tensor, "d r"]) -> float:
    """Angle in degrees between x and the subspace with orthonormal basis B (NaN if x = 0).

    >>> subspace_angle_deg(torch.tensor([1.0, 1.0, 0.0]), torch.eye(3)[:, :1])
    45.0
    """
    x, B = x.to(torch.float64), B.to(torch.float64)
    if float(x.norm()) == 0:
        return float("nan")
    inside = B.T @ x
    return math.degrees(math.atan2(float((x - B @ inside).norm()), float(inside.norm())))


def _as_tokens(X: Tensor, d: int, name: str) -> Tensor:
    X = torch.as_tensor(X).detach().to("cpu", torch.float64)
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"{name} must be [N, {d}] (padding removed), got {tuple(X.shape)}")
    if not torch.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return X


def shared_weight_table(
    F: Float[Tensor, "d d"],
    resid_post: Sequence[Float[Tensor, "N d"]],
    resid_pre0: Float[Tensor, "N d"],
    *,
    real_tol: float = 1e-9,
) -> pd.DataFrame:
    """Predicted (power iteration on I + F) vs observed mean token direction, per layer.

    F: the one shared layer matrix [d, d]. resid_pre0: tokens entering the first application
    [N, d]; resid_post[t]: tokens leaving application t (t = 0 .. L-1), padding removed.
    The prediction starts at m_0 = mean of resid_pre0 and iterates m <- (I+F) m / ||(I+F) m||;
    row t compares m_{t+1} with the mean of resid_post[t] (raw tokens averaged, then the line).
    Columns (``SHARED_WEIGHT_COLUMNS``): layer, angle_pred_obs_deg (angle between the two lines),
    predicted_rate = |mu2 / mu1| of I + F (the same on every row), angle_obs_principal_deg and
    angle_pred_principal_deg (angle to the principal subspace of I + F: v1, or the real plane of a
    complex pair), abs_mu1, abs_mu2, mu1_is_complex, n_tokens. A zero observed mean gives NaN.
    """
    F = checked_matrices(F)
    if F.ndim != 2:
        raise ValueError(f"F must be one [d, d] matrix, got shape {tuple(F.shape)}")
    d = F.shape[0]
    m = _as_tokens(resid_pre0, d, "resid_pre0").mean(0)
    if float(m.norm()) == 0:
        raise ValueError("the mean input token is zero: the power iteration has no start direction")
    s = layer_spectrum(F, "I+F", real_tol)
    step = torch.eye(d, dtype=torch.float64) + F
    rows = []
    for t, X in enumerate(resid_post):
        X = _as_tokens(X, d, f"resid_post[{t}]")
        m = step @ m
        m = m / m.norm()
        obs = X.mean(0)
        rows.append({
            "layer": t, "angle_pred_obs_deg": line_angle_deg(m, obs), "predicted_rate": s.gap_ratio,
            "angle_obs_principal_deg": subspace_angle_deg(obs, s.B),
            "angle_pred_principal_deg": subspace_angle_deg(m, s.B), "abs_mu1": abs(s.mu1),
            "abs_mu2": abs(s.mu2), "mu1_is_complex": s.lambda1_is_complex, "n_tokens": X.shape[0],
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(SHARED_WEIGHT_COLUMNS))
