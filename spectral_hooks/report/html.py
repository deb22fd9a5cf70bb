"""One self-contained HTML page for a `Report`.

Figures are embedded as base64 PNG ``<img>`` elements, styling is inline CSS, and there is no
script, external stylesheet, font or image: the file reads offline in any browser. Every string
that comes from the report (metadata, section and column names, cell values) is HTML-escaped.
Each section carries a short explanation and the definitions of its columns inline, plus a
relative link to the full metric reference (docs/metrics.md).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html as _html
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .._version import __version__

__all__ = ["render_html", "write_html", "notebook_html", "SECTION_INFO", "COLUMN_DOCS"]

#: Rows of a table shown in full; longer tables show their head and say so.
MAX_ROWS = 60

#: title, one-paragraph explanation, and anchor in docs/metrics.md for each known section.
SECTION_INFO: dict[str, tuple[str, str]] = {
    "power": ("Power-method view",
              "Each attention layer without its FFN acts like one step of the power method with the "
              "layer matrix F_t = Σ_h W_O^h W_V^h: it tilts tokens toward the principal eigen-direction "
              "of F_t. The gap ratio |λ₂|/|λ₁| says how strong that pull is; γ_in and γ measure how "
              "aligned the tokens are before and after the layer, against the alignment of random "
              "directions (the null), and ρ is the share of tokens whose alignment increased."),
    "cross_power": ("Cross-attention power view",
                    "The decoder stack of an encoder-decoder model: the spectrum of each block's "
                    "cross-attention matrix F_t = Σ_h W_O^h W_V^h, which maps the encoder output "
                    "into the decoder's residual stream (weights alone: token columns are empty)."),
    "spectra": ("Eigenvalues",
                "All (or the top-k) eigenvalues of the layer matrices F_t and of the token Jacobians, "
                "in long format, one row per eigenvalue; plotted in the complex plane in the "
                "power-method and Jacobian sections."),
    "shared_weights": ("Shared weights",
                       "For models that apply one layer repeatedly (ALBERT): the direction and rate "
                       "that the FFN-free power iteration x ← (I+F)x/‖(I+F)x‖ predicts, against the "
                       "consensus direction the recording shows, layer by layer."),
    "jacobian": ("Jacobian view",
                 "Each block is linearised at the recorded input: J_l is the Jacobian of the block "
                 "output at a token with respect to its input, and ΔJ = J − I its residual-free part. "
                 "Complex eigenvalues mean rotation, symmetric energy near 1 means a nearly symmetric "
                 "(gradient-like) map, departure from normality measures how far J is from having "
                 "orthogonal eigenvectors. Every rate is shown with its random-matrix null."),
    "trends": ("Depth trends",
               "Spearman rank correlation of each per-layer metric with the layer index, and its "
               "p-value: a monotone change through depth."),
    "bottleneck": ("End-to-end bottleneck",
                   "Ranks of the cumulative product P_l = J_l ⋯ J_1 at one token position: how many "
                   "directions survive l blocks. Compared across the trained model, a fresh "
                   "initialisation of the same config, and two ablations (symmetric part of each J, "
                   "Schur diagonal of each J, i.e. non-normality removed)."),
    "propagation": ("Perturbation propagation",
                    "A perturbation injected at one layer pushed through the chained Jacobians: its "
                    "growth or compression per layer and its alignment with the top singular "
                    "directions."),
    "topology": ("Topology of residual units",
                 "A graph of the residual-stream units of each layer (edges: strongest Pearson "
                 "correlations over tokens), split into communities. The coupling is the Spearman "
                 "correlation between a unit's bridge score (how evenly it links communities) and its "
                 "amplification by the block, with two controls: the same at initialisation, and with "
                 "community labels shuffled."),
    "units": ("Residual units",
              "Per layer and unit: community, bridge score (participation coefficient) and "
              "amplification ‖ΔJ e_i‖."),
}

#: One-line definitions of the columns, shown inline next to each table.
COLUMN_DOCS: dict[str, str] = {
    # keys
    "layer": "layer index t (0 = first block)",
    "position": "token position of the Jacobian (default: last non-padding token)",
    "variant": "trained, init (fresh initialisation), symmetric or schur (ablations)",
    "depth": "number of blocks in the cumulative product P_l",
    "unit": "index of the residual-stream unit (coordinate of h_l)",
    "index": "rank of the eigenvalue by modulus (0 = largest)",
    "source": "F (layer matrix F_t) or jacobian (token Jacobian J_l)",
    "metric": "name of the per-layer metric whose depth trend is given",
    # power
    "lambda1_real": "real part of λ₁, the eigenvalue of F_t of largest modulus",
    "lambda1_imag": "imaginary part of λ₁",
    "abs_lambda1": "|λ₁|",
    "abs_lambda2": "|λ₂|, λ₂ = the largest eigenvalue that is not the conjugate of λ₁",
    "gap_ratio": "r = |λ₂|/|λ₁| (smaller = stronger pull toward the principal subspace)",
    "lambda1_is_complex": "λ₁ is one of a complex conjugate pair (principal subspace is a plane)",
    "gamma_in": "mean alignment ‖Bᵀx‖/‖x‖ of the layer's input tokens with the principal subspace",
    "gamma": "mean alignment of the layer's output tokens with the principal subspace",
    "gamma_null": "expected alignment of a uniformly random direction (the null)",
    "lift": "γ / γ_null",
    "gamma2": "alignment with the span of the top two eigen-directions",
    "gamma2_null": "null of γ₂",
    "rho": "share of tokens whose alignment increased through the layer",
    "rho_pvalue": "one-sided exact binomial p-value of ρ against 1/2",
    "n_tokens": "number of (non-padding) tokens used",
    "mean_cos": "mean pairwise cosine of the tokens (consensus)",
    "collapse_residual": "‖X − 1x̄ᵀ‖_F / ‖X‖_F (0 = rank collapse)",
    "erank": "effective rank (Roy–Vetterli) exp(−Σ p_i log p_i), p_i = σ_i / Σσ",
    # spectra
    "real": "real part of the eigenvalue",
    "imag": "imaginary part of the eigenvalue",
    "abs": "modulus of the eigenvalue",
    # jacobian
    "frac_complex": "share of all eigenvalues of J with |Im λ| > 10⁻⁶|λ| (rotation; exact only)",
    "frac_complex_null": "the same for a real Gaussian matrix of the same size (Edelman–Kostlan–Shub)",
    "mean_abs_angle": "Σ|λ||arg λ| / Σ|λ| over the complex eigenvalues of J (radians; exact only)",
    "frac_negative": "share of real negative eigenvalues of J (reflections, not rotation; exact only)",
    "sym_energy": "‖S‖²_F/‖ΔJ‖²_F, S = (ΔJ+ΔJᵀ)/2: 1 symmetric, ≈0.5 random, 0 antisymmetric",
    "commutator": "‖ΔJᵀΔJ − ΔJΔJᵀ‖_F / ‖ΔJ‖²_F (non-normality, 0 = normal)",
    "departure": "Henrici departure from normality √(‖J‖²_F − Σ|λ_i|²) (exact only)",
    "departure_rel": "Henrici departure / ‖ΔJ‖_F (exact only)",
    "top_eig_abs": "modulus of the largest eigenvalue of J",
    "n_matvecs": "Jacobian-vector products used",
    # trends
    "spearman_rho": "Spearman correlation of the metric with the layer index",
    "pvalue": "two-sided p-value of that correlation",
    # bottleneck
    "participation_ratio": "(Σσ²)² / Σσ⁴",
    "stable_rank": "Σσ² / σ₁²",
    "surviving": "number of singular values σ_i ≥ 10⁻² σ₁",
    # topology
    "n_communities": "number of communities found in the unit-correlation graph",
    "modularity": "modularity Q of that partition",
    "coupling_rho": "Spearman correlation between bridge score and amplification over units",
    "coupling_pvalue": "p-value of coupling_rho",
    "coupling_rho_init": "the same coupling at initialisation (control)",
    "coupling_rho_shuffled": "the same coupling with community labels shuffled (control)",
    "community": "community label of the unit",
    "bridge_score": "participation coefficient P_i = 1 − Σ_c (k_{i,c}/k_i)² (0 = inside one community)",
    "amplification": "g_i = ‖ΔJ e_i‖, how strongly the block amplifies the unit",
}

CSS = """
:root { --fg:#1d2330; --muted:#5b6474; --line:#dde2ea; --bg:#ffffff; --soft:#f5f7fa; --accent:#1f5fa8; }
* { box-sizing: border-box; }
body { margin:0; background:var(--soft); color:var(--fg);
  font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; background: var(--bg);
  min-height: 100vh; box-shadow: 0 0 0 1px var(--line); }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 8px; padding-top: 12px; border-top: 2px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; color: var(--muted); }
a { color: var(--accent); }
.sub { color: var(--muted); margin: 0 0 16px; }
nav ul { list-style: none; padding: 0; margin: 8px 0 0; display: flex; flex-wrap: wrap; gap: 6px 14px; }
.explain { background: var(--soft); border-left: 4px solid var(--accent); padding: 8px 14px; margin: 8px 0 12px; }
.explain p { margin: 4px 0; }
figure { margin: 16px 0; text-align: center; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.table-wrap { overflow-x: auto; margin: 8px 0; border: 1px solid var(--line); }
table { border-collapse: collapse; font-size: 12.5px; font-variant-numeric: tabular-nums;
        width: max-content; min-width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: var(--soft); position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #fafbfc; }
table.meta th, table.meta td { text-align: left; vertical-align: top; white-space: normal; }
table.meta th { width: 14em; }
table.meta td pre { margin: 0; white-space: pre-wrap; font-size: 12px; }
dl.cols { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 13px; margin: 6px 0; }
dl.cols dt { font-family: ui-monospace, Menlo, Consolas, monospace; color: var(--fg); }
dl.cols dd { margin: 0; color: var(--muted); }
details { margin: 6px 0; }
summary { cursor: pointer; color: var(--accent); }
.note { color: var(--muted); font-size: 13px; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""


def _e(value: Any) -> str:
    return _html.escape(str(value), quote=True)


def _default_docs_href(target: Path | None) -> str:
    """Relative link from the report's folder to docs/metrics.md when that file is found."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
    if target is not None and docs.is_file():
        try:
            return Path(os.path.relpath(docs, target.resolve().parent)).as_posix()
        except ValueError:  # another drive on Windows
            return docs.as_uri()
    return "docs/metrics.md"


def _fig_png_b64(fig, dpi: int = 100) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table_html(df: pd.DataFrame, max_rows: int = MAX_ROWS) -> str:
    shown = df if len(df) <= max_rows else df.head(max_rows)
    body = shown.to_html(
        index=False, escape=True, border=0, na_rep="NaN", float_format=lambda v: f"{v:.4g}",
        classes="data",
    )
    note = ""
    if len(df) > max_rows:
        note = (f'<p class="note">Showing the first {max_rows} of {len(df)} rows; the saved report '
                "holds the full table.</p>")
    return f'<div class="table-wrap">{body}</div>{note}'


def _column_meaning(column: str, schema) -> str | None:
    declared = schema.column(column) if schema is not None else None
    return declared.meaning if declared is not None else COLUMN_DOCS.get(column)


def _column_list(df: pd.DataFrame, schema=None) -> str:
    """Definitions of the table's columns: from the section's schema, else `COLUMN_DOCS`."""
    meanings = [(c, _column_meaning(str(c), schema)) for c in df.columns]
    items = [f"<dt>{_e(c)}</dt><dd>{_e(m)}</dd>" for c, m in meanings if m is not None]
    if not items:
        return ""
    return f'<details><summary>Column definitions</summary><dl class="cols">{"".join(items)}</dl></details>'


def _meta_value(value: Any) -> str:
    if isinstance(value, (Mapping, list, tuple)):
        try:
            text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
        return f"<pre>{_e(text)}</pre>"
    return _e(value)


def _metadata_table(meta: Mapping[str, Any]) -> str:
    if not meta:
        return '<p class="note">No metadata.</p>'
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_meta_value(v)}</td></tr>" for k, v in meta.items())
    return f'<div class="table-wrap"><table class="meta"><tbody>{rows}</tbody></table></div>'


def render_html(report, *, figures: bool = True, docs_href: str | None = None, title: str | None = None) -> str:
    """The report as one self-contained HTML document (a string).

    ``docs_href`` is the link target of the metric reference (default ``docs/metrics.md``;
    `write_html` computes a path relative to the file it writes).
    """
    href = docs_href if docs_href is not None else _default_docs_href(None)
    meta = dict(report.metadata)
    model = meta.get("model")
    page_title = title or ("spectral_hooks report" + (f" — {model}" if model is not None else ""))

    names = list(report.sections)
    figs_by_section = _figures_html(report, names) if figures else {}

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(page_title)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>{_e(page_title)}</h1>",
    ]
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    version = meta.get("spectral_hooks_version")
    if version is None:
        version = __version__
    parts.append(f'<p class="sub">Generated {_e(generated)} by spectral_hooks {_e(version)}. '
                 f'Metric definitions: <a href="{_e(href)}">{_e(href)}</a>.</p>')
    toc = ['<li><a href="#metadata">Metadata</a></li>']
    toc += [f'<li><a href="#section-{_e(n)}">{_e(SECTION_INFO.get(n, (n,))[0])}</a></li>' for n in names]
    parts.append(f'<nav><strong>Contents</strong><ul>{"".join(toc)}</ul></nav>')

    if "compare" in meta and isinstance(meta["compare"], Mapping):
        cmp_ = meta["compare"]
        parts.append('<div class="explain"><p>This report holds <strong>differences</strong> '
                     f'({_e(cmp_.get("sign", "self - other"))}): numeric columns are the first report '
                     'minus the second, rows matched on their key columns.</p></div>')

    parts.append('<h2 id="metadata">Metadata</h2>')
    parts.append(_metadata_table(meta))

    for name in names:
        info = SECTION_INFO.get(name)
        heading = info[0] if info else name
        parts.append(f'<h2 id="section-{_e(name)}">{_e(heading)} <small class="note">({_e(name)})</small></h2>')
        if info:
            parts.append(f'<div class="explain"><p>{_e(info[1])}</p><p>Definitions: '
                         f'<a href="{_e(href)}#{_e(name)}">metric reference, section “{_e(name)}”</a>.</p></div>')
        parts.extend(figs_by_section.get(name, []))
        df = report.get(name)
        if df is None:
            parts.append('<p class="note">Not computed.</p>')
            continue
        parts.append(_column_list(df, report.schemas.get(name)))
        parts.append(_table_html(df))

    parts.append(f'<footer>spectral_hooks {_e(version)} · self-contained report: no network access is '
                 "needed to view it.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _figures_html(report, names: list[str]) -> dict[str, list[str]]:
    """``<figure>`` elements by the section they belong to (imports matplotlib)."""
    from .lazy_plots import load_plots

    plots = load_plots()
    FIGURES, MissingSectionError = plots.FIGURES, plots.MissingSectionError

    figs_by_section: dict[str, list[str]] = {}
    for fig_name, spec in FIGURES.items():
        target = spec.section if spec.section in names else None
        if target is None and fig_name.startswith("eigenvalues") and "spectra" in names:
            target = "spectra"
        if target is None:
            continue
        try:
            fig = spec.func(report)
        except MissingSectionError:
            continue
        img = _fig_png_b64(fig)
        figs_by_section.setdefault(target, []).append(
            f'<figure id="fig-{_e(fig_name)}"><img alt="{_e(spec.caption)}" '
            f'src="data:image/png;base64,{img}"><figcaption>{_e(spec.caption)}</figcaption></figure>'
        )
    return figs_by_section


def write_html(report, path: str | os.PathLike[str], *, figures: bool = True, docs_href: str | None = None) -> str:
    """Write `render_html` to ``path`` (a file, or a directory that gets ``report.html``).

    Returns the HTML text. Raises OSError with a clear message when it cannot be written.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "report.html"
    href = docs_href if docs_href is not None else _default_docs_href(target)
    text = render_html(report, figures=figures, docs_href=href)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the HTML report to {str(target)!r} ({exc.strerror})") from None
    return text


def notebook_html(report, *, head: int = 5) -> str:
    """Compact HTML for Jupyter: metadata summary and the head of each computed table.

    Lazy sections not yet computed are listed, not computed (displaying a report never
    starts an analysis).
    """
    meta = dict(report.metadata)
    keys = [k for k in ("model", "config_hash", "spectral_hooks_version", "compare") if k in meta]
    keys += [k for k in meta if k not in keys][: max(0, 8 - len(keys))]
    out = ['<div class="spectral-hooks-report">', "<strong>spectral_hooks Report</strong>",
           _metadata_table({k: meta[k] for k in keys})]
    if len(meta) > len(keys):
        out.append(f'<p class="note">… and {len(meta) - len(keys)} more metadata entries.</p>')
    for name in report.sections:
        if not report.is_computed(name):
            out.append(f"<p><strong>{_e(name)}</strong>: not computed yet (access "
                       f"<code>report.{_e(name)}</code> to compute it)</p>")
            continue
        df = report.get(name)
        if df is None:
            out.append(f"<p><strong>{_e(name)}</strong>: not available</p>")
            continue
        out.append(f"<p><strong>{_e(name)}</strong> ({len(df)} rows × {len(df.columns)} columns)</p>")
        out.append(_table_html(df, max_rows=head))
    out.append("</div>")
    return "\n".join(out)
