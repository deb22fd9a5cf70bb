"""Every p-value column of a report has its Benjamini-Hochberg ``*_adj`` beside it, equal to
``scipy.stats.false_discovery_control`` over its documented family; the units' signed gains
and the communities' means against a dense jacfwd oracle (tests/oracles.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import spectral_hooks as sh
from spectral_hooks.analysis.columns import SCHEMAS
from spectral_hooks.anatomy.base import fresh_model
from tests.oracles import token_jacobian
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
pytest.importorskip("networkx")
IDS = torch.randint(1, 100, (1, 7), generator=torch.Generator().manual_seed(2))

#: section -> the columns grouping a family (None: the whole table), docs/metrics.md
FAMILIES = {"power": None, "trends": None, "topology": None, "communities": None,
            "reinit_test": None}


@pytest.fixture(scope="module")
def case():
    model = make_model("bert")
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    report = probe.analyze(jacobian={"k": 4, "dense": True}, topology=True, reinit=True,
                           reinit_seeds=2, progress=False)
    return model, probe, report


def _pvalue_columns(columns) -> list[str]:
    return [c for c in columns if c.endswith("pvalue")]


def test_every_declared_pvalue_has_its_adjusted_column_next_to_it():
    for name, schema in SCHEMAS.items():
        names = [c.name for c in schema.columns]
        for column in _pvalue_columns(names):
            assert f"{column}_adj" in names, f"{name}.{column} has no {column}_adj"
            assert names.index(f"{column}_adj") == names.index(column) + 1, (name, column)


def test_adjusted_pvalues_match_scipy_over_their_family(case):
    report = case[2]
    seen = set()
    for section in report.sections:
        table = report[section]
        for column in _pvalue_columns(table.columns):
            assert list(table.columns).index(f"{column}_adj") == \
                list(table.columns).index(column) + 1
            raw = table[column].to_numpy(dtype=float)
            keep = ~np.isnan(raw)
            want = np.full(len(raw), np.nan)
            if keep.any():
                want[keep] = stats.false_discovery_control(raw[keep])
            np.testing.assert_allclose(table[f"{column}_adj"], want, rtol=1e-12,
                                       err_msg=f"{section}.{column}")
            seen.add(section)
    assert seen == set(FAMILIES)


def test_unit_gains_match_jacfwd(case):
    model, probe, report = case
    units = report.units
    with sh.instrument(init := fresh_model(model, seed=1)) as init_probe, torch.no_grad():
        init(IDS)
    for layer in range(probe.anatomy.n_layers):
        rows = units.query("layer == @layer")
        J = token_jacobian(probe, layer).numpy()
        J0 = token_jacobian(init_probe, layer).numpy()
        np.testing.assert_allclose(rows["log_gain"], np.log(np.linalg.norm(J, axis=0)),
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(rows["log_gain_init"], np.log(np.linalg.norm(J0, axis=0)),
                                   rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(rows["amplification"],
                                   np.linalg.norm(J - np.eye(len(J)), axis=0), rtol=1e-9)


def test_community_means_are_those_of_their_units(case):
    report = case[2]
    units, table = report.units, report.communities
    means = units.groupby(["layer", "community"])[["log_gain", "log_gain_init"]].mean()
    for row in table.itertuples():
        assert row.mean_log_gain == pytest.approx(means.loc[(row.layer, row.community),
                                                            "log_gain"], rel=1e-12)
        assert row.mean_log_gain_init == pytest.approx(
            means.loc[(row.layer, row.community), "log_gain_init"], rel=1e-12)
    assert table.groupby("layer")["n_units"].sum().eq(units.groupby("layer").size()).all()


def test_matrix_free_unit_gains_carry_standard_errors_covering_jacfwd(case):
    """Matrix-free (``dense=False``, ``bottleneck_dense=False``: the default above d = 2048)
    the units' amplification and gains are Hutchinson estimates: each comes with its standard
    error in ``<name>_se`` (0 in the dense report of the fixture), and the jacfwd values lie
    within 4 of them for (nearly) every unit."""
    model, probe, dense_report = case
    for column in ("amplification", "log_gain", "log_gain_init"):
        se = dense_report.units[f"{column}_se"]
        assert list(dense_report.units.columns).index(f"{column}_se") == \
            list(dense_report.units.columns).index(column) + 1
        assert (se == 0).all(), column
    report = probe.analyze(jacobian={"k": 4, "dense": False, "n_samples": 64,
                                     "bottleneck_dense": False}, topology=True,
                           progress=False)
    units = report.units
    z = []
    for layer in range(probe.anatomy.n_layers):
        rows = units.query("layer == @layer")
        J = token_jacobian(probe, layer).numpy()
        for column, want in (("log_gain", np.log(np.linalg.norm(J, axis=0))),
                             ("amplification", np.linalg.norm(J - np.eye(len(J)), axis=0))):
            se = rows[f"{column}_se"].to_numpy()
            assert (se > 0).all(), column
            z.append((rows[column].to_numpy() - want) / se)
    z = np.concatenate(z)
    assert np.isfinite(z).all()
    assert np.mean(np.abs(z) <= 4) >= 0.98, np.sort(np.abs(z))[-5:]
    assert np.mean(np.abs(z) <= 2) >= 0.85
    block = report.communities.query("layer_type == 'block'")
    assert (block["mean_log_gain_se_bound"] > 0).all() and (block["amplification_se_bound"] > 0).all()
    assert (dense_report.communities["mean_log_gain_se_bound"] == 0).all()
