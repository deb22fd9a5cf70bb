"""block_jacobian / jacobian_product / dense_block_jacobian vs independent dense jacfwd oracles."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import make_bridge, make_model  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.linalg import eigs  # noqa: E402
from spectral_hooks.linearize import block_jacobian, dense_block_jacobian, jacobian_product  # noqa: E402
from tests.oracles import (  # noqa: E402
    chained_token_jacobian,
    eigvals_by_modulus,
    full_jacobian,
    matched_distance,
)
from tests.profiles import quick_subset  # noqa: E402

TOL = 1e-6
IDS = torch.tensor([[5, 17, 3, 42, 8, 61, 2]])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


_CACHE: dict = {}


def recorded(family: str):
    if family not in _CACHE:
        model = make_bridge("gpt2") if family == "bridge" else make_model(family)
        with sh.instrument(model) as probe:
            with torch.no_grad():
                model(IDS)
        _CACHE[family] = probe
    return _CACHE[family]


# ------------------------------------------------------------------ independent oracle
_ORACLES: dict = {}


def oracle_full(probe, layer: int, sample: int = 0) -> torch.Tensor:
    """d block(H)[i, :] / d H[j, :] as [L, d, L, d], calling the block module directly."""
    key = (id(probe), layer, sample)
    if key not in _ORACLES:  # the probe is kept with its oracle: its id is never reused
        _ORACLES[key] = (probe, full_jacobian(probe, layer, sample=sample))
    return _ORACLES[key][1]


def oracle(probe, layer, kind, p=None, sample=0, rows=None):
    J = oracle_full(probe, layer, sample)
    L, d = J.shape[:2]
    if kind == "token":
        p = L - 1 if p is None else p
        return J[p, :, p, :]
    rows = torch.arange(L) if rows is None else rows
    return J[rows][:, :, rows].reshape(len(rows) * d, len(rows) * d)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def check_op(op, D, n_vec=2):
    g = torch.Generator().manual_seed(1)
    for _ in range(n_vec):
        x = torch.randn(D.shape[1], generator=g, dtype=torch.float64)
        assert rel(op.matvec(x), D @ x) < TOL
        assert rel(op.rmatvec(x), D.T @ x) < TOL
    X = torch.randn(D.shape[1], 3, generator=g, dtype=torch.float64)
    assert rel(op.matmat(X), D @ X) < TOL
    assert rel(op.rmatmat(X), D.T @ X) < TOL


FAMILIES = ["gpt2", "bert", "albert", "gpt_neo", "llama", "gemma3", "olmo2", "bridge"]


@pytest.mark.parametrize("family", quick_subset(FAMILIES, keep={"gpt2", "bert", "bridge"}))
def test_token_and_sequence_operators_match_jacfwd(family):
    probe = recorded(family)
    layer = probe.anatomy.n_layers - 1
    J_tok = block_jacobian(probe.anatomy, probe.recording, layer)
    assert J_tok.shape == (32, 32) and int(J_tok.positions[0]) == IDS.shape[1] - 1
    check_op(J_tok, oracle(probe, layer, "token"))
    # causal HF blocks recompute only row p (earlier keys/values fixed), verified at build time
    assert J_tok.single_query == (family in ("gpt2", "gpt_neo", "llama", "gemma3", "olmo2"))
    if family in ("gpt2", "bert", "llama"):
        J_mid = block_jacobian(probe.anatomy, probe.recording, layer, position=2)
        check_op(J_mid, oracle(probe, layer, "token", p=2), n_vec=1)
    J_seq = block_jacobian(probe.anatomy, probe.recording, layer, kind="sequence")
    assert J_seq.shape == (32 * IDS.shape[1],) * 2
    check_op(J_seq, oracle(probe, layer, "sequence"), n_vec=1)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_product_matches_composed_blocks(family):
    probe = recorded(family)
    P = jacobian_product(probe.anatomy, probe.recording, 0, 1)
    D = oracle(probe, 1, "token") @ oracle(probe, 0, "token")
    check_op(P, D, n_vec=1)
    # causal: the product is the end-to-end Jacobian of blocks 0..1 at the last token
    assert rel(P.to_dense(), chained_token_jacobian(probe, 0, 1)) < TOL


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_top_eigenvalues_match_dense_eig(family):
    probe = recorded(family)
    J = block_jacobian(probe.anatomy, probe.recording, 1)
    # tol 1e-7: HF's Llama RMSNorm computes in float32 even in a float64 model, so matvecs of
    # Llama-family blocks carry ~1e-8 relative rounding
    res = eigs(J, 6, tol=1e-7)
    assert bool(res.converged)
    dense = eigvals_by_modulus(oracle(probe, 1, "token"))
    k = res.values.shape[-1]
    got = res.values.flatten()[:k]
    # conjugate-invariant: compare the top-k moduli, then match values as sets
    assert torch.allclose(got.abs(), dense.abs()[:k], atol=TOL, rtol=TOL)
    assert matched_distance(got, dense[:k]) < TOL * max(1.0, float(dense.abs()[0]))


def test_union_of_token_spectra_is_causal_sequence_spectrum():
    probe = recorded("gpt2")
    rec, anat = probe.recording, probe.anatomy
    # method="jvp": the property is about the operators, not the engine (no trace per position)
    seq = torch.linalg.eigvals(block_jacobian(anat, rec, 0, kind="sequence",
                                              method="jvp").to_dense())
    parts = [torch.linalg.eigvals(block_jacobian(anat, rec, 0, position=p,
                                                 method="jvp").to_dense())
             for p in range(IDS.shape[1])]
    union = torch.cat(parts)
    assert seq.shape == union.shape
    assert matched_distance(seq, union) < 1e-6
    D = dense_block_jacobian(anat, rec, 0, kind="sequence").reshape(7, 32, 7, 32)
    upper = torch.stack([D[i, :, j].norm() for i in range(7) for j in range(i + 1, 7)])
    assert float(upper.max()) == 0.0  # block lower-triangular


def test_default_sdpa_needs_no_user_action():
    model = make_model("llama")
    assert model.config._attn_implementation == "sdpa"
    probe = recorded("llama")
    J = block_jacobian(probe.anatomy, probe.recording, 0)
    J.matvec(torch.ones(32, dtype=torch.float64))
    assert J.engine.method_used == "linearize"


def test_float32_model_is_not_mutated_and_float64_is_default():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe:
        with torch.no_grad():
            before = model(IDS).last_hidden_state
    J = block_jacobian(probe.anatomy, probe.recording, 1)
    assert J.dtype == torch.float64
    J.matvec(torch.randn(32, dtype=torch.float64))
    J.rmatvec(torch.randn(32, dtype=torch.float64))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        assert torch.equal(model(IDS).last_hidden_state, before)
    J32 = block_jacobian(probe.anatomy, probe.recording, 1, dtype=torch.float32, method="jvp")
    assert J32.matvec(torch.ones(32)).dtype == torch.float32


def test_left_padded_batch_gives_the_unpadded_operator():
    model = make_model("gpt2")
    short = torch.tensor([[7, 3, 9, 4]])
    ids = torch.tensor([[5, 17, 3, 42, 8, 61], [0, 0, 7, 3, 9, 4]])
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(ids, attention_mask=mask, position_ids=pos)
            model(short)
    anat, rec = probe.anatomy, probe.recording
    for kind in ("token", "sequence"):
        a = block_jacobian(anat, rec, 1, sample=1, kind=kind)
        b = block_jacobian(anat, rec, 1, sample=2, kind=kind)
        assert a.shape == b.shape
        assert rel(a.to_dense(), b.to_dense()) < 1e-10
    assert block_jacobian(anat, rec, 1, sample=1).positions == (5,)
    with pytest.raises(ValueError, match="padding"):
        block_jacobian(anat, rec, 1, sample=1, position=0)
    with pytest.raises(ValueError, match="padding"):  # sample 2 is shorter: recording pads it
        block_jacobian(anat, rec, 1, sample=2, position=5)


def test_bad_inputs_raise_clear_errors():
    probe = recorded("gpt2")
    anat, rec = probe.anatomy, probe.recording
    with pytest.raises(ValueError, match="out of range"):
        block_jacobian(anat, rec, 5)
    with pytest.raises(ValueError, match="out of range"):
        block_jacobian(anat, rec, 0, position=99)
    with pytest.raises(ValueError, match="out of range"):
        block_jacobian(anat, rec, 0, position=-99)
    with pytest.raises(ValueError, match="kind"):
        block_jacobian(anat, rec, 0, kind="full")
    with pytest.raises(ValueError, match="first"):
        jacobian_product(anat, rec, 1, 0)
    model = make_model("gpt2")
    with sh.instrument(model, layers=[1]) as partial:
        with torch.no_grad():
            model(IDS)
    with pytest.raises(ValueError, match="not recorded"):
        block_jacobian(partial.anatomy, partial.recording, 0)
    with pytest.raises(ValueError, match="not recorded"):
        jacobian_product(partial.anatomy, partial.recording, 0, 1)
    # NaN in the recorded input
    with sh.instrument(model) as bad:
        with torch.no_grad():
            model(IDS)
    bad.recording.block_input(1).hidden[0, -1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"^NaN or Inf in the recording at layer 1, sample 0, "
                       r"token \d+ \(capture point: block input"):
        block_jacobian(bad.anatomy, bad.recording, 1)
    block_jacobian(bad.anatomy, bad.recording, 1, position=0)  # other positions are fine


def test_dense_refuses_large_unless_forced():
    model = make_model("gpt2")
    ids = torch.arange(1, 41)[None] % 100  # 40 tokens x 32 = 1280 (fine); fake the limit
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(ids)
    import spectral_hooks.linearize as lin
    old, lin.DENSE_JACOBIAN_MAX = lin.DENSE_JACOBIAN_MAX, 1000
    try:
        with pytest.raises(ValueError, match="force=True"):
            dense_block_jacobian(probe.anatomy, probe.recording, 0, kind="sequence")
    finally:
        lin.DENSE_JACOBIAN_MAX = old


def test_decode_step_only_recording_is_refused():
    model = make_model("gpt2")
    with torch.no_grad():
        out = model(IDS, use_cache=True)
        with sh.instrument(model) as probe:
            model(torch.tensor([[11]]), past_key_values=out.past_key_values)
    with pytest.raises(ValueError, match="prefill"):
        block_jacobian(probe.anatomy, probe.recording, 0)


class _NoForwardAD(torch.autograd.Function):
    """A kernel with a backward but no forward-mode derivative (old-style: no setup_context,
    so torch.func transforms refuse it and even VJPs must go through torch.autograd)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - torch.tanh(x) ** 2)


def test_finite_difference_fallback(caplog):
    probe = recorded("gpt2")
    anat, rec = probe.anatomy, probe.recording
    D = oracle(probe, 1, "token")
    J = block_jacobian(anat, rec, 1, method="finite_difference")
    x = torch.randn(32, dtype=torch.float64)
    assert rel(J.matvec(x), D @ x) < 1e-7
    # a kernel without forward AD: "auto" warns and falls back
    model = make_model("gpt2")
    act = model.h[0].mlp.act
    model.h[0].mlp.act = type("Act", (torch.nn.Module,), {
        "forward": lambda self, x: _NoForwardAD.apply(x)})()
    try:
        with sh.instrument(model) as p2:
            with torch.no_grad():
                model(IDS)
        J2 = block_jacobian(p2.anatomy, p2.recording, 0)
        with caplog.at_level(logging.WARNING, logger="spectral_hooks.linearize"):
            y = J2.matvec(x)
        assert J2.engine.method_used == "finite_difference"
        assert any("finite-difference" in r.message for r in caplog.records)
        Dr = dense_block_jacobian(p2.anatomy, p2.recording, 0)  # jacfwd fails -> jacrev
        assert rel(y, Dr @ x) < 1e-7
        assert rel(J2.rmatvec(x), Dr.T @ x) < TOL
    finally:
        model.h[0].mlp.act = act


SPLIT = ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "gemma2", "gemma3", "olmo2"]
CONCAT = ["gpt_neo"]


@pytest.mark.parametrize("family", SPLIT + CONCAT)
def test_split_single_query_batched_jvps_match_jacfwd(family):
    # split mode: the query row is scored against the fixed keys and its own key separately
    # (GQA for llama/mistral/qwen2), many columns per batched JVP through one shared traced
    # graph. Concat mode (the block's own attention, no batching): gpt_neo, whose attention is
    # not pluggable. gemma2's eager softmax (dtype=float32) and every RMSNorm's float32 upcast
    # stay float64 in a float64 replay, so gemma2 passes the split check and every family
    # is exact to rounding
    probe = recorded(family)
    model_cfg = probe.anatomy.model.config
    impl = model_cfg._attn_implementation
    ops = [block_jacobian(probe.anatomy, probe.recording, layer)
           for layer in range(probe.anatomy.n_layers)]
    for layer, J in enumerate(ops):
        want = "concat" if family in CONCAT else "split"
        assert J.single_query_mode == want
        assert J.block_size == (None if family in CONCAT else 32)
        D = oracle(probe, layer, "token")
        g = torch.Generator().manual_seed(layer)
        X = torch.randn(32, 45, generator=g, dtype=torch.float64)  # a full and a padded chunk
        # norms and softmax stay float64 in the replay (HF's own upcast them to float32); the
        # oracle runs GPT-Neo's own float32 query/key upcast, so it is the inexact side there
        exact = family != "gpt_neo"
        tol = 1e-12 if exact else TOL
        assert rel(J.matmat(X), D @ X) < tol
        assert rel(J.matvec(X[:, 0]), D @ X[:, 0]) < tol
        # adjoint: split blocks run the transposed traced graph (1, 32 and 64 columns)
        assert rel(J.rmatmat(X), D.T @ X) < tol
        assert rel(J.rmatvec(X[:, 1]), D.T @ X[:, 1]) < tol
        assert rel(J.rmatmat(X[:, 2:7]), D.T @ X[:, 2:7]) < tol
        if family not in CONCAT:
            assert all(J.engine._vblocks[w] is not None for w in (1, 32, 64))
    assert model_cfg._attn_implementation == impl  # the user's config is untouched
    res = eigs(ops[-1], 5, tol=1e-10 if exact else TOL, block_size=4)
    assert bool(res.converged)
    dense = eigvals_by_modulus(oracle(probe, len(ops) - 1, "token"))
    k = res.values.shape[-1]
    # eigenvalues: residual tol x conditioning (float32-RMSNorm families are looser)
    assert matched_distance(res.values.flatten()[:k], dense[:k]) < (
        1e-6 if exact else 1e-4) * float(dense.abs()[0])


def test_shared_jvp_graph_is_reused_and_rechecked_per_layer(caplog):
    # one traced JVP graph serves every block of one structure; a Python-level difference it
    # baked in (GPT-2's per-layer 1/(layer+1) attention scale) is caught by the per-layer check
    # and that layer gets its own trace -- both give the jacfwd Jacobian
    import transformers as tf

    from spectral_hooks.linearize import shared
    torch.manual_seed(0)
    outcomes = {}
    for scaled in (False, True):
        cfg = tf.GPT2Config(vocab_size=100, n_embd=64, n_layer=3, n_head=4, n_positions=64,
                            bos_token_id=0, eos_token_id=0,
                            scale_attn_by_inverse_layer_idx=scaled)
        model = tf.GPT2Model(cfg).double().eval()
        with sh.instrument(model) as probe:
            with torch.no_grad():
                model(IDS)
        shared._TRACES.clear()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="spectral_hooks.linearize"):
            for layer in range(3):
                J = block_jacobian(probe.anatomy, probe.recording, layer)
                assert J.single_query_mode == "split"
                X = torch.randn(64, 33, dtype=torch.float64)
                assert rel(J.matmat(X), oracle(probe, layer, "token") @ X) < 1e-12
        outcomes[scaled] = (len(shared._TRACES), caplog.text.count("tracing it on its own"))
    assert outcomes[False] == (1, 0)  # one trace for three layers
    assert outcomes[True] == (1, 2)   # layers 1 and 2 disagree: traced on their own, not cached


def test_eigs_on_an_overflowing_block_jacobian_names_layer_and_token_without_per_product_syncs():
    """Inside eigs the operator skips its own NaN / Inf test (a host sync per application); the
    solver's device-side test raises the operator's error: NonFiniteComputationError naming
    the layer, sample and token, as the operator's own test does for a direct call."""
    from spectral_hooks.errors import NonFiniteComputationError

    model = make_model("gpt2", dtype=torch.float64)
    ids = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    probe = sh.instrument(model, layers=[1], capture=("resid_pre",))
    with torch.no_grad():
        model(ids)
    probe.remove()
    with torch.no_grad():
        model.h[1].mlp.c_fc.weight.mul_(1e200)
        model.h[1].mlp.c_proj.weight.mul_(1e200)
    J = probe.jacobian(1)
    for block_size in (1, 4):
        with pytest.raises(NonFiniteComputationError,
                           match="JVP of block 1 at sample 0, token 4 holds NaN or Inf"):
            eigs(J, 2, block_size=block_size)
    with pytest.raises(NonFiniteComputationError, match="JVP of block 1 at sample 0, token 4"):
        J.matvec(torch.ones(J.shape[1], dtype=torch.float64))  # direct: its own test


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_wide_matmat_is_one_pass_of_one_graph_that_reads_no_zero_terms(family):
    # issue 24: 64 columns run as ONE pass of a graph traced at width 64 (not two of 32), and
    # the traced JVP no longer carries the weights' zero tangents (mm(x, 0) added to every
    # projection's tangent): no residual the tangent graph reads is an all-zero tensor. Both
    # equal the jacfwd oracle.
    from spectral_hooks.linearize import shared
    probe = recorded(family)
    shared._TRACES.clear()
    J = block_jacobian(probe.anatomy, probe.recording, 0)
    X = torch.randn(J.shape[0], 64, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    assert rel(J.matmat(X), oracle(probe, 0, "token") @ X) < 1e-12
    engine = J.engine
    assert sorted(engine._blocks) == [64]  # pyright: ignore[reportAttributeAccessIssue]
    residuals = engine._blocks[64].residuals  # pyright: ignore[reportAttributeAccessIssue]
    zero = [tuple(r.shape) for r in residuals
            if isinstance(r, torch.Tensor) and not r.is_meta and r.numel() > 1
            and not bool(r.any())]
    assert zero == []


def test_drop_zero_terms_keeps_broadcasting_adds_and_alpha():
    from torch.fx.experimental.proxy_tensor import make_fx

    from spectral_hooks.linearize.zero_terms import drop_zero_terms

    def f(x, w, b):
        z = x @ torch.zeros_like(w)                 # zero [2, 3]
        kept = b + z                                # broadcasts b [3] -> [2, 3]: kept
        scaled = torch.add(x @ w, z, alpha=2.0)     # alpha: kept
        dropped = x @ w + z                         # dropped
        return kept, scaled, dropped

    args = (torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64),
            torch.randn(3, dtype=torch.float64))
    gm = make_fx(f)(*args)
    want = gm(*args)
    assert drop_zero_terms(gm.graph) == 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    for got, ref in zip(gm(*args), want):
        assert torch.equal(got, ref)


def test_transposed_graph_differentiates_elementwise_backward_ops():
    # forward-AD tangents use ops such as silu_backward(t, x), linear in t but with no
    # derivative for t: the transpose rewrites them as t * op(1, x); J^T = the VJP oracle
    from torch.fx.experimental.proxy_tensor import make_fx

    from spectral_hooks.linearize.shared import _ELEMENTWISE_BACKWARD, _differentiable_in_tangent

    def tangent(x, t):  # the tangent of y = silu(x) @ W, written as forward AD writes it
        return torch.ops.aten.silu_backward.default(t, x) @ W

    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 5, generator=g, dtype=torch.float64)
    x, u = (torch.randn(3, n, generator=g, dtype=torch.float64) for n in (6, 5))
    gm = make_fx(tangent)(x, torch.zeros_like(x))
    assert any(n.target in _ELEMENTWISE_BACKWARD for n in gm.graph.nodes)
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.func.vjp(lambda t: gm(x, t), torch.zeros_like(x))[1](u)
    rewritten = _differentiable_in_tangent(gm)
    assert all(n.args[0].target == torch.ops.aten.ones_like.default  # factor op(1, x) only
               for n in rewritten.graph.nodes if n.target in _ELEMENTWISE_BACKWARD)
    t = torch.randn(3, 6, generator=g, dtype=torch.float64)
    assert torch.allclose(rewritten(x, t), gm(x, t), rtol=1e-14, atol=1e-15)  # rounding
    got = torch.func.vjp(lambda t: rewritten(x, t), torch.zeros_like(x))[1](u)[0]
    want = torch.func.vjp(torch.nn.functional.silu, x)[1](u @ W.T)[0]
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-15)


def test_one_snapshot_mode_traces_the_same_graph_with_one_fake_mode(monkeypatch):
    # make_fx in "real" mode snapshots every value through a FakeTensorMode; without an ambient
    # one it builds (and captures a stack trace for) a new mode per value. One ambient mode:
    # the same graph, bit-identical results, one mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from spectral_hooks.linearize.function import one_snapshot_mode

    def f(x, w):
        return torch.nn.functional.gelu(torch.layer_norm(x, (4,)) @ w).softmax(-1)

    args = (torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64))
    made = []
    init = FakeTensorMode.__init__
    monkeypatch.setattr(FakeTensorMode, "__init__",
                        lambda self, *a, **k: (made.append(1), init(self, *a, **k))[1])
    plain = make_fx(f)(*args)
    n_plain = len(made)
    made.clear()
    with one_snapshot_mode():
        one = make_fx(f)(*args)
    assert one.code == plain.code
    assert torch.equal(one(*args), plain(*args))
    assert len(made) == 1 < n_plain


def test_cache_fill_stops_after_the_keys_and_values(monkeypatch):
    # the fill only needs the earlier rows' keys/values: the block's MLP never runs for them
    from spectral_hooks.linearize.single_query import SingleQueryFunction

    probe = recorded("gpt2")
    J = block_jacobian(probe.anatomy, probe.recording, 1)
    full = J.engine.fn.full_fn  # pyright: ignore[reportAttributeAccessIssue]
    calls = []
    mlp = probe.anatomy.layers[1].block.mlp
    handle = mlp.register_forward_hook(lambda *_: calls.append(1))
    try:
        sq = SingleQueryFunction(full, split=True)
    finally:
        handle.remove()
    assert calls == []
    assert sq.cache.keys is not None and sq.cache.keys.shape[-2] == IDS.shape[1] - 1
    x = torch.randn(32, dtype=torch.float64)
    assert rel(J.matvec(x), oracle(probe, 1, "token") @ x) < 1e-12
