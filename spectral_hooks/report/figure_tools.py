"""What every figure of a report shares: the Agg canvas, section lookup, NaN-safe columns, styles.

    >>> fig = new_figure(4, 3)            # a Figure on its own Agg canvas; pyplot is never used
    >>> numeric(pd.DataFrame({"x": [1, None]}), "x").tolist()
    [1.0, nan]
    >>> format_p(0.000032)
    '3.2e-05'

Imports matplotlib: only `spectral_hooks.report.plots` and its figure modules import this one.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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


def new_figure(width: float, height: float) -> Figure:
    """A ``width`` x ``height`` inch Figure (100 dpi, constrained layout) on an Agg canvas."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def section_table(report: Any, name: str, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """The report's section ``name``; MissingSectionError when it is absent, empty, or lacks
    one of ``columns``."""
    df = report.get(name)
    if df is None or len(df) == 0:
        raise MissingSectionError(f"the report has no {name!r} section")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MissingSectionError(f"section {name!r} lacks columns {missing}")
    return df


def numeric(df: pd.DataFrame, col: str) -> np.ndarray:
    """Column ``col`` as float64 (non-numbers and missing values NaN; all NaN if absent)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    return cast(pd.Series, pd.to_numeric(df[col], errors="coerce")).to_numpy(dtype=float,
                                                                            na_value=np.nan)


def any_finite(*arrays: np.ndarray) -> bool:
    """True when some element of some array is finite (something to draw)."""
    return any(np.isfinite(a).any() for a in arrays)


def mark_no_data(ax: Axes, what: str = "no finite values") -> None:
    """Write ``what`` in grey at the centre of the axes ``ax`` (an empty panel says why)."""
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="#888888")


def per_layer_range(df: pd.DataFrame, x: str, cols: list[str]) -> pd.DataFrame:
    """Mean, min and max of ``cols`` per value of ``x`` (several positions per layer)."""
    present = [c for c in cols if c in df.columns]
    work = pd.DataFrame({x: numeric(df, x)})
    for c in present:
        work[c] = numeric(df, c)
    work = cast(pd.DataFrame, work[np.isfinite(work[x])])
    g = work.groupby(x, sort=True)
    out = cast(pd.DataFrame, g.mean())
    for c in present:
        out[c + "__min"] = g[c].min()
        out[c + "__max"] = g[c].max()
    return out


def trend_label(report: Any, metric: str) -> str:
    """`` (trained, depth trend: Spearman ρ = +0.52, p = 3.1e-02)`` from the report's
    ``trends`` row of ``metric``; "" when there is none or ρ is not finite."""
    trends = report.get("trends")
    if trends is None or "metric" not in trends.columns:
        return ""
    row = trends[trends["metric"] == metric]
    if len(row) == 0:
        return ""
    rho = float(cast(pd.Series, pd.to_numeric(row["spearman_rho"], errors="coerce")).iloc[0]) \
        if "spearman_rho" in row else math.nan
    p = float(cast(pd.Series, pd.to_numeric(row["pvalue"], errors="coerce")).iloc[0]) \
        if "pvalue" in row else math.nan
    if not math.isfinite(rho):
        return ""
    return f" ({base_state(report)}, depth trend: Spearman ρ = {rho:+.2f}, p = {format_p(p)})"


def format_p(p: float) -> str:
    """A p-value in scientific notation with two digits ("n/a" when not finite)."""
    if not math.isfinite(p):
        return "n/a"
    return f"{p:.1e}"  # scientific always: 3.2e-07, 4.5e-02


def integer_xaxis(ax: Axes) -> None:
    """Integer ticks only on the x axis of ``ax`` (layers)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))



# ---------------------------------------------------------------------- what a figure shows
# Every figure records, for each series it draws, the model state of the rows behind it
# (``fig.spectral_hooks_meta``): the HTML page shows it (data attributes, alt text) and the
# tests check that no series mixes trained and init and that a figure with categories has a
# legend naming them.
NULL_STATE = "null"  # a reference drawn from random matrices, not a model


def base_state(report: Any) -> str:
    """The state of rows without a ``variant`` column: the analysed model, or a difference."""
    meta = getattr(report, "metadata", None) or {}
    return "difference" if "compare" in meta else "trained"


def rows_state(report: Any, df: pd.DataFrame) -> str:
    """The model state of the rows ``df`` ("trained", "init", ...); several joined by "+"."""
    if "variant" not in df.columns:
        return base_state(report)
    values = sorted({str(v) for v in df["variant"].dropna().unique()})
    return "+".join(values) if values else base_state(report)


def column_state(report: Any, column: str) -> str:
    """The state a column of a section without ``variant`` shows (``*_init``: init...)."""
    if column.endswith("_init"):
        return "init"
    if column.endswith("_null") or "_null_" in column:
        return NULL_STATE
    if column.endswith("_shuffled"):
        return "shuffled"
    return base_state(report)


def tag(fig: Figure, series: list[tuple[str, str]], categories: list[str] | None = None,
        layout: str = "overlay") -> Figure:
    """Record on ``fig`` the (label, state) of each series drawn and its categories.

    ``layout``: "overlay" (labelled series in the same axes), "panels" (one state per panel),
    "single" (one series).
    """
    seen: list[tuple[str, str]] = []
    for item in series:
        if item not in seen:
            seen.append(item)
    fig.spectral_hooks_meta = {  # pyright: ignore[reportAttributeAccessIssue]  # our own tag
        "series": [{"label": label, "state": state} for label, state in seen],
        "categories": list(categories or []),
        "layout": layout,
    }
    return fig


def legend_labels(fig: Figure) -> list[str]:
    """Every label of every legend of ``fig`` (figure legends and axes legends)."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    out: list[str] = []
    for leg in legends:
        assert leg is not None  # filtered above
        out += [t.get_text() for t in leg.get_texts() if t.get_text() not in out]
    return out


def figure_meta(fig: Figure) -> dict[str, Any]:
    """What ``fig`` shows: states, series, categories, legend labels (for HTML and tests)."""
    meta = dict(getattr(fig, "spectral_hooks_meta", None) or {"series": [], "categories": []})
    states: list[str] = []
    for s in meta.get("series", []):
        if s["state"] not in states:
            states.append(s["state"])
    meta["states"] = [s for s in states if s != NULL_STATE] + ([NULL_STATE] if NULL_STATE in states else [])
    meta["legend"] = legend_labels(fig)
    return meta
