"""NaN and Inf are named where they are (issue 16, "unclear" cases): a non-finite recorded value
is one NonFiniteError up front naming layer, sample, token and capture point; one arising in a
computation from finite inputs (a block replay that overflows, F from a non-finite weight) is a
NonFiniteComputationError naming the layer and position. Each message says what to do."""

from __future__ import annotations

import warnings

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import NonFiniteComputationError, NonFiniteError, RecordingError
from tests.tiny_models import make_model

FIX = "run the model in float32 or bfloat16"


@pytest.fixture(scope="module", autouse=True)
def _quiet(one_torch_thread):
    yield


def _ids(batch=2, n=5):
    return torch.randint(1, 100, (batch, n), generator=torch.Generator().manual_seed(0))


def _record(model, ids, **kwargs):
    probe = sh.instrument(model, **kwargs)
    with torch.no_grad():
        model(ids)
    probe.remove()
    return probe


def _analyze(probe, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = probe.analyze(**options)
        for name in ("power", "jacobian"):
            if name in report:
                getattr(report, name)
    return report


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("capture", ["resid_pre", "attn_out", "resid_post"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_recorded_value_names_layer_sample_token_and_capture(family, capture, value):
    model = make_model(family, dtype=torch.float32)
    probe = _record(model, _ids(), capture=(capture,))
    probe.recording._runs[0].chunks[(capture, 1)][0][1, 3, 2] = value
    probe.recording._runs[0].chunks[(capture, 1)][0][1, 4, 0] = value  # a second one
    expected = "NaN" if value != value else "Inf"
    for options in ({"power": True}, {"power": False, "jacobian": {"k": 2}}):
        with pytest.raises(NonFiniteError) as info:
            _analyze(probe, **options)
        err, message = info.value, str(info.value)
        assert isinstance(err, RecordingError) and isinstance(err, ValueError)
        assert (err.layer, err.capture, err.sample, err.position) == (1, capture, 1, 3)
        assert message.startswith(f"{expected} in the recording at layer 1, sample 1, token 3 "
                                  f"(capture point: {capture}")
        assert "2 (capture point, token) pairs" in message and FIX in message


def test_non_finite_padding_is_ignored():
    model = make_model("bert", dtype=torch.float32)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 4] = 0
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    probe.recording._runs[0].chunks[("resid_post", 1)][0][0, 4] = float("nan")
    assert _analyze(probe, power=True).power["gamma"].notna().all()


def test_non_finite_block_input_is_named_for_the_jacobian_view():
    model = make_model("gpt2", dtype=torch.float64)
    probe = _record(model, _ids(), capture=("resid_post",))
    probe.recording._runs[0].block_calls[1].hidden[0, 2, 5] = float("nan")
    _analyze(probe, power=True)  # the power view does not use block inputs
    with pytest.raises(NonFiniteError, match=r"^NaN in the recording at layer 1, sample 0, "
                       r"token 2 \(capture point: block input") as info:
        _analyze(probe, power=False, jacobian={"k": 2, "positions": "all"})
    assert info.value.capture == "block input" and "probe.clear()" in str(info.value)
    # the block function checks its own input too (linearize used directly)
    with pytest.raises(NonFiniteError, match="layer 1, sample 0, token 2"):
        probe.jacobian(1, position=2)


@pytest.mark.parametrize("family,module,set_to", [
    ("gpt2", "h.1.mlp.c_proj", lambda w: w.fill_(3e38)),  # finite, its output sum overflows
    ("llama", "layers.1.post_attention_layernorm", lambda w: w.mul_(1e30)),  # gate * up does
])
def test_weights_producing_inf_in_a_layer_are_named(family, module, set_to):
    model = make_model(family, dtype=torch.float32)
    with torch.no_grad():
        set_to(model.get_submodule(module).weight)
    probe = _record(model, _ids())
    with pytest.raises(NonFiniteError) as info:
        _analyze(probe, power=True)
    err = info.value
    assert (err.layer, err.capture, err.sample) == (1, "resid_post", 0)
    assert f"at layer 1, sample 0, token {err.position} (capture point: resid_post" in str(err)
    assert "fix the weights of layer 1" in str(err)


def test_inf_bias_in_a_stats_recording_names_layer_and_capture():
    model = make_model("gpt2", dtype=torch.float32)
    with torch.no_grad():
        model.h[0].mlp.c_proj.bias[3] = float("inf")
    probe = _record(model, _ids(), store="stats")
    with pytest.raises(NonFiniteError, match=r"^Inf in the recording at layer 0, position "
                       r"unknown: store='stats'.*capture point: resid_post"):
        _analyze(probe, power=True)


@pytest.mark.parametrize("dense", [True, False])
def test_block_replay_that_overflows_names_layer_sample_and_token(dense):
    model = make_model("gpt2", dtype=torch.float64)
    probe = _record(model, _ids(), layers=[1], capture=("resid_pre",))
    with torch.no_grad():  # finite recording; the replay of block 1 overflows float64
        model.h[1].mlp.c_fc.weight.mul_(1e200)
        model.h[1].mlp.c_proj.weight.mul_(1e200)
    with pytest.raises(NonFiniteComputationError) as info:
        _analyze(probe, power=False, jacobian={"k": 2, "dense": dense, "n_samples": 4})
    err = info.value
    assert isinstance(err, FloatingPointError)
    assert (err.layer, err.sample, err.position) == (1, 0, 4)
    assert "of block 1 at sample 0, token 4 holds NaN or Inf" in str(err)
    assert "recorded input there is finite" in str(err) and "p.abs().max()" in str(err)


def test_non_finite_attention_weight_names_the_layer_in_power_and_steering():
    model = make_model("gpt2", dtype=torch.float32)
    probe = _record(model, _ids())
    with torch.no_grad():
        model.h[1].attn.c_proj.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteComputationError, match=r"F = W_O W_V of layer 1 holds "):
        _analyze(probe, power=True)
    with pytest.raises(NonFiniteComputationError, match="layer 1's value or output projection"):
        sh.steer(model, torch.ones(32), layer=1)
