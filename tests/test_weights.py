"""layer_matrices (F_t, fold_norm) and layer_biases (c_t) vs the raw-weight oracle of
tests/oracles.py, which reads the HF modules directly (Conv1D, fused qkv, GQA groups, Gemma's
1 + weight), on tiny families with every parameter randomised (norm gains and biases included:
their initial values, ones and zeros, would hide a missing fold or bias)."""

import pytest
import torch

import spectral_hooks as sh
from tests.oracles import attention_norm_gain, layer_matrix_and_bias
from tests.tiny_models import make_model

FAMILIES = ["gpt2", "bert", "albert", "gpt_neo", "gpt_neox", "llama", "qwen2", "gemma2",
            "olmo2"]
TOL = dict(rtol=1e-12, atol=1e-12)


def randomised(family: str, dtype: torch.dtype = torch.float64):
    model = make_model(family, dtype=dtype)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def n_layers(model) -> int:
    return model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") \
        else model.config.n_layer


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, randomised(request.param)


@pytest.mark.parametrize("fold_norm", [False, True])
def test_layer_matrices_match_raw_weights(family_model, fold_norm):
    family, model = family_model
    F = sh.layer_matrices(model, fold_norm=fold_norm)
    assert F.dtype == torch.float64 and F.shape == (n_layers(model), 32, 32)
    for layer in range(n_layers(model)):
        want, _ = layer_matrix_and_bias(model, family, layer, fold_norm=fold_norm)
        torch.testing.assert_close(F[layer], want, **TOL)


def test_fold_norm_changes_only_pre_norm_families(family_model):
    family, model = family_model
    plain, folded = sh.layer_matrices(model), sh.layer_matrices(model, fold_norm=True)
    if attention_norm_gain(model, family, 0) is None:
        assert torch.equal(plain, folded)
    else:  # the randomised gains are far from 1: folding must show
        assert float((plain - folded).abs().max()) > 0.1


def test_layer_biases_match_raw_weights(family_model):
    family, model = family_model
    c = sh.layer_biases(model)
    assert c.dtype == torch.float64 and c.shape == (n_layers(model), 32)
    for layer in range(n_layers(model)):
        _, want = layer_matrix_and_bias(model, family, layer)
        torch.testing.assert_close(c[layer], want, **TOL)
    if family in ("llama", "gemma2", "olmo2"):  # no attention biases at all
        assert not c.any()


def test_float32_weights_are_read_in_float64():
    model = randomised("llama", dtype=torch.float32)
    F, c = sh.layer_matrices(model, fold_norm=True), sh.layer_biases(model)
    assert F.dtype == c.dtype == torch.float64
    for layer in range(2):
        want_F, want_c = layer_matrix_and_bias(model, "llama", layer, fold_norm=True)
        torch.testing.assert_close(F[layer], want_F, **TOL)
        torch.testing.assert_close(c[layer], want_c, **TOL)


def test_albert_shared_layer_gives_one_matrix():
    model = randomised("albert")
    F = sh.layer_matrices(model)
    assert F.shape[0] == 3 and torch.equal(F[0], F[1]) and torch.equal(F[1], F[2])
