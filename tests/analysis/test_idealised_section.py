"""Section ``idealised`` on tiny models: the prediction is a numpy run of the idealised dynamics
from the recorded first-layer tokens with F from the raw weights (tests/oracles.py), sequence by
sequence (padding dropped), causal models with causal uniform attention; the observed columns are
the power section's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError
from tests.oracles import layer_matrix_and_bias
from tests.tiny_models import make_model


def numpy_prediction(F: list[np.ndarray], seqs: list[np.ndarray], causal: bool) -> list:
    """Per layer, the predicted tokens of all sequences (tokens as rows, float64)."""
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in seqs]
    out = []
    for Ft in F:
        nxt = []
        for X in Xs:
            n = len(X)
            A = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
            A /= A.sum(1, keepdims=True)
            Y = (X.T + Ft @ X.T @ A.T).T  # the paper's column form
            nxt.append(Y / np.linalg.norm(Y, axis=1, keepdims=True))
        Xs = nxt
        out.append(np.concatenate(Xs))
    return out


@pytest.mark.parametrize("family, causal", [("bert", False), ("gpt2", True)])
def test_prediction_matches_a_numpy_run_and_observation_matches_power(family, causal):
    model = make_model(family)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0  # a padded second sequence: five real tokens
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    report = probe.analyze(idealised=True, iterate="I+F")
    table, power = report.idealised, report.power
    assert (table.iterate == "I+F").all()  # the table's one ordering: the one its dynamics iterates
    assert table.layer.tolist() == [0, 1] and (table.n_tokens == 12).all()
    assert (table.n_sequences == 2).all() and (table.attention == "uniform").all()
    np.testing.assert_allclose(table.gamma_obs, power.gamma, rtol=1e-12)
    np.testing.assert_allclose(table.mean_cos_obs, power.mean_cos, rtol=1e-12)
    rec = probe.recording
    X0 = rec.tensor("resid_pre", 0).double().numpy()
    seqs = [X0[0, :7], X0[1, :5]]
    F = [layer_matrix_and_bias(model, family, t)[0].numpy() for t in range(2)]
    for t, pred in enumerate(numpy_prediction(F, seqs, causal)):
        vals, vecs = np.linalg.eig(F[t])
        i = int(np.argmax(np.abs(1 + vals)))  # I + F's leading mode
        v = vecs[:, i]
        B = (np.linalg.qr(np.stack([v.real, v.imag], 1))[0] if abs(v.imag).max() > 1e-9
             else (v.real / np.linalg.norm(v.real))[:, None])
        gamma = (np.linalg.norm(pred @ B, axis=1) / np.linalg.norm(pred, axis=1)).mean()
        assert table.gamma_pred[t] == pytest.approx(gamma, rel=1e-9)
        U = pred / np.linalg.norm(pred, axis=1, keepdims=True)
        n = len(U)
        mean_cos = (np.square(U.sum(0)).sum() - n) / (n * (n - 1))
        assert table.mean_cos_pred[t] == pytest.approx(mean_cos, rel=1e-9)
    # idealised={"iterate": "F"} gives the power section's default B_t; the power option alone
    # does not change the idealised table
    other = probe.analyze(idealised={"iterate": "F"})
    assert (other.idealised.iterate == "F").all()
    np.testing.assert_allclose(other.idealised.gamma_obs, other.power.gamma, rtol=1e-12)
    same = probe.analyze(idealised=True)
    np.testing.assert_allclose(same.idealised.gamma_obs, table.gamma_obs, rtol=0)


@pytest.mark.filterwarnings("ignore::spectral_hooks.analysis.TokenColumnsWarning")
def test_stats_only_recording_skips_the_section_with_its_reason():
    model = make_model("bert")
    with sh.instrument(model, store="stats") as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(2)))
    report = probe.analyze(idealised=True)
    assert "idealised" not in report.sections
    assert "resid_pre" in report.metadata["sections_skipped"]["idealised"]


def test_the_option_is_validated():
    with pytest.raises(OptionError, match="idealised"):
        sh.AnalyzeOptions(idealised="yes")
    with pytest.raises(OptionError, match="idealised.iterate"):
        sh.AnalyzeOptions(idealised={"iterate": "2F"})
