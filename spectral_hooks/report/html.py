"""One self-contained HTML page for a `Report`, from Jinja2 templates (autoescaped).

Figures are embedded as base64 PNG ``<img>`` elements, styling is inline CSS, and there is no
script, external stylesheet, font or image: the file reads offline in any browser. Every string
that comes from the report (metadata, section and column names, cell values) is escaped by
Jinja2's autoescaping.

Each section shows its explanation, its figures, a summary table of its headline columns
(`spectral_hooks.report.tables`) and, folded below, the full table cut into parts no wider than
the page. The page ends with a glossary of every column shown, built from the sections' column
schemas (the report's own, else those `spectral_hooks.analysis.columns` registers), so the page
needs no link to a source checkout. Each ``<figure>`` carries data attributes naming the model
states of what it draws, its categories and its legend labels.
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from .._version import __version__
from .schema import known_schema
from .sections_info import DERIVED_COLUMNS, SECTION_INFO
from .tables import MAX_ROWS, shows_whole, summary_frame, table_views

__all__ = ["render_html", "write_html", "notebook_html", "SECTION_INFO", "glossary"]

_TEMPLATES = Path(__file__).with_name("templates")
_KEY_FACTS = ("model", "config_hash", "spectral_hooks_version", "compare", "power_coverage")


def _wbr(name: object) -> Markup:
    """A column name that may wrap after its underscores (escaped)."""
    return Markup("_<wbr>").join(escape(p) for p in str(name).split("_"))


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False, lstrip_blocks=False,
)
_ENV.filters["wbr"] = _wbr


# ---------------------------------------------------------------------- glossary
@dataclass
class GlossaryEntry:
    """One column of the page's glossary: its name, meaning and dtype (from its schema)."""

    name: str
    meaning: str
    dtype: str


@dataclass
class GlossarySection:
    """The glossary of one report section: its name, title and the entries of its columns."""

    section: str
    title: str
    entries: list[GlossaryEntry] = field(default_factory=list)


def _schema_of(report: Any, name: str):
    schemas = getattr(report, "schemas", None) or {}
    return schemas.get(name) or known_schema(name)


def _meaning(schema, column: str) -> tuple[str, str]:
    declared = schema.column(column) if schema is not None else None
    if declared is not None:
        return declared.meaning, declared.dtype
    if column in DERIVED_COLUMNS:
        return DERIVED_COLUMNS[column], "summary"
    return "not described by a column schema", "?"


def glossary(report: Any, shown: Mapping[str, list[str]]) -> list[GlossarySection]:
    """The meaning of every column ``shown`` (section -> column names), from the schemas."""
    out = []
    for name, columns in shown.items():
        schema = _schema_of(report, name)
        title = SECTION_INFO.get(name, (name,))[0]
        entries = [GlossaryEntry(c, *_meaning(schema, c)) for c in columns]
        out.append(GlossarySection(name, title, entries))
    return out


# ---------------------------------------------------------------------- figures
@dataclass
class FigureView:
    """A figure as the template shows it: the PNG (base64) and its size, caption, alt text,
    and what it draws (model states, series, categories, legend) as JSON for the page."""

    name: str
    caption: str
    alt: str
    png: str
    width: int
    height: int
    states: list[str]
    layout: str
    series_json: str
    categories_json: str
    legend_json: str


def _png(fig, dpi: int = 100) -> tuple[str, int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    w, h = (int(round(v * dpi)) for v in fig.get_size_inches())
    return base64.b64encode(buf.getvalue()).decode("ascii"), w, h


def _figures(report: Any, names: list[str]) -> dict[str, list[FigureView]]:
    """``FigureView`` objects by the section they belong to (imports matplotlib)."""
    from .lazy_plots import load_plots

    plots = load_plots()
    from .figure_tools import figure_meta

    out: dict[str, list[FigureView]] = {}
    for fig_name, spec in plots.FIGURES.items():
        target = spec.section if spec.section in names else None
        if target is None and fig_name.startswith("eigenvalues") and "spectra" in names:
            target = "spectra"
        if target is None:
            continue
        try:
            fig = spec.func(report)
        except plots.MissingSectionError:
            continue
        meta = figure_meta(fig)
        png, w, h = _png(fig)
        states = meta["states"]
        alt = f"{spec.caption} Model state shown: {', '.join(states) or 'n/a'}."
        if meta["legend"]:
            alt += f" Legend: {'; '.join(meta['legend'])}."
        out.setdefault(target, []).append(FigureView(
            fig_name, spec.caption, alt, png, w, h, states, meta.get("layout", "overlay"),
            json.dumps(meta["series"], ensure_ascii=False),
            json.dumps(meta["categories"], ensure_ascii=False),
            json.dumps(meta["legend"], ensure_ascii=False)))
    return out


# ---------------------------------------------------------------------- sections
def _section_view(report: Any, name: str, df, figures: list[FigureView]) -> dict:
    info = SECTION_INFO.get(name)
    view: dict[str, Any] = dict(name=name, title=info[0] if info else name,
                                explain=info[1] if info else "", figures=figures,
                                missing=df is None, summary=None, summary_note="", full=[],
                                meanings={}, key_cols=[], n_rows=0, n_cols=0, cut=False, shown_rows=0)
    if df is None:
        return view
    schema = _schema_of(report, name)
    from .compare import KEY_COLUMNS

    whole = shows_whole(df)
    if not whole:
        summary, note = summary_frame(name, df)
        view["summary"] = table_views(summary, max_rows=None)
        view["summary_note"] = note
        shown_cols = [str(c) for c in summary.columns]
    else:
        shown_cols = []
    view["full"] = table_views(df, max_rows=MAX_ROWS)
    for v in view["full"]:
        shown_cols += [c for c in v.columns if c not in shown_cols]
    view["meanings"] = {c: _meaning(schema, c)[0] for c in shown_cols}
    view["key_cols"] = [k for k in KEY_COLUMNS if k in shown_cols]
    view["columns"] = shown_cols
    view.update(n_rows=len(df), n_cols=len(df.columns), cut=len(df) > MAX_ROWS,
                shown_rows=min(len(df), MAX_ROWS))
    return view


def _meta_rows(meta: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    rows = []
    for key, value in meta.items():
        if isinstance(value, (Mapping, list, tuple)):
            try:
                text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
            except (TypeError, ValueError):
                text = repr(value)
            rows.append((str(key), text, True))
        else:
            rows.append((str(key), str(value), False))
    return rows


def render_html(report: Any, *, figures: bool = True, docs_href: str | None = None,
                title: str | None = None) -> str:
    """The report as one self-contained HTML document (a string).

    ``docs_href``: an optional link to a metric reference (the page's own glossary defines
    every column; no link is needed).
    """
    meta = dict(report.metadata)
    model = meta.get("model")
    page_title = title or ("spectral_hooks report" + (f" — {model}" if model is not None else ""))
    names = list(report.sections)
    figs = _figures(report, names) if figures else {}
    sections = [_section_view(report, n, report.get(n), figs.get(n, [])) for n in names]
    shown = {s["name"]: s["columns"] for s in sections if not s["missing"]}
    version = meta.get("spectral_hooks_version")
    compare = meta.get("compare")
    facts = {k: meta[k] for k in _KEY_FACTS if k in meta and k != "compare"}
    return _ENV.get_template("report.html.j2").render(
        title=page_title,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__ if version is None else version,
        docs_href=docs_href,
        compare=(compare.get("sign", "self - other") if isinstance(compare, Mapping) else None),
        key_facts=_meta_rows(facts),
        more_metadata=_meta_rows({k: v for k, v in meta.items() if k not in facts}),
        sections=sections,
        glossary=glossary(report, shown),
    )


def write_html(report: Any, path: str | os.PathLike[str], *, figures: bool = True,
               docs_href: str | None = None) -> str:
    """Write `render_html` to ``path`` (a file, or a directory that gets ``report.html``).

    Returns the HTML text. Raises OSError with a clear message when it cannot be written.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "report.html"
    text = render_html(report, figures=figures, docs_href=docs_href)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the HTML report to {str(target)!r} ({exc.strerror})") from None
    return text


def notebook_html(report: Any, *, head: int = 5) -> str:
    """Compact HTML for Jupyter: metadata summary and the head of each computed table.

    Lazy sections not yet computed are listed, not computed (displaying a report never
    starts an analysis).
    """
    meta = dict(report.metadata)
    keys = [k for k in _KEY_FACTS if k in meta]
    keys += [k for k in meta if k not in keys][: max(0, 8 - len(keys))]
    sections = []
    for name in report.sections:
        if not report.is_computed(name):
            sections.append(dict(name=name, state="lazy"))
            continue
        df = report.get(name)
        if df is None:
            sections.append(dict(name=name, state="missing"))
            continue
        sections.append(dict(name=name, state="ok", n_rows=len(df), n_cols=len(df.columns),
                             views=table_views(df, max_rows=head)))
    return _ENV.get_template("notebook.html.j2").render(
        key_facts=_meta_rows({k: meta[k] for k in keys}), n_more=max(0, len(meta) - len(keys)),
        sections=sections)
