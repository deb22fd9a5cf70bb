"""Recordings equal the model's own hidden states, and F equals an independent oracle,
for every supported Hugging Face family (tiny configs built offline, float64)."""

import pytest
import torch

import spectral_hooks as sh
from tests.tiny_models import FAMILIES, make_model

# The modules whose input is the value projection's input and whose output is W_O(.) + b_O.
# Written out here independently of spectral_hooks.anatomy (this is the oracle's knowledge).
RAW_PROJECTIONS = {
    "gpt2": ("attn.c_attn", "attn.c_proj"),
    "bert": ("attention.self.value", "attention.output.dense"),
    "albert": ("attention.value", "attention.dense"),
    "gpt_neo": ("attn.attention.v_proj", "attn.attention.out_proj"),
    "gpt_neox": ("attention.query_key_value", "attention.dense"),
}


def _projection_names(family):
    return RAW_PROJECTIONS.get(family, ("self_attn.v_proj", "self_attn.o_proj"))


def _oracle_F(model, block, family, d_model):
    """Fit y = F x + c from one-token inputs: with a single key, attention is 1 and the
    attention output is exactly W_O (W_V x + b_V) + b_O. The value projection's input is
    replaced by random vectors (norm outputs lie in a hyperplane, which would hide a direction)."""
    v_name, o_name = _projection_names(family)
    v_mod, o_mod = block.get_submodule(v_name), block.get_submodule(o_name)
    xs, ys = [], []

    def random_input(module, args):
        xs.append(torch.randn_like(args[0]))
        return (xs[-1],) + tuple(args[1:])

    h1 = v_mod.register_forward_pre_hook(random_input)
    h2 = o_mod.register_forward_hook(lambda m, a, o: ys.append(o.detach()))
    try:
        with torch.no_grad():
            model(torch.randint(0, 100, (4 * d_model, 1)))
    finally:
        h1.remove(), h2.remove()
    x = xs[0].reshape(-1, d_model)
    y = ys[0].reshape(-1, d_model)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    solution = torch.linalg.lstsq(design, y).solution  # [d+1, d]
    return solution[:-1].T


@pytest.mark.parametrize("family", FAMILIES)
def test_recording_matches_hidden_states(family):
    model = make_model(family)
    ids = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        expected = model(ids, output_hidden_states=True)
        with sh.instrument(model) as probe:
            out = model(ids, output_hidden_states=True)
    assert torch.equal(out.last_hidden_state, expected.last_hidden_state)
    hidden = out.hidden_states
    rec, n = probe.recording, probe.anatomy.n_layers
    assert n == len(hidden) - 1
    for layer in range(n):
        torch.testing.assert_close(rec.resid_pre[layer], hidden[layer], rtol=0, atol=1e-12)
        assert rec.attn_out[layer].shape == hidden[layer].shape
        if layer < n - 1:  # HF applies the final norm to the last hidden state
            torch.testing.assert_close(rec.resid_post[layer], hidden[layer + 1], rtol=0,
                                       atol=1e-12)
    assert not rec.resid_post[0].requires_grad
    assert rec.mask.shape == (2, 6) and bool(rec.mask.all())


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_matrix_matches_oracle(family):
    model = make_model(family)
    anatomy = sh.anatomy_of(model)
    for layer in {0, anatomy.n_layers - 1}:
        part = anatomy.layers[layer]
        F = torch.einsum("hdk,hkm->dm", part.output_weights(), part.value_weights())
        oracle = _oracle_F(model, part.block, family, anatomy.d_model)
        torch.testing.assert_close(F, oracle, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_wrappers_have_the_same_anatomy(family):
    base = make_model(family)
    wrapped = make_model(family, wrapper=True)
    a, b = sh.anatomy_of(base), sh.anatomy_of(wrapped)
    assert (a.family, a.n_layers, a.d_model, a.causal) == (b.family, b.n_layers, b.d_model,
                                                           b.causal)
    ids = torch.randint(0, 100, (1, 5))
    with sh.instrument(wrapped) as probe, torch.no_grad():
        out = wrapped(ids, output_hidden_states=True)
    torch.testing.assert_close(probe.recording.resid_pre[1], out.hidden_states[1])


def test_attn_out_is_the_residual_contribution_pre_norm():
    """Pre-norm (GPT-2): resid_post = resid_pre + attn_out + mlp_out, so the MLP's input
    residual equals resid_pre + attn_out."""
    model = make_model("gpt2")
    mid = []
    block = model.h[0]
    handle = block.ln_2.register_forward_hook(lambda m, a, o: mid.append(a[0].detach()))
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 5)))
    handle.remove()
    rec = probe.recording
    torch.testing.assert_close(rec.resid_pre[0] + rec.attn_out[0], mid[0])


def test_sandwich_attn_out_is_after_post_attention_norm():
    model = make_model("gemma2")
    mid = []
    handle = model.layers[0].pre_feedforward_layernorm.register_forward_hook(
        lambda m, a, o: mid.append(a[0].detach()))
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5)))
    handle.remove()
    rec = probe.recording
    torch.testing.assert_close(rec.resid_pre[0] + rec.attn_out[0], mid[0])


def test_albert_shared_layer_recorded_once_per_application():
    model = make_model("albert")
    anatomy = sh.anatomy_of(model)
    assert anatomy.n_layers == model.config.num_hidden_layers
    assert anatomy.shared_groups == (tuple(range(anatomy.n_layers)),)
    assert len({id(p.block) for p in anatomy.layers}) == 1
    with sh.instrument(model) as probe, torch.no_grad():
        out = model(torch.randint(0, 100, (2, 4)), output_hidden_states=True)
    for layer in range(anatomy.n_layers):
        torch.testing.assert_close(probe.recording.resid_pre[layer], out.hidden_states[layer])
    assert probe.n_handles == 0  # removed on leaving the with-block
