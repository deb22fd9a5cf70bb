"""ChainProducts: products of operator chains sharing factors, applied in one sweep. Checked
against the dense float64 products, by counted factor calls, and through the solvers."""

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import ChainProducts, DenseOperator, LinearOperator, svds
from spectral_hooks.metrics.bottleneck import bottleneck_table, single_layer_ablation_table
from spectral_hooks.metrics.rank_estimates import rank_estimates, rank_estimates_of


class _Counting(LinearOperator):
    """A dense factor that counts its calls (sequential applications) and columns."""

    def __init__(self, A):
        self.calls = 0

        def mm(X):
            self.calls += 1
            return A @ X

        def rmm(Y):
            self.calls += 1
            return A.T @ Y
        super().__init__(tuple(A.shape), matvec=lambda x: mm(x[:, None])[:, 0], matmat=mm,
                         rmatvec=lambda y: rmm(y[:, None])[:, 0], rmatmat=rmm,
                         dtype=A.dtype, device=A.device)


def _factors(d=12, L=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.eye(d, dtype=torch.float64) + torch.randn(d, d, generator=g,
                                                            dtype=torch.float64) / 3
            for _ in range(L)]


def _dense(chain):
    P = torch.eye(chain[0].shape[0], dtype=torch.float64)
    for M in chain:
        P = M @ P
    return P


def test_sweeps_equal_the_dense_products_and_their_adjoints():
    Js = _factors()
    ops = [_Counting(J) for J in Js]
    ablated = DenseOperator(0.5 * (Js[1] + Js[1].T))
    chains = [ops[:1], ops[:3], ops, [ops[0], ablated, *ops[2:]]]
    mats = [Js[:1], Js[:3], Js, [Js[0], 0.5 * (Js[1] + Js[1].T), *Js[2:]]]
    family = ChainProducts(chains)
    X = torch.randn(4, 12, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = torch.stack([_dense(m) @ X[j] for j, m in enumerate(mats)])
    torch.testing.assert_close(family.matmat_all(X), want, rtol=1e-13, atol=1e-13)
    want_t = torch.stack([_dense(m).T @ X[j] for j, m in enumerate(mats)])
    torch.testing.assert_close(family.rmatmat_all(X), want_t, rtol=1e-13, atol=1e-13)
    for j, member in enumerate(family.members):  # each member alone: its own chain
        torch.testing.assert_close(member.matmat(X[j]), want[j], rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(member.rmatmat(X[j]), want_t[j], rtol=1e-13, atol=1e-13)


def test_a_symmetric_part_rides_on_its_factors_call():
    from spectral_hooks.metrics.schur import symmetric_part

    Js = _factors(L=3, seed=8)
    ops = [_Counting(J) for J in Js]
    sym = symmetric_part(ops[1])
    family = ChainProducts([ops, [ops[0], sym, ops[2]], [ops[0], sym]])
    mats = [Js, [Js[0], 0.5 * (Js[1] + Js[1].T), Js[2]], [Js[0], 0.5 * (Js[1] + Js[1].T)]]
    X = torch.randn(3, 12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got, got_t = family.matmat_all(X), family.rmatmat_all(X)
    for j, m in enumerate(mats):
        torch.testing.assert_close(got[j], _dense(m) @ X[j], rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(got_t[j], _dense(m).T @ X[j], rtol=1e-13, atol=1e-13)
    # position 1: one call of J_2 for all three chains, one of J_2^T for the two ablated ones
    assert ops[1].calls == 2 * 2 and ops[1].n_matvecs == 2 * (3 + 2) * 4
    # two symmetric parts of one factor at one position: both ride on its call
    twin = ChainProducts([[ops[0], symmetric_part(ops[1])], [ops[0], symmetric_part(ops[1])],
                          [ops[0], ops[1]]])
    half = 0.5 * (Js[1] + Js[1].T) @ Js[0]
    torch.testing.assert_close(twin.matmat_all(X)[:2], torch.stack([half @ X[0], half @ X[1]]),
                               rtol=1e-13, atol=1e-13)
    # alone, the symmetric part is a plain operator: both halves of its own
    sym_alone = symmetric_part(DenseOperator(Js[1]))
    torch.testing.assert_close(ChainProducts([[sym_alone]]).matmat_all(X[:1])[0],
                               0.5 * (Js[1] + Js[1].T) @ X[0], rtol=1e-13, atol=1e-13)


def test_one_call_per_factor_and_position_where_separate_products_take_one_per_chain_factor():
    Js = _factors(L=5)
    ops = [_Counting(J) for J in Js]
    family = ChainProducts([ops[:depth] for depth in range(1, 6)])
    X = torch.randn(5, 12, 3, dtype=torch.float64)
    family.matmat_all(X)
    assert [o.calls for o in ops] == [1] * 5  # 5 sequential applications, not 1+2+...+5 = 15
    # the columns are those of the separate products: factor i serves the 5 - i chains through it
    assert [o.n_matvecs for o in ops] == [3 * (5 - i) for i in range(5)]
    assert sum(family.spent) == sum(o.n_matvecs for o in ops)
    assert family.spent == [3 * depth for depth in range(1, 6)]  # each chain's own share
    family.rmatmat_all(X)
    assert [o.calls for o in ops] == [2] * 5


def test_svds_of_the_members_in_lockstep_equals_the_dense_singular_values():
    Js = _factors(d=20, L=3, seed=2)
    family = ChainProducts([[DenseOperator(J) for J in Js][:depth] for depth in (1, 2, 3)])
    res = svds(family.members, 4, tol=1e-12)
    for j, depth in enumerate((1, 2, 3)):
        s = torch.linalg.svdvals(_dense(Js[:depth]))[:4]
        torch.testing.assert_close(res.S[j], s, rtol=1e-10, atol=0)


def test_estimates_in_lockstep_are_the_separate_runs():
    Js = _factors(d=24, L=4, seed=3)
    Js[2][:, 0] = 0  # rank-deficient: a singular value exactly 0 from depth 3 on
    family = ChainProducts([[DenseOperator(J) for J in Js][:depth] for depth in range(1, 5)])
    seeds = [7, 8, 9, 10]
    together = rank_estimates_of(family.members, n_probes=6, steps=10, seeds=seeds)
    for member, seed, got in zip(family.members, seeds, together):
        alone = rank_estimates(member, n_probes=6, steps=10, seed=seed)
        for key, value in alone.items():
            # the Gauss-Radau rule at 0 amplifies rounding next to a Ritz value near 0 (see
            # test_bottleneck_estimates): 1e-6 relative there, far below the standard error
            rtol = 1e-6 if key in ("erank_est", "erank_est_lo", "erank_est_se") else 1e-10
            assert got[key] == pytest.approx(value, rel=rtol, abs=1e-12), key


def test_the_bottleneck_estimates_cost_two_sweeps_a_lanczos_step():
    d, L, steps = 16, 4, 6
    Js = _factors(d=d, L=L, seed=4)

    def calls(n_probes, table, **kw):
        ops = [_Counting(J) for J in Js]
        table(ops, k=3, n_probes=n_probes, steps=steps, seed=0, **kw)
        return sum(o.calls for o in ops)
    # trained, every depth: the estimates' Lanczos steps on P_l^T P_l for l = 1..4 take one
    # sweep down and one up the chain a step (2 L calls), not 2 (1 + 2 + 3 + 4)
    assert calls(2, bottleneck_table) - calls(0, bottleneck_table) == steps * 2 * L
    # one-layer ablations (each a chain of L factors, one replaced by its symmetric part): the
    # ablated chain's columns ride on the factor's call at its position, plus one call of the
    # transpose for them: 2 calls a position
    slq = calls(2, single_layer_ablation_table, variant="symmetric") - calls(
        0, single_layer_ablation_table, variant="symmetric")
    assert slq == steps * 2 * (2 * L)
    assert slq < steps * 2 * L * (L + 1)  # one chain at a time: L + 1 calls per chain


def test_the_bottleneck_top_k_runs_the_depths_in_lockstep():
    d, L = 16, 4
    Js = _factors(d=d, L=L, seed=5)
    ops = [_Counting(J) for J in Js]
    table = bottleneck_table(ops, k=3, n_probes=0, seed=0)
    together = sum(o.calls for o in ops)
    ops = [_Counting(J) for J in Js]
    alone = ChainProducts([ops[:depth] for depth in range(1, L + 1)]).members
    for P in alone:  # the same products one depth at a time: l calls a product at depth l
        svds(P, 3, tol=1e-8, seed=0)
    assert together < 0.6 * sum(o.calls for o in ops)
    for depth in range(1, L + 1):  # and the same top-k
        s = torch.linalg.svdvals(_dense(Js[:depth]))
        assert table.sigma_max.iloc[depth - 1] == pytest.approx(float(s[0]), rel=1e-10)


def test_a_member_alone_leaves_the_finite_tests_to_its_factors():
    # a sweep's products are tested by the solver that asked for them; a member applied on
    # its own is not, so its factors keep their own NaN / Inf tests
    seen = []

    class Spy(LinearOperator):
        def __init__(self, A):
            def mm(X):
                seen.append(self.caller_checks_finite)
                return A @ X
            super().__init__(tuple(A.shape), matvec=lambda x: mm(x[:, None])[:, 0],
                             matmat=mm, rmatmat=lambda Y: A.T @ Y, dtype=A.dtype,
                             device=A.device)

    factor = Spy(torch.eye(4, dtype=torch.float64))
    family = ChainProducts([[factor], [factor, factor]])
    family.members[1].matmat(torch.ones(4, 2, dtype=torch.float64))
    assert seen == [False, False]
    with family.members[1].checked_by_caller():  # a caller that tests: the factors may skip
        family.members[1].matmat(torch.ones(4, 2, dtype=torch.float64))
    family.matmat_all(torch.ones(2, 4, 2, dtype=torch.float64))
    assert seen[2:] == [True, True, True, True] and not factor.caller_checks_finite


def test_bad_chains_are_refused():
    A = DenseOperator(torch.eye(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one chain"):
        ChainProducts([])
    with pytest.raises(ValueError, match="no empty chain"):
        ChainProducts([[A], []])
    with pytest.raises(ValueError, match="take 3 rows"):
        ChainProducts([[A, DenseOperator(torch.ones(3, 4, dtype=torch.float64))]])
    wide = DenseOperator(torch.ones(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="every product must be 3 x 3"):
        ChainProducts([[A], [A, wide]])
    with pytest.raises(ValueError, match="1 names for 2 chains"):
        ChainProducts([[A], [A, A]], names=["one"])
    with pytest.raises(TypeError, match="LinearOperators"):
        ChainProducts([[A, np.eye(3)]])


def test_rectangular_factors_that_compose():
    """Chains in and out of a wider space (a row scattered into a sequence, blocks on the
    sequence, the row read back: the end-to-end Jacobians of a bidirectional stack) equal the
    dense products, forward and adjoint, and share the calls of their common factors."""
    g = torch.Generator().manual_seed(5)
    d, wide = 3, 7
    S = torch.zeros(wide, d, dtype=torch.float64)
    S[2:5] = torch.eye(d, dtype=torch.float64)
    Fs = [torch.randn(wide, wide, generator=g, dtype=torch.float64) for _ in range(3)]
    scatter, read = DenseOperator(S), DenseOperator(S.T)
    blocks = [DenseOperator(F) for F in Fs]
    family = ChainProducts([[scatter, *blocks[:depth], read] for depth in (1, 2, 3)],
                           counted=blocks, names=["P1", "P2", "P3"])
    assert [P.name for P in family.members] == ["P1", "P2", "P3"]
    assert all(P.shape == (d, d) for P in family.members)
    X = torch.randn(3, d, 2, generator=g, dtype=torch.float64)
    want, dense = [], torch.eye(wide, dtype=torch.float64)
    for F in Fs:
        dense = F @ dense
        want.append(S.T @ dense @ S)
    for j, P in enumerate(want):
        torch.testing.assert_close(family.matmat_all(X)[j], P @ X[j], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(family.rmatmat_all(X)[j], P.T @ X[j], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(family.members[j].matmat(X[j]), P @ X[j])
    before = [F.n_matvecs for F in blocks]
    family.matmat_all(X)
    # F_1 carries the columns of all three chains in one call, F_3 those of the longest only
    assert [F.n_matvecs - b for F, b in zip(blocks, before)] == [6, 4, 2]


def test_complex_factors_among_real_ones_and_wide_products():
    """Found by fuzzing: a complex factor after a real one lost its imaginary parts at the next
    real factor (cast to real; svds then converged to the wrong product's values), and wide
    products (m != n) crashed when a slot was idle (zeros: it kept its input's shape)."""
    g = torch.Generator().manual_seed(0)
    F = torch.randn(4, 6, generator=g, dtype=torch.float64)
    C = torch.randn(4, 4, generator=g, dtype=torch.complex128)
    L = torch.randn(6, 4, generator=g, dtype=torch.float64)
    family = ChainProducts([[DenseOperator(F), DenseOperator(L)],
                            [DenseOperator(F), DenseOperator(C), DenseOperator(L)]])
    P2 = L.to(C.dtype) @ C @ F.to(C.dtype)
    X = torch.randn(6, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(family.members[1].matmat(X), P2 @ X.to(C.dtype))
    res = svds(family.members, 2)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.S[1], torch.linalg.svdvals(P2)[:2])
    torch.testing.assert_close(res.S[0], torch.linalg.svdvals(L @ F)[:2])

    W = torch.randn(3, 8, generator=g, dtype=torch.float64)
    I3 = torch.randn(3, 3, generator=g, dtype=torch.float64)
    wide = ChainProducts([[DenseOperator(W)], [DenseOperator(W), DenseOperator(I3)]])
    Z = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)
    Z[0] = 0
    out = wide.matmat_all(Z)
    assert out.shape == (2, 3, 2) and not out[0].any()
    torch.testing.assert_close(out[1], I3 @ W @ Z[1])
    res = svds(wide.members, 2)
    torch.testing.assert_close(res.S, torch.stack([torch.linalg.svdvals(W)[:2],
                                                   torch.linalg.svdvals(I3 @ W)[:2]]))
