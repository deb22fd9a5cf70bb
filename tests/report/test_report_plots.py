"""Figures: readable alone (title, axis labels, legend), robust to NaN and missing sections."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from spectral_hooks.report import Report
from spectral_hooks.report.plots import FIGURES, MissingSectionError, figure, figures


def _title(fig: Figure) -> str:
    sup = fig.get_suptitle() if hasattr(fig, "get_suptitle") else (fig._suptitle.get_text() if fig._suptitle else "")
    return sup or " ".join(ax.get_title() for ax in fig.axes)


def _check_readable(name: str, fig: Figure) -> None:
    assert isinstance(fig, Figure), name
    assert _title(fig).strip(), f"{name}: no title"
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert visible, name
    for ax in visible:
        assert ax.get_ylabel().strip(), f"{name}: axes without y label"
        shares_x = ax.get_shared_x_axes().get_siblings(ax)
        assert any(a.get_xlabel().strip() for a in shares_x), f"{name}: axes without x label"
    has_legend = bool(fig.legends) or any(ax.get_legend() is not None for ax in visible)
    if name != "units":  # colour = community; one panel per layer, nothing to key
        assert has_legend, f"{name}: no legend"



def test_all_figures_readable(make_report):
    figs = figures(make_report())
    assert list(figs) == list(FIGURES)
    for name, fig in figs.items():
        _check_readable(name, fig)
    # panels: one per layer, unit circle in each
    eig = figs["eigenvalues_F"]
    assert sum(ax.get_visible() for ax in eig.axes) == 6
    assert all(ax.patches for ax in eig.axes if ax.get_visible())
    # the bottleneck uses a log y axis and one line per variant
    bn = figs["bottleneck"].axes[0]
    assert bn.get_yscale() == "log"
    assert {t.get_text() for t in bn.get_legend().get_texts()} == {"trained", "init", "symmetric", "schur"}


def test_nan_values_do_not_break_figures(make_sections):
    sections = make_sections(seed=2)
    rng = np.random.default_rng(0)
    for df in sections.values():
        for col in df.columns:
            if df[col].dtype.kind == "f":
                df.loc[rng.random(len(df)) < 0.4, col] = np.nan
    sections["power"]["gamma"] = np.nan  # a whole column missing its values
    sections["topology"]["coupling_rho"] = np.nan
    figs = figures(Report(sections, {}))
    assert list(figs) == list(FIGURES)
    for name, fig in figs.items():
        _check_readable(name, fig)
        fig.canvas.draw()  # rendering must not raise either


def test_missing_sections_are_skipped(make_sections):
    assert figures(Report({}, {})) == {}
    sections = make_sections()
    only_bn = Report({"bottleneck": sections["bottleneck"]}, {})
    assert list(figures(only_bn)) == ["bottleneck"]
    with pytest.raises(MissingSectionError, match="power"):
        figure(only_bn, "alignment")
    with pytest.raises(KeyError, match="available"):
        figure(only_bn, "nope")
    # spectra with only F eigenvalues: no Jacobian plane
    spectra = sections["spectra"]
    rep = Report({"spectra": spectra[spectra["source"] == "F"], "jacobian": sections["jacobian"]}, {})
    assert set(figures(rep)) == {"eigenvalues_F", "rotation_symmetry"}
    # a power table with only the required columns still plots
    minimal = sections["power"][["layer", "gap_ratio"]]
    figs = figures(Report({"power": minimal}, {}))
    assert set(figs) == {"alignment", "gap_ratio"}
    for name, fig in figs.items():
        _check_readable(name, fig)


def test_report_plot_convenience(make_report):
    rep = make_report()
    fig = rep.plot("gap_ratio")
    assert "gap" in _title(fig).lower()
