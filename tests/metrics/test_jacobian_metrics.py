"""Jacobian-view metrics (METRICS.md section 2) and depth trends vs independent dense float64
computations (numpy / scipy), on random non-normal maps, an MLP-residual block Jacobian and
synthetic operators with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.special
import scipy.stats
import torch

from spectral_hooks.linalg import LinearOperator
from spectral_hooks.metrics.jacobian import (
    SCHUR_MAX_D,
    eigen_rows,
    expected_real_eigenvalues,
    frac_complex_null,
    frac_complex_top_null,
    jacobian_metrics,
    jacobian_row,
    schur_diagonal,
    symmetric_part,
)
from spectral_hooks.metrics.trends import (
    betainc_regularized,
    depth_trend,
    student_t_two_sided,
    trends_table,
)
from tests.oracles import (
    assert_same_spectrum,
    commutator,
    henrici_departure,
    jacobian_metrics_oracle,
    rotation_stats,
    self_alignment,
    sym_energy,
    top_k_by_modulus,
)


def _op(M: np.ndarray) -> LinearOperator:
    """A generic matrix-free operator (not a DenseOperator) with an adjoint."""
    A = torch.as_tensor(M, dtype=torch.float64)
    return LinearOperator(A.shape, matvec=lambda x: A @ x, rmatvec=lambda y: A.T @ y,
                          dtype=torch.float64, device="cpu", name="testop")


def _random_J(d: int, seed: int, scale: float = 0.15) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.eye(d) + scale * rng.standard_normal((d, d)) + 0.3 * np.triu(
        rng.standard_normal((d, d)), 1) / math.sqrt(d)


def _mlp_block(d: int, seed: int):
    """h -> h + W2 gelu(W1 LN(h)) at a random point: its Jacobian (jacfwd), JVP/VJP operator."""
    g = torch.Generator().manual_seed(seed)
    W1 = torch.randn(4 * d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    W2 = torch.randn(d, 4 * d, generator=g, dtype=torch.float64) / math.sqrt(4 * d)
    h0 = torch.randn(d, generator=g, dtype=torch.float64)

    def f(h):
        return h + W2 @ torch.nn.functional.gelu(W1 @ torch.nn.functional.layer_norm(h, (d,)))

    Jd = torch.func.jacfwd(f)(h0).numpy()
    _, vjp = torch.func.vjp(f, h0)
    op = LinearOperator((d, d), matvec=lambda v: torch.func.jvp(f, (h0,), (v,))[1],
                        rmatvec=lambda u: vjp(u)[0], dtype=torch.float64, device="cpu",
                        name="mlp_block")
    return Jd, op


# ----------------------------------------------------------------------------- dense mode


@pytest.mark.parametrize("source", ["random", "mlp"])
def test_dense_mode_exact(source):
    J = _random_J(24, 1) if source == "random" else _mlp_block(32, 2)[0]
    d, k = J.shape[0], 5
    D = J - np.eye(d)
    m = jacobian_metrics(torch.as_tensor(J), dense=True, k=k)
    assert m.dense and m.converged and m.eigenvalues.shape == (d,)
    assert_same_spectrum(m.eigenvalues.numpy(), np.linalg.eigvals(J), 1e-9)
    assert float(m.eig_residuals.max()) < 1e-10
    np.testing.assert_allclose(m.singular_values.numpy(), np.linalg.svd(J, compute_uv=False),
                               rtol=1e-12)
    np.testing.assert_allclose(m.delta_singular_values.numpy(),
                               np.linalg.svd(D, compute_uv=False), rtol=1e-10, atol=1e-13)
    want = jacobian_metrics_oracle(J, k)
    row = jacobian_row(m, layer=0, position=0)
    for name in ("frac_complex", "mean_abs_angle", "frac_negative", f"frac_complex_top{k}",
                 f"mean_abs_angle_top{k}", f"frac_negative_top{k}", "sym_energy", "commutator",
                 f"self_alignment_top{k}", "top_eig_abs"):
        assert row[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12, nan_ok=True), name
    assert m.departure == pytest.approx(henrici_departure(J), rel=1e-6, abs=1e-7)
    assert m.departure_rel == pytest.approx(henrici_departure(J) / np.linalg.norm(D), rel=1e-6)
    assert m.sym_energy_se == 0.0 and m.commutator_se == 0.0
    assert m.frac_complex_null == pytest.approx(frac_complex_null(d))
    # an operator in dense mode is formed with d matvecs
    assert jacobian_metrics(_op(J), dense=True).n_matvecs == d


def test_departure_is_shift_invariant_and_normalised_by_delta():
    """Henrici's departure of J and of J + c I is the same; departure_rel divides by ||J - I||_F,
    so a near-identity block does not look normal because of the identity."""
    rng = np.random.default_rng(2)
    d = 40
    N = np.triu(rng.standard_normal((d, d)), 1) * 0.05
    J = np.eye(d) + np.diag(rng.uniform(-0.1, 0.1, d)) + N
    m = jacobian_metrics(torch.as_tensor(J), k=4, dense=True)
    m2 = jacobian_metrics(torch.as_tensor(J + 3 * np.eye(d)), k=4, dense=True)
    assert m.departure == pytest.approx(np.linalg.norm(N), rel=1e-6)
    assert m2.departure == pytest.approx(m.departure, rel=1e-6)
    assert m.departure_rel > 0.9  # N dominates Delta J
    assert m.departure / np.linalg.norm(J) < 0.25  # what the old ||J||_F normalisation read


# ----------------------------------------------------------------------------- matrix-free


def test_materialised_estimates_are_the_operators_and_unread_singular_values_are_skipped():
    # the same seeded probes on J's matrix: the operator's estimates to rounding, not new draws
    _, op = _mlp_block(48, 4)
    a = jacobian_metrics(op, k=6, n_samples=32, seed=3)
    b = jacobian_metrics(_mlp_block(48, 4)[1], k=6, n_samples=32, seed=3, materialize=True,
                         singular_values=False)
    for name in ("sym_energy", "sym_energy_se", "commutator", "commutator_se",
                 "departure_rel_lower", "departure_rel_lower_se", "frob_sq"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-10, abs=1e-14), name
    assert b.departure_rel_upper == pytest.approx(a.departure_rel_upper, rel=1e-6)
    assert b.singular_values is None and a.singular_values is not None
    assert b.converged and float(b.eig_residuals.max()) < 1e-8


@pytest.mark.parametrize("materialize", [False, True])
@pytest.mark.parametrize("source", ["random", "mlp"])
def test_matrix_free_vs_dense(source, materialize):
    # materialize=True: the same values from J's matrix (formed from d columns), every pair
    # and triplet checked with fresh products of the operator
    if source == "random":
        J = _random_J(64, 3)
        op = _op(J)
    else:
        J, op = _mlp_block(48, 4)
    d, k = J.shape[0], 8
    D = J - np.eye(d)
    m = jacobian_metrics(op, k=k, n_samples=256, seed=1, materialize=materialize)
    assert m.converged and not m.dense
    assert m.departure is None and m.full is None and m.frac_complex_null is None
    ref = top_k_by_modulus(np.linalg.eigvals(J), k)
    assert_same_spectrum(m.eigenvalues.numpy(), ref, 1e-7)
    assert float(m.eig_residuals.max()) < 1e-7
    s_ref = np.linalg.svd(J, compute_uv=False)
    np.testing.assert_allclose(m.singular_values.numpy(), s_ref[:k], rtol=1e-8)
    np.testing.assert_allclose(m.delta_singular_values.numpy(),
                               np.linalg.svd(D, compute_uv=False)[:k], rtol=1e-8)
    frac, ang, neg = rotation_stats(ref)  # the top-k of J itself
    assert m.top.frac_complex == frac and m.top.frac_negative == neg
    assert m.top.mean_abs_angle == pytest.approx(ang, rel=1e-6, nan_ok=True)
    for name, value, se, exact in (("sym_energy", m.sym_energy, m.sym_energy_se, sym_energy(D)),
                                   ("commutator", m.commutator, m.commutator_se, commutator(D))):
        assert 0 < se < 0.05 * value, name
        assert abs(value - exact) < 4 * se, name
    fro = np.sum(J ** 2)
    assert abs(m.frob_sq - fro) < 0.05 * fro
    assert m.self_alignment == pytest.approx(self_alignment(D, k), abs=1e-6)
    assert m.top_eig_abs == pytest.approx(np.abs(ref[0]), rel=1e-9)
    if materialize:  # d columns, then the checks of <= k + 1 eigenpairs and 2 x k triplets
        assert d <= m.n_matvecs == op.n_matvecs <= d + (k + 1) + 2 * (2 * k)
    else:
        assert m.n_matvecs == op.n_matvecs > 4 * 256
    # dense mode computes the same top-k statistics from its exact top-k
    e = jacobian_metrics(torch.as_tensor(J), k=k, dense=True, seed=1)
    assert (e.top.frac_complex, e.top.frac_negative) == (frac, neg)
    assert (e.top_null, e.top_null_se) == (m.top_null, m.top_null_se)


def test_commutator_standard_error_covers_the_exact_value():
    """Over independent probe sets the Hutchinson commutator lands within 2 standard errors of
    the exact value about 95% of the time (a calibrated error bar, not just a small one)."""
    J = _random_J(40, 9, scale=0.3)
    exact = commutator(J - np.eye(40))
    z = []
    for seed in range(40):
        m = jacobian_metrics(_op(J), k=2, n_samples=32, seed=seed)
        z.append((m.commutator - exact) / m.commutator_se)
    z = np.asarray(z)
    assert np.mean(np.abs(z) < 2) > 0.8 and abs(np.mean(z)) < 0.6


def test_top_k_null_vs_direct_monte_carlo():
    """frac_complex_top{k}_null against an independent numpy Monte Carlo of the same (d, k)."""
    d, k = 48, 6
    mean, se = frac_complex_top_null(d, k, seed=3)
    rng = np.random.default_rng(0)
    fr = np.array([rotation_stats(top_k_by_modulus(np.linalg.eigvals(
        rng.standard_normal((d, d))), k))[0] for _ in range(400)])
    assert abs(mean - fr.mean()) < 4 * math.hypot(se, fr.std(ddof=1) / math.sqrt(len(fr)))
    assert 0 < se < 0.1


def test_conjugate_pair_at_the_boundary_returns_k_plus_1():
    rng = np.random.default_rng(5)
    d, k = 30, 4
    blocks = [np.diag([5.0, 4.0, 3.0])]
    blocks.append(2.0 * np.array([[math.cos(0.7), -math.sin(0.7)], [math.sin(0.7), math.cos(0.7)]]))
    blocks.append(np.diag(np.linspace(1.5, 0.1, d - 5)))
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    J = Q @ scipy.linalg.block_diag(*blocks) @ Q.T
    m = jacobian_metrics(_op(J), k=k)
    assert m.eigenvalues.shape == (k + 1,)
    assert_same_spectrum(m.eigenvalues.numpy(), top_k_by_modulus(np.linalg.eigvals(J), k), 1e-8)
    rows = eigen_rows(m, layer=2, position=7)
    assert len(rows) == k + 1 and rows[0] == dict(source="jacobian", layer=2, position=7, index=0,
                                                  real=pytest.approx(5.0), imag=pytest.approx(0.0),
                                                  abs=pytest.approx(5.0))


# ----------------------------------------------------------------------------- known answers


@pytest.mark.parametrize("dense", [True, False])
def test_symmetric_J(dense):
    rng = np.random.default_rng(6)
    A = rng.standard_normal((40, 40))
    J = np.eye(40) + (A + A.T) / 10
    m = jacobian_metrics(torch.as_tensor(J) if dense else _op(J), k=6, dense=dense)
    assert m.sym_energy == pytest.approx(1.0, abs=1e-12)
    assert m.commutator == pytest.approx(0.0, abs=1e-12)
    assert m.top.frac_complex == 0.0 and math.isnan(m.top.mean_abs_angle)
    lam = np.linalg.eigvalsh(J)
    assert m.top.frac_negative == rotation_stats(top_k_by_modulus(lam, 6))[2]
    if dense:
        assert m.full.frac_complex == 0.0 and m.full.frac_negative == np.mean(lam < 0)
        assert m.departure < 1e-6
        assert m.self_alignment == pytest.approx(self_alignment(J - np.eye(40), 6), rel=1e-8)


def test_reflections_are_not_rotation():
    """J ~ 0 on the directions a norm removes: J - I ~ -1 there. The top-k of J - I would read
    angle pi; the top-k of J (what is reported) reads the rotation of the signal directions."""
    rng = np.random.default_rng(8)
    d = 30
    th = 0.2
    rot = 2.0 * np.array([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    T = scipy.linalg.block_diag(rot, np.diag([1.5, -1.2]), np.diag(np.linspace(0.9, 0.5, d - 6)),
                                np.zeros((2, 2)))
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    J = Q @ T @ Q.T
    for dense in (True, False):
        m = jacobian_metrics(torch.as_tensor(J) if dense else _op(J), k=4, dense=dense)
        assert m.top.frac_complex == 0.5 and m.top.frac_negative == 0.25
        assert m.top.mean_abs_angle == pytest.approx(th, rel=1e-8)


@pytest.mark.parametrize("dense", [True, False])
def test_rotation_J(dense):
    """J = 2 R, R = Q blockdiag(rot(theta_j)) Q^T orthogonal: the eigenvalues of J are
    2 e^{+-i theta_j}: every one complex, mean_abs_angle = mean theta, J normal."""
    rng = np.random.default_rng(7)
    d = 32
    th = rng.uniform(0.3, 2.8, d // 2)
    R = scipy.linalg.block_diag(*[np.array([[math.cos(t), -math.sin(t)],
                                            [math.sin(t), math.cos(t)]]) for t in th])
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    J = 2 * Q @ R @ Q.T
    m = jacobian_metrics(torch.as_tensor(J) if dense else _op(J), k=6, dense=dense,
                         n_samples=256)
    assert m.top.frac_complex == 1.0 and m.top.frac_negative == 0.0
    assert m.commutator == pytest.approx(0.0, abs=1e-10)
    if dense:
        assert m.full.mean_abs_angle == pytest.approx(th.mean(), rel=1e-10)
        assert m.departure < 1e-6


def test_antisymmetric_delta_has_zero_sym_energy():
    rng = np.random.default_rng(8)
    A = rng.standard_normal((30, 30))
    J = np.eye(30) + (A - A.T) / 5
    assert jacobian_metrics(_op(J), k=4).sym_energy == pytest.approx(0.0, abs=1e-12)
    assert jacobian_metrics(torch.as_tensor(J), dense=True).sym_energy < 1e-12


# ----------------------------------------------------------------------------- null


def test_expected_real_eigenvalues_closed_forms():
    def dfact(n):
        return 1 if n <= 0 else math.prod(range(n, 0, -2))

    for d in range(1, 65):  # EKS Corollary 5.2: double-factorial sums
        if d % 2 == 0:
            ref = math.sqrt(2) * sum(dfact(4 * j - 1) / dfact(4 * j) for j in range(d // 2))
        else:
            ref = 1 + math.sqrt(2) * sum(dfact(4 * j - 3) / dfact(4 * j - 2)
                                         for j in range(1, (d - 1) // 2 + 1))
        assert expected_real_eigenvalues(d) == pytest.approx(ref, rel=1e-12)
    for d in (256, 4096):  # E_d = sqrt(2d/pi) + 1/2 + O(1/sqrt d)
        assert expected_real_eigenvalues(d) - math.sqrt(2 * d / math.pi) == pytest.approx(0.5,
                                                                                          abs=0.02)
    assert (1 - frac_complex_null(4096)) / math.sqrt(2 / (math.pi * 4096)) == pytest.approx(
        1, abs=0.01)
    assert frac_complex_null(4096) == pytest.approx(0.987, abs=1e-3)


@pytest.mark.parametrize("d,n", [(4, 2000), (8, 2000), (32, 500), (64, 200)])
def test_frac_complex_null_vs_monte_carlo(d, n):
    rng = np.random.default_rng(d)
    fr = np.array([np.mean(np.linalg.eigvals(rng.standard_normal((d, d))).imag != 0)
                   for _ in range(n)])
    assert abs(fr.mean() - frac_complex_null(d)) < 3 * fr.std(ddof=1) / math.sqrt(n)


# ----------------------------------------------------------------------------- Schur ablation


def test_schur_diagonal_real_and_complex_routes():
    J = _random_J(20, 9, scale=0.4)
    lam = np.linalg.eigvals(J)
    assert np.sum(lam.imag > 0) >= 3
    N = schur_diagonal(torch.as_tensor(J))
    assert N.dtype == torch.float64
    Nn = N.numpy()
    assert_same_spectrum(np.linalg.eigvals(Nn), lam, 1e-9)
    np.testing.assert_allclose(Nn @ Nn.T, Nn.T @ Nn, atol=1e-10)
    assert henrici_departure(Nn) < 1e-9 and jacobian_metrics(N, dense=True).departure < 1e-6
    assert henrici_departure(J) > 0.1
    C = schur_diagonal(torch.as_tensor(J), real=False).numpy()  # complex Schur: Q diag(T) Q^*
    assert_same_spectrum(np.linalg.eigvals(C), lam, 1e-9)
    np.testing.assert_allclose(C @ C.conj().T, C.conj().T @ C, atol=1e-10)
    assert np.linalg.norm(C.imag) > 1e-3  # documented: not real for a non-normal real J


def test_schur_diagonal_errors_and_warning():
    with pytest.raises(ValueError, match="SCHUR_MAX_D = 2048"):
        schur_diagonal(torch.zeros(SCHUR_MAX_D + 1, SCHUR_MAX_D + 1))
    with pytest.raises(ValueError, match="square"):
        schur_diagonal(torch.zeros(3, 4))
    Q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))
    jordan = torch.as_tensor(Q @ (np.eye(4) + np.eye(4, k=1)) @ Q.T)  # defective
    N = schur_diagonal(jordan)  # still a usable Schur basis: the computed eigenvalues of J
    assert_same_spectrum(np.linalg.eigvals(N.numpy()), np.linalg.eigvals(jordan.numpy()), 1e-3)
    with pytest.warns(RuntimeWarning, match="ill-conditioned"):
        schur_diagonal(jordan, check_tol=1e-300)


def test_symmetric_part_operator():
    J = _random_J(12, 10)
    S = symmetric_part(_op(J))
    np.testing.assert_allclose(S.to_dense().numpy(), (J + J.T) / 2, atol=1e-14)
    np.testing.assert_allclose(S.T.to_dense().numpy(), (J + J.T) / 2, atol=1e-14)


# ----------------------------------------------------------------------------- rows, errors


def test_rows_and_bad_input():
    m = jacobian_metrics(_op(_random_J(20, 11)), k=4, n_samples=16)
    row = jacobian_row(m, layer=3, position=-1)
    for c in ("layer", "position", "frac_complex_top4", "frac_complex_top4_null",
              "frac_complex_top4_null_se", "mean_abs_angle_top4", "frac_negative_top4",
              "sym_energy", "sym_energy_se", "commutator", "commutator_se",
              "self_alignment_top4", "top_eig_abs", "n_matvecs", "k", "converged", "dense"):
        assert c in row
    for c in ("frac_complex", "frac_complex_null", "mean_abs_angle", "departure",
              "departure_rel"):
        assert c not in row  # exact computation only
    assert row["layer"] == 3 and row["k"] == 4 and row["dense"] is False
    exact = jacobian_row(jacobian_metrics(torch.as_tensor(_random_J(20, 11)), k=4, dense=True), layer=3,
                         position=-1)
    assert set(row) <= set(exact)
    assert len(eigen_rows(m, layer=0, position=0)) == m.eigenvalues.shape[0]
    with pytest.raises(ValueError, match="d = 20"):
        jacobian_metrics(_op(_random_J(20, 0)), k=20)
    with pytest.raises(ValueError, match="square"):
        jacobian_metrics(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="real"):
        jacobian_metrics(torch.zeros(3, 3, dtype=torch.complex128), dense=True)
    no_adj = LinearOperator((10, 10), matvec=lambda x: x, dtype=torch.float64, device="cpu")
    with pytest.raises(NotImplementedError, match="adjoint"):
        jacobian_metrics(no_adj, k=2)


# ----------------------------------------------------------------------------- depth trends


def test_incomplete_beta_and_t_tail_vs_scipy():
    for a, b, x in [(0.5, 0.5, 0.3), (2.0, 3.0, 0.4), (10.0, 0.5, 0.97), (50.0, 0.5, 0.2),
                    (0.7, 12.0, 0.05), (3.5, 0.5, 0.999)]:
        assert betainc_regularized(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x),
                                                             rel=1e-11, abs=1e-300)
    for t, df in [(0.1, 3), (2.0, 10), (-4.5, 7), (12.0, 40), (1.3, 1)]:
        assert student_t_two_sided(t, df) == pytest.approx(2 * scipy.stats.t.sf(abs(t), df),
                                                           rel=1e-10)


@pytest.mark.parametrize("n", [9, 12, 24, 40])
def test_depth_trend_vs_spearmanr(n):
    rng = np.random.default_rng(n)
    y = np.round(0.05 * np.arange(n) + rng.standard_normal(n), 1)  # ties included
    rho, p = depth_trend(y)
    ref = scipy.stats.spearmanr(np.arange(n), y)
    assert rho == pytest.approx(ref.statistic, rel=1e-12)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("n", [4, 6, 8])
def test_depth_trend_exact_permutation_vs_scipy(n):
    rng = np.random.default_rng(100 + n)
    y = np.round(0.3 * np.arange(n) + rng.standard_normal(n), 0)
    rho, p = depth_trend(y, layers=np.arange(n) * 2 + 1)
    assert rho == pytest.approx(scipy.stats.spearmanr(np.arange(n), y).statistic, rel=1e-12)

    rx = np.arange(n) - (n - 1) / 2

    def stat(b, axis):  # Spearman rho of the (re-ordered) values against the layer index
        rb = scipy.stats.rankdata(b, axis=axis)
        rb = rb - rb.mean(axis, keepdims=True)
        return (rb * rx).sum(axis) / np.sqrt((rb ** 2).sum(axis) * (rx ** 2).sum())

    ref = scipy.stats.permutation_test((y,), stat, vectorized=True, permutation_type="pairings",
                                       n_resamples=np.inf, alternative="two-sided")
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_depth_trend_edge_cases_and_table():
    assert all(math.isnan(v) for v in depth_trend([1.0, 1.0, 1.0, 1.0]))
    assert all(math.isnan(v) for v in depth_trend([1.0, 2.0]))
    assert depth_trend([1.0, float("nan"), 2.0, 3.0, 4.0])[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="layers"):
        depth_trend([1.0, 2.0, 3.0], layers=[0, 1])
    rng = np.random.default_rng(12)
    df = pd.DataFrame({"layer": np.repeat(np.arange(12), 2), "position": np.tile([3, 7], 12),
                       "sym_energy": rng.uniform(size=24), "departure": rng.uniform(size=24)})
    t = trends_table(df, ["sym_energy", "departure"])
    assert list(t.columns) == ["metric", "spearman_rho", "pvalue", "n_layers"]
    for _, r in t.iterrows():
        per_layer = df.groupby("layer")[r["metric"]].mean()
        ref = scipy.stats.spearmanr(per_layer.index, per_layer.values)
        assert r["spearman_rho"] == pytest.approx(ref.statistic, rel=1e-12)
        assert r["pvalue"] == pytest.approx(ref.pvalue, rel=1e-9) and r["n_layers"] == 12
    with pytest.raises(ValueError, match="nope"):
        trends_table(df, ["nope"])
