"""Figures of the Jacobian view: rotation and symmetry, the bottleneck, topology and units.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze(bottleneck=True)  # a bottleneck section
    >>> fig = bottleneck_erank(report)           # a matplotlib Figure
    >>> [ax.get_ylabel().split()[:2] for ax in fig.axes]   # two panels
    [['effective', 'rank'], ['surviving', 'directions']]
"""

from __future__ import annotations

import math
import re
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .figure_tools import (
    ALPHA,
    NULL_STATE,
    VARIANT_STYLE,
    any_finite,
    column_state,
    integer_xaxis,
    mark_no_data,
    new_figure,
    numeric,
    per_layer_range,
    rows_state,
    section_table,
    tag,
    trend_label,
)


# ---------------------------------------------------------------------- Jacobian view
def _variants(df) -> list:
    """The variants of a table in display order (trained, init, ...); [None] without the column."""
    if "variant" not in df.columns:
        return [None]
    found = list(dict.fromkeys(df["variant"].astype(str)))
    return [v for v in VARIANT_STYLE if v in found] + [v for v in found if v not in VARIANT_STYLE]


def rotation_symmetry_vs_depth(report: Any) -> Figure:
    """frac_complex of J (full spectrum, else its top-k) and sym_energy of ΔJ vs depth, each with
    its null; one line per variant (trained, init): positions of a layer are averaged, variants
    never are."""
    df = section_table(report, "jacobian", ("layer",))
    top = sorted(c for c in df.columns if re.fullmatch(r"frac_complex_top\d+", c))
    fc = "frac_complex" if "frac_complex" in df.columns or not top else top[0]
    fig = new_figure(8.5, 6.6)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    fig.suptitle("Rotation vs symmetry of the block Jacobians through depth, trained vs init")
    series: list[tuple[str, str]] = []
    variants = _variants(df)
    for a, col, null_col, ylabel, title in (
        (ax, fc, fc + "_null", "share of complex eigenvalues of J", fc + trend_label(report, fc)),
        (ax2, "sym_energy", None, "symmetric energy ‖S‖²_F / ‖ΔJ‖²_F",
         "sym_energy" + trend_label(report, "sym_energy")),
    ):
        drawn = False
        for v in variants:
            rows = df if v is None else cast(pd.DataFrame, df[df["variant"].astype(str) == v])
            agg = per_layer_range(rows, "layer", [col])
            x = agg.index.to_numpy(dtype=float)
            y = agg[col].to_numpy() if col in agg else np.full(len(agg), np.nan)
            if not any_finite(y):
                continue
            multi = len(rows) > len(agg)
            state = rows_state(report, rows)
            label = (v or state) + (" (mean over positions)" if multi else "")
            style = VARIANT_STYLE.get(v or "trained", VARIANT_STYLE["trained"])
            a.plot(x, y, ms=4, label=label, **style)
            series.append((f"{col}: {label}", state))
            if multi:
                a.fill_between(x, agg[col + "__min"], agg[col + "__max"], color=style["color"],
                               alpha=0.13, lw=0, label=f"{v or state}: range over positions")
            drawn = True
        if not drawn:
            mark_no_data(a)
        if null_col is not None and null_col in df.columns:
            agg = per_layer_range(df, "layer", [null_col])
            if any_finite(agg[null_col].to_numpy()):
                label = "null: random real Gaussian matrix" + (
                    " (Edelman–Kostlan–Shub)" if null_col == "frac_complex_null" else ", same top-k")
                a.plot(agg.index.to_numpy(dtype=float), agg[null_col], color="#d62728", ls="--",
                       lw=1, label=label)
                series.append((label, NULL_STATE))
        if col == "sym_energy":
            a.axhline(0.5, color="#d62728", ls="--", lw=1, label="null: random matrix (0.5)")
            a.axhline(1.0, color="#7f7f7f", ls=":", lw=0.8, label="1 = symmetric")
            series.append(("null: random matrix (0.5)", NULL_STATE))
        a.set_ylim(-0.03, 1.05)
        a.set_ylabel(ylabel, fontsize=8)
        a.set_title(title, fontsize=9)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="best")
    ax2.set_xlabel("layer")
    integer_xaxis(ax2)
    return tag(fig, series, [v for v in variants if v is not None])


def bottleneck_erank(report: Any) -> Figure:
    """Effective rank (and surviving directions) of the cumulative Jacobian product per variant."""
    df = section_table(report, "bottleneck", ("variant", "depth"))
    if "ablated_layer" in df.columns:  # whole-model variants; single-layer ablations: the table
        ablated = numeric(df, "ablated_layer")
        df = df[~(ablated >= 0)]
    series: list[tuple[str, str]] = []
    fig = new_figure(8.5, 6.4)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    fig.suptitle("End-to-end bottleneck: ranks of P_l = J_l ⋯ J_1 by depth")
    variants = list(dict.fromkeys(df["variant"].astype(str)))
    order = [v for v in VARIANT_STYLE if v in variants] + [v for v in variants if v not in VARIANT_STYLE]
    for a, col, ylabel in ((ax, "erank", "effective rank (Roy–Vetterli)"),
                           (ax2, "surviving", "surviving directions\nσ_i ≥ 10⁻² σ₁")):
        drawn = False
        for v in order:
            sub = cast(pd.DataFrame, df[df["variant"].astype(str) == v]).sort_values("depth")
            x, y = numeric(sub, "depth"), numeric(sub, col)
            y = np.where(y > 0, y, np.nan)  # log axis
            if any_finite(y):
                a.plot(x, y, ms=4, label=v, **VARIANT_STYLE.get(v, {}))
                series.append((v, rows_state(report, sub)))
                drawn = True
        if drawn:
            a.set_yscale("log")
            a.legend(fontsize=8, title="variant", title_fontsize=8)
        else:
            mark_no_data(a)
        a.set_ylabel(ylabel + " (log)" if drawn else ylabel, fontsize=8)
        a.grid(alpha=0.3, which="both")
    ax.set_title("trained vs initialisation vs ablations (symmetric part, Schur diagonal)", fontsize=9)
    ax2.set_xlabel("depth l (number of blocks in the product)")
    integer_xaxis(ax2)
    return tag(fig, series, order)


# ---------------------------------------------------------------------- topology
def topology_coupling(report: Any) -> Figure:
    """Spearman coupling between bridge score and amplification per layer, with its controls."""
    df = section_table(report, "topology", ("layer",)).sort_values("layer")
    x = numeric(df, "layer")
    fig = new_figure(8.5, 6.0)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    fig.suptitle("Topology of residual units: bridges vs amplification, per layer")
    rho = numeric(df, "coupling_rho")
    adjusted = "coupling_pvalue_adj" in df.columns
    p = numeric(df, "coupling_pvalue_adj" if adjusted else "coupling_pvalue")
    ptext = "BH-adjusted p" if adjusted else "p"
    series: list[tuple[str, str]] = []
    ax.axhline(0, color="#7f7f7f", lw=0.8)
    if any_finite(rho):
        sig = np.isfinite(p) & (p < ALPHA)
        state = column_state(report, "coupling_rho")
        ax.plot(x, rho, color="#1f77b4", lw=1.2, label=state)
        series.append((state, state))
        ax.scatter(x[sig], rho[sig], color="#1f77b4", s=30, zorder=3, label=f"{ptext} < {ALPHA}")
        ax.scatter(x[~sig], rho[~sig], facecolor="white", edgecolor="#1f77b4", s=30, zorder=3,
                   label=f"{ptext} ≥ {ALPHA} or n/a")
    for col, style, label in (
        ("coupling_rho_init", dict(color="#7f7f7f", ls="--", marker="s"), "control: initialisation"),
        ("coupling_rho_shuffled", dict(color="#d62728", ls=":", marker="x"), "control: shuffled communities"),
    ):
        y = numeric(df, col)
        if any_finite(y):
            ax.plot(x, y, ms=4, label=label, **style)
            series.append((label, column_state(report, col)))
    if not any_finite(rho):
        mark_no_data(ax)
    ax.set_ylim(-1.05, 1.05)
    ax.set_ylabel("Spearman ρ(bridge score, amplification)", fontsize=8)
    ax.set_title("coupling per layer", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")

    mod = numeric(df, "modularity")
    if any_finite(mod):
        ax2.plot(x, mod, color="#2ca02c", marker="o", ms=4, label="modularity")
        series.append(("modularity", column_state(report, "modularity")))
        ax2.set_ylabel("modularity Q", fontsize=8)
        ncom = numeric(df, "n_communities")
        if len(x) <= 32:
            for xi, mi, ni in zip(x, mod, ncom):
                if np.isfinite(mi) and np.isfinite(ni):
                    ax2.annotate(f"{int(ni)}", (xi, mi), textcoords="offset points", xytext=(0, 5),
                                 ha="center", fontsize=6)
        ax2.legend(fontsize=7, loc="best", title="labels: number of communities", title_fontsize=7)
    else:
        ax2.set_ylabel("modularity Q", fontsize=8)
        mark_no_data(ax2)
    ax2.set_title("community structure of the unit-correlation graph", fontsize=9)
    ax2.set_xlabel("layer")
    ax2.grid(alpha=0.3)
    integer_xaxis(ax2)
    return tag(fig, series)


#: colours of the largest communities of a layer, by size rank; smaller ones are grey
_RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def units_scatter(report: Any, *, max_panels: int = 12, ncols: int = 4) -> Figure:
    """Bridge score vs amplification of each residual unit, one panel per layer.

    Colour: the unit's community, by size rank within its layer (community labels are arbitrary
    and per layer, so the legend names ranks: largest, 2nd largest, ...; the rest grey).
    """
    df = section_table(report, "units", ("layer", "bridge_score", "amplification"))
    layers = sorted({int(v) for v in numeric(df, "layer") if np.isfinite(v)})
    if len(layers) > max_panels:  # evenly spaced subset
        pick = np.unique(np.linspace(0, len(layers) - 1, max_panels).round().astype(int))
        layers = [layers[i] for i in pick]
    n = max(len(layers), 1)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = new_figure(2.9 * ncols + 0.4, 2.6 * nrows + 1.1)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    fig.suptitle("Residual units: bridge score vs amplification ‖ΔJ e_i‖, per layer")
    lay = numeric(df, "layer")
    used_ranks: set[int] = set()
    state = rows_state(report, df)
    for ax, layer in zip(axes, layers):
        sub = cast(pd.DataFrame, df[lay == layer])
        bx, ay = numeric(sub, "bridge_score"), numeric(sub, "amplification")
        ok = np.isfinite(bx) & np.isfinite(ay)
        if ok.any():
            comm = numeric(sub, "community")[ok] if "community" in sub else np.zeros(int(ok.sum()))
            labels, counts = np.unique(np.nan_to_num(comm, nan=-1), return_counts=True)
            rank_of = {lab: r for r, lab in enumerate(labels[np.argsort(-counts, kind="stable")])}
            ranks = np.array([rank_of[c] for c in np.nan_to_num(comm, nan=-1)])
            colours = [(_RANK_COLOURS[r] if r < len(_RANK_COLOURS) else "#b0b0b0") for r in ranks]
            ax.scatter(bx[ok], ay[ok], s=6, c=colours, linewidths=0)
            used_ranks |= {min(int(r), len(_RANK_COLOURS)) for r in ranks}
        else:
            mark_no_data(ax)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("bridge score P_i", fontsize=8)
        ax.set_ylabel("amplification g_i", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(layers):]:
        ax.set_visible(False)
    names = ["largest community", "2nd largest", "3rd largest"] + [
        f"{i}th largest" for i in range(4, len(_RANK_COLOURS) + 1)]
    categories = [names[r] if r < len(_RANK_COLOURS) else "smaller communities"
                  for r in sorted(used_ranks)]
    handles = [Line2D([], [], ls="", marker="o", color=(_RANK_COLOURS[r] if r < len(_RANK_COLOURS)
                                                        else "#b0b0b0"), label=lab)
               for r, lab in zip(sorted(used_ranks), categories)]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4),
                   fontsize=8, frameon=False, title="community of the unit, by size within its layer",
                   title_fontsize=8)
    return tag(fig, [(f"layer {layer}", state) for layer in layers], categories, layout="panels")
