"""Figures of a `Report` (matplotlib, Agg canvas; pyplot's global state is never touched).

Each function takes a Report (or anything with ``.get(name)`` returning a DataFrame or None) and
returns a `matplotlib.figure.Figure` that reads on its own: title, axis labels, legend. A figure
whose section is missing raises `MissingSectionError` when asked for by name; `figures(report)`
simply leaves it out. NaN values leave gaps and never raise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle

__all__ = [
    "FIGURES",
    "MissingSectionError",
    "figure",
    "figures",
    "eigenvalues_plane",
    "alignment_vs_depth",
    "gap_ratio_vs_depth",
    "rotation_symmetry_vs_depth",
    "bottleneck_erank",
    "topology_coupling",
    "units_scatter",
]

ALPHA = 0.05  # significance level used to mark p-values
COMPLEX_TOL = 1e-6  # |Im| > tol |lambda| counts as complex (METRICS.md section 2)
VARIANT_STYLE = {
    "trained": dict(color="#1f77b4", marker="o", linestyle="-"),
    "init": dict(color="#7f7f7f", marker="s", linestyle="--"),
    "symmetric": dict(color="#2ca02c", marker="^", linestyle="-."),
    "schur": dict(color="#d62728", marker="D", linestyle=":"),
}


class MissingSectionError(LookupError):
    """The report lacks the section (or the columns) a figure needs."""


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _section(report, name: str, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    df = report.get(name)
    if df is None or len(df) == 0:
        raise MissingSectionError(f"the report has no {name!r} section")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MissingSectionError(f"section {name!r} lacks columns {missing}")
    return df


def _num(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _finite(*arrays: np.ndarray) -> bool:
    return any(np.isfinite(a).any() for a in arrays)


def _no_data(ax, what: str = "no finite values") -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="#888888")


def _per_layer(df: pd.DataFrame, x: str, cols: list[str]) -> pd.DataFrame:
    """Mean, min and max of ``cols`` per value of ``x`` (several positions per layer)."""
    present = [c for c in cols if c in df.columns]
    work = pd.DataFrame({x: _num(df, x)})
    for c in present:
        work[c] = _num(df, c)
    work = work[np.isfinite(work[x])]
    g = work.groupby(x, sort=True)
    out = g.mean()
    for c in present:
        out[c + "__min"] = g[c].min()
        out[c + "__max"] = g[c].max()
    return out


def _trend_label(report, metric: str) -> str:
    trends = report.get("trends")
    if trends is None or "metric" not in trends.columns:
        return ""
    row = trends[trends["metric"] == metric]
    if len(row) == 0:
        return ""
    rho = float(pd.to_numeric(row["spearman_rho"], errors="coerce").iloc[0]) if "spearman_rho" in row else math.nan
    p = float(pd.to_numeric(row["pvalue"], errors="coerce").iloc[0]) if "pvalue" in row else math.nan
    if not math.isfinite(rho):
        return ""
    return f" (depth trend: Spearman ρ = {rho:+.2f}, p = {_fmt_p(p)})"


def _fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.3f}"


def _integer_xaxis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# ---------------------------------------------------------------------- eigenvalues
def eigenvalues_plane(report, source: str = "F", *, max_panels: int = 48, ncols: int = 4) -> Figure:
    """Eigenvalues per layer in the complex plane, one small panel per layer.

    ``source`` is ``"F"`` (layer matrices F_t) or ``"jacobian"`` (token Jacobians J_l; several
    positions of a layer share its panel). Real eigenvalues and complex conjugate pairs are drawn
    in different colours; the unit circle is dashed.
    """
    df = _section(report, "spectra", ("source", "layer", "real", "imag"))
    df = df[df["source"].astype(str) == source]
    if len(df) == 0:
        raise MissingSectionError(f"section 'spectra' has no rows with source == {source!r}")
    layers = sorted({int(v) for v in _num(df, "layer") if np.isfinite(v)})[:max_panels]
    n = max(len(layers), 1)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(2.6 * ncols + 0.4, 2.5 * nrows + 0.9)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    what = "F_t = Σ_h W_O^h W_V^h" if source == "F" else "token Jacobians J_l"
    fig.suptitle(f"Eigenvalues of {what} in the complex plane, per layer")
    layer_col = _num(df, "layer")
    re_all, im_all = _num(df, "real"), _num(df, "imag")
    for ax, layer in zip(axes, layers):
        sel = layer_col == layer
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
            top = float(mod.max()) if mod.size else 0.0
            lim = 1.12 * max(top, 1.0) if top >= 0.25 else 1.25 * max(top, 1e-12)
            if top < 0.25:
                ax.text(0.02, 0.02, "unit circle outside view", transform=ax.transAxes, fontsize=6, color="#555555")
        else:
            lim = 1.2
            _no_data(ax)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal", adjustable="box")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("Re λ", fontsize=8)
        ax.set_ylabel("Im λ", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(layers):]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], ls="", marker="o", color="#1f77b4", label="real eigenvalue"),
        Line2D([], [], ls="", marker="o", color="#ff7f0e", label="complex (conjugate pair)"),
        Line2D([], [], ls="--", color="#555555", label="unit circle |λ| = 1"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


# ---------------------------------------------------------------------- power view
def _null_sd_factor(is_complex: np.ndarray) -> np.ndarray:
    """sd of a(u; B) for u uniform on the sphere, as a multiple of its mean (large d).

    a^2 ~ Beta(k/2, (d-k)/2) with E a^2 = k/d, and E a ~ sqrt(2/(pi d)) (k=1) or
    sqrt(pi/(2d)) (k=2), so sd/mean = sqrt(pi/2 - 1) (k=1) or sqrt(4/pi - 1) (k=2).
    """
    return np.where(is_complex, math.sqrt(4 / math.pi - 1), math.sqrt(math.pi / 2 - 1))


def alignment_vs_depth(report) -> Figure:
    """gamma_in, gamma (and gamma2) vs depth against the null band; rho with p-values below."""
    df = _section(report, "power", ("layer",)).sort_values("layer")
    x = _num(df, "layer")
    fig = _new_figure(8.5, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    fig.suptitle("Alignment with the principal subspace of F_t through depth")
    drawn = False
    for col, style, label in (
        ("gamma_in", dict(color="#7f7f7f", marker="o", ls="--"), "γ_in: layer input (resid_pre)"),
        ("gamma", dict(color="#1f77b4", marker="o", ls="-"), "γ: layer output (resid_post)"),
        ("gamma2", dict(color="#9467bd", marker="^", ls=":"), "γ₂: top-two eigen-planes"),
    ):
        y = _num(df, col)
        if _finite(y):
            ax.plot(x, y, label=label, ms=4, **style)
            drawn = True
    null = _num(df, "gamma_null")
    if _finite(null):
        ax.plot(x, null, color="#d62728", lw=1, label="null: E a(u; B), u uniform")
        n = _num(df, "n_tokens")
        cplx = df["lambda1_is_complex"].astype(bool).to_numpy() if "lambda1_is_complex" in df else np.zeros(len(df), bool)
        if _finite(n):
            half = 2 * null * _null_sd_factor(cplx) / np.sqrt(np.where(n > 0, n, np.nan))
            ax.fill_between(x, null - half, null + half, color="#d62728", alpha=0.18, lw=0,
                            label="null ± 2 s.e. (n tokens)")
        drawn = True
    null2 = _num(df, "gamma2_null")
    if _finite(null2) and _finite(_num(df, "gamma2")):
        ax.plot(x, null2, color="#d62728", lw=1, ls=":", label="null of γ₂")
    if not drawn:
        _no_data(ax)
    ax.set_ylabel("alignment a = ‖Bᵀx‖/‖x‖ (mean over tokens)")
    ax.set_title("γ vs depth (higher = tokens tilted toward the principal eigen-direction)", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")

    rho, p = _num(df, "rho"), _num(df, "rho_pvalue")
    ax2.axhline(0.5, color="#d62728", lw=1, label="null: ρ = 1/2")
    if _finite(rho):
        sig = np.isfinite(p) & (p < ALPHA)
        ax2.plot(x, rho, color="#1f77b4", lw=1, zorder=2)
        ax2.scatter(x[sig], rho[sig], color="#1f77b4", s=30, zorder=3, label=f"p < {ALPHA} (one-sided binomial)")
        ax2.scatter(x[~sig], rho[~sig], facecolor="white", edgecolor="#1f77b4", s=30, zorder=3,
                    label=f"p ≥ {ALPHA} or n/a")
        if len(x) <= 24:
            for xi, ri, pi in zip(x, rho, p):
                if np.isfinite(ri):
                    ax2.annotate(f"p={_fmt_p(pi)}", (xi, ri), textcoords="offset points", xytext=(0, 6),
                                 ha="center", fontsize=6, color="#333333")
    else:
        _no_data(ax2)
    ax2.set_ylim(-0.05, 1.12)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("ρ: share of tokens whose\nalignment increased")
    ax2.set_title("ρ vs depth, p-value of the exact binomial test against 1/2", fontsize=9)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7, loc="lower right")
    _integer_xaxis(ax2)
    return fig


def gap_ratio_vs_depth(report) -> Figure:
    """Gap ratio |λ2|/|λ1| of F_t vs depth; complex λ1 layers marked."""
    df = _section(report, "power", ("layer", "gap_ratio")).sort_values("layer")
    x, y = _num(df, "layer"), _num(df, "gap_ratio")
    fig = _new_figure(8.5, 4.0)
    ax = fig.subplots()
    ax.set_title("Spectral gap of F_t through depth (smaller = stronger pull toward v₁)")
    if _finite(y):
        cplx = df["lambda1_is_complex"].astype(bool).to_numpy() if "lambda1_is_complex" in df else np.zeros(len(df), bool)
        ax.plot(x, y, color="#1f77b4", lw=1, zorder=2)
        ax.scatter(x[~cplx], y[~cplx], color="#1f77b4", s=25, zorder=3, label="λ₁ real")
        if cplx.any():
            ax.scatter(x[cplx], y[cplx], color="#ff7f0e", marker="D", s=25, zorder=3, label="λ₁ complex (pair)")
        ax.axhline(1.0, color="#7f7f7f", ls="--", lw=0.8, label="no gap (|λ₂| = |λ₁|)")
        ax.legend(fontsize=8)
        top = np.nanmax(y[np.isfinite(y)])
        ax.set_ylim(0, max(1.05, 1.05 * top))
    else:
        _no_data(ax)
    ax.set_xlabel("layer")
    ax.set_ylabel("gap ratio r = |λ₂| / |λ₁|")
    ax.grid(alpha=0.3)
    _integer_xaxis(ax)
    return fig


# ---------------------------------------------------------------------- Jacobian view
def rotation_symmetry_vs_depth(report) -> Figure:
    """frac_complex and sym_energy of ΔJ vs depth, each with its null."""
    df = _section(report, "jacobian", ("layer",))
    agg = _per_layer(df, "layer", ["frac_complex", "frac_complex_null", "sym_energy"])
    x = agg.index.to_numpy(dtype=float)
    fig = _new_figure(8.5, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    fig.suptitle("Rotation vs symmetry of the block Jacobians through depth")
    multi = len(df) > len(agg)
    for a, col, null_val, null_col, ylabel, title in (
        (ax, "frac_complex", None, "frac_complex_null", "share of complex eigenvalues of ΔJ",
         "frac_complex" + _trend_label(report, "frac_complex")),
        (ax2, "sym_energy", 0.5, None, "symmetric energy ‖S‖²_F / ‖ΔJ‖²_F",
         "sym_energy" + _trend_label(report, "sym_energy")),
    ):
        y = agg[col].to_numpy() if col in agg else np.full(len(agg), np.nan)
        if _finite(y):
            a.plot(x, y, color="#1f77b4", marker="o", ms=4, label=col + (" (mean over positions)" if multi else ""))
            if multi:
                a.fill_between(x, agg[col + "__min"], agg[col + "__max"], color="#1f77b4", alpha=0.15, lw=0,
                               label="range over positions")
        else:
            _no_data(a)
        if null_col is not None and null_col in agg and _finite(agg[null_col].to_numpy()):
            a.plot(x, agg[null_col], color="#d62728", ls="--", lw=1,
                   label="null: random real Gaussian matrix (Edelman–Kostlan–Shub)")
        if null_val is not None:
            a.axhline(null_val, color="#d62728", ls="--", lw=1, label="null: random matrix (0.5)")
            a.axhline(1.0, color="#7f7f7f", ls=":", lw=0.8, label="1 = symmetric")
        a.set_ylim(-0.03, 1.05)
        a.set_ylabel(ylabel, fontsize=8)
        a.set_title(title, fontsize=9)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="best")
    ax2.set_xlabel("layer")
    _integer_xaxis(ax2)
    return fig


def bottleneck_erank(report) -> Figure:
    """Effective rank (and surviving directions) of the cumulative Jacobian product per variant."""
    df = _section(report, "bottleneck", ("variant", "depth"))
    fig = _new_figure(8.5, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    fig.suptitle("End-to-end bottleneck: ranks of P_l = J_l ⋯ J_1 by depth")
    variants = list(dict.fromkeys(df["variant"].astype(str)))
    order = [v for v in VARIANT_STYLE if v in variants] + [v for v in variants if v not in VARIANT_STYLE]
    for a, col, ylabel in ((ax, "erank", "effective rank (Roy–Vetterli)"),
                           (ax2, "surviving", "surviving directions\nσ_i ≥ 10⁻² σ₁")):
        drawn = False
        for v in order:
            sub = df[df["variant"].astype(str) == v].sort_values("depth")
            x, y = _num(sub, "depth"), _num(sub, col)
            y = np.where(y > 0, y, np.nan)  # log axis
            if _finite(y):
                a.plot(x, y, ms=4, label=v, **VARIANT_STYLE.get(v, {}))
                drawn = True
        if drawn:
            a.set_yscale("log")
            a.legend(fontsize=8, title="variant", title_fontsize=8)
        else:
            _no_data(a)
        a.set_ylabel(ylabel + " (log)" if drawn else ylabel, fontsize=8)
        a.grid(alpha=0.3, which="both")
    ax.set_title("trained vs initialisation vs ablations (symmetric part, Schur diagonal)", fontsize=9)
    ax2.set_xlabel("depth l (number of blocks in the product)")
    _integer_xaxis(ax2)
    return fig


# ---------------------------------------------------------------------- topology
def topology_coupling(report) -> Figure:
    """Spearman coupling between bridge score and amplification per layer, with its controls."""
    df = _section(report, "topology", ("layer",)).sort_values("layer")
    x = _num(df, "layer")
    fig = _new_figure(8.5, 6.0)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    fig.suptitle("Topology of residual units: bridges vs amplification, per layer")
    rho, p = _num(df, "coupling_rho"), _num(df, "coupling_pvalue")
    ax.axhline(0, color="#7f7f7f", lw=0.8)
    if _finite(rho):
        sig = np.isfinite(p) & (p < ALPHA)
        ax.plot(x, rho, color="#1f77b4", lw=1.2, label="trained")
        ax.scatter(x[sig], rho[sig], color="#1f77b4", s=30, zorder=3, label=f"p < {ALPHA}")
        ax.scatter(x[~sig], rho[~sig], facecolor="white", edgecolor="#1f77b4", s=30, zorder=3,
                   label=f"p ≥ {ALPHA} or n/a")
    for col, style, label in (
        ("coupling_rho_init", dict(color="#7f7f7f", ls="--", marker="s"), "control: initialisation"),
        ("coupling_rho_shuffled", dict(color="#d62728", ls=":", marker="x"), "control: shuffled communities"),
    ):
        y = _num(df, col)
        if _finite(y):
            ax.plot(x, y, ms=4, label=label, **style)
    if not _finite(rho):
        _no_data(ax)
    ax.set_ylim(-1.05, 1.05)
    ax.set_ylabel("Spearman ρ(bridge score, amplification)", fontsize=8)
    ax.set_title("coupling per layer", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")

    mod = _num(df, "modularity")
    if _finite(mod):
        ax2.plot(x, mod, color="#2ca02c", marker="o", ms=4, label="modularity")
        ax2.set_ylabel("modularity Q", fontsize=8)
        ncom = _num(df, "n_communities")
        if len(x) <= 32:
            for xi, mi, ni in zip(x, mod, ncom):
                if np.isfinite(mi) and np.isfinite(ni):
                    ax2.annotate(f"{int(ni)}", (xi, mi), textcoords="offset points", xytext=(0, 5),
                                 ha="center", fontsize=6)
        ax2.legend(fontsize=7, loc="best", title="labels: number of communities", title_fontsize=7)
    else:
        ax2.set_ylabel("modularity Q", fontsize=8)
        _no_data(ax2)
    ax2.set_title("community structure of the unit-correlation graph", fontsize=9)
    ax2.set_xlabel("layer")
    ax2.grid(alpha=0.3)
    _integer_xaxis(ax2)
    return fig


def units_scatter(report, *, max_panels: int = 12, ncols: int = 4) -> Figure:
    """Bridge score vs amplification of each residual unit, one panel per layer."""
    df = _section(report, "units", ("layer", "bridge_score", "amplification"))
    layers = sorted({int(v) for v in _num(df, "layer") if np.isfinite(v)})
    if len(layers) > max_panels:  # evenly spaced subset
        pick = np.unique(np.linspace(0, len(layers) - 1, max_panels).round().astype(int))
        layers = [layers[i] for i in pick]
    n = max(len(layers), 1)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(2.9 * ncols + 0.4, 2.6 * nrows + 0.8)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    fig.suptitle("Residual units: bridge score vs amplification ‖ΔJ e_i‖, per layer")
    lay = _num(df, "layer")
    for ax, layer in zip(axes, layers):
        sub = df[lay == layer]
        bx, ay = _num(sub, "bridge_score"), _num(sub, "amplification")
        ok = np.isfinite(bx) & np.isfinite(ay)
        if ok.any():
            c = _num(sub, "community")[ok] if "community" in sub else None
            ax.scatter(bx[ok], ay[ok], s=6, c=c, cmap="tab20", linewidths=0)
        else:
            _no_data(ax)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("bridge score P_i", fontsize=8)
        ax.set_ylabel("amplification g_i", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(layers):]:
        ax.set_visible(False)
    return fig


# ---------------------------------------------------------------------- registry
@dataclass(frozen=True)
class FigureSpec:
    func: Callable[..., Figure]
    section: str  # the report section whose HTML part shows it
    caption: str


FIGURES: dict[str, FigureSpec] = {
    "eigenvalues_F": FigureSpec(
        lambda r: eigenvalues_plane(r, "F"), "power",
        "Eigenvalues of each layer matrix F_t in the complex plane; orange points are conjugate pairs."),
    "alignment": FigureSpec(
        alignment_vs_depth, "power",
        "Token alignment with the principal subspace before (γ_in) and after (γ) each layer, against "
        "the uniform-direction null; ρ below with its binomial p-value."),
    "gap_ratio": FigureSpec(gap_ratio_vs_depth, "power", "Gap ratio |λ₂|/|λ₁| of F_t through depth."),
    "eigenvalues_jacobian": FigureSpec(
        lambda r: eigenvalues_plane(r, "jacobian"), "jacobian",
        "Top eigenvalues of the token Jacobians J_l in the complex plane; the unit circle marks |λ| = 1."),
    "rotation_symmetry": FigureSpec(
        rotation_symmetry_vs_depth, "jacobian",
        "Share of complex eigenvalues and symmetric energy of ΔJ = J − I through depth, with their nulls."),
    "bottleneck": FigureSpec(
        bottleneck_erank, "bottleneck",
        "Effective rank and surviving directions of the cumulative Jacobian product, per variant."),
    "topology_coupling": FigureSpec(
        topology_coupling, "topology",
        "Spearman coupling between bridge score and amplification per layer, with the initialisation "
        "and shuffled-community controls."),
    "units": FigureSpec(units_scatter, "units", "Bridge score vs amplification of every unit, per layer."),
}


def figure(report, name: str) -> Figure:
    """The figure ``name`` (a key of `FIGURES`); MissingSectionError if its data is absent."""
    if name not in FIGURES:
        raise KeyError(f"unknown figure {name!r}; available: {sorted(FIGURES)}")
    return FIGURES[name].func(report)


def figures(report) -> dict[str, Figure]:
    """Every figure the report's sections allow, in display order; missing ones are left out."""
    out: dict[str, Figure] = {}
    for name, spec in FIGURES.items():
        try:
            out[name] = spec.func(report)
        except MissingSectionError:
            continue
    return out
