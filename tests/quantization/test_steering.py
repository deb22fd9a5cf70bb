"""Steering a quantized model: the edit is an additive float term, the packed weights are never
written, and removing the edit gives back the layer bit-exactly (no hook left)."""

from __future__ import annotations

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis.cache import _leaves
from spectral_hooks.anatomy import effective

try:  # the hook helpers move to spectral_hooks.hooks (another issue's refactor)
    from spectral_hooks.hooks.taps import count_hook_points as count_hooks
except ImportError:  # before that move
    from spectral_hooks.taps import count_hook_points as count_hooks  # type: ignore

from .models import IDS, float_copy, quantized


def _stored(model):
    """Every tensor the model stores (a tensor subclass's inner tensors), cloned."""
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        for i, leaf in enumerate(_leaves(t)):
            out[f"{name}.{i}"] = leaf.detach().clone()
    return out


@pytest.mark.parametrize("kind", ("bnb_nf4", "torchao_int8", "quanto_qint4", "hqq_4bit"))
def test_steering_a_quantized_model(kind):
    model = quantized(kind)
    u = torch.ones(64, dtype=torch.float64) / 8
    with torch.no_grad():
        before = model(input_ids=IDS).last_hidden_state
    stored = _stored(model)
    hooks = count_hooks(model)

    edit = sh.steer(model, u, layer=-1, gap=0.5)
    assert edit.gap_after <= 0.5 + 1e-9 < edit.gap_before
    with torch.no_grad():
        steered = model(input_ids=IDS).last_hidden_state
    assert not torch.equal(steered, before)
    after = _stored(model)
    assert all(torch.equal(after[k], v) for k, v in stored.items())  # packed: untouched
    # the same edit of the float copy: the same alpha and spectra
    reference = sh.steer(float_copy(model), u, layer=-1, gap=0.5)
    assert edit.alpha == pytest.approx(reference.alpha, rel=1e-6)
    assert abs(edit.lambda1_after) == pytest.approx(abs(reference.lambda1_after), rel=1e-6)
    # the power view reads the steered weight
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=IDS)
    row = probe.analyze(power=True).power.iloc[-1]
    assert row["gap_ratio"] == pytest.approx(edit.gap_after, rel=1e-6)

    edit.remove()
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).last_hidden_state, before)  # bit-exact
    assert count_hooks(model) == hooks
    assert effective.additive_state() == ()


def test_a_failed_edit_leaves_no_term(monkeypatch):
    import spectral_hooks.steering as steering

    def fail(*args, **kwargs):
        raise RuntimeError("no edit reaches the gap")

    monkeypatch.setattr(steering, "rank1_output_edit", fail)
    model = quantized("torchao_int8")
    hooks = count_hooks(model)
    with pytest.raises(RuntimeError, match="no edit"):
        sh.steer(model, torch.ones(64) / 8, layer=-1)
    assert count_hooks(model) == hooks
    assert effective.additive_state() == ()
