"""probe.analyze(): lazy, cached, invalidated by weight edits; sane on the real MiniLM-L6."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from tests.tiny_models import make_model


def test_minilm_power_report_is_finite_and_in_range(minilm):
    model, tokenizer = minilm
    batch = tokenizer(["The cat sat on the mat.", "Eigenvalues of attention layers.",
                       "A longer sentence, with punctuation, about power iterations."],
                      padding=True, return_tensors="pt")
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
    power = probe.analyze().power
    assert list(power.layer) == list(range(6))
    assert "gamma_u" not in power.columns  # steered-token alignment: only with power.direction
    numeric = power.select_dtypes("number")
    assert np.isfinite(numeric.to_numpy(dtype=float)).all()
    for col in ("gamma_in", "gamma", "gamma2", "rho", "rho_pvalue", "gap_ratio", "mean_cos"):
        assert power[col].between(0, 1).all(), col
    assert (power.gamma_null > 0).all() and (power.n_tokens == int(batch["attention_mask"].sum())).all()
    np.testing.assert_allclose(power.lift, power.gamma / power.gamma_null)
    # |lambda_1| against an independent float64 eig of W_O W_V from the raw weights
    layer = model.encoder.layer[2].attention
    F = (layer.output.dense.weight.double() @ layer.self.value.weight.double()).detach().numpy()
    assert power.abs_lambda1[2] == pytest.approx(np.abs(np.linalg.eigvals(F)).max(), rel=1e-10)


def test_sections_are_lazy_cached_and_invalidated_by_weight_edits():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 6)))
    report = probe.analyze()
    assert not report.is_computed("power")
    first = report.power
    assert report.power is first and probe.analyze().power is first  # cached
    with sh.steer(model, torch.randn(32, dtype=torch.float64), gap=0.1):
        steered = probe.analyze().power
    assert steered.abs_lambda1.iloc[-1] != first.abs_lambda1.iloc[-1]
    assert probe.analyze().power.abs_lambda1.iloc[-1] == first.abs_lambda1.iloc[-1]


def test_albert_gets_a_shared_weight_section_and_report_round_trips(tmp_path):
    model = make_model("albert")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 5)))
    report = probe.analyze()
    assert "shared_weights" in report.sections and len(report.shared_weights) == 3
    report.save(tmp_path)
    loaded = sh.Report.load(tmp_path)
    for name in report.sections:
        assert loaded[name].equals(report[name])


def test_analyze_errors():
    model = make_model("gpt2")
    probe = sh.instrument(model)
    with pytest.raises(ValueError, match="nothing recorded"):
        probe.analyze()
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 4)))
    with pytest.raises(ValueError, match="iterate"):
        probe.analyze(iterate="F+I")
    with pytest.raises(TypeError, match="unknown analyze"):
        probe.analyze(colour="red")
    probe.remove()


def test_cache_sees_fused_optimizer_steps_and_new_batches():
    model = make_model("gpt2", dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    ids = torch.randint(0, 100, (2, 6))
    with sh.instrument(model) as probe:
        model(ids)
        first = probe.analyze().power
        model(ids).last_hidden_state.sum().backward()
        optimizer.step()  # fused: parameters' _version does not move
        probe.clear()
        with torch.no_grad():
            model(ids)  # same shapes as before
        second = probe.analyze().power
    assert not np.allclose(first.abs_lambda1, second.abs_lambda1)


def test_cache_sees_edits_through_data():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 6)))
    before = probe.analyze().power.abs_lambda1.tolist()
    model.h[1].attn.c_proj.weight.data[8:16] *= 10  # no _version bump, few elements
    after = probe.analyze().power.abs_lambda1.tolist()
    F = sh.layer_matrices(model)[1]
    assert after[1] == pytest.approx(torch.linalg.eigvals(F).abs().max().item(), rel=1e-10)
    assert after[1] != before[1]


def test_albert_subset_or_missing_resid_pre_skips_the_shared_section():
    model = make_model("albert")
    for kwargs in ({"layers": [1, 2]}, {"capture": ["resid_post"]}):
        with sh.instrument(model, **kwargs) as probe, torch.no_grad():
            model(torch.randint(0, 100, (2, 5)))
        report = probe.analyze()
        assert "shared_weights" not in report.sections
        assert report.power is not None
