"""stacked_block_jacobians (one linearisation for all layers) and the linalg batch_group hook."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import make_model  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.linalg import LinearOperator, eigs, svds  # noqa: E402
from spectral_hooks.linearize import block_jacobian, dense_block_jacobian, stacked_block_jacobians  # noqa: E402
from tests.oracles import eigvals_by_modulus, farthest_from, token_jacobian  # noqa: E402

IDS = torch.tensor([[5, 17, 3, 42, 8, 61, 2]])
TOL = 1e-8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


_CACHE: dict = {}


def recorded(family: str):
    if family not in _CACHE:
        if family == "gpt2_3":  # three layers: subsets, order, lockstep masking
            from transformers import GPT2Config, GPT2Model
            torch.manual_seed(0)
            model = GPT2Model(GPT2Config(vocab_size=100, n_embd=32, n_layer=3, n_head=4,
                                         n_positions=64)).to(torch.float64).eval()
        else:
            model = make_model(family)
        with sh.instrument(model) as probe:
            with torch.no_grad():
                model(IDS)
        _CACHE[family] = probe
    return _CACHE[family]


_ORACLES: dict = {}


def block_oracle(probe, layer: int) -> torch.Tensor:
    """d block(H)[p] / d H[p] (p = last token) by jacfwd of the block module itself."""
    key = (id(probe), layer)
    if key not in _ORACLES:  # the probe is kept with its oracle: its id is never reused
        _ORACLES[key] = (probe, token_jacobian(probe, layer))
    return _ORACLES[key][1]


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt2_3"])
def test_stacked_operators_match_per_layer_and_jacfwd(family):
    probe = recorded(family)
    an, rec = probe.anatomy, probe.recording
    layers = list(range(an.n_layers))
    ops = stacked_block_jacobians(an, rec, layers)
    assert ops is not None and [o.layer for o in ops] == layers
    group = ops[0].batch_group
    assert all(o.batch_group is group for o in ops) and group.size == len(layers)
    g = torch.Generator().manual_seed(3)
    for op in ops:
        J = block_jacobian(an, rec, op.layer)
        D = block_oracle(probe, op.layer)
        D2 = dense_block_jacobian(an, rec, op.layer)
        assert op.shape == J.shape == (32, 32) and int(op.positions[0]) == IDS.shape[1] - 1
        for _ in range(2):
            x = torch.randn(32, generator=g, dtype=torch.float64)
            assert rel(op.matvec(x), J.matvec(x)) < TOL
            assert rel(op.rmatvec(x), J.rmatvec(x)) < TOL
            assert rel(op.matvec(x), D @ x) < TOL
            assert rel(op.rmatvec(x), D.T @ x) < TOL
        X = torch.randn(32, 3, generator=g, dtype=torch.float64)
        assert rel(op.matmat(X), D2 @ X) < TOL
        assert rel(op.rmatmat(X), D2.T @ X) < TOL
        Z = torch.complex(X, torch.randn(32, 3, generator=g, dtype=torch.float64))
        assert rel(op.matmat(Z), D.to(Z.dtype) @ Z) < TOL
    # all layers in one call equals each layer's own operator
    Xall = torch.randn(len(layers), 32, 2, generator=g, dtype=torch.float64)
    Yall = group.matmat_all(Xall)
    Rall = group.rmatmat_all(Xall)
    for i, op in enumerate(ops):
        assert rel(Yall[i], block_oracle(probe, op.layer) @ Xall[i]) < TOL
        assert rel(Rall[i], block_oracle(probe, op.layer).T @ Xall[i]) < TOL


def test_subset_and_order_of_layers():
    probe = recorded("gpt2_3")
    an, rec = probe.anatomy, probe.recording
    ops = stacked_block_jacobians(an, rec, [2, -3])
    assert [o.layer for o in ops] == [2, 0]
    one = stacked_block_jacobians(an, rec, [1])
    x = torch.randn(32, dtype=torch.float64)
    for op in ops + one:
        assert rel(op.matvec(x), block_oracle(probe, op.layer) @ x) < TOL
    with pytest.raises(ValueError):
        stacked_block_jacobians(an, rec, [0, 0])
    with pytest.raises(ValueError):
        stacked_block_jacobians(an, rec, [3])


@pytest.mark.parametrize("family", ["gpt2_3", "llama"])
def test_eigs_on_stacked_ops_equals_per_layer_eigs_in_batched_calls(family):
    probe = recorded(family)
    an, rec = probe.anatomy, probe.recording
    layers = list(range(an.n_layers))
    ops = stacked_block_jacobians(an, rec, layers)
    group = ops[0].batch_group
    group.n_calls = 0
    k = 6
    tol = 1e-9 if family.startswith("gpt2") else 1e-6  # HF RMSNorm rounds in float32
    res = eigs(ops, k, tol=tol, seed=2)
    ref = eigs([block_jacobian(an, rec, l) for l in layers], k, tol=tol, seed=2)
    assert bool(res.converged.all())
    for i, l in enumerate(layers):
        top = eigvals_by_modulus(block_oracle(probe, l))[:k]
        got = res.values[i][torch.isfinite(res.values[i])]  # k, or k + 1 (a split pair)
        want = ref.values[i][torch.isfinite(ref.values[i])]
        # every dense top-k value is found (up to conjugation)
        assert farthest_from(top, got) < 100 * tol * float(top[0].abs())
        a = torch.sort(got.abs()).values
        b = torch.sort(want.abs()).values
        assert float((a - b).abs().max()) < 100 * tol * float(b.max())
    # one batched call served every member at each Krylov step
    # (n_matvecs: the max over members; per-member calls would total ~len(layers) times it)
    assert 0 < group.n_calls <= 1.5 * int(res.n_matvecs)


@pytest.mark.parametrize("family", ["gemma2", "gpt_neo", "bert"])
def test_heterogeneous_or_noncausal_models_fall_back(family, monkeypatch):
    probe = recorded(family)
    an, rec = probe.anatomy, probe.recording
    assert stacked_block_jacobians(an, rec, list(range(an.n_layers))) is None
    if family == "bert":
        return
    assert an.layer_kinds is not None and len(set(an.layer_kinds)) > 1  # an anatomy fact
    # without the layer kinds, the recorded inputs or the forward check must still refuse,
    # or else the stacked operators must be right
    an = an.replace(layer_kinds=None)
    ops = stacked_block_jacobians(an, rec, list(range(an.n_layers)))
    if family == "gemma2":
        assert ops is None  # sliding vs global masks differ at 7 tokens, window 4
    if ops is not None:
        x = torch.randn(32, dtype=torch.float64)
        for op in ops:
            assert rel(op.matvec(x), block_oracle(probe, op.layer) @ x) < TOL


def test_forward_check_refuses_a_per_layer_behaviour_it_cannot_see(monkeypatch):
    """A per-layer attribute of the module (not a parameter) is invisible to the stacked
    function; the forward check against each layer's own function must catch it."""
    probe = recorded("gpt2_3")
    an, rec = probe.anatomy, probe.recording
    monkeypatch.setattr(an.layers[1].block.ln_1, "eps", 0.5)  # an attribute, not a parameter
    assert stacked_block_jacobians(an, rec, [0, 1, 2]) is None
    assert stacked_block_jacobians(an, rec, [2, 0]) is not None


# ------------------------------------------------------------------ the generic linalg hook
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
