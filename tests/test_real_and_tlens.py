"""The real pretrained MiniLM-L6 and a TransformerLens 4 TransformerBridge."""

import pytest
import torch

import spectral_hooks as sh
from tests.tiny_models import make_bridge, make_model


def test_minilm_recordings_match_hidden_states(minilm):
    model, tokenizer = minilm
    batch = tokenizer(["The cat sat on the mat.", "Spectra of transformer layers.",
                       "A third, somewhat longer sentence about power iterations."],
                      padding=True, return_tensors="pt")
    with sh.instrument(model) as probe, torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    rec, anatomy = probe.recording, probe.anatomy
    assert (anatomy.family, anatomy.n_layers, anatomy.d_model) == ("bert", 6, 384)
    assert torch.equal(rec.mask, batch["attention_mask"])
    for layer in range(6):
        assert torch.equal(rec.resid_pre[layer], out.hidden_states[layer])
        assert torch.equal(rec.resid_post[layer], out.hidden_states[layer + 1])


@pytest.fixture(scope="module")
def bridge():
    pytest.importorskip("transformer_lens.model_bridge")
    return make_bridge("gpt2")


def test_bridge_recording_matches_tl_cache(bridge):
    ids = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
        with sh.instrument(bridge) as probe:
            bridge(ids)
    rec = probe.recording
    assert probe.anatomy.family.startswith("tlens_bridge/") and probe.anatomy.n_layers == 2
    for layer in range(2):
        for name in ("resid_pre", "resid_post", "attn_out"):
            key = f"blocks.{layer}.hook_{name}"
            torch.testing.assert_close(rec[key], cache[key], rtol=0, atol=1e-12)


def test_bridge_layer_matrix_equals_hf_weights(bridge):
    hf = make_model("gpt2", wrapper=True)  # same seed -> same weights as inside the bridge
    d = 32
    for layer in range(2):
        w_v = hf.transformer.h[layer].attn.c_attn.weight.detach()[:, 2 * d:]  # (in, out) rows
        w_o = hf.transformer.h[layer].attn.c_proj.weight.detach()
        expected = (w_v @ w_o).T  # column convention
        part = sh.anatomy_of(bridge).layers[layer]
        F = torch.einsum("hdk,hkm->dm", part.output_weights(), part.value_weights())
        torch.testing.assert_close(F, expected, rtol=1e-10, atol=1e-12)
