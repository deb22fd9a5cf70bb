"""``analyze(idealised={"attention": "recorded"})`` against a dense float64 oracle: the
paper's column-form iteration X <- N(X + sum_h W_O^h W_V^h X A_h^T) written out by hand with
the raw per-head weights (tests/oracles.py) and the attention probabilities the model itself
returns with ``output_attentions=True`` (not the recording), sequence by sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError, RecordingError
from tests.oracles import _attention_of, layer_matrix_and_bias
from tests.tiny_models import _config

CAPTURE = ("resid_pre", "resid_post", "attn_pattern")


def eager_model(family: str, seed: int = 0) -> torch.nn.Module:
    config, base_cls, _ = _config(family)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return base_cls(config).double().eval()


def oracle_prediction(model, family, X0, attentions, rows) -> list[np.ndarray]:
    """Per layer, the predicted tokens [sum n_s, d] (rows), by a plain loop over heads."""
    L = len(attentions)
    Xs = []
    for b, real in rows:
        X = X0[b][real].T.copy()  # d x n: tokens as columns, as in the paper
        Xs.append(X / np.linalg.norm(X, axis=0, keepdims=True))
    out = []
    for t in range(L):
        W_V, _, W_O, _, H, H_kv = _attention_of(model, family, t)
        W_V, W_O = W_V.detach().double().numpy(), W_O.detach().double().numpy()
        dh = W_O.shape[1] // H
        nxt = []
        for (b, real), X in zip(rows, Xs):
            A = attentions[t][b].detach().double().numpy()[:, real][:, :, real]
            update = np.zeros_like(X)
            for h in range(H):
                g = h // (H // H_kv)
                F_h = W_O[:, h * dh:(h + 1) * dh] @ W_V[g * dh:(g + 1) * dh]
                update += F_h @ X @ A[h].T
            Y = X + update
            nxt.append(Y / np.linalg.norm(Y, axis=0, keepdims=True))
        Xs = nxt
        out.append(np.concatenate([X.T for X in Xs]))
    return out


def principal_basis(F: np.ndarray) -> np.ndarray:
    """B of I + F's leading mode (the idealised table's default ordering)."""
    vals, vecs = np.linalg.eig(F)
    v = vecs[:, int(np.argmax(np.abs(1 + vals)))]
    if abs(v.imag).max() > 1e-9:
        return np.linalg.qr(np.stack([v.real, v.imag], 1))[0]
    return (v.real / np.linalg.norm(v.real))[:, None]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_recorded_attention_matches_a_dense_loop(family):
    model = eager_model(family)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    with sh.instrument(model, capture=CAPTURE) as probe, torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    # the capture changes nothing and equals what the model returns
    assert torch.equal(out.last_hidden_state, reference.last_hidden_state)
    for t in range(2):
        assert torch.equal(probe.recording.attn_pattern[t], reference.attentions[t])
    report = probe.analyze(idealised={"attention": "recorded"})
    table = report.idealised
    assert (table.attention == "recorded").all() and table.layer.tolist() == [0, 1]
    X0 = probe.recording.tensor("resid_pre", 0).double().numpy()
    rows = [(0, np.arange(7)), (1, np.arange(5))]
    pred = oracle_prediction(model, family, X0, reference.attentions, rows)
    for t, P in enumerate(pred):
        B = principal_basis(layer_matrix_and_bias(model, family, t)[0].numpy())
        gamma = (np.linalg.norm(P @ B, axis=1) / np.linalg.norm(P, axis=1)).mean()
        assert table.gamma_pred[t] == pytest.approx(gamma, rel=1e-10)
        n = len(P)
        mean_cos = (np.square(P.sum(0)).sum() - n) / (n * (n - 1))
        assert table.mean_cos_pred[t] == pytest.approx(mean_cos, rel=1e-10, abs=1e-12)
    # observed columns do not depend on the attention of the prediction; uniform unchanged
    uniform = probe.analyze(idealised=True).idealised
    assert (uniform.attention == "uniform").all()
    np.testing.assert_array_equal(uniform.gamma_obs, table.gamma_obs)
    assert not np.allclose(uniform.gamma_pred, table.gamma_pred)
    assert probe.n_handles == 0


def test_uniform_heads_equal_the_F_path():
    """With every recorded pattern replaced by the uniform one, the per-head path gives the
    uniform table: the two code paths agree."""
    from spectral_hooks.metrics.idealised import uniform_attention
    from spectral_hooks.metrics.idealised_table import idealised_table

    g = torch.Generator().manual_seed(3)
    heads = [(torch.randn(2, 3, 6, generator=g, dtype=torch.float64),
              torch.randn(2, 6, 3, generator=g, dtype=torch.float64)) for _ in range(2)]
    F = torch.stack([torch.einsum("hdk,hkm->dm", W_O, W_V) for W_V, W_O in heads])
    start = [torch.randn(4, 6, generator=g, dtype=torch.float64)]
    A = uniform_attention(4, causal=True).expand(2, 4, 4)
    a = idealised_table(F, start, causal=True)
    b = idealised_table(F, start, heads=heads, patterns=[[A], [A]], causal=True)
    np.testing.assert_allclose(a.gamma_pred, b.gamma_pred, rtol=1e-12)
    np.testing.assert_allclose(a.mean_cos_pred, b.mean_cos_pred, rtol=1e-12)


def test_recorded_without_the_capture_is_one_clear_error():
    model = eager_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(2)))
    with pytest.raises(RecordingError, match="attn_pattern"):
        probe.analyze(idealised={"attention": "recorded"})


def test_the_option_is_validated():
    with pytest.raises(OptionError, match="idealised.attention"):
        sh.AnalyzeOptions(idealised={"attention": "learned"})
    with pytest.raises(OptionError, match="idealised"):
        sh.AnalyzeOptions(idealised={"atention": "recorded"})
    options = sh.AnalyzeOptions(idealised=sh.IdealisedOptions(attention="recorded"))
    assert options.to_dict()["idealised"] == {"attention": "recorded", "iterate": "I+F"}
    assert sh.AnalyzeOptions(idealised=True).idealised_options.attention == "uniform"
