"""The cheap-operator paths of eigs (issue 13): one host sync per Arnoldi step with the
NaN / Inf test folded into the breakdown test, and dense CPU batches solved one member at a
time. Checked against a dense float64 oracle (torch.linalg.eigvals)."""

import warnings

import pytest
import torch

from spectral_hooks.linalg import DenseOperator, LinearOperator, dense, eigs
from spectral_hooks.linalg.batch import OpBatch

from ._spectra import set_distance, top_by_modulus


def _decaying(n, seed):
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    d = 0.8 ** torch.arange(n, dtype=torch.float64)
    return Q @ torch.diag(d) @ Q.T + 1e-3 * torch.randn(n, n, generator=g, dtype=torch.float64)


def _oracle_error(values, A, k):
    values = values[~torch.isnan(values)]
    ref = top_by_modulus(torch.linalg.eigvals(A), values.shape[-1])
    return set_distance(values, ref)


@pytest.mark.parametrize("lockstep", [False, True], ids=["one-at-a-time", "lockstep"])
def test_dense_batch_paths_match_the_oracle(monkeypatch, lockstep):
    n, k = dense.ONE_AT_A_TIME_N, 5
    monkeypatch.setattr(dense, "ONE_AT_A_TIME_N", 10 ** 9 if lockstep else n)
    A = torch.stack([_decaying(n, s) for s in range(3)])
    assert dense.one_at_a_time(OpBatch(A, what="eigs")) is not lockstep
    res = eigs(A, k, v0=torch.ones(n))
    assert res.values.shape[0] == 3 and bool(res.converged.all())
    assert float(res.residuals.max()) <= 1e-10
    for b in range(3):
        assert _oracle_error(res.values[b], A[b], k) < 1e-9
        x, lam = res.vectors[b], res.values[b]
        r = A[b].to(x.dtype) @ x - x * lam
        assert float(torch.linalg.vector_norm(r, dim=0).max()) < 1e-9
    single = eigs(A[1], k, v0=torch.ones(n))
    assert _oracle_error(single.values, A[1], k) < 1e-9
    assert res.n_matvecs >= single.n_matvecs  # the max over members, probes included


def _late_nan_operator(n, after, bad):
    """Returns A x for the first ``after`` applications, then ``bad`` (NaN or Inf) in one entry."""
    A = _decaying(n, 3)
    calls = [0]

    def matvec(x):
        calls[0] += 1
        y = A @ x
        if calls[0] > after:
            y = y.clone()
            y[0] = bad
        return y
    return LinearOperator((n, n), matvec=matvec, dtype=torch.float64, device="cpu",
                          name=f"late_{bad}")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_product_mid_run_names_the_operator(bad):
    op = _late_nan_operator(60, 7, bad)
    with pytest.raises(FloatingPointError, match=f"late_{bad}"):
        eigs(op, 3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_product_in_block_mode_names_the_operator(bad):
    # block mode reads its NaN / Inf test once per expansion (no per-step sync): still raised
    op = _late_nan_operator(60, 9, bad)
    with pytest.raises(FloatingPointError, match=f"late_{bad}"):
        eigs(op, 3, block_size=4)


def test_non_finite_member_of_a_batch_is_named():
    good = LinearOperator((60, 60), matvec=lambda x: _decaying(60, 4) @ x, dtype=torch.float64,
                          device="cpu", name="good_op")
    with pytest.raises(FloatingPointError, match="late_nan") as info:
        eigs([good, _late_nan_operator(60, 5, float("nan"))], 3)
    assert "good_op" not in str(info.value)


class _OwnError(FloatingPointError):
    pass


class _SelfCheckingOp(LinearOperator):
    """Tests its own products (as linearize's operators do) unless the caller says it does;
    its non-finite error is its own."""

    def __init__(self, n, after):
        self.seen = []  # caller_checks_finite at each application
        inner = _late_nan_operator(n, after, float("nan"))
        super().__init__((n, n), matvec=self._mv, dtype=torch.float64, device="cpu",
                         name="self_checking")
        self._inner = inner

    def _mv(self, x):
        self.seen.append(self.caller_checks_finite)
        return self._inner.matvec(x)

    def nonfinite_error(self, adjoint=False):
        return _OwnError(f"own error of self_checking (adjoint={adjoint})")


@pytest.mark.parametrize("block_size", [1, 4])
def test_solver_tells_the_operator_it_checks_and_raises_the_operators_own_error(block_size):
    op = _SelfCheckingOp(60, 9)
    with pytest.raises(_OwnError, match="adjoint=False"):
        eigs(op, 3, block_size=block_size)
    assert op.seen and all(op.seen)  # every application inside eigs: the solver tests it
    assert not op.caller_checks_finite  # reset after each application
    op.matvec(torch.ones(60, dtype=torch.float64))
    assert op.seen[-1] is False  # a direct call: the operator tests its own output


def _expansion(A, B, m, stop_at):
    """Arnoldi from e_0 over ``B`` copies of A (B = 1 takes arnoldi's single-operator loop,
    B = 2 the masked lockstep one): member 0's basis, projected matrix and size."""
    from spectral_hooks.linalg.arnoldi import extend
    n = A.shape[0]
    V = torch.zeros(B, n, m + 1, dtype=torch.float64)
    Hb = torch.zeros(B, m + 1, m, dtype=torch.float64)
    V[:, :, 0] = torch.ones(n, dtype=torch.float64) / n ** 0.5
    gen = torch.Generator().manual_seed(0)
    size = extend(OpBatch(A.expand(B, n, n).clone(), what="eigs"), V, Hb, [0] * B, [False] * B,
                  m, 1, lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64),
                  stop_at=stop_at)
    return V[0], Hb[0], size[0]


@pytest.mark.parametrize("rank", [None, 6], ids=["full", "rank-6 (breakdown)"])
def test_one_operator_expands_as_the_batched_loop_does(rank):
    n, m = 40, 20
    A = _decaying(n, 5)
    if rank is not None:
        U, S, Vh = torch.linalg.svd(A)
        A = U[:, :rank] @ torch.diag(S[:rank]) @ Vh[:rank]
    for stop_at in (0, 8):
        V1, H1, s1 = _expansion(A, 1, m, stop_at)
        V2, H2, s2 = _expansion(A, 2, m, stop_at)
        # a breakdown at every step from the rank on: the run stops at the first at stop_at
        assert s1 == s2 == (m if rank is None or not stop_at else max(stop_at, rank + 1))
        s = s1
        # a Krylov decomposition: orthonormal basis, A V = V H (+ the residual column)
        eye = torch.eye(s + 1, dtype=torch.float64)
        assert torch.allclose(V1[:, :s + 1].T @ V1[:, :s + 1], eye, atol=1e-12)
        assert torch.allclose(A @ V1[:, :s], V1[:, :s + 1] @ H1[:s + 1, :s], atol=1e-12)
        # the same decomposition as the lockstep loop's up to the breakdown (after it each
        # continues with its own random vector)
        upto = s if rank is None else rank
        assert torch.allclose(H1[:upto + 1, :upto], H2[:upto + 1, :upto], atol=1e-12)
        assert torch.allclose(V1[:, :upto], V2[:, :upto], atol=1e-12)


class _Stack:
    """A batch group of dense matrices (``protocols.BatchGroup``): one call applies them all."""

    def __init__(self, mats):
        self.mats, self.size, self.dtype, self.calls = torch.stack(mats), len(mats), torch.float64, 0

    def matmat_all(self, X):
        self.calls += 1
        return self.mats @ X

    def rmatmat_all(self, X):
        return self.mats.mT @ X


def test_a_list_of_operators_is_solved_one_at_a_time_unless_grouped():
    n, k = dense.ONE_AT_A_TIME_N, 5
    mats = [_decaying(n, s) for s in range(3)]
    ops = [DenseOperator(A) for A in mats]
    assert dense.one_at_a_time(OpBatch(ops, what="eigs"))
    res = eigs(ops, k, v0=torch.ones(n))
    assert bool(res.converged.all())
    for b in range(3):
        assert _oracle_error(res.values[b], mats[b], k) < 1e-9
    # operators that share a batch group are applied by one call: lockstep keeps that
    group = _Stack(mats)
    members = []
    for i, A in enumerate(mats):
        op = LinearOperator((n, n), matvec=lambda x, A=A: A @ x, dtype=torch.float64,
                            device="cpu", name=f"member {i}")
        op.batch_group, op.batch_index = group, i  # pyright: ignore[reportAttributeAccessIssue]
        members.append(op)
    assert not dense.one_at_a_time(OpBatch(members, what="eigs"))
    grouped = eigs(members, k, v0=torch.ones(n))
    assert group.calls > 0 and bool(grouped.converged.all())
    for b in range(3):
        assert _oracle_error(grouped.values[b], mats[b], k) < 1e-9


def test_a_list_mixing_real_and_complex_operators_stays_in_lockstep():
    # a member solved alone would work in its own precision: the complex start vector the
    # batch draws cannot go into a real member's basis
    n, k = dense.ONE_AT_A_TIME_N, 4
    g = torch.Generator().manual_seed(7)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    C = torch.randn(n, n, generator=g, dtype=torch.complex128)
    ops = [DenseOperator(A), DenseOperator(C)]
    assert not dense.one_at_a_time(OpBatch(ops, what="eigs"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "casting complex values to real"
        res = eigs(ops, k)
    assert bool(res.converged.all())
    for b, M in enumerate((A, C)):
        assert _oracle_error(res.values[b], M, k) < 1e-9
