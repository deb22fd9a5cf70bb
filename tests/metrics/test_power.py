"""Power-method metrics vs independent float64 oracles (numpy / scipy), METRICS.md section 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from spectral_hooks.metrics.nulls import gamma_null, rho_test
from spectral_hooks.metrics.power import alignment, consensus, power_table, spectra_table
from spectral_hooks.metrics.spectrum import LayerSpectrum, spectrum
from spectral_hooks.metrics.steering_math import rank1_output_edit

REQUIRED = [
    "layer", "lambda1_real", "lambda1_imag", "abs_lambda1", "abs_lambda2", "gap_ratio",
    "lambda1_is_complex", "gamma_in", "gamma", "gamma_null", "lift", "gamma2", "gamma2_null",
    "rho", "rho_pvalue", "n_tokens", "mean_cos", "collapse_residual", "erank",
]  # fmt: skip


# ----------------------------------------------------------------------------- oracles


def rot_block(modulus: float, angle: float) -> np.ndarray:
    c, s = modulus * math.cos(angle), modulus * math.sin(angle)
    return np.array([[c, -s], [s, c]])


def build(blocks: list, seed: int, normal: bool = False) -> np.ndarray:
    """Block-diagonal real matrix (scalars or 2x2 rotation-scalings) under a random similarity."""
    d = sum(1 if np.isscalar(b) else 2 for b in blocks)
    D, i = np.zeros((d, d)), 0
    for b in blocks:
        if np.isscalar(b):
            D[i, i], i = b, i + 1
        else:
            D[i : i + 2, i : i + 2], i = b, i + 2
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    S = Q if normal else Q @ np.diag(rng.uniform(1.0, 2.0, d)) @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    return S @ D @ np.linalg.inv(S)


def oracle(F: np.ndarray, shift: float = 0.0):
    """lambda1, lambda2 (eigenvalues of F), gap, principal plane P1, two-plane P2 via numpy."""
    vals, vecs = np.linalg.eig(F)
    q = np.abs(vals + shift)
    i1 = max(range(len(vals)), key=lambda i: (round(q[i], 12), vals[i].imag))
    is_cplx = abs(vals[i1].imag) > 1e-9
    partner = [i for i in range(len(vals)) if i != i1 and is_cplx and abs(vals[i] - np.conj(vals[i1])) < 1e-9]
    rest = [i for i in range(len(vals)) if i != i1 and i not in partner]
    i2 = max(rest, key=lambda i: q[i])

    def plane(v, lam):
        if abs(lam.imag) > 1e-9:
            cols = np.stack([v.real, v.imag], 1)
        else:  # rotate the phase away, keep the real vector
            cols = np.real(v * np.conj(v[np.argmax(abs(v))]))[:, None]
        U, s, _ = np.linalg.svd(cols, full_matrices=False)
        return U[:, s > 1e-10 * s[0]]

    P1 = plane(vecs[:, i1], vals[i1])
    P2 = np.linalg.svd(np.hstack([P1, plane(vecs[:, i2], vals[i2])]), full_matrices=False)[0]
    return vals[i1], vals[i2], q[i2] / q[i1], P1, P2


def proj_dist(A: np.ndarray, B: np.ndarray) -> float:
    """Sign/rotation-invariant subspace distance ||A A^T - B B^T||_2 (orthonormal columns)."""
    return float(np.linalg.norm(A @ A.T - B @ B.T, 2))


def np_align(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    return np.linalg.norm(X @ P, axis=1) / np.linalg.norm(X, axis=1)


def t64(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


# ----------------------------------------------------------------------------- spectrum

REAL_CASE = [3.0, -1.5, rot_block(math.sqrt(2), math.pi / 4), 0.5, 0.2, 0.05]
COMPLEX_CASE = [rot_block(3.0, 0.7), 2.0, -1.0, rot_block(0.8, 2.0), 0.1]


@pytest.mark.parametrize("blocks, complex_l1", [(REAL_CASE, False), (COMPLEX_CASE, True)])
@pytest.mark.parametrize("normal", [True, False])
def test_spectrum_vs_numpy(blocks, complex_l1, normal):
    F = build(blocks, seed=1, normal=normal)
    s = spectrum(t64(F).float())  # float32 input: computed in float64 regardless
    lam1, lam2, gap, P1, P2 = oracle(F.astype(np.float32).astype(np.float64))
    assert isinstance(s, LayerSpectrum) and s.eigenvalues.dtype == torch.complex128
    assert s.lambda1_is_complex == complex_l1
    assert abs(s.lambda1 - lam1) < 1e-9 and abs(s.lambda2 - lam2) < 1e-9
    assert s.gap_ratio == pytest.approx(gap, rel=1e-10)
    assert s.B.shape == (F.shape[0], 2 if complex_l1 else 1) and s.B.dtype == torch.float64
    assert proj_dist(s.B.numpy(), P1) < 1e-8
    assert proj_dist(s.B2.numpy(), P2) < 1e-8
    assert torch.allclose(s.B2.T @ s.B2, torch.eye(s.B2.shape[1], dtype=torch.float64), atol=1e-12)
    # every eigenvalue, as a multiset, and each eigenpair
    ref = np.sort_complex(np.linalg.eigvals(F.astype(np.float32).astype(np.float64)))
    assert np.allclose(np.sort_complex(s.eigenvalues.numpy()), ref, atol=1e-9)
    Ft = t64(F.astype(np.float32))
    resid = (Ft.to(torch.complex128) @ s.eigenvectors - s.eigenvectors * s.eigenvalues).norm(dim=0)
    assert float(resid.max()) < 1e-9


def test_spectrum_known_values():
    s = spectrum(t64(build(COMPLEX_CASE, seed=3)))
    assert s.lambda1 == pytest.approx(3 * complex(math.cos(0.7), math.sin(0.7)), abs=1e-10)
    assert s.lambda2 == pytest.approx(2.0, abs=1e-10) and not s.lambda2_is_complex
    assert s.gap_ratio == pytest.approx(2 / 3, rel=1e-10)
    assert s.B2.shape[1] == 3
    lone = spectrum(torch.tensor([[0.0, -2.0], [2.0, 0.0]]))  # only a conjugate pair: no lambda2
    assert lone.lambda1_is_complex and math.isnan(lone.gap_ratio) and lone.B2.shape == (2, 2)


def test_ordering_conjugates_adjacent():
    F = build([rot_block(2, 1.0), rot_block(2, 2.0), 2.0, -2.0, rot_block(1, 0.3), 0.5], seed=4)
    vals = spectrum(t64(F)).eigenvalues.numpy()
    mods = np.abs(vals)
    assert np.all(np.diff(mods) <= 1e-9)
    i = 0
    while i < len(vals):
        if abs(vals[i].imag) > 1e-9:
            assert vals[i].imag > 0 and vals[i + 1] == np.conj(vals[i])
            i += 2
        else:
            i += 1


def test_iterate_I_plus_F_changes_ordering():
    F = build([-3.0, 2.5, 0.4, -0.2], seed=5)
    sF, sI = spectrum(t64(F)), spectrum(t64(F), iterate="I+F")
    assert sF.lambda1 == pytest.approx(-3.0) and sF.gap_ratio == pytest.approx(2.5 / 3)
    assert sI.lambda1 == pytest.approx(2.5) and sI.lambda2 == pytest.approx(-3.0)
    assert sI.mu1 == pytest.approx(3.5) and sI.gap_ratio == pytest.approx(2.0 / 3.5)
    _, _, gap, P1, _ = oracle(F, shift=1.0)
    assert sI.gap_ratio == pytest.approx(gap) and proj_dist(sI.B.numpy(), P1) < 1e-9
    assert torch.allclose(sF.eigenvalues.abs().sort().values, sI.eigenvalues.abs().sort().values)


def test_spectrum_batched_and_bad_input():
    Fs = torch.stack([t64(build(REAL_CASE, seed=k)) for k in range(3)])
    out = spectrum(Fs)
    assert isinstance(out, list) and len(out) == 3 and all(abs(s.lambda1 - 3) < 1e-9 for s in out)
    for bad in [torch.zeros(3, 4), torch.zeros(2, 2, 2, 2), torch.full((2, 2), float("nan"))]:
        with pytest.raises(ValueError):
            spectrum(bad)
    with pytest.raises(ValueError):
        spectrum(torch.eye(2), iterate="F+I")


# ----------------------------------------------------------------------------- alignment, nulls, rho


def test_alignment_vs_numpy():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 7, 10))
    P = np.linalg.qr(rng.standard_normal((10, 2)))[0]
    a = alignment(t64(X).float(), t64(P))
    assert a.shape == (5, 7) and a.dtype == torch.float64
    ref = np.linalg.norm(X @ P, axis=-1) / np.linalg.norm(X, axis=-1)
    assert np.allclose(a.numpy(), ref, atol=1e-6)  # X passed as float32
    X[0, 0] = 0
    a = alignment(t64(X), t64(P))
    assert a[0, 0] == 0 and torch.isfinite(a).all()
    with pytest.raises(ValueError):
        alignment(t64(X), t64(2 * P))  # not orthonormal
    with pytest.raises(ValueError):
        alignment(t64(X[..., :9]), t64(P))


@pytest.mark.parametrize("d, r", [(12, 1), (12, 2), (5, 2)])
def test_gamma_null_monte_carlo(d, r):
    rng = np.random.default_rng(d * 10 + r)
    g = rng.standard_normal((400_000, d))
    a = np.linalg.norm(g[:, :r], axis=1) / np.linalg.norm(g, axis=1)
    se = a.std() / math.sqrt(len(a))
    assert abs(gamma_null(d, r) - a.mean()) < 3 * se
    assert abs(gamma_null(d, r, exact=False, seed=1) - gamma_null(d, r)) < 5 * se * math.sqrt(2)


def test_gamma_null_limits_and_bad_input():
    assert gamma_null(4096) == pytest.approx(math.sqrt(2 / (math.pi * 4096)), rel=1e-3)
    assert gamma_null(10**7, 2) == pytest.approx(math.sqrt(math.pi / 4 * 2 / 10**7), rel=1e-5)
    assert gamma_null(3, 3) == 1.0 and gamma_null(2, 1) == pytest.approx(2 / math.pi)
    for d, r in [(0, 1), (3, 0), (3, 4), (3.0, 1)]:
        with pytest.raises(ValueError):
            gamma_null(d, r)


@pytest.mark.parametrize("n, k", [(1, 0), (1, 1), (10, 7), (37, 30), (200, 100), (5000, 2700), (5000, 1000)])
def test_rho_pvalue_vs_scipy(n, k):
    a_in = torch.zeros(n, dtype=torch.float64)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    a_out = torch.cat([torch.ones(k), -torch.ones(n - k)])[perm]
    rho, p = rho_test(a_in, a_out)
    ref = binomtest(k, n, 0.5, alternative="greater").pvalue
    assert rho == k / n
    assert p == pytest.approx(ref, rel=1e-9, abs=1e-300)


def test_rho_ties_and_bad_input():
    rho, p = rho_test(torch.tensor([0.5, 0.5, 0.1, 0.9]), torch.tensor([0.5, 0.6, 0.0, 0.95]))
    assert rho == 0.5 and p == pytest.approx(binomtest(2, 4, 0.5, alternative="greater").pvalue)
    assert all(math.isnan(v) for v in rho_test(torch.zeros(0), torch.zeros(0)))
    with pytest.raises(ValueError):
        rho_test(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError):
        rho_test(torch.tensor([float("nan")]), torch.zeros(1))


# ----------------------------------------------------------------------------- consensus


def np_consensus(X: np.ndarray):
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T
    n = len(X)
    mean_cos = (C.sum() - np.trace(C)) / (n * (n - 1))
    resid = np.linalg.norm(X - X.mean(0)) / np.linalg.norm(X)
    s = np.linalg.svd(X, compute_uv=False)
    p = s / s.sum()
    return mean_cos, resid, float(np.exp(-np.sum(p[p > 0] * np.log(p[p > 0]))))


def test_consensus_vs_numpy():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((40, 12)) + 3 * rng.standard_normal(12)
    c = consensus(t64(X))
    for got, ref in zip((c.mean_cos, c.collapse_residual, c.erank), np_consensus(X)):
        assert got == pytest.approx(ref, rel=1e-10)
    collapsed = consensus(t64(np.outer(rng.uniform(1, 2, 9), rng.standard_normal(5))))
    assert collapsed.mean_cos == pytest.approx(1.0) and collapsed.collapse_residual < 0.5
    assert collapsed.erank == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(consensus(t64(X[:1])).mean_cos)
    zero = consensus(torch.zeros(3, 4))
    assert zero.mean_cos == 0 and math.isnan(zero.collapse_residual) and math.isnan(zero.erank)
    with pytest.raises(ValueError):
        consensus(t64(X[0]))


# ----------------------------------------------------------------------------- tables


def test_power_table_vs_oracle():
    rng = np.random.default_rng(7)
    Fs = [build(REAL_CASE, seed=10), build(COMPLEX_CASE, seed=11),
          build([1.0, -0.9, 0.3, 0.2, 0.1, 0.05, 0.01], seed=12)]
    d, N = 7, 50
    pre = [rng.standard_normal((N, d)) for _ in Fs]
    post = [x + 0.5 * x @ F.T for x, F in zip(pre, Fs)]
    table = power_table(t64(np.stack(Fs)), [t64(x) for x in pre], [t64(x) for x in post])
    assert set(REQUIRED) <= set(table.columns) and len(table) == 3
    assert not table["truncated"].any() and table["converged"].all() and (table["n_computed"] == d).all()
    for t, F in enumerate(Fs):
        row = table.iloc[t]
        lam1, lam2, gap, P1, P2 = oracle(F)
        a_in, a_out = np_align(pre[t], P1), np_align(post[t], P1)
        k = int((a_out > a_in).sum())
        g0 = gamma_null(d, P1.shape[1])
        expect = {
            "layer": t, "lambda1_real": lam1.real, "lambda1_imag": lam1.imag, "abs_lambda1": abs(lam1),
            "abs_lambda2": abs(lam2), "gap_ratio": gap, "lambda1_is_complex": t == 1,
            "gamma_in": a_in.mean(), "gamma": a_out.mean(), "gamma_null": g0, "lift": a_out.mean() / g0,
            "gamma2": np_align(post[t], P2).mean(), "gamma2_null": gamma_null(d, P2.shape[1]),
            "rho": k / N, "rho_pvalue": binomtest(k, N, 0.5, alternative="greater").pvalue, "n_tokens": N,
        }  # fmt: skip
        for col, ref in expect.items():
            assert row[col] == pytest.approx(ref, rel=1e-8, abs=1e-10), col
        for col, ref in zip(("mean_cos", "collapse_residual", "erank"), np_consensus(post[t])):
            assert row[col] == pytest.approx(ref, rel=1e-9), col


def test_power_table_weights_only_and_subsets():
    Fs = t64(np.stack([build(REAL_CASE, seed=k) for k in range(4)]))
    table = power_table(Fs, layers=[-1, 1], iterate="I+F")
    assert table["layer"].tolist() == [3, 1] and (table["iterate"] == "I+F").all()
    assert table[["gamma", "gamma_in", "rho", "mean_cos"]].isna().all().all()
    assert np.isfinite(table[["gap_ratio", "gamma_null", "gamma2_null"]].to_numpy(float)).all()
    X = torch.randn(9, 7, dtype=torch.float64)
    part = power_table(Fs, [None, X, None, None], [None, None, None, X])
    assert np.isnan(part.loc[1, "gamma"]) and np.isfinite(part.loc[1, "gamma_in"]) and np.isnan(part.loc[1, "rho"])
    assert np.isfinite(part.loc[3, "gamma"]) and part.loc[3, "n_tokens"] == 9
    with pytest.raises(ValueError):
        power_table(Fs, [X] * 4, [X[:5]] * 4)  # token counts differ
    with pytest.raises(ValueError):
        power_table(Fs, [X] * 3)
    with pytest.raises(ValueError):
        power_table(Fs, layers=[4])
    with pytest.raises(ValueError):
        power_table(Fs, [X[:, :5]] * 4)


def test_spectra_table_vs_numpy():
    Fs = np.stack([build(REAL_CASE, seed=1), build(COMPLEX_CASE, seed=2)])
    df = spectra_table(t64(Fs))
    cols = ["source", "layer", "position", "index", "real", "imag", "abs", "truncated", "converged"]
    assert df.columns.tolist() == cols
    assert len(df) == 14 and (df["source"] == "F").all() and (df["position"] == -1).all()
    assert not df["truncated"].any() and df["converged"].all()
    for t in range(2):
        sub = df[df["layer"] == t]
        got = np.sort_complex(sub["real"].to_numpy() + 1j * sub["imag"].to_numpy())
        assert np.allclose(got, np.sort_complex(np.linalg.eigvals(Fs[t])), atol=1e-9)
        assert sub["index"].tolist() == list(range(7)) and np.all(np.diff(sub["abs"].to_numpy()) <= 1e-12)


# ----------------------------------------------------------------------------- steering math


def heads(H=4, dh=4, d=16, seed=0, kv_groups=None):
    g = torch.Generator().manual_seed(seed)
    if kv_groups:
        W_V = torch.randn(kv_groups, dh, d, generator=g, dtype=torch.float64).repeat_interleave(H // kv_groups, 0)
    else:
        W_V = torch.randn(H, dh, d, generator=g, dtype=torch.float64)
    return W_V / math.sqrt(d), torch.randn(H, d, dh, generator=g, dtype=torch.float64) / math.sqrt(dh)


def F_of(W_V, W_O) -> np.ndarray:
    return sum(W_O[h].numpy() @ W_V[h].numpy() for h in range(W_V.shape[0]))


def np_leading(F: np.ndarray, u: np.ndarray):
    vals, vecs = np.linalg.eig(F)
    order = np.argsort(-np.abs(vals))
    i1 = order[0] if vals[order[0]].imag >= 0 else order[1]
    partner = order[1] if i1 == order[0] and abs(vals[i1].imag) > 1e-9 else order[0] if i1 != order[0] else None
    i2 = next(i for i in order if i not in (i1, partner))
    v = vecs[:, i1]
    return vals[i1], abs(vals[i2]) / abs(vals[i1]), abs(np.vdot(v, u)) / np.linalg.norm(v)


def test_rank1_edit_reaches_gap():
    W_V, W_O = heads()
    u = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    e = rank1_output_edit(W_V, W_O, 5 * u, gap=0.01)
    un = (u / u.norm()).numpy()
    F0, F1 = F_of(W_V, W_O), F_of(W_V, W_O + e.delta_W_O)
    assert e.reachable_fraction == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(F1, F0 + e.alpha * np.outer(un, un), atol=1e-10)
    lam1, gap, cos = np_leading(F1, un)
    assert abs(lam1.imag) < 1e-9 and lam1.real > 0 and gap <= 0.01 + 1e-12 and cos >= 0.99
    assert e.lambda1_after == pytest.approx(lam1, abs=1e-9) and e.gap_after == pytest.approx(gap, rel=1e-9)
    lam0, gap0, _ = np_leading(F0, un)
    assert abs(e.lambda1_before) == pytest.approx(abs(lam0)) and e.gap_before == pytest.approx(gap0)
    # the residual update I + F' meets the target too (its ratio is reported separately)
    eye = np.eye(len(F1))
    lam1r, gapr, cosr = np_leading(eye + F1, un)
    assert abs(lam1r.imag) < 1e-9 and lam1r.real > 0 and gapr <= 0.01 + 1e-12 and cosr >= 0.9
    assert e.residual_gap_after == pytest.approx(gapr, rel=1e-9)
    assert e.residual_gap_before == pytest.approx(np_leading(eye + F0, un)[1], rel=1e-9)
    # smallest alpha (to the search tolerance): 5% less misses one of the two gap targets
    F_less = F0 + 0.95 * e.alpha * np.outer(un, un)
    assert max(np_leading(F_less, un)[1], np_leading(eye + F_less, un)[1]) > 0.01


def test_rank1_edit_explicit_alpha_and_gqa():
    W_V, W_O = heads(H=4, dh=2, d=16, kv_groups=2, seed=1)
    V = W_V.reshape(-1, 16).numpy()
    P = np.linalg.svd(V, full_matrices=False)[2][:4]  # row space of stacked W_V (rank 2 groups * 2)
    u = np.random.default_rng(4).standard_normal(16)
    u /= np.linalg.norm(u)
    e = rank1_output_edit(W_V, W_O, t64(u), alpha=2.0)
    u_r = P.T @ (P @ u)
    assert e.alpha == 2.0 and e.reachable_fraction == pytest.approx(np.linalg.norm(u_r), rel=1e-9)
    assert e.reachable_fraction < 0.99
    assert np.allclose(F_of(W_V, W_O + e.delta_W_O), F_of(W_V, W_O) + 2.0 * np.outer(u, u_r), atol=1e-10)
    inside = t64(V.T @ np.arange(1.0, 9.0))
    e2 = rank1_output_edit(W_V, W_O, inside, gap=0.05)
    assert e2.reachable_fraction == pytest.approx(1.0, abs=1e-9) and e2.gap_after <= 0.05


@pytest.mark.parametrize("groups", [[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 1, 2]])
def test_rank1_edit_of_grouped_query_heads_against_the_dense_oracle(groups):
    """Heads sharing their W_V (GQA, and unequal groups): the search runs on the (r+1) x (r+1)
    matrix of the merged factors, and everything it reports is the dense oracle's: w is
    pinv(V^T) u, F' = F + alpha u u_r^T, lambda1 / gap / |cos(v1, u)| of F' and I + F' from
    numpy's eig, and alpha the smallest to the search tolerance."""
    g = torch.Generator().manual_seed(7)
    d, dh = 24, 2
    distinct = torch.randn(3, dh, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    W_V = distinct[groups]
    W_O = torch.randn(6, d, dh, generator=g, dtype=torch.float64) / math.sqrt(dh)
    u = np.random.default_rng(5).standard_normal(d)
    u /= np.linalg.norm(u)
    V = W_V.reshape(-1, d).numpy()
    e = rank1_output_edit(W_V, W_O, t64(u), gap=0.05)
    w = np.linalg.pinv(V.T) @ u
    u_r = V.T @ w
    np.testing.assert_allclose(e.w.numpy(), w, atol=1e-12)
    np.testing.assert_allclose(e.u_reachable.numpy(), u_r, atol=1e-12)
    F0, F1 = F_of(W_V, W_O), F_of(W_V, W_O + e.delta_W_O)
    assert np.allclose(F1, F0 + e.alpha * np.outer(u, u_r), atol=1e-12)
    eye = np.eye(d)
    for F, got in ((F1, (e.lambda1_after, e.gap_after, e.eigvec_cos_after)),
                   (F0, (e.lambda1_before, e.gap_before, e.eigvec_cos_before))):
        lam1, gap, _ = np_leading(F, u)
        assert got[0] == pytest.approx(lam1, abs=1e-10) and got[1] == pytest.approx(gap, rel=1e-9)
        B = _oracle_basis(F)  # lambda1's real eigenvector, or the real plane of a complex pair
        assert got[2] == pytest.approx(np.linalg.norm(B.T @ u), rel=1e-9)
    lam1r, gapr, cosr = np_leading(eye + F1, u)
    assert e.residual_gap_after == pytest.approx(gapr, rel=1e-9)
    lam1, gap, cos = np_leading(F1, u)
    assert abs(lam1.imag) < 1e-9 and lam1.real > 0 and gap <= 0.05 + 1e-12 and cos >= 0.9
    assert abs(lam1r.imag) < 1e-9 and lam1r.real > 0 and gapr <= 0.05 + 1e-12 and cosr >= 0.9
    F_less = F0 + 0.95 * e.alpha * np.outer(u, u_r)  # 5% less misses one of the targets
    missed = [np_leading(F_less, u), np_leading(eye + F_less, u)]
    assert any(m[1] > 0.05 or m[2] < 0.9 or abs(m[0].imag) > 1e-9 or m[0].real <= 0
               for m in missed)


def test_rank1_edit_bad_input():
    W_V, W_O = heads()
    for u in [torch.zeros(16), torch.ones(15), torch.full((16,), float("nan")), torch.ones(16, 1)]:
        with pytest.raises(ValueError):
            rank1_output_edit(W_V, W_O, u)
    with pytest.raises(ValueError):
        rank1_output_edit(W_V, W_O.transpose(1, 2), torch.ones(16))
    with pytest.raises(ValueError):
        rank1_output_edit(W_V, W_O, torch.ones(16), gap=0.0)
    W_Vg, W_Og = heads(H=4, dh=2, d=16, kv_groups=2, seed=1)
    P = np.linalg.svd(W_Vg.reshape(-1, 16).numpy())[2]
    with pytest.raises(ValueError):  # orthogonal to the value row space: unreachable
        rank1_output_edit(W_Vg, W_Og, t64(P[-1]))


def _oracle_basis(F: np.ndarray, iterate: str = "F") -> np.ndarray:
    """Dense float64 numpy oracle: orthonormal basis of the leading mode (1-D real, 2-D pair)."""
    vals, vecs = np.linalg.eig(F)
    i = int(np.argmax(np.abs(vals + (1.0 if iterate == "I+F" else 0.0))))
    v = vecs[:, i]
    if abs(vals[i].imag) > 1e-9:
        return np.linalg.qr(np.stack([v.real, v.imag], 1))[0]
    return (v.real / np.linalg.norm(v.real))[:, None]


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_gap_difference_reference_layer_and_direction_columns_match_numpy(iterate):
    """gap_diff = |mu1| - |mu2|; gamma_ref / subspace_cos_ref against one fixed layer's B_r
    (numpy eig + SVD of B_t^T B_r); gamma_u = mean |cos(x, u)|, all from dense float64 numpy."""
    g = np.random.default_rng(30)
    L, d, n = 4, 7, 9
    F = g.standard_normal((L, d, d))
    post = [g.standard_normal((n, d)) for _ in range(L)]
    u = g.standard_normal(d)
    T = lambda xs: [torch.tensor(x) for x in xs]  # noqa: E731
    table = power_table(torch.tensor(F), None, T(post), iterate=iterate, reference_layer=1,
                        direction=torch.tensor(u))
    default = power_table(torch.tensor(F), None, T(post), iterate=iterate)
    assert (default.ref_layer == L - 1).all()
    assert "gamma_u" not in default.columns and "gamma_u" in table.columns  # only when asked
    assert list(table.columns).index("gamma_u") == list(table.columns).index("subspace_cos_ref") + 1
    part = power_table(torch.tensor(F), None, T(post), iterate=iterate, layers=[0, 1])
    assert (part.ref_layer == L - 1).all()  # not the last analysed layer: ranks agree
    np.testing.assert_allclose(part.gamma_ref, default.gamma_ref[:2], rtol=1e-12)
    B_r = _oracle_basis(F[1], iterate)
    shift = 1.0 if iterate == "I+F" else 0.0
    for t in range(L):
        q = np.linalg.eigvals(F[t]) + shift
        q = q[np.argsort(-np.abs(q), kind="stable")]
        second = next(x for x in q[1:] if not np.isclose(x, np.conj(q[0])))
        assert table.gap_diff[t] == pytest.approx(abs(q[0]) - abs(second), rel=1e-9)
        X = post[t] / np.linalg.norm(post[t], axis=1, keepdims=True)
        assert table.gamma_ref[t] == pytest.approx(np.linalg.norm(X @ B_r, axis=1).mean(),
                                                   rel=1e-9)
        B_t = _oracle_basis(F[t], iterate)
        assert table.subspace_cos_ref[t] == pytest.approx(
            np.linalg.svd(B_t.T @ B_r, compute_uv=False).max(), rel=1e-9)
        assert table.gamma_u[t] == pytest.approx(np.abs(X @ u / np.linalg.norm(u)).mean(),
                                                 rel=1e-12)
        assert table.gamma_ref_null[t] == gamma_null(d, B_r.shape[1])
    assert (table.ref_layer == 1).all() and table.subspace_cos_ref[1] == pytest.approx(1.0)
    np.testing.assert_allclose(table.gamma_ref[1], table.gamma[1], rtol=1e-12)
    with pytest.raises(ValueError, match="length 7"):
        power_table(torch.tensor(F), direction=torch.ones(6))
    with pytest.raises(ValueError, match="out of range"):
        power_table(torch.tensor(F), reference_layer=L)
