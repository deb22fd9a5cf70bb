"""Figures of the power-method view: eigenvalues in the complex plane, alignment, gap ratio.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze()                 # a power section
    >>> fig = alignment_vs_depth(report)         # a matplotlib Figure
    >>> fig.axes[0].get_ylabel()
    'alignment a = ‖Bᵀx‖/‖x‖ (mean over tokens)'
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle

from .figure_tools import (
    ALPHA,
    COMPLEX_TOL,
    MissingSectionError,
    any_finite,
    column_state,
    format_p,
    integer_xaxis,
    mark_no_data,
    new_figure,
    numeric,
    rows_state,
    section_table,
    tag,
)


# ---------------------------------------------------------------------- eigenvalues
def _plane_limits(re: np.ndarray, im: np.ndarray) -> tuple[tuple[float, float], float]:
    """x limits and y half-height of a square view holding every point and the origin."""
    x0, x1 = min(float(re.min()), 0.0), max(float(re.max()), 0.0)
    half = max(x1 - x0, 2 * float(np.abs(im).max()), 1e-12) / 2 * 1.12
    centre = (x0 + x1) / 2
    return (centre - half, centre + half), half


def eigenvalues_plane(report: Any, source: str = "F", *, max_panels: int = 48, ncols: int = 4) -> Figure:
    """Eigenvalues per layer in the complex plane, one small panel per layer.

    ``source`` is ``"F"`` (layer matrices F_t) or ``"jacobian"`` (token Jacobians J_l; several
    positions of a layer share its panel). Each panel is scaled to its eigenvalues (and the
    origin); the unit circle is drawn dashed, clipped where the view ends. Real eigenvalues and
    complex conjugate pairs are drawn in different colours. A table with a ``variant`` column
    gets one panel per variant and layer (never one panel for two model states).
    """
    df = section_table(report, "spectra", ("source", "layer", "real", "imag"))
    df = cast(pd.DataFrame, df[df["source"].astype(str) == source])
    if len(df) == 0:
        raise MissingSectionError(f"section 'spectra' has no rows with source == {source!r}")
    layer_col = numeric(df, "layer")
    variants = (list(dict.fromkeys(df["variant"].astype(str))) if "variant" in df.columns else [None])
    layers = sorted({int(v) for v in layer_col if np.isfinite(v)})
    panels = [(v, layer) for v in variants for layer in layers][:max_panels]
    n = max(len(panels), 1)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = new_figure(2.6 * ncols + 0.4, 2.5 * nrows + 0.9)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    what = "F_t = Σ_h W_O^h W_V^h" if source == "F" else "token Jacobians J_l"
    fig.suptitle(f"Eigenvalues of {what} in the complex plane, per layer (each panel to its own scale)")
    re_all, im_all = numeric(df, "real"), numeric(df, "imag")
    series = []
    for ax, (variant, layer) in zip(axes, panels):
        sel = layer_col == layer
        if variant is not None:
            sel &= (df["variant"].astype(str) == variant).to_numpy()
        state = rows_state(report, cast(pd.DataFrame, df[sel]))
        series.append((f"layer {layer}" + (f" · {variant}" if variant else ""), state))
        re, im = re_all[sel], im_all[sel]
        ok = np.isfinite(re) & np.isfinite(im)
        re, im = re[ok], im[ok]
        mod = np.hypot(re, im)
        cplx = np.abs(im) > COMPLEX_TOL * np.maximum(mod, np.finfo(float).tiny)
        ax.axhline(0, color="#cccccc", lw=0.6, zorder=0)
        ax.axvline(0, color="#cccccc", lw=0.6, zorder=0)
        ax.add_patch(Circle((0, 0), 1.0, fill=False, ls="--", lw=0.8, color="#555555", zorder=1))
        if ok.any():
            ax.scatter(re[~cplx], im[~cplx], s=9, color="#1f77b4", zorder=3, linewidths=0)
            ax.scatter(re[cplx], im[cplx], s=9, color="#ff7f0e", zorder=3, linewidths=0)
            xlim, half = _plane_limits(re, im)
            if max(math.hypot(xlim[0], half), math.hypot(xlim[1], half)) < 1:  # box inside the disc
                ax.text(0.02, 0.02, "unit circle outside view", transform=ax.transAxes,
                        fontsize=6, color="#555555")
            n_out = int((mod > 1).sum())
            ax.text(0.98, 0.98, f"max |λ| = {mod.max():.3g}" + (f"\n{n_out} outside |λ|=1" if n_out else ""),
                    transform=ax.transAxes, ha="right", va="top", fontsize=6, color="#333333")
        else:
            xlim, half = (-1.2, 1.2), 1.2
            mark_no_data(ax)
        ax.set_xlim(*xlim)
        ax.set_ylim(-half, half)
        ax.set_aspect("equal", adjustable="box")
        ax.set_title(series[-1][0] + (f" ({state})" if state != "trained" and variant is None else ""),
                     fontsize=9)
        ax.set_xlabel("Re λ", fontsize=8)
        ax.set_ylabel("Im λ", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], ls="", marker="o", color="#1f77b4", label="real eigenvalue"),
        Line2D([], [], ls="", marker="o", color="#ff7f0e", label="complex (conjugate pair)"),
        Line2D([], [], ls="--", color="#555555", label="unit circle |λ| = 1"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return tag(fig, series, ["real eigenvalue", "complex (conjugate pair)"], layout="panels")


# ---------------------------------------------------------------------- power view
def _null_sd_factor(is_complex: np.ndarray) -> np.ndarray:
    """sd of a(u; B) for u uniform on the sphere, as a multiple of its mean (large d).

    a^2 ~ Beta(k/2, (d-k)/2) with E a^2 = k/d, and E a ~ sqrt(2/(pi d)) (k=1) or
    sqrt(pi/(2d)) (k=2), so sd/mean = sqrt(pi/2 - 1) (k=1) or sqrt(4/pi - 1) (k=2).
    """
    return np.where(is_complex, math.sqrt(4 / math.pi - 1), math.sqrt(math.pi / 2 - 1))


def alignment_vs_depth(report: Any) -> Figure:
    """gamma_in, gamma (and gamma2) vs depth against the null band; rho with p-values below."""
    df = section_table(report, "power", ("layer",)).sort_values("layer")
    x = numeric(df, "layer")
    fig = new_figure(8.5, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    fig.suptitle("Alignment with the principal subspace of F_t through depth")
    drawn = False
    state = rows_state(report, df)
    series = []
    for col, style, label in (
        ("gamma_in", dict(color="#7f7f7f", marker="o", ls="--"), "γ_in: layer input (resid_pre)"),
        ("gamma", dict(color="#1f77b4", marker="o", ls="-"), "γ: layer output (resid_post)"),
        ("gamma2", dict(color="#9467bd", marker="^", ls=":"), "γ₂: top-two eigen-planes"),
    ):
        y = numeric(df, col)
        if any_finite(y):
            ax.plot(x, y, label=label, ms=4, **style)
            series.append((label, state))
            drawn = True
    null = numeric(df, "gamma_null")
    if any_finite(null):
        ax.plot(x, null, color="#d62728", lw=1, label="null: E a(u; B), u uniform")
        series.append(("null: E a(u; B), u uniform", column_state(report, "gamma_null")))
        n = numeric(df, "n_tokens")
        cplx = (df["lambda1_is_complex"].astype(bool).to_numpy() if "lambda1_is_complex" in df
                else np.zeros(len(df), bool))
        if any_finite(n):
            half = 2 * null * _null_sd_factor(cplx) / np.sqrt(np.where(n > 0, n, np.nan))
            ax.fill_between(x, null - half, null + half, color="#d62728", alpha=0.18, lw=0,
                            label="null ± 2 s.e. (n tokens)")
        drawn = True
    null2 = numeric(df, "gamma2_null")
    if any_finite(null2) and any_finite(numeric(df, "gamma2")):
        ax.plot(x, null2, color="#d62728", lw=1, ls=":", label="null of γ₂")
    if not drawn:
        mark_no_data(ax)
    ax.set_ylabel("alignment a = ‖Bᵀx‖/‖x‖ (mean over tokens)")
    ax.set_title("γ vs depth (higher = tokens tilted toward the principal eigen-direction)", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")

    rho = numeric(df, "rho")
    adjusted = "rho_pvalue_adj" in df.columns
    p = numeric(df, "rho_pvalue_adj" if adjusted else "rho_pvalue")
    ptext = "BH-adjusted p" if adjusted else "p"
    ax2.axhline(0.5, color="#d62728", lw=1, label="null: ρ = 1/2")
    if any_finite(rho):
        sig = np.isfinite(p) & (p < ALPHA)
        ax2.plot(x, rho, color="#1f77b4", lw=1, zorder=2)
        ax2.scatter(x[sig], rho[sig], color="#1f77b4", s=30, zorder=3,
                    label=f"ρ, {ptext} < {ALPHA} (one-sided binomial)")
        ax2.scatter(x[~sig], rho[~sig], facecolor="white", edgecolor="#1f77b4", s=30, zorder=3,
                    label=f"ρ, {ptext} ≥ {ALPHA} or n/a")
        series.append(("ρ", state))
        if len(x) <= 16:  # printed p-values; more layers: the summary table has them
            for i, (xi, ri, pi) in enumerate(zip(x, rho, p)):
                if np.isfinite(ri):
                    ax2.annotate(format_p(pi), (xi, ri), textcoords="offset points",
                                 xytext=(0, 7 if i % 2 == 0 else -12), ha="center", fontsize=7,
                                 color="#333333")
    else:
        mark_no_data(ax2)
    ax2.set_ylim(-0.05, 1.12)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("ρ: share of tokens whose\nalignment increased")
    ax2.set_title(f"ρ vs depth, labels: {ptext}-value of the exact binomial test against 1/2", fontsize=9)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7, loc="lower right")
    integer_xaxis(ax2)
    return tag(fig, series)


def gap_ratio_vs_depth(report: Any) -> Figure:
    """Gap ratio |λ2|/|λ1| of F_t vs depth; complex λ1 layers marked."""
    df = section_table(report, "power", ("layer", "gap_ratio")).sort_values("layer")
    x, y = numeric(df, "layer"), numeric(df, "gap_ratio")
    fig = new_figure(8.5, 4.0)
    ax = fig.subplots()
    ax.set_title("Spectral gap of F_t through depth (smaller = stronger pull toward v₁)")
    if any_finite(y):
        cplx = (df["lambda1_is_complex"].astype(bool).to_numpy() if "lambda1_is_complex" in df
                else np.zeros(len(df), bool))
        ax.plot(x, y, color="#1f77b4", lw=1, zorder=2)
        ax.scatter(x[~cplx], y[~cplx], color="#1f77b4", s=25, zorder=3, label="λ₁ real")
        if cplx.any():
            ax.scatter(x[cplx], y[cplx], color="#ff7f0e", marker="D", s=25, zorder=3, label="λ₁ complex (pair)")
        ax.axhline(1.0, color="#7f7f7f", ls="--", lw=0.8, label="no gap (|λ₂| = |λ₁|)")
        ax.legend(fontsize=8)
        tag(fig, [("gap ratio", rows_state(report, df))],
            ["λ₁ real", "λ₁ complex (pair)"] if cplx.any() else ["λ₁ real"])
        top = np.nanmax(y[np.isfinite(y)])
        ax.set_ylim(0, max(1.05, 1.05 * top))
    else:
        mark_no_data(ax)
    ax.set_xlabel("layer")
    ax.set_ylabel("gap ratio r = |λ₂| / |λ₁|")
    ax.grid(alpha=0.3)
    integer_xaxis(ax)
    return fig
