"""Topology of residual units (METRICS.md section 3) against independent oracles."""

import logging
import math
import sys
import warnings

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import DenseOperator, LinearOperator
from spectral_hooks.metrics.topology import (
    TOPOLOGY_COLUMNS,
    UNITS_COLUMNS,
    Communities,
    amplification,
    communities,
    community_amplification,
    modularity,
    participation,
    spearman,
    topology_tables,
    unit_graph,
)

nx = pytest.importorskip("networkx")

N_A, N_B, N_BRIDGE = 30, 30, 6
BRIDGES = list(range(N_A + N_B, N_A + N_B + N_BRIDGE))


def planted(seed=0, n_tokens=1500):
    """Two blocks driven by two latent factors (noise 0.6), 6 bridge units driven by both
    (noise 1.0): in-block correlation ~0.74, bridge-bridge ~0.67, bridge-block ~0.5."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(n_tokens, 2, generator=g, dtype=torch.float64)
    d = N_A + N_B + N_BRIDGE
    load = torch.zeros(2, d, dtype=torch.float64)
    load[0, :N_A] = 1.0
    load[1, N_A:N_A + N_B] = 1.0
    load[:, N_A + N_B:] = 1.0
    sig = torch.full((d,), 0.6, dtype=torch.float64)
    sig[N_A + N_B:] = 1.0
    return f @ load + torch.randn(n_tokens, d, generator=g, dtype=torch.float64) * sig


@pytest.fixture(scope="module")
def planted_graph():
    return unit_graph(planted(), top_k=10)


# -- graph ---------------------------------------------------------------------------------

def _oracle_graph(X: np.ndarray, k: int):
    """np.corrcoef, constant units -> 0, per-node top-k by |r| written with argsort, OR."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        C = np.corrcoef(X, rowvar=False)
    C = np.nan_to_num(C, nan=0.0)
    np.fill_diagonal(C, 0.0)
    d = C.shape[0]
    keep = np.zeros((d, d), dtype=bool)
    for i in range(d):
        others = [j for j in range(d) if j != i]
        order = sorted(others, key=lambda j: -abs(C[i, j]))
        for j in order[:k]:
            keep[i, j] = keep[j, i] = True
    keep &= C != 0
    W = np.where(keep, C, 0.0)
    edges = sorted((i, j) for i in range(d) for j in range(i + 1, d) if keep[i, j])
    return W, edges


@pytest.mark.parametrize("k", [1, 4, 9])
def test_unit_graph_matches_numpy_corrcoef(k):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 24)) @ rng.standard_normal((24, 24)) * 0.4 \
        + rng.standard_normal((200, 24))
    X[:, 5] = 3.0                                             # a constant unit
    G = unit_graph(torch.from_numpy(X), top_k=k)
    W, edges = _oracle_graph(X, k)
    assert G.weights.dtype == torch.float64
    np.testing.assert_allclose(G.weights.numpy(), W, atol=1e-12, rtol=0)
    assert [tuple(e) for e in G.edges.tolist()] == edges
    np.testing.assert_allclose(G.edge_weights.numpy(), [W[i, j] for i, j in edges], atol=1e-12)
    assert torch.equal(G.weights, G.weights.T)
    assert bool((G.weights.diagonal() == 0).all())
    assert G.constant_units.tolist() == [j == 5 for j in range(24)]
    assert not bool(G.weights[5].any())                       # constant unit: no edges
    assert G.n_tokens == 200 and G.n_units == 24 and G.top_k == k
    # every non-constant node keeps at least k edges after symmetrisation
    deg = (G.weights != 0).sum(1)
    assert int(deg[torch.arange(24) != 5].min()) >= k


# -- communities and bridges -----------------------------------------------------------------

def _assert_recovered(labels: torch.Tensor):
    a = set(labels[:N_A].tolist())
    b = set(labels[N_A:N_A + N_B].tolist())
    assert len(a) == 1 and len(b) == 1 and a != b, (a, b)


@pytest.mark.parametrize("method", ["leiden", "louvain"])
def test_planted_communities_and_bridges(planted_graph, method):
    if method == "leiden":
        pytest.importorskip("leidenalg")
        pytest.importorskip("igraph")
    C = communities(planted_graph, seed=0, method=method)
    assert isinstance(C, Communities) and C.method == method
    assert C.labels.dtype == torch.int64 and C.labels.shape == (planted_graph.n_units,)
    assert C.n_communities == int(C.labels.max()) + 1
    assert sorted(set(C.labels.tolist())) == list(range(C.n_communities))
    _assert_recovered(C.labels)
    P = participation(planted_graph, C.labels)
    assert sorted(P.argsort(descending=True)[:N_BRIDGE].tolist()) == BRIDGES
    assert float(P[BRIDGES].min()) > float(P[:N_A + N_B].max())
    # same seed, same partition
    assert torch.equal(communities(planted_graph, seed=0, method=method).labels, C.labels)


def test_signed_leiden_separates_anticorrelated_blocks():
    pytest.importorskip("leidenalg")
    g = torch.Generator().manual_seed(3)
    f = torch.randn(800, 1, generator=g, dtype=torch.float64)
    sign = torch.tensor([1.0] * 15 + [-1.0] * 15, dtype=torch.float64)
    X = f * sign + 0.7 * torch.randn(800, 30, generator=g, dtype=torch.float64)
    G = unit_graph(X, top_k=20)                      # top-20 mixes + and - edges
    assert bool((G.edge_weights < 0).any())
    C = communities(G, seed=0, method="leiden")
    a, b = set(C.labels[:15].tolist()), set(C.labels[15:].tolist())
    assert len(a) == 1 and len(b) == 1 and a != b


def test_auto_falls_back_to_louvain_with_a_notice(planted_graph, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "leidenalg", None)      # import leidenalg -> ImportError
    with caplog.at_level(logging.WARNING, logger="spectral_hooks.metrics.correlation_graph"):
        C = communities(planted_graph, seed=0)
    assert C.method == "louvain"
    assert any("Louvain" in r.getMessage() for r in caplog.records)
    _assert_recovered(C.labels)
    with pytest.raises(ImportError, match="leidenalg"):
        communities(planted_graph, method="leiden")


def test_participation_by_hand():
    W = torch.zeros(5, 5, dtype=torch.float64)
    for i, j, w in [(0, 1, 1.0), (0, 2, -2.0), (0, 3, 0.5), (1, 2, 0.25), (3, 4, 3.0)]:
        W[i, j] = W[j, i] = w
    labels = torch.tensor([0, 0, 1, 1, 2])
    # unit 0: k = 3.5, k_0 = 1, k_1 = 2.5; unit 1: k = 1.25, k_0 = 1, k_1 = .25
    # unit 2: k = 2.25, k_0 = 2.25; unit 3: k = 3.5, k_0 = .5, k_2 = 3; unit 4: k_1 = 3
    expect = [1 - (1 / 3.5) ** 2 - (2.5 / 3.5) ** 2, 1 - (1 / 1.25) ** 2 - (.25 / 1.25) ** 2,
              0.0, 1 - (.5 / 3.5) ** 2 - (3 / 3.5) ** 2, 0.0]
    np.testing.assert_allclose(participation(W, labels).numpy(), expect, atol=1e-15)
    # an isolated unit gets 0; Communities accepted in place of labels
    W2 = torch.zeros(3, 3, dtype=torch.float64)
    W2[0, 1] = W2[1, 0] = 1.0
    P = participation(W2, Communities(torch.tensor([0, 1, 2]), 3, 0.0, "louvain"))
    assert P.tolist() == [0.0, 0.0, 0.0]


def test_modularity_matches_networkx(planted_graph):
    G = planted_graph
    nxg = nx.Graph()
    nxg.add_nodes_from(range(G.n_units))
    for (i, j), w in zip(G.edges.tolist(), G.edge_weights.tolist()):
        nxg.add_edge(i, j, weight=abs(w))

    def nx_q(labels):
        parts = [set(np.flatnonzero(labels.numpy() == c).tolist())
                 for c in range(int(labels.max()) + 1)]
        return nx.community.modularity(nxg, [p for p in parts if p], weight="weight")

    C = communities(G, seed=0, method="louvain")
    assert C.modularity == pytest.approx(nx_q(C.labels), abs=1e-12)
    rand = torch.randint(0, 4, (G.n_units,), generator=torch.Generator().manual_seed(0))
    assert modularity(G, rand) == pytest.approx(nx_q(rand), abs=1e-12)
    assert modularity(G.weights, rand) == pytest.approx(nx_q(rand), abs=1e-12)
    assert math.isnan(modularity(torch.zeros(3, 3, dtype=torch.float64),
                                 torch.tensor([0, 1, 2])))


# -- amplification -------------------------------------------------------------------------

def test_amplification_dense_and_matrix_free():
    rng = np.random.default_rng(7)
    D = rng.standard_normal((64, 64))
    exact = np.linalg.norm(D, axis=0)
    g, is_est, se = amplification(torch.from_numpy(D), dense=True)
    assert not is_est and g.dtype == torch.float64 and not se.any()
    np.testing.assert_allclose(g.numpy(), exact, rtol=1e-12)

    Dt = torch.from_numpy(D)
    op = LinearOperator((64, 64), matvec=lambda x: Dt @ x, rmatvec=lambda y: Dt.T @ y,
                        dtype=torch.float64, device="cpu")
    g_mf, is_est, _ = amplification(op, n_samples=512, seed=0)
    assert is_est and g_mf.shape == (64,) and g_mf.dtype == torch.float64
    # Hutchinson: relative error ~ sqrt(sum_{j!=i} (D^T D)_ij^2 / 512) / (2 g_i^2) ~ 2% per unit
    assert np.linalg.norm(g_mf.numpy() - exact) / np.linalg.norm(exact) < 0.05
    assert np.median(np.abs(g_mf.numpy() / exact - 1)) < 0.05
    np.testing.assert_array_less(np.abs(g_mf.numpy() / exact - 1), 0.10)
    assert op.n_matvecs == 2 * 512
    g_again = amplification(DenseOperator(Dt), n_samples=512, seed=0).value
    torch.testing.assert_close(g_again, g_mf, rtol=1e-10, atol=0)


def test_amplification_standard_errors_cover_the_dense_values():
    """Matrix-free per-unit values come with standard errors: over 20 seeds x 48 units, the
    dense column norms lie within 2 standard errors about 95% of the time (delta method on
    the Hutchinson diagonal), and the errors shrink as 1/sqrt(probes)."""
    rng = np.random.default_rng(9)
    D = torch.from_numpy(rng.standard_normal((48, 48)) * np.linspace(0.3, 2.0, 48))
    exact = torch.linalg.vector_norm(D, dim=0)
    z = torch.cat([(lambda r: (r.value - exact) / r.std_error)(
        amplification(DenseOperator(D), n_samples=64, seed=seed)) for seed in range(20)])
    covered = float((z.abs() <= 2).double().mean())
    assert 0.90 <= covered <= 0.99, covered
    se = [amplification(DenseOperator(D), n_samples=n, seed=0).std_error.mean() for n in (16, 256)]
    assert 3 < float(se[0] / se[1]) < 5.5  # ~ sqrt(16)


def test_community_amplification_is_projected_frobenius():
    rng = np.random.default_rng(8)
    D = rng.standard_normal((20, 20))
    labels = torch.from_numpy(rng.integers(0, 3, 20))
    expect = [np.linalg.norm(D[:, labels.numpy() == c], "fro") ** 2 / (labels == c).sum().item()
              for c in range(3)]
    Dt = torch.from_numpy(D)
    np.testing.assert_allclose(community_amplification(Dt, labels).numpy(), expect, rtol=1e-12)
    g = amplification(Dt, dense=True).value
    np.testing.assert_allclose(community_amplification(g, labels).numpy(), expect, rtol=1e-12)


# -- Spearman ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [10, 13, 40, 300])
def test_spearman_matches_scipy_with_ties(n):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(n)
    a = np.round(rng.standard_normal(n), 1)                   # ties
    b = np.round(0.5 * a + rng.standard_normal(n), 1)
    b[:3] = b[3]                                              # more ties
    rho, p = spearman(torch.from_numpy(a), b)
    ref = stats.spearmanr(a, b)
    assert rho == pytest.approx(ref.statistic, abs=1e-6)
    assert p == pytest.approx(ref.pvalue, abs=1e-6)


def test_spearman_small_n_exact_and_degenerate():
    stats = pytest.importorskip("scipy.stats")
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]
    rho, p = spearman(a, b)
    assert rho == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    # exact two-sided permutation p-value, enumerated here
    import itertools
    ra = np.argsort(np.argsort(a))
    hits = sum(abs(np.corrcoef(ra, perm)[0, 1]) >= abs(rho) - 1e-12
               for perm in itertools.permutations(range(6)))
    assert p == pytest.approx(hits / math.factorial(6), abs=1e-12)
    assert all(math.isnan(v) for v in spearman([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]))


# -- tables --------------------------------------------------------------------------------

def test_topology_tables_planted_coupling():
    X = planted()
    d = X.shape[1]
    g = torch.ones(d, dtype=torch.float64)
    g[BRIDGES] = 3.0                                          # amplification on the bridges
    g_init = torch.rand(d, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    X2 = planted(seed=1, n_tokens=400)
    topo, units = topology_tables({3: X, 1: X2}, {3: g, 1: torch.ones(d, dtype=torch.float64)},
                                  g_init_by_layer={3: g_init}, seed=0, n_shuffles=20)
    assert list(topo.columns) == TOPOLOGY_COLUMNS
    assert list(units.columns) == UNITS_COLUMNS
    assert topo["layer"].tolist() == [1, 3]
    row = topo.set_index("layer").loc[3]
    assert row["coupling_rho"] > 0.5 and row["coupling_pvalue"] < 1e-4
    assert abs(row["coupling_rho_shuffled"]) < 0.2
    assert abs(row["coupling_rho_init"]) < 0.4
    assert row["n_units"] == d and row["n_tokens"] == 1500 and row["n_communities"] >= 2
    assert row["method"] in ("leiden", "louvain") and 0 < row["modularity"] < 1
    other = topo.set_index("layer").loc[1]
    assert math.isnan(other["coupling_rho_init"]) and math.isnan(other["coupling_rho"])
    assert len(units) == 2 * d
    u3 = units[units["layer"] == 3]
    assert u3["unit"].tolist() == list(range(d))
    np.testing.assert_array_equal(u3["amplification"].to_numpy(), g.numpy())
    assert sorted(u3.nlargest(N_BRIDGE, "bridge_score")["unit"].tolist()) == BRIDGES
    # the units table reproduces the coupling
    assert spearman(u3["bridge_score"].to_numpy(), u3["amplification"].to_numpy())[0] \
        == pytest.approx(row["coupling_rho"], abs=1e-12)


# -- bad input -------------------------------------------------------------------------------

def test_bad_input_raises():
    X = torch.randn(10, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="3 tokens"):
        unit_graph(X[:2])
    with pytest.raises(ValueError, match="top_k"):
        unit_graph(X, top_k=6)
    with pytest.raises(ValueError, match="top_k"):
        unit_graph(X, top_k=0)
    with pytest.raises(ValueError, match="2-dimensional"):
        unit_graph(X[0])
    with pytest.raises(ValueError, match="NaN"):
        unit_graph(torch.full((5, 4), float("nan")), top_k=2)
    G = unit_graph(X, top_k=2)
    with pytest.raises(ValueError, match="labels"):
        participation(G, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="method"):
        communities(G, method="spectral")
    with pytest.raises(ValueError, match="equal length"):
        spearman([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="entries"):
        topology_tables({0: X}, {0: torch.ones(5)}, top_k=2)
    with pytest.raises(ValueError, match="same layers"):
        topology_tables({0: X}, {1: torch.ones(6)}, top_k=2)
    with pytest.raises(ValueError, match="top_k"):
        topology_tables({0: X}, {0: torch.ones(6)}, top_k=6)
    with pytest.raises(ValueError, match="dense=True"):
        amplification(DenseOperator(torch.eye(3, dtype=torch.float64)), dense=True)
    with pytest.raises(ValueError, match="labels"):
        community_amplification(torch.ones(4), torch.tensor([0, 1]))


def test_unit_graph_at_d_4096():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 4096, generator=g, dtype=torch.float32)      # float32 in, float64 out
    G = unit_graph(X, top_k=10)
    assert G.weights.shape == (4096, 4096) and G.weights.dtype == torch.float64
    deg = (G.weights != 0).sum(1)
    assert int(deg.min()) >= 10 and G.n_edges == int(deg.sum()) // 2
    assert torch.equal(G.weights, G.weights.T)
    P = participation(G, torch.arange(4096) % 7)
    assert P.shape == (4096,) and bool(((P >= 0) & (P < 1)).all())


def test_signed_bridge_gain_against_numpy_and_scipy():
    """A trained block that suppresses the planted bridges (columns scaled by 0.3) and one that
    amplifies them (x 3), against an unstructured init: signed Spearman and the bridges' mean
    log gain from numpy column norms of the dense J and scipy.stats.spearmanr."""
    from scipy.stats import spearmanr

    from spectral_hooks.metrics.topology import log_gain

    X = planted()
    d = X.shape[1]
    g = np.random.default_rng(40)
    J_init = np.eye(d) + 0.3 * g.standard_normal((d, d))
    for scale, sign in ((0.3, -1), (3.0, 1)):
        J = np.eye(d) + 0.3 * g.standard_normal((d, d))
        J[:, BRIDGES] *= scale
        gain = log_gain(torch.tensor(J), dense=True)[0]
        gain0 = log_gain(torch.tensor(J_init), dense=True)[0]
        np.testing.assert_allclose(gain.numpy(), np.log(np.linalg.norm(J, axis=0)), rtol=1e-12)
        topo, units = topology_tables({0: X}, {0: gain.exp()}, gain_by_layer={0: gain},
                                      gain_init_by_layer={0: gain0}, n_shuffles=0)
        row = topo.iloc[0]
        P = units.bridge_score.to_numpy()
        lg, lg0 = np.log(np.linalg.norm(J, axis=0)), np.log(np.linalg.norm(J_init, axis=0))
        for col, y in (("", lg), ("_init", lg0), ("_vs_init", lg - lg0)):
            ref = spearmanr(P, y)
            assert row[f"bridge_gain_rho{col}"] == pytest.approx(ref.statistic, abs=1e-12)
            assert row[f"bridge_gain_pvalue{col}"] == pytest.approx(ref.pvalue, rel=1e-6)
        top = P >= np.quantile(P, 0.9)
        assert row["bridge_log_gain"] == pytest.approx(lg[top].mean(), rel=1e-12)
        assert row["bridge_log_gain_init"] == pytest.approx(lg0[top].mean(), rel=1e-12)
        assert np.sign(row["bridge_gain_rho"]) == sign and np.sign(row["bridge_log_gain"]) == sign
        assert np.sign(row["bridge_gain_rho_vs_init"]) == sign
    none = topology_tables({0: X}, {0: gain.exp()}, n_shuffles=0)[0].iloc[0]
    assert math.isnan(none["bridge_gain_rho"]) and math.isnan(none["bridge_log_gain_init"])
