"""Figures of a `Report` (matplotlib, Agg canvas; pyplot's global state is never touched).

Each function takes a Report (or anything with ``.get(name)`` returning a DataFrame or None) and
returns a `matplotlib.figure.Figure` that reads on its own: title, axis labels, legend. A figure
whose section is missing raises `MissingSectionError` when asked for by name; `figures(report)`
simply leaves it out. NaN values leave gaps and never raise.

Layout: shared helpers in `spectral_hooks.report.figure_tools`, the power-method figures in
`spectral_hooks.report.plots_power`, the Jacobian-view figures in
`spectral_hooks.report.plots_jacobian`; this module holds the registry `FIGURES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from ..errors import UnknownNameError
from .figure_tools import ALPHA, COMPLEX_TOL, VARIANT_STYLE, MissingSectionError  # noqa: F401
from .plots_jacobian import (
    bottleneck_erank,
    rotation_symmetry_vs_depth,
    topology_coupling,
    units_scatter,
)
from .plots_power import alignment_vs_depth, eigenvalues_plane, gap_ratio_vs_depth

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

# ---------------------------------------------------------------------- registry
@dataclass(frozen=True)
class FigureSpec:
    """A figure of the registry: the function drawing it from a report, the section whose
    HTML part shows it, and its caption."""

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


def figure(report: Any, name: str) -> Figure:
    """The figure ``name`` (a key of `FIGURES`); MissingSectionError if its data is absent."""
    if name not in FIGURES:
        raise UnknownNameError("name", name, f"a figure name; available: {sorted(FIGURES)}")
    return FIGURES[name].func(report)


def figures(report: Any) -> dict[str, Figure]:
    """Every figure the report's sections allow, in display order; missing ones are left out."""
    out: dict[str, Figure] = {}
    for name, spec in FIGURES.items():
        try:
            out[name] = spec.func(report)
        except MissingSectionError:
            continue
    return out
