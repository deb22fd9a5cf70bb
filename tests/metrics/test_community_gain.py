"""Signed unit gains, per-community gain tables and the topology p-values (metrics level)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from spectral_hooks.linalg import DenseOperator
from spectral_hooks.metrics.community_gain import COMMUNITY_COLUMNS, community_table
from spectral_hooks.metrics.topology import amplification, log_gain, topology_tables

pytest.importorskip("networkx")


def test_log_gain_dense_and_matrix_free():
    g = torch.Generator().manual_seed(0)
    J = torch.eye(40, dtype=torch.float64) * torch.linspace(0.2, 3.0, 40, dtype=torch.float64) \
        + 0.05 * torch.randn(40, 40, generator=g, dtype=torch.float64)
    want = np.log(np.linalg.norm(J.numpy(), axis=0))
    got, estimated, se = log_gain(J, dense=True)
    assert not estimated and not se.any()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13)
    assert (got[:3] < 0).all() and (got[-3:] > 0).all()      # suppressed ... amplified
    est, estimated, se = log_gain(DenseOperator(J), n_samples=2000, seed=1)
    assert estimated
    assert float((est - got).abs().max()) < 0.15             # Hutchinson, 2000 probes
    assert float(((est - got).abs() <= 4 * se).double().mean()) == 1.0  # its standard errors


def test_log_gain_standard_errors_cover_the_dense_values():
    """Over 20 seeds x 40 units, log ||J e_i|| lies within 2 standard errors of the matrix-free
    estimate about 95% of the time."""
    g = torch.Generator().manual_seed(4)
    J = torch.eye(40, dtype=torch.float64) * torch.linspace(0.2, 3.0, 40, dtype=torch.float64) \
        + 0.3 * torch.randn(40, 40, generator=g, dtype=torch.float64)
    want = torch.linalg.vector_norm(J, dim=0).log()
    z = torch.cat([(r.value - want) / r.std_error for r in
                   (log_gain(DenseOperator(J), n_samples=64, seed=seed) for seed in range(20))])
    assert not z.isnan().any()
    covered = float((z.abs() <= 2).double().mean())
    assert 0.90 <= covered <= 0.99, covered


def _units(d=60, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.repeat([0, 1, 2], d // 3)
    gain = rng.normal(0.0, 0.3, d)
    gain[labels == 1] += 1.0                                  # community 1 amplified
    bridge = rng.uniform(size=d)
    return pd.DataFrame({"layer": 2, "unit": np.arange(d), "community": labels,
                         "bridge_score": bridge, "amplification": rng.uniform(0.5, 1, d),
                         "log_gain": gain, "log_gain_init": rng.normal(0.0, 0.3, d)})


def test_community_error_bounds_cover_the_spread_of_estimated_means():
    """Matrix-free unit gains share their probes, so their errors correlate; the communities'
    ``*_se_bound`` (the mean of the units' standard errors) bounds the standard error of the
    community mean whatever the correlation: over 30 seeds the community means spread by less
    than the bound (the mean bound, with 20% room for the spread's own sampling error), the
    bound is not vacuous (under 10x the spread), and it is 0 where the units are exact."""
    g = torch.Generator().manual_seed(5)
    d = 30
    J = torch.eye(d, dtype=torch.float64) * torch.linspace(0.5, 2.0, d, dtype=torch.float64) \
        + 0.3 * torch.randn(d, d, generator=g, dtype=torch.float64)
    labels = np.repeat([0, 1, 2], d // 3)

    def table(norms, amp):
        units = pd.DataFrame({"layer": 0, "unit": np.arange(d), "community": labels,
                              "bridge_score": np.linspace(0, 1, d),
                              "amplification": amp.value.numpy(),
                              "amplification_se": amp.std_error.numpy(),
                              "log_gain": norms.value.numpy(),
                              "log_gain_se": norms.std_error.numpy(),
                              "log_gain_init": np.nan})
        return community_table(units, n_shuffles=0)

    eye = torch.eye(d, dtype=torch.float64)
    runs = [table(log_gain(DenseOperator(J), n_samples=32, seed=seed),
                  amplification(DenseOperator(J - eye), n_samples=32, seed=seed))
            for seed in range(30)]
    for column in ("mean_log_gain", "amplification"):
        spread = np.std([r[column].to_numpy() for r in runs], axis=0, ddof=1)
        bound = np.mean([r[f"{column}_se_bound"].to_numpy() for r in runs], axis=0)
        assert (spread <= 1.2 * bound).all() and (bound < 10 * spread).all(), (column, spread,
                                                                                 bound)
    exact = table(log_gain(J, dense=True), amplification(J - eye, dense=True))
    assert (exact[["mean_log_gain_se_bound", "amplification_se_bound"]] == 0).all().all()
    assert exact["mean_log_gain_init_se_bound"].isna().all()


def test_community_table_against_a_direct_computation():
    units = _units()
    table = community_table(units, n_shuffles=400, seed=3)
    assert list(table.columns) == COMMUNITY_COLUMNS and len(table) == 3
    rng = np.random.default_rng((3, 2))
    perms = np.stack([rng.permutation(len(units)) for _ in range(400)])
    g, g0 = units["log_gain"].to_numpy(), units["log_gain_init"].to_numpy()
    for row in table.itertuples():
        members = np.flatnonzero(units["community"].to_numpy() == row.community)
        assert row.n_units == len(members)
        assert row.mean_log_gain == pytest.approx(g[members].mean(), rel=1e-13)
        assert row.mean_log_gain_init == pytest.approx(g0[members].mean(), rel=1e-13)
        null = g[perms[:, members]].mean(1)
        assert row.mean_log_gain_null == pytest.approx(null.mean(), rel=1e-12)
        assert row.mean_log_gain_null_sd == pytest.approx(null.std(ddof=1), rel=1e-12)
        greater = (1 + np.sum(null >= row.mean_log_gain)) / 401
        less = (1 + np.sum(null <= row.mean_log_gain)) / 401
        assert row.gain_pvalue == pytest.approx(min(1, 2 * min(greater, less)))
        amp = units["amplification"].to_numpy()[members]
        assert row.amplification == pytest.approx((amp ** 2).mean(), rel=1e-13)
        rho, p = stats.spearmanr(units["bridge_score"].to_numpy()[members], g[members])
        assert row.gain_coupling_rho == pytest.approx(rho, rel=1e-10)
        assert row.gain_coupling_pvalue == pytest.approx(p, rel=1e-6)
    # the amplified community stands out from the shuffled null; the others sit below it
    amplified = table.set_index("community").loc[1]
    assert amplified.mean_log_gain > 0 and amplified.gain_pvalue == pytest.approx(2 / 401)
    assert (table["layer_type"] == "block").all()
    for name in ("gain_pvalue", "gain_init_pvalue", "gain_coupling_pvalue"):
        np.testing.assert_allclose(table[f"{name}_adj"], stats.false_discovery_control(table[name]))


def test_community_table_without_init_and_degenerate_communities():
    units = _units(d=9)
    units["community"] = [0] * 7 + [1, 2]         # two singletons: no coupling
    units["log_gain_init"] = np.nan
    table = community_table(units, n_shuffles=50)
    assert table["mean_log_gain_init"].isna().all() and table["gain_init_pvalue"].isna().all()
    assert table.set_index("community").loc[[1, 2], "gain_coupling_rho"].isna().all()
    whole = units.assign(community=0)
    assert community_table(whole, n_shuffles=50)["gain_pvalue"].isna().all()  # no null
    with pytest.raises(ValueError, match="log_gain"):
        community_table(units.drop(columns="log_gain"))


def test_topology_pvalues_and_their_adjustment():
    g = torch.Generator().manual_seed(0)
    X = {l: torch.randn(300, 24, generator=g, dtype=torch.float64) for l in range(4)}
    amp = {l: torch.rand(24, generator=g, dtype=torch.float64) for l in range(4)}
    amp0 = {l: torch.rand(24, generator=g, dtype=torch.float64) for l in range(4)}
    gain = {l: torch.randn(24, generator=g, dtype=torch.float64) for l in range(4)}
    topo, units = topology_tables(X, amp, g_init_by_layer=amp0, top_k=4, n_shuffles=10,
                                  gain_by_layer=gain, method="louvain")
    for row in topo.itertuples():
        P = units.query("layer == @row.layer")["bridge_score"].to_numpy()
        rho0, p0 = stats.spearmanr(P, amp0[row.layer].numpy())
        assert row.coupling_rho_init == pytest.approx(rho0, rel=1e-10)
        assert row.coupling_pvalue_init == pytest.approx(p0, rel=1e-6)
        assert 1 / 11 <= row.coupling_pvalue_shuffled <= 1
    for name in ("coupling_pvalue", "coupling_pvalue_init", "coupling_pvalue_shuffled"):
        np.testing.assert_allclose(topo[f"{name}_adj"], stats.false_discovery_control(topo[name]))
    np.testing.assert_allclose(units["log_gain"], torch.cat([gain[l] for l in range(4)]))
    assert units["log_gain_init"].isna().all()
