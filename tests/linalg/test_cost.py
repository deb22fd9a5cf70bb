"""The CPU cost rule (``linalg.cost``, issue 37): the shape ``svds`` picks by the operator's
width and device (no timing: the choice itself, and the values against a dense oracle)."""

import pytest
import torch

from spectral_hooks.linalg import LinearOperator, cost, svds
from spectral_hooks.linalg.batch import OpBatch
from spectral_hooks.linalg.svd import _shape


class _Counting(LinearOperator):
    """A dense operator with a batched-product hint that records every application's width."""

    def __init__(self, A, hint=32, device="cpu"):
        self.widths = []

        def mm(X):
            self.widths.append(X.shape[1])
            return A @ X

        def rmm(Y):
            self.widths.append(Y.shape[1])
            return A.T @ Y
        super().__init__(tuple(A.shape), matvec=lambda x: A @ x, rmatvec=lambda y: A.T @ y,
                         matmat=mm, rmatmat=rmm, dtype=A.dtype, device=device,
                         block_size=hint)


def _batch(n, device="cpu", hint=32):
    return OpBatch(_Counting(torch.eye(n, dtype=torch.float64), hint, device), what="svds")


def test_flop_bound_is_the_cpu_from_the_crossover_width():
    n = cost.CPU_FLOP_BOUND_N
    assert not cost.flop_bound(n - 1, "cpu") and cost.flop_bound(n, "cpu")
    assert not cost.flop_bound(4 * n, "cuda") and not cost.flop_bound(4 * n, torch.device("mps"))
    assert not cost.flop_bound(4 * n, "cpu", device_path=True)


def test_svds_default_block_follows_the_rule():
    n = cost.CPU_FLOP_BOUND_N
    k = 16
    assert _shape(_batch(128), k, None, None)[0] == 16          # dispatch-bound: the hint, <= k
    assert _shape(_batch(n), k, None, None)[0] == 1             # FLOP-bound: one column
    assert _shape(_batch(n), k, None, None, device_path=True)[0] == 16  # the accelerator's
    assert _shape(_batch(n, device="meta"), k, None, None)[0] == 16     # not the CPU
    assert _shape(_batch(n), k, None, 4)[0] == 4                # as given, whatever the rule


def test_single_vector_svds_above_the_crossover_equals_the_dense_svd(monkeypatch):
    monkeypatch.setattr(cost, "CPU_FLOP_BOUND_N", 200)  # a small operator, FLOP-bound by rule
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(240, 240, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(240, 240, generator=g, dtype=torch.float64)).Q
    A = (U * 0.97 ** torch.arange(240, dtype=torch.float64)) @ V.T
    op = _Counting(A)
    res = svds(op, 8, tol=1e-10)
    assert bool(res.converged)
    assert res.S == pytest.approx(torch.linalg.svdvals(A)[:8], rel=1e-9)
    assert op.widths.count(1) > 0.9 * len(op.widths)  # only the final check applies k at once
    blocked = _Counting(A)
    resb = svds(blocked, 8, tol=1e-10, device_path=True)  # the accelerator's block default
    assert resb.S == pytest.approx(res.S, rel=1e-9)
    assert max(blocked.widths) == 8 and blocked.widths.count(1) == 0
