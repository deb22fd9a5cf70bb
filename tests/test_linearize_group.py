"""Layer groups (linearize.group): several blocks' Jacobians as ONE batched operator, and the
jacobian section computed group by group; every value against torch.func.jacfwd of the block
module itself (tests/oracles.py) and against the per-layer path."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import make_model  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.linalg import eigs, svds  # noqa: E402
from spectral_hooks.linearize import block_jacobian  # noqa: E402
from spectral_hooks.linearize import group as group_module  # noqa: E402
from spectral_hooks.linearize.group import (  # noqa: E402
    BlockGroup,
    block_jacobian_group,
    group_capacity,
    layer_bytes,
)
from tests.oracles import eigvals_by_modulus, token_jacobian  # noqa: E402

IDS = torch.tensor([[5, 17, 3, 42, 8, 61, 2]])
pytestmark = pytest.mark.usefixtures("one_torch_thread")
_CACHE: dict = {}


def recorded(family: str, layers: int = 3):
    key = (family, layers)
    if key not in _CACHE:
        import transformers as tf
        torch.manual_seed(0)
        if family == "gpt2":
            model = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=layers,
                                               n_head=4, n_positions=64))
        elif family == "llama":  # GQA 4 / 2
            model = tf.LlamaModel(tf.LlamaConfig(
                vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
        else:
            model = make_model(family)
        model = model.to(torch.float64).eval()
        with sh.instrument(model) as probe:
            with torch.no_grad():
                model(IDS)
        _CACHE[key] = probe
    return _CACHE[key]


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_group_products_equal_jacfwd_of_each_block(family):
    probe = recorded(family)
    ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1, 2])
    assert ops is not None and [J.layer for J in ops] == [0, 1, 2]
    group = ops[0].batch_group
    assert isinstance(group, BlockGroup) and group.size == 3
    d = ops[0].shape[0]
    oracle = torch.stack([token_jacobian(probe, layer) for layer in range(3)])
    eye = torch.eye(d, dtype=torch.float64).expand(3, d, d)
    assert rel(group.matmat_all(eye), oracle) < 1e-10            # 32 columns: width 32
    assert rel(group.rmatmat_all(eye), oracle.mT) < 1e-10
    e0 = eye[:, :, :1]
    assert rel(group.matmat_all(e0), oracle[:, :, :1]) < 1e-10    # one column: width 1
    for i, J in enumerate(ops):                                    # a member alone
        assert rel(J.matmat(eye[0, :, :5]), oracle[i, :, :5]) < 1e-10
        assert rel(J.rmatvec(eye[0, :, 3]), oracle[i, 3]) < 1e-10
        delta = J - sh.linalg.IdentityOperator(d)
        assert delta.batch_group is group.shifted(1.0)             # J - I batches too
        assert rel(delta.matmat(eye[0]), oracle[i] - eye[0]) < 1e-10
    assert not group.solo


def test_group_solves_equal_the_dense_oracle():
    probe = recorded("llama")
    ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1, 2])
    assert ops is not None
    res = eigs(ops, 6, tol=1e-10)
    sv = svds(ops, 6, tol=1e-10)
    for i in range(3):
        J = token_jacobian(probe, i)
        want = eigvals_by_modulus(J)
        got = res.values[i][~torch.isnan(res.values[i].real)]
        assert torch.allclose(got.abs()[:6], want.abs()[:6], rtol=1e-8)
        assert torch.allclose(sv.S[i], torch.linalg.svdvals(J)[:6], rtol=1e-8)
    assert bool(res.converged.all()) and bool(sv.converged.all())


def test_a_subset_of_layers_in_any_order_and_complex_vectors():
    probe = recorded("gpt2")
    an, rec = probe.anatomy, probe.recording
    ops = block_jacobian_group(an, rec, [2, -3])
    assert ops is not None and [J.layer for J in ops] == [2, 0]
    g = torch.Generator().manual_seed(3)
    X = torch.randn(32, 3, generator=g, dtype=torch.float64)
    Z = torch.complex(X, torch.randn(32, 3, generator=g, dtype=torch.float64))
    for J in ops:
        D = token_jacobian(probe, J.layer)
        assert rel(J.matmat(Z), D.to(Z.dtype) @ Z) < 1e-10
        assert rel(J.rmatmat(Z), D.T.to(Z.dtype) @ Z) < 1e-10
    with pytest.raises(ValueError):  # the library's LayerIndexError
        block_jacobian_group(an, rec, [0, 3])


def test_solves_apply_the_whole_group_in_one_call_per_step():
    probe = recorded("llama")
    ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1, 2])
    assert ops is not None
    group = ops[0].batch_group
    group.n_calls = 0
    res = eigs(ops, 6, tol=1e-10)
    # n_matvecs: the most any member took; per-member calls would total ~3 times it
    assert 0 < group.n_calls <= 1.5 * int(res.n_matvecs)


@pytest.mark.parametrize("family", ["gemma2", "gpt_neo"])
def test_layers_of_different_attention_types_do_not_group(family):
    """Sliding/global (Gemma 2) and local/global (GPT-Neo) layers trace different graphs."""
    probe = recorded(family)
    an, rec = probe.anatomy, probe.recording
    assert an.layer_kinds is not None and len(set(an.layer_kinds)) > 1  # an anatomy fact
    assert block_jacobian_group(an, rec, list(range(an.n_layers))) is None


def test_a_per_layer_attribute_the_parameters_do_not_show_is_not_grouped_away(monkeypatch):
    """A per-layer attribute of a module (not a parameter) changes the block's function: the
    layers do not group, or each member still equals its own block's Jacobian."""
    probe = recorded("gpt2")
    an, rec = probe.anatomy, probe.recording
    monkeypatch.setattr(an.layers[1].block.ln_1, "eps", 0.5)
    ops = block_jacobian_group(an, rec, [0, 1, 2])
    eye = torch.eye(32, dtype=torch.float64)
    for J in ops or []:
        assert rel(J.matmat(eye), token_jacobian(probe, J.layer)) < 1e-10
    assert block_jacobian_group(an, rec, [2, 0]) is not None


def test_bidirectional_and_mixed_models_do_not_group():
    bert = recorded("bert")
    assert block_jacobian_group(bert.anatomy, bert.recording, [0, 1]) is None
    llama = recorded("llama")
    assert block_jacobian_group(llama.anatomy, llama.recording, [1]) is None  # one layer


def test_capacity_follows_the_memory_formula(monkeypatch):
    probe = recorded("llama", layers=5)
    J = block_jacobian(probe.anatomy, probe.recording, 0)
    per = layer_bytes(J)
    params = sum(p.numel() for p in probe.anatomy.layers[0].block.parameters())
    assert per > params * 8                      # the float64 weights and the activations
    assert group_capacity(J, 5) == 5             # a tiny model: every layer in one group
    monkeypatch.setattr(group_module, "GROUP_MEMORY_CAP", 2.5 * (per + 6 * 16 * 32 * 48))
    assert group_capacity(J, 5) == 2


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("dense", [False, True])
def test_section_grouped_equals_per_layer_and_jacfwd(family, dense, monkeypatch):
    probe = recorded(family, layers=3) if family != "bert" else recorded("bert")
    if family == "llama":  # two groups of at most two layers
        monkeypatch.setattr(group_module, "GROUP_MEMORY_CAP", 2.5 * (layer_bytes(
            block_jacobian(probe.anatomy, probe.recording, 0)) + 6 * 4 * 32 * 48))
    k = 4
    opts = {"k": k, "dense": dense, "tol": 1e-10}
    grouped = probe.analyze(power=False, progress=False, jacobian=opts).jacobian
    alone = probe.analyze(power=False, progress=False,
                          jacobian={**opts, "group_layers": False}).jacobian
    assert len(grouped) == len(probe.recording.layers)
    exact = ["top_eig_abs", f"frac_complex_top{k}", f"mean_abs_angle_top{k}",
             f"self_alignment_top{k}"]
    for col in exact + ["sym_energy", "commutator"]:
        assert grouped[col].to_list() == pytest.approx(alone[col].to_list(), rel=1e-7, abs=1e-9)
    for layer in probe.recording.layers:
        J = token_jacobian(probe, layer)
        row = grouped[grouped.layer == layer].iloc[0]
        assert row.top_eig_abs == pytest.approx(float(eigvals_by_modulus(J)[0].abs()), rel=1e-8)
        if dense:  # exact: sym_energy of Delta J from the oracle
            D = J - torch.eye(J.shape[0], dtype=J.dtype)
            sym = float(((D + D.T) / 2).norm() ** 2 / D.norm() ** 2)
            assert row.sym_energy == pytest.approx(sym, rel=1e-8)
    assert bool(grouped.converged.all())


def test_section_groups_by_the_cost_rule_unless_told(monkeypatch):
    # group_layers=None (the default): layer groups where an application costs dispatch (the
    # CPU below cost.CPU_FLOP_BOUND_N), one layer at a time (and single-vector svds) where it
    # costs FLOPs; True / False force either. The values are the same to solver tolerance.
    from spectral_hooks.analysis.jacobian import JacobianView
    from spectral_hooks.analysis.options import JacobianOptions
    from spectral_hooks.linalg import cost

    probe = recorded("llama", layers=3)

    def together(**opts):
        return JacobianView(probe.subject, JacobianOptions(dense=False, k=4, **opts)
                            ).layers_together()

    assert probe.anatomy.d_model < cost.CPU_FLOP_BOUND_N
    assert together() and together(group_layers=True) and not together(group_layers=False)
    k, opts = 4, {"k": 4, "dense": False, "tol": 1e-10}
    grouped = probe.analyze(power=False, progress=False, jacobian=opts).jacobian
    monkeypatch.setattr(cost, "CPU_FLOP_BOUND_N", probe.anatomy.d_model)  # now FLOP-bound
    assert not together() and together(group_layers=True)
    probe.invalidate()
    alone = probe.analyze(power=False, progress=False, jacobian=opts).jacobian
    # single-vector svds takes no more columns than the block method (at d = 32 and k = 4 both
    # take svd.py's whole space, exact in one pass, so the same number)
    assert alone.n_matvecs.sum() <= grouped.n_matvecs.sum()
    for col in ["top_eig_abs", f"frac_complex_top{k}", f"mean_abs_angle_top{k}",
                f"self_alignment_top{k}", "sym_energy", "commutator"]:
        assert alone[col].to_list() == pytest.approx(grouped[col].to_list(), rel=1e-7, abs=1e-9)
    view = JacobianView(probe.subject, JacobianOptions(dense=False, k=k, tol=1e-10))
    position = view.positions()[0]
    for layer in probe.recording.layers:
        J = token_jacobian(probe, layer)
        row = alone[alone.layer == layer].iloc[0]
        assert row.top_eig_abs == pytest.approx(float(eigvals_by_modulus(J)[0].abs()), rel=1e-8)
        m = view.metrics(layer, position)  # memoised by the run above: its single-vector svds
        eye = torch.eye(J.shape[0], dtype=J.dtype)
        assert m.singular_values is None  # the section runs no svds(J): no column reads it
        assert m.delta_singular_values == pytest.approx(torch.linalg.svdvals(J - eye)[:k],
                                                        rel=1e-8)
    assert bool(alone.converged.all())


def test_models_whose_blocks_differ_only_in_their_activation_share_no_graph():
    """Two models' blocks of one class and shape that compute differently (SiLU vs GELU) are
    grouped back to back, then the first again: each runs its own traced graph (no fallback
    from a graph traced for the other; the grouped graph always maps its own trace) and every
    member equals the dense jacfwd oracle of its block."""
    import warnings

    from transformers import LlamaConfig, LlamaModel

    from spectral_hooks.errors import FallbackWarning

    for act in ("silu", "gelu", "silu"):
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                          hidden_act=act)
        model = LlamaModel(cfg).eval()
        with sh.instrument(model) as probe, torch.no_grad():
            model(IDS)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1, 2])
            assert ops is not None
            eye = torch.eye(32, dtype=torch.float64)
            for layer, op in enumerate(ops):
                oracle = token_jacobian(probe, layer)
                torch.testing.assert_close(op.matmat(eye), oracle, rtol=0, atol=1e-12)
