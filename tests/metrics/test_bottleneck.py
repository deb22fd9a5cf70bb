"""Bottleneck (ranks of P_l = J_l ... J_1), its ablations and perturbation propagation vs
independent numpy computations, plus products of known low-rank factors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import LinearOperator
from spectral_hooks.metrics.bottleneck import bottleneck_table, propagation_table
from spectral_hooks.metrics.jacobian import schur_diagonal


def _op(M: np.ndarray) -> LinearOperator:
    A = torch.as_tensor(M, dtype=torch.float64)
    return LinearOperator(A.shape, matvec=lambda x: A @ x, rmatvec=lambda y: A.T @ y,
                          dtype=torch.float64, device="cpu", name="testop")


def _ranks_ref(s: np.ndarray, tau: float = 1e-2) -> dict:
    p = s / s.sum()
    p = p[p > 0]
    return dict(erank=math.exp(-np.sum(p * np.log(p))),
                participation_ratio=np.sum(s ** 2) ** 2 / np.sum(s ** 4),
                stable_rank=np.sum(s ** 2) / s.max() ** 2,
                surviving=int(np.sum(s >= tau * s.max())))


def _layers(d: int, L: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.eye(d) * 0.6 + rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(L)]


def _check_rows(table, sv_per_depth, truncated):
    for row, s in zip(table.itertuples(), sv_per_depth):
        ref = _ranks_ref(s)
        assert row.erank == pytest.approx(ref["erank"], rel=1e-8)
        assert row.participation_ratio == pytest.approx(ref["participation_ratio"], rel=1e-8)
        assert row.stable_rank == pytest.approx(ref["stable_rank"], rel=1e-8)
        assert row.surviving == ref["surviving"]
        assert row.sigma_max == pytest.approx(s.max(), rel=1e-10)
        assert row.n_singular == len(s) and row.truncated == truncated


def test_known_low_rank_factors():
    """J_l = U_l D_l U_{l-1}^T with orthogonal U: P_l = U_l (D_l ... D_1) U_0^T."""
    rng = np.random.default_rng(0)
    d = 24
    U = [np.linalg.qr(rng.standard_normal((d, d)))[0] for _ in range(4)]
    ranks = [16, 9, 4]  # flat spectra: every rank is exactly r
    Js = [U[i + 1] @ np.diag([1.0] * r + [0.0] * (d - r)) @ U[i].T for i, r in enumerate(ranks)]
    for dense in (True, False):
        t = bottleneck_table([torch.as_tensor(J) for J in Js] if dense else [_op(J) for J in Js],
                             k=20, dense=dense)
        assert list(t["depth"]) == [1, 2, 3] and set(t["variant"]) == {"trained"}
        for col in ("erank", "participation_ratio", "stable_rank"):
            np.testing.assert_allclose(t[col], ranks, rtol=1e-8)
        assert list(t["surviving"]) == ranks
    # geometric spectra 2^-i per layer: P_l has singular values 2^(-l i)
    D = np.diag(2.0 ** -np.arange(d))
    Js = [U[i + 1] @ D @ U[i].T for i in range(3)]
    t = bottleneck_table([torch.as_tensor(J) for J in Js], dense=True)
    _check_rows(t, [2.0 ** (-(l + 1) * np.arange(d)) for l in range(3)], False)
    assert list(t["surviving"]) == [7, 4, 3]  # 2^(-l i) >= 1e-2


def test_matrix_free_top_k_vs_dense_product():
    d, L, k = 40, 4, 12
    Js = _layers(d, L, 1)
    P, svs = np.eye(d), []
    for J in Js:
        P = J @ P
        svs.append(np.linalg.svd(P, compute_uv=False))
    ops = [_op(J) for J in Js]
    t = bottleneck_table(ops, k=k, seed=3)
    _check_rows(t, [s[:k] for s in svs], True)
    assert t["n_matvecs"].is_monotonic_increasing and t["n_matvecs"].iloc[-1] == sum(
        o.n_matvecs for o in ops)
    _check_rows(bottleneck_table([torch.as_tensor(J) for J in Js], dense=True), svs, False)
    _check_rows(bottleneck_table([_op(J) for J in Js], k=d), svs, False)  # k = d: full
    rnd = bottleneck_table(ops, k=k, method="randomized")  # approximate by design
    np.testing.assert_allclose(rnd["sigma_max"], [s[0] for s in svs], rtol=1e-6)


@pytest.mark.parametrize("dense", [True, False])
def test_symmetric_variant_vs_dense(dense):
    d, L, k = 30, 3, 10
    Js = _layers(d, L, 2)
    P, svs = np.eye(d), []
    for J in Js:
        P = (J + J.T) / 2 @ P
        svs.append(np.linalg.svd(P, compute_uv=False))
    t = bottleneck_table([_op(J) for J in Js], k=k, variant="symmetric", dense=dense)
    assert set(t["variant"]) == {"symmetric"}
    _check_rows(t, svs if dense else [s[:k] for s in svs], not dense)


def test_schur_variant():
    d = 20
    Js = _layers(d, 3, 4)
    t = bottleneck_table([torch.as_tensor(J) for J in Js], variant="schur")
    assert set(t["variant"]) == {"schur"} and not t["truncated"].any()
    # depth 1: the normal part has singular values |lambda_i(J_1)|
    _check_rows(t.iloc[:1], [np.sort(np.abs(np.linalg.eigvals(Js[0])))[::-1]], False)
    P, svs = np.eye(d), []
    for J in Js:
        P = schur_diagonal(torch.as_tensor(J)).numpy() @ P
        svs.append(np.linalg.svd(P, compute_uv=False))
    _check_rows(t, svs, False)
    # normal layers are their own normal part: the ablation changes nothing
    Ns = [(J + J.T) / 2 for J in Js]
    a = bottleneck_table([torch.as_tensor(N) for N in Ns], variant="schur")
    b = bottleneck_table([torch.as_tensor(N) for N in Ns], dense=True)
    np.testing.assert_allclose(a["erank"], b["erank"], rtol=1e-9)


def test_bad_input():
    Js = [torch.eye(10, dtype=torch.float64)] * 2
    with pytest.raises(ValueError, match="d = 10"):
        bottleneck_table([_op(np.eye(10))] * 2, k=11)
    with pytest.raises(ValueError, match="SCHUR_MAX_D = 2048"):
        bottleneck_table([torch.zeros(2049, 2049)], variant="schur")
    with pytest.raises(ValueError, match="SCHUR_MAX_D"):
        bottleneck_table([_op(np.eye(10))], variant="schur")
    with pytest.raises(ValueError, match="variant"):
        bottleneck_table(Js, variant="nope")
    with pytest.raises(ValueError, match="one size"):
        bottleneck_table([torch.eye(3), torch.eye(4)])
    with pytest.raises(ValueError, match="at least one"):
        bottleneck_table([])
    with pytest.raises(ValueError, match="start_layer"):
        propagation_table(Js, start_layer=2)
    with pytest.raises(ValueError, match="d = 10"):
        propagation_table(Js, k=11)
    with pytest.raises(ValueError, match="non-zero"):
        propagation_table(Js, vector=torch.zeros(10))


def test_propagation_vs_numpy():
    d, L, k = 32, 5, 6
    Js = _layers(d, L, 5)
    x0 = np.random.default_rng(9).standard_normal(d) * 3
    t = propagation_table([_op(J) for J in Js], start_layer=1, vector=torch.as_tensor(x0), k=k)
    assert list(t["layer"]) == [1, 2, 3, 4]
    x = x0
    for row, J in zip(t.itertuples(), Js[1:]):
        y = J @ x
        U, _, Vt = np.linalg.svd(J)
        assert row.norm == pytest.approx(np.linalg.norm(y), rel=1e-12)
        assert row.growth == pytest.approx(np.linalg.norm(y) / np.linalg.norm(x), rel=1e-12)
        assert row.alignment_top == pytest.approx(
            np.linalg.norm(U[:, :k].T @ y) / np.linalg.norm(y), rel=1e-7)
        assert row.alignment_in == pytest.approx(
            np.linalg.norm(Vt[:k] @ x) / np.linalg.norm(x), rel=1e-7)
        x = y
    # the null: E ||U_k^T u|| for u uniform on the sphere, by Monte Carlo
    u = np.random.default_rng(1).standard_normal((20000, d))
    mc = np.mean(np.linalg.norm(u[:, :k], axis=1) / np.linalg.norm(u, axis=1))
    assert t["alignment_null"].iloc[0] == pytest.approx(mc, abs=0.01)
    # default: a random unit vector (seeded), so the first norm is the first growth
    r = propagation_table([torch.as_tensor(J) for J in Js], k=k, seed=4)
    assert r["norm"].iloc[0] == pytest.approx(r["growth"].iloc[0], rel=1e-12)
    assert r.equals(propagation_table([torch.as_tensor(J) for J in Js], k=k, seed=4))
