"""Sublayer Jacobians (linearize/sublayers.py) against dense ``torch.func.jacfwd`` oracles of
the sublayer functions written by hand from the HF modules (GPT-2 pre-norm, BERT post-norm,
Llama's FFN), the exact factorisation J_block = J_ffn J_attn at one token, and the refusals."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import spectral_hooks as sh
from spectral_hooks.errors import UnsupportedModelError
from spectral_hooks.linearize import dense_block_jacobian
from spectral_hooks.linearize.function import math_sdpa
from spectral_hooks.linearize.sublayers import sublayer_function, sublayer_jacobian
from tests.tiny_models import _config, make_model

IDS = torch.tensor([[3, 17, 42, 8, 55, 21]])


def recorded(model):
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=IDS)
    return probe


def dense(op) -> torch.Tensor:
    return op.matmat(torch.eye(op.shape[1], dtype=torch.float64))


def hand_oracles(model, family, probe, layer, p):
    """(f_attn, f_ffn) of row p written from the modules, and (x_p, resid_mid_p)."""
    H = probe.recording.block_input(layer).hidden[0].double()
    if family == "gpt2":
        block = model.h[layer]

        def attn(x):
            Hx = H.clone()
            Hx[p] = x
            return x + block.attn(block.ln_1(Hx)[None])[0][0, p]

        def ffn(h):
            return h + block.mlp(block.ln_2(h))
    else:  # bert
        block = model.encoder.layer[layer]

        def attn(x):
            Hx = H.clone()
            Hx[p] = x
            return block.attention(Hx[None])[0][0, p]

        def ffn(h):
            return block.output(block.intermediate(h[None]), h[None])[0]
    x = H[p]
    return attn, ffn, x, attn(x)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
@pytest.mark.parametrize("layer", [0, 1])
def test_sublayers_match_hand_written_jacfwd(family, layer):
    model = make_model(family)
    probe = recorded(model)
    p = 5
    attn, ffn, x, mid = hand_oracles(model, family, probe, layer, p)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # forward AD: the math kernel
        J_attn_ref = torch.func.jacfwd(attn)(x)
        J_ffn_ref = torch.func.jacfwd(ffn)(mid)
    J_attn = dense(sublayer_jacobian(probe.anatomy, probe.recording, layer, sublayer="attention"))
    J_ffn = dense(sublayer_jacobian(probe.anatomy, probe.recording, layer, sublayer="ffn"))
    torch.testing.assert_close(J_attn, J_attn_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(J_ffn, J_ffn_ref, rtol=1e-10, atol=1e-12)
    f = sublayer_function(probe.anatomy, probe.recording, layer, sublayer="ffn")
    torch.testing.assert_close(f.x0[0], mid.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["gpt2", "bert", "llama", "qwen2", "albert"])
def test_block_jacobian_factors_through_resid_mid(family):
    model = make_model(family)
    probe = recorded(model)
    for layer in range(probe.anatomy.n_layers):
        J = dense_block_jacobian(probe.anatomy, probe.recording, layer)
        J_attn = dense(sublayer_jacobian(probe.anatomy, probe.recording, layer,
                                         sublayer="attention"))
        J_ffn = dense(sublayer_jacobian(probe.anatomy, probe.recording, layer, sublayer="ffn"))
        torch.testing.assert_close(J_ffn @ J_attn, J, rtol=1e-10, atol=1e-12)


def test_llama_ffn_matches_a_hand_written_jacfwd():
    model = make_model("llama")
    probe = recorded(model)
    f = sublayer_function(probe.anatomy, probe.recording, 1, sublayer="ffn")
    block = model.layers[1]
    with torch.no_grad(), math_sdpa():  # RMSNorm in float64, as in every replay
        ref = torch.func.jacfwd(lambda h: h + block.mlp(block.post_attention_layernorm(h)))(
            f.x0[0])
    J = dense(sublayer_jacobian(probe.anatomy, probe.recording, 1, sublayer="ffn"))
    torch.testing.assert_close(J, ref, rtol=1e-10, atol=1e-12)


def test_sequential_gpt_neox_is_split_and_parallel_is_refused():
    config, base_cls, _ = _config("gpt_neox")
    config.use_parallel_residual = False
    torch.manual_seed(0)
    probe = recorded(base_cls(config).double().eval())
    J = dense_block_jacobian(probe.anatomy, probe.recording, 0)
    parts = [dense(sublayer_jacobian(probe.anatomy, probe.recording, 0, sublayer=s))
             for s in ("attention", "ffn")]
    torch.testing.assert_close(parts[1] @ parts[0], J, rtol=1e-10, atol=1e-12)
    parallel = recorded(make_model("gpt_neox"))
    with pytest.raises(UnsupportedModelError, match="parallel"):
        sublayer_jacobian(parallel.anatomy, parallel.recording, 0, sublayer="ffn")
    undeclared = recorded(make_model("gpt_neo"))
    with pytest.raises(UnsupportedModelError, match="sequential families"):
        sublayer_jacobian(undeclared.anatomy, undeclared.recording, 0, sublayer="ffn")
