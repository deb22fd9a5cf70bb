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


def test_figures_name_the_model_state_of_each_series(make_report):
    from spectral_hooks.report.figure_tools import figure_meta

    for name, fig in figures(make_report()).items():
        meta = figure_meta(fig)
        assert meta["series"] and meta["states"], name
        assert all("+" not in s["state"] for s in meta["series"]), (name, meta["series"])
        for category in meta["categories"]:  # every category is named in a legend
            assert any(category in label for label in meta["legend"]), (name, category)
    rot = figure_meta(figures(make_report())["rotation_symmetry"])
    assert {"trained", "init", "null"} <= set(rot["states"])


def test_rotation_symmetry_keeps_trained_and_init_apart(make_sections):
    jac = make_sections()["jacobian"]
    fig = figure(Report({"jacobian": jac}, {}), "rotation_symmetry")
    sym_ax = fig.axes[1]
    lines = {ln.get_label(): ln.get_ydata() for ln in sym_ax.get_lines()}
    trained = jac[jac["variant"] == "trained"].groupby("layer")["sym_energy"].mean().to_numpy()
    init = jac[jac["variant"] == "init"].groupby("layer")["sym_energy"].mean().to_numpy()
    assert np.allclose(lines["trained (mean over positions)"], trained)
    assert np.allclose(lines["init (mean over positions)"], init)


def test_eigenvalue_panels_hold_every_eigenvalue_and_the_unit_circle(make_sections):
    sections = make_sections()
    spectra = sections["spectra"].copy()
    big = (spectra["source"] == "F") & (spectra["layer"] == 2) & (spectra["index"] == 0)
    spectra.loc[big, ["real", "imag"]] = [-1.9, 0.8]  # modulus ~2.06, off the unit circle
    fig = figure(Report({"spectra": spectra}, {}), "eigenvalues_F")
    for ax in (a for a in fig.axes if a.get_visible()):
        layer = int(ax.get_title().split()[1])
        rows = spectra[(spectra["source"] == "F") & (spectra["layer"] == layer)]
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert x0 <= rows["real"].min() and rows["real"].max() <= x1, layer
        assert y0 <= rows["imag"].min() and rows["imag"].max() <= y1, layer
        assert any(type(p).__name__ == "Circle" for p in ax.patches)


def test_community_scatter_has_a_legend(make_report):
    fig = figure(make_report(), "units")
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "largest community" in labels
