"""Bottleneck: the end-to-end Jacobian P_l = d h_l[p] / d h_0[p] itself for bidirectional models
(against jacfwd through the chained blocks, tests/oracles.py), the per-position product for
causal ones (where it is exact), and the Schur ablation's canonical order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.linearize.end_to_end import end_to_end_jacobians, end_to_end_operators
from spectral_hooks.metrics.schur import canonical_order, schur_diagonal
from tests.oracles import chained_token_jacobian, token_jacobian
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _recorded(family: str):
    model = make_model(family)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0)))
    return probe


def test_bidirectional_end_to_end_is_exact_and_not_the_product():
    probe = _recorded("bert")
    L = probe.anatomy.n_layers
    P = end_to_end_jacobians(probe.anatomy, probe.recording)
    ops = end_to_end_operators(probe.anatomy, probe.recording)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(P.shape[-1], generator=g, dtype=torch.float64)
    product = torch.eye(P.shape[-1], dtype=torch.float64)
    for l in range(L):
        want = chained_token_jacobian(probe, 0, l)
        assert float((P[l] - want).abs().max()) < 1e-10 * float(want.abs().max())
        assert torch.allclose(ops[l].matvec(v), want @ v, rtol=1e-10, atol=1e-12)
        assert torch.allclose(ops[l].rmatvec(v), want.T @ v, rtol=1e-10, atol=1e-12)
        V = torch.randn(P.shape[-1], 5, generator=g, dtype=torch.float64)  # batched by vmap
        assert torch.allclose(ops[l].matmat(V), want @ V, rtol=1e-10, atol=1e-12)
        assert torch.allclose(ops[l].rmatmat(V), want.T @ V, rtol=1e-10, atol=1e-12)
        product = token_jacobian(probe, l, position=5) @ product
    # a random tiny BERT couples positions weakly (~1e-5 here), far above rounding (~1e-14)
    assert float((product - P[-1]).abs().max()) > 1e-8 * float(P[-1].abs().max())
    report = probe.analyze(power=False, bottleneck=True, jacobian={"ablations": ()})
    table = report.bottleneck
    assert set(table.computation) == {"end_to_end"}
    s = np.linalg.svd(P[-1].numpy(), compute_uv=False)
    p = s / s.sum()
    assert table.erank.iloc[-1] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-8)


def test_causal_product_is_the_end_to_end_jacobian():
    probe = _recorded("gpt2")
    P = end_to_end_jacobians(probe.anatomy, probe.recording)
    product = torch.eye(P.shape[-1], dtype=torch.float64)
    for l in range(probe.anatomy.n_layers):
        product = token_jacobian(probe, l, position=5) @ product
        assert torch.allclose(product, P[l], rtol=1e-9, atol=1e-11)
    table = probe.analyze(power=False, bottleneck=True).bottleneck
    assert set(table.computation) == {"product"}


def test_schur_ablation_order_is_canonical():
    """Eigenvalues 2, +-1 (a tie that is not a conjugate pair), +-1.5i: the normal part is the
    same whatever order LAPACK returns them in (similarity-covariant under a permutation)."""
    lam = torch.tensor([2.0, 1.0, -1.0, 1.5j, -1.5j, 0.5])
    assert canonical_order(lam) == [0, 3, 4, 1, 2, 5]
    rng = np.random.default_rng(0)
    d = 6
    T = np.diag([2.0, 1.0, -1.0, 0.0, 0.0, 0.5]) + np.triu(rng.standard_normal((d, d)), 1)
    T[3:5, 3:5] = [[0.0, 1.5], [-1.5, 0.0]]
    T[4, 3] = -1.5
    V = rng.standard_normal((d, d))
    J = torch.as_tensor(V @ T @ np.linalg.inv(V))
    N = schur_diagonal(J)
    for seed in range(3):
        perm = torch.as_tensor(np.random.default_rng(seed).permutation(d))
        Pm = torch.eye(d, dtype=torch.float64)[perm]
        N2 = schur_diagonal(Pm @ J @ Pm.T)
        assert torch.allclose(Pm.T @ N2 @ Pm, N, atol=1e-8)


def _erank(M: np.ndarray) -> float:
    s = np.linalg.svd(M, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def test_one_layer_at_a_time_ablation_is_its_end_to_end_effect():
    """Causal models: the ablation of layer m alone, J_L ... A(J_m) ... J_1 at full depth,
    against jacfwd blocks (tests/oracles.py) multiplied here, for A = symmetric part; the
    schur rows equal the product with only that block replaced by its normal part."""
    probe = _recorded("gpt2")
    L = probe.anatomy.n_layers
    J = [token_jacobian(probe, l, position=5).numpy() for l in range(L)]
    report = probe.analyze(power=False, bottleneck=True, jacobian={"dense": True})
    table = report.bottleneck
    for variant in ("symmetric", "schur"):
        rows = table[(table.variant == variant) & (table.ablated_layer >= 0)]
        assert rows.ablated_layer.tolist() == list(range(L)) and set(rows.depth) == {L}
        every = table[(table.variant == variant) & (table.ablated_layer == -1)]
        assert every.depth.tolist() == list(range(1, L + 1))
        for m in range(L):
            if variant == "symmetric":
                A = 0.5 * (J[m] + J[m].T)
            else:
                A = schur_diagonal(torch.as_tensor(J[m])).numpy()
            P = np.eye(J[0].shape[0])
            for l in range(L):
                P = (A if l == m else J[l]) @ P
            got = rows[rows.ablated_layer == m].erank.item()
            assert got == pytest.approx(_erank(P), rel=1e-8), (variant, m)
    trained = table[table.variant == "trained"]
    assert set(trained.ablated_layer) == {-1}


def test_one_layer_ablation_matrix_free_and_absent_for_bidirectional():
    from spectral_hooks.metrics.bottleneck import single_layer_ablation_table

    g = torch.Generator().manual_seed(3)
    Js = [torch.eye(12, dtype=torch.float64) + torch.randn(12, 12, generator=g,
                                                         dtype=torch.float64) / 4
          for _ in range(3)]
    exact = single_layer_ablation_table(Js, variant="symmetric", dense=True, layers=[4, 5, 6])
    free = single_layer_ablation_table(Js, variant="symmetric", k=12, layers=[4, 5, 6])
    assert exact.ablated_layer.tolist() == [4, 5, 6]
    np.testing.assert_allclose(free.erank, exact.erank, rtol=1e-8)
    table = _recorded("bert").analyze(power=False, bottleneck=True).bottleneck
    assert set(table.ablated_layer) == {-1}  # the product is not P_L there: no per-layer rows


def test_bidirectional_depths_share_each_sweep_and_equal_the_dense_ranks(monkeypatch):
    """The end-to-end operators of every depth are one chain of full-sequence block
    Jacobians: one product of all depths runs each block once (L calls, not 1 + ... + L), and
    the matrix-free table in lockstep equals the dense singular values (k = d)."""
    from spectral_hooks.linearize.function import BlockFunction
    from spectral_hooks.metrics.bottleneck import end_to_end_table

    probe = _recorded("albert")  # 3 layers, one shared block at three linearisation points
    L = probe.anatomy.n_layers
    P = end_to_end_jacobians(probe.anatomy, probe.recording)
    ops = end_to_end_operators(probe.anatomy, probe.recording)
    d = P.shape[-1]
    calls = []
    full = BlockFunction.full
    monkeypatch.setattr(BlockFunction, "full", lambda fn, H: calls.append(fn.layer) or full(fn, H))
    X = torch.randn(L, d, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    together = ops[0].batch_group.matmat_all(X)
    assert sorted(calls) == list(range(L))
    calls.clear()
    alone = [op.matmat(x) for op, x in zip(ops, X)]
    assert len(calls) == L * (L + 1) // 2
    for l in range(L):
        torch.testing.assert_close(together[l], P[l] @ X[l], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(alone[l], P[l] @ X[l], rtol=1e-10, atol=1e-12)
    free = end_to_end_table(ops, k=d, n_probes=0, tol=1e-12)
    exact = end_to_end_table(list(P), dense=True)
    for column in ("erank", "stable_rank", "participation_ratio", "sigma_max"):
        np.testing.assert_allclose(free[column], exact[column], rtol=1e-8)
    assert (free.surviving == exact.surviving).all()
    assert free.n_matvecs.is_monotonic_increasing and free.n_matvecs.iloc[0] > 0
