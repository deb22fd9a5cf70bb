"""Summary tables, column order, value formatting, page-width parts and the glossary."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectral_hooks.report import Column, Report, SectionSchema
from spectral_hooks.report.html import render_html
from spectral_hooks.report.tables import (
    WIDTH_PX,
    _col_width,
    format_cell,
    ordered_columns,
    summary_frame,
    table_views,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "saved"


def test_qualifiers_stand_after_their_metric():
    cols = ["layer", "coupling_rho", "modularity", "coupling_pvalue", "coupling_rho_init",
            "coupling_pvalue_adj", "gamma", "gamma_null", "sym_energy", "sym_energy_se",
            "spearman_rho", "pvalue", "pvalue_adj"]
    assert ordered_columns(cols) == [
        "layer", "coupling_rho", "coupling_pvalue", "coupling_rho_init", "coupling_pvalue_adj",
        "modularity", "gamma", "gamma_null", "sym_energy", "sym_energy_se", "spearman_rho",
        "pvalue", "pvalue_adj"]


def test_values_formatted():
    assert format_cell("rho_pvalue", 3.2e-7).text == "3.2e-07"
    assert format_cell("pvalue_adj", 0.4512).text == "4.5e-01"
    assert format_cell("coupling_pvalue", float("nan")).kind == "na"
    assert format_cell("gap_ratio", 0.74729).text == "0.7473"
    assert format_cell("sigma_max", 123456.0).text == "1.23e+05"
    assert format_cell("lambda1_is_complex", np.bool_(True)).text == "yes"


def test_summary_never_averages_trained_with_init(make_sections):
    jac = make_sections()["jacobian"]
    summary, note = summary_frame("jacobian", jac)
    assert list(summary.columns[:2]) == ["layer", "variant"]
    assert not summary.duplicated(["layer", "variant"]).any()
    assert "averaged separately" in note and "n_rows" in summary
    # an adjusted p-value (a qualifier of a qualifier) comes along with its metric
    power = make_sections()["power"].assign(rho_pvalue_adj=0.5)
    cols = list(summary_frame("power", power)[0].columns)
    assert cols[cols.index("rho"):cols.index("rho") + 3] == ["rho", "rho_pvalue", "rho_pvalue_adj"]
    for (layer, variant), row in summary.set_index(["layer", "variant"]).iterrows():
        rows = jac[(jac["layer"] == layer) & (jac["variant"] == variant)]
        assert row["sym_energy"] == pytest.approx(rows["sym_energy"].mean())
    # trained and init of a layer are adjacent rows
    assert summary["variant"].tolist()[:2] == ["trained", "init"]


@pytest.mark.parametrize("name", ["minilm_dense", "tiny_gpt2", "tiny_albert"])
def test_golden_reports_summaries_and_glossary(name):
    rep = Report.load(GOLDEN / name)
    for section in rep.sections:
        df = rep[section]
        summary, _ = summary_frame(section, df)
        assert 0 < len(summary.columns) <= 16, section
        if "variant" in summary.columns:
            keys = [k for k in ("variant", "layer", "depth") if k in summary.columns]
            assert not summary.duplicated(keys).any(), section
        if "ablated_layer" in df.columns and (df["ablated_layer"] >= 0).any():
            assert len(summary) == int((df["ablated_layer"] < 0).sum())
        for view in table_views(df):
            width = sum(_col_width(c, [r[i] for r in view.rows]) for i, c in enumerate(view.columns))
            assert width <= WIDTH_PX or len(view.columns) <= 3, (section, view.columns)
    page = render_html(rep, figures=False)
    # every column shown is explained from its schema (a saved report: the registered ones)
    assert "not described by a column schema" not in page
    shown = set(re.findall(r'<th [^>]*><a href="#g-([^"]+)"', page))
    glossary = set(re.findall(r'<dt id="g-([^"]+)"', page))
    assert shown and shown <= glossary


def test_a_new_section_renders_from_its_schema():
    """A section the report code does not know (as later analyses add) gets a summary of its
    keys and first metrics, its p-values in scientific notation, and a glossary from its schema."""
    schema = SectionSchema("reinit_test", (
        Column("metric", "str", "the per-layer metric tested", "reinit"),
        Column("layer", "int", "layer index", "reinit"),
        Column("trained", "float", "the trained model's value", "reinit"),
        Column("init_mean", "float", "mean over the re-initialisations", "reinit"),
        Column("init_sd", "float", "standard deviation over the re-initialisations", "reinit"),
        Column("pvalue", "float", "empirical p-value (1 + #{init >= trained}) / (n + 1)", "reinit"),
        Column("pvalue_adj", "float", "Benjamini-Hochberg adjusted p-value", "reinit"),
        Column("extra_*", "float", "more numbers", "reinit"),
    ), key_columns=("metric", "layer"))
    rng = np.random.default_rng(0)
    n = 12
    df = pd.DataFrame({"metric": ["sym_energy"] * 6 + ["commutator"] * 6, "layer": list(range(6)) * 2,
                       "trained": rng.random(n), "init_mean": rng.random(n), "init_sd": rng.random(n),
                       "pvalue": rng.random(n) * 1e-6, "pvalue_adj": rng.random(n) * 1e-5,
                       **{f"extra_{i}": rng.random(n) for i in range(10)}})
    rep = Report({"reinit_test": df}, {"model": "m"}, schemas={"reinit_test": schema})
    summary, _ = summary_frame("reinit_test", df)
    assert list(summary.columns[:2]) == ["metric", "layer"]
    page = render_html(rep, figures=False)
    assert 'id="section-reinit_test"' in page and '<details class="full">' in page
    assert "empirical p-value (1 + #{init &gt;= trained}) / (n + 1)" in page
    assert "Benjamini-Hochberg adjusted p-value" in page and "more numbers" in page
    cells = re.findall(r'<td class="p"[^>]*>([^<]+)</td>', page)
    assert cells and all(re.fullmatch(r"\d\.\de-\d\d", c) for c in cells)
