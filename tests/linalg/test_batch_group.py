"""The linalg batch_group hook: operators that are slots of one shared engine (a
``BatchGroup``: ``size``, ``dtype``, ``matmat_all``, ``rmatmat_all``) are applied by one call
per solver step, with the same values and counts as each operator alone. The engine the
analysis uses is ``linearize.group`` (tests/test_linearize_group.py)."""

from __future__ import annotations

import torch

from spectral_hooks.linalg import LinearOperator, eigs, svds


class _DenseGroup:
    def __init__(self, A: torch.Tensor) -> None:
        self.A, self.size, self.dtype = A, A.shape[0], A.dtype
        self.calls = {"mm": 0, "rmm": 0}

    def matmat_all(self, X):
        self.calls["mm"] += 1
        return self.A @ X

    def rmatmat_all(self, X):
        self.calls["rmm"] += 1
        return self.A.mT @ X


def _dense_group_ops(A: torch.Tensor, group: _DenseGroup):
    ops = []
    for i in range(A.shape[0]):
        M = A[i]
        op = LinearOperator(M.shape, matvec=lambda x, M=M: M @ x,
                            rmatvec=lambda y, M=M: M.T @ y, dtype=M.dtype,
                            device=M.device)
        op.batch_group, op.batch_index = group, i
        ops.append(op)
    return ops


def test_batch_group_hook_is_generic_and_exact():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 60, 60, generator=g, dtype=torch.float64)
    group = _DenseGroup(A)
    ops = _dense_group_ops(A, group)
    sub = [ops[3], ops[1], ops[2]]  # a subset, out of order: other slots get zeros
    res = eigs(sub, 5, tol=1e-10, seed=1)
    ref = eigs(A[[3, 1, 2]], 5, tol=1e-10, seed=1)
    assert group.calls["mm"] > 0
    assert torch.allclose(res.values, ref.values, rtol=0, atol=1e-9)
    assert res.n_matvecs == ref.n_matvecs
    s = svds(sub, 4, seed=1)  # the rmatmat_all path
    sd = torch.linalg.svdvals(A[[3, 1, 2]])[:, :4]
    assert group.calls["rmm"] > 0
    assert torch.allclose(s.S, sd, rtol=1e-6)
    # the same operator twice: each member still gets its own product
    res2 = eigs([ops[0], ops[0]], 3, tol=1e-10, seed=1)
    assert torch.allclose(res2.values[0], res2.values[1], atol=1e-9)
    # masked members: one call, zero rows for the inactive ones, counts per active member
    from spectral_hooks.linalg.batch import OpBatch
    b = OpBatch(sub, what="test")
    X = torch.randn(3, 60, 2, dtype=torch.float64)
    before = group.calls["mm"]
    Y = b.apply(X, [True, False, True])
    assert group.calls["mm"] == before + 1
    assert torch.allclose(Y[0], A[3] @ X[0]) and torch.allclose(Y[2], A[2] @ X[2])
    assert bool((Y[1] == 0).all()) and b.counts == [2, 0, 2]
