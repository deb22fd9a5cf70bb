"""Tables of the HTML report: headline summaries, qualifier ordering, value formatting, width.

    >>> ordered_columns(["layer", "gamma", "rho", "gamma_null", "rho_pvalue_adj", "rho_pvalue"])
    ['layer', 'gamma', 'gamma_null', 'rho', 'rho_pvalue_adj', 'rho_pvalue']
    >>> format_cell("rho_pvalue", 3.2e-7).text, format_cell("gap_ratio", 0.123456).text
    ('3.2e-07', '0.1235')

pandas only (no matplotlib, no Jinja2): `spectral_hooks.report.html` turns the `TableView`
objects built here into HTML. Trained and init rows are never averaged together: a summary that
averages rows (the positions of a layer, the units of a layer) groups them by ``variant`` too.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from .compare import KEY_COLUMNS
from .sections_info import HEADLINES, LABEL_COLUMNS, QUALIFIERS

__all__ = ["Cell", "TableView", "ordered_columns", "qualified_by", "format_cell", "is_pvalue",
           "summary_frame", "table_views", "MAX_ROWS", "WIDTH_PX"]

MAX_ROWS = 60  # rows of a full table shown; the saved report holds them all
WIDTH_PX = 1000  # a table chunk is at most this wide (the page's text column is ~1064 px)
SUMMARY_ONLY = (10, 40)  # a table this small (columns, rows) is shown whole, with no summary
VARIANT_ORDER = ("trained", "init", "symmetric", "schur")
_CHAR_PX, _PAD_PX = 7.6, 18  # 13px tabular figures; cell padding and border


@dataclass
class Cell:
    """One formatted table cell: its text, its kind (for styling) and an optional tooltip."""

    text: str
    kind: str = "num"  # num, p (a p-value), na (missing), txt, bool
    title: str | None = None


@dataclass
class TableView:
    """One HTML table: column names, formatted rows, and what a reader should know about it."""

    columns: list[str]
    rows: list[list[Cell]]
    row_states: list[str] = field(default_factory=list)  # the variant of each row, or ""
    caption: str = ""


# ---------------------------------------------------------------------- column order
def is_pvalue(column: str) -> bool:
    """Whether ``column`` holds p-values (printed in scientific notation)."""
    return "pvalue" in column.split("_") or column.endswith("_p")


def qualified_by(column: str, columns: list[str]) -> str | None:
    """The column that ``column`` qualifies (its null, p-value, control...), or None."""
    parts = column.split("_")
    if set(parts) <= QUALIFIERS:  # a bare "pvalue" qualifies the column before it
        at = columns.index(column) if column in columns else 0
        before = [c for c in columns[:at] if not set(c.split("_")) <= QUALIFIERS]
        return before[-1] if before else None
    for cut in range(len(parts) - 1, 0, -1):
        base, rest = "_".join(parts[:cut]), parts[cut:]
        if not set(rest) <= QUALIFIERS:
            break
        if base in columns and base != column:
            return base
        # "coupling_pvalue" qualifies "coupling_rho": the first column named base_<word>
        for other in columns:
            if (other != column and other.startswith(base + "_")
                    and not set(other[len(base) + 1:].split("_")) & QUALIFIERS):
                return other
    return None


def ordered_columns(columns: list[str]) -> list[str]:
    """``columns`` with every qualifier placed right after the column it qualifies."""
    columns = [str(c) for c in columns]
    parent = {c: qualified_by(c, columns) for c in columns}

    def root(c: str) -> str:
        seen = set()
        while parent.get(c) is not None and c not in seen:
            seen.add(c)
            c = parent[c]  # type: ignore[assignment]
        return c

    out: list[str] = []
    for c in columns:
        if parent[c] is None:
            out.append(c)
            out += [q for q in columns if q != c and parent[q] is not None and root(q) == c]
    return out + [c for c in columns if c not in out]


# ---------------------------------------------------------------------- values
def format_cell(column: str, value: object) -> Cell:
    """One value as text: p-values as 3.2e-07, floats to 4 significant digits, NaN as a dash."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return Cell("–", "na", "missing (NaN)")
    if isinstance(value, (bool, np.bool_)):
        return Cell("yes" if value else "no", "bool")
    if isinstance(value, (int, np.integer)):
        return Cell(str(int(value)))
    if isinstance(value, (complex, np.complexfloating)):
        if math.isnan(value.real) or math.isnan(value.imag):
            return Cell("–", "na", "missing (NaN)")
        return Cell(f"{value.real:.4g}{value.imag:+.4g}j")
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if is_pvalue(column):
            return Cell(f"{v:.1e}", "p", repr(v))
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return Cell(f"{v:.2e}", "num", repr(v))
        return Cell(f"{v:.4g}", "num", repr(v) if f"{v:.4g}" != repr(v) else None)
    return Cell(str(value), "txt")


# ---------------------------------------------------------------------- summaries
def _expand(patterns: tuple[str, ...], columns: list[str]) -> list[str]:
    out: list[str] = []
    for p in patterns:
        out += [c for c in columns if fnmatch.fnmatchcase(c, p) and c not in out]
    return out


def _headline_columns(name: str, df: pd.DataFrame) -> list[str]:
    columns = [str(c) for c in df.columns]
    parent = {c: qualified_by(c, columns) for c in columns}
    keys = [k for k in KEY_COLUMNS if k in columns and k not in ("position", "unit", "index",
                                                                   "ablated_layer")]
    if name in HEADLINES:
        heads = _expand(HEADLINES[name], [c for c in columns if parent[c] is None])
    else:  # a section this module does not know: its keys and its first few metrics
        metrics = [c for c in columns if c not in KEY_COLUMNS and parent[c] is None]
        heads = keys + metrics[:6]
    heads = [k for k in keys if k not in heads] + heads
    heads += [c for c in LABEL_COLUMNS if c in columns and c not in heads]

    def root(c: str) -> str:
        for _ in range(len(columns)):
            if parent.get(c) is None:
                break
            c = parent[c]  # type: ignore[assignment]
        return c

    chosen = heads + [c for c in columns if parent[c] is not None and root(c) in heads
                      and not c.endswith("_se")]
    return [c for c in ordered_columns(columns) if c in chosen]


def _variant_sort(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if "variant" not in df.columns:
        return df.sort_values(keys, kind="stable") if keys else df
    rank = {v: i for i, v in enumerate(VARIANT_ORDER)}
    order = df["variant"].astype(str).map(lambda v: rank.get(v, len(rank)))
    firsts = [k for k in keys if k != "variant"]
    work = df.assign(_vrank=order.to_numpy())
    return work.sort_values(firsts + ["_vrank"], kind="stable").drop(columns="_vrank")


def _spectra_summary(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    keys = [k for k in ("source", "variant", "layer", *LABEL_COLUMNS) if k in df.columns]
    re_, im = (cast(pd.Series, pd.to_numeric(df[c], errors="coerce")) for c in ("real", "imag"))
    mod = np.hypot(re_, im)
    work = df[keys].assign(max_abs=mod, frac_complex=(im.abs() > 1e-6 * mod).astype(float),
                           n_outside_unit=(mod > 1).astype(int), n_eigenvalues=1)
    out = work.groupby(keys, sort=True, observed=True).agg(
        n_eigenvalues=("n_eigenvalues", "sum"), max_abs=("max_abs", "max"),
        frac_complex=("frac_complex", "mean"), n_outside_unit=("n_outside_unit", "sum"),
    ).reset_index()
    return out, "one row per source and layer, over every position listed"


def summary_frame(name: str, df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The headline columns of a section, rows averaged where several share a key (by variant).

    Returns the table and a sentence saying what was selected or averaged.
    """
    if name == "spectra" and {"real", "imag", "layer"} <= set(df.columns):
        return _spectra_summary(df)
    notes = []
    if "ablated_layer" in df.columns:
        ablated = cast(pd.Series, pd.to_numeric(df["ablated_layer"], errors="coerce"))
        if (ablated >= 0).any():
            df = cast(pd.DataFrame, df[ablated < 0])
            notes.append("whole-model variants only (ablations of single layers: full table)")
    cols = _headline_columns(name, df)
    keys = [k for k in KEY_COLUMNS if k in cols]
    out = cast(pd.DataFrame, df[cols])
    if keys and out.duplicated(keys).any():
        numeric = [c for c in cols if c not in keys and (pd.api.types.is_numeric_dtype(out[c])
                                                         or pd.api.types.is_bool_dtype(out[c]))]
        labels = [c for c in LABEL_COLUMNS if c in cols]  # one value per key: kept
        grouped = out.groupby(keys + labels, sort=False, observed=True, dropna=False)
        agg = cast(pd.DataFrame, grouped[numeric].mean(numeric_only=False) if numeric
                   else grouped.size().to_frame("_"))
        agg["n_rows"] = grouped.size()
        out = agg.drop(columns="_", errors="ignore").reset_index()
        counts = sorted(set(out["n_rows"].tolist()))
        what = "positions" if "position" in df.columns else ("units" if "unit" in df.columns else "rows")
        per = " and ".join(k for k in keys if k != "variant") or "row"
        notes.append(f"mean over the {what} of each {per} ({', '.join(map(str, counts))} each)"
                     + ("; trained and init averaged separately" if "variant" in keys else ""))
    numeric_keys = [k for k in keys if k != "variant"]
    out = _variant_sort(out, numeric_keys + (["variant"] if "variant" in keys else []))
    if "variant" in out.columns:  # variant after the layer / depth it qualifies
        order = numeric_keys + ["variant"] + [c for c in out.columns if c not in keys]
        out = cast(pd.DataFrame, out[order + [c for c in out.columns if c not in order]])
    return out.reset_index(drop=True), "; ".join(notes)


def shows_whole(df: pd.DataFrame) -> bool:
    """Whether the table is small enough to show whole, without a separate summary."""
    return len(df.columns) <= SUMMARY_ONLY[0] and len(df) <= SUMMARY_ONLY[1]


# ---------------------------------------------------------------------- views
def _col_width(name: str, cells: list[Cell]) -> float:
    header = max((len(p) for p in name.split("_")), default=1) + 1
    body = max((len(c.text) for c in cells), default=1)
    return max(header, body) * _CHAR_PX + _PAD_PX


def table_views(df: pd.DataFrame, *, max_rows: int | None = MAX_ROWS, caption: str = "",
                width_px: float = WIDTH_PX) -> list[TableView]:
    """``df`` as one or more tables no wider than ``width_px``: key columns repeat in each."""
    shown = df if max_rows is None or len(df) <= max_rows else df.head(max_rows)
    columns = ordered_columns([str(c) for c in shown.columns])
    cells = {c: [format_cell(c, v) for v in shown[c].tolist()] for c in columns}
    keys = [c for c in columns if c in KEY_COLUMNS or c in LABEL_COLUMNS]
    key_w = sum(_col_width(k, cells[k]) for k in keys)
    chunks: list[list[str]] = []
    current: list[str] = []
    used = key_w
    for c in (c for c in columns if c not in keys):
        w = _col_width(c, cells[c])
        if current and used + w > width_px:
            chunks.append(current)
            current, used = [], key_w
        current.append(c)
        used += w
    if current or not chunks:
        chunks.append(current)
    states = (shown["variant"].astype(str).tolist() if "variant" in shown.columns
              else [""] * len(shown))
    views = []
    for i, chunk in enumerate(chunks):
        cols = keys + chunk
        note = caption
        if len(chunks) > 1:
            note = (note + "; " if note else "") + f"columns part {i + 1} of {len(chunks)}"
        rows = [[cells[c][r] for c in cols] for r in range(len(shown))]
        views.append(TableView(cols, rows, states, note))
    return views
