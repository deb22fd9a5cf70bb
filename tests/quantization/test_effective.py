"""Effective weights of quantized layers: dequantized, checked against their own forward, refused
with their name when the two disagree; the analysis cache's fingerprint reads tensor subclasses."""

from __future__ import annotations

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis.cache import WeightsFingerprint, _same
from spectral_hooks.anatomy.effective import effective_weight, quantized_layers
from spectral_hooks.anatomy.quantized import dequantized, quantization_of, verify
from spectral_hooks.errors import UnsupportedModelError

from .models import IDS, KINDS, base_model, quantized


def _v_proj(model):
    return model.layers[0].self_attn.v_proj


@pytest.mark.parametrize("kind", KINDS)
def test_dequantized_weight_is_what_the_forward_multiplies_by(kind):
    model = quantized(kind)
    layer = _v_proj(model)
    q = quantization_of(layer)
    assert q is not None
    W = effective_weight(layer)  # verified inside (refused otherwise)
    assert W.shape == (32, 64) and W.is_floating_point()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = layer(x.to(q.compute_dtype if q.library != "bitsandbytes" else torch.float32))
    ref = x.double() @ W.double().t()
    rel = float((y.double() - ref).norm() / ref.norm())
    assert rel < (0.05 if q.activations or q.compute_dtype == torch.bfloat16 else 1e-5), rel
    # close to the float weight it was quantized from (4-bit: a coarse grid)
    base = _v_proj(base_model()).weight.detach()
    err = float((W.float() - base).norm() / base.norm())
    assert err < 0.2, err


@pytest.mark.parametrize("kind", ("torchao_int8", "torchao_int4", "quanto_qint4", "hqq_4bit"))
def test_fingerprint_reads_tensor_subclasses(kind):
    model = quantized(kind)
    fingerprint = WeightsFingerprint(model)
    first = fingerprint()
    assert _same(first, fingerprint())
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=IDS)
    power = probe.analyze(power=True).power  # no bare torch error (issue 55)
    assert probe.analyze(power=True).power is power  # a cache hit


def test_fingerprint_sees_a_new_quantized_weight():
    model = quantized("torchao_int8")
    fingerprint = WeightsFingerprint(model)
    first = fingerprint()
    layer = _v_proj(model)
    with torch.no_grad():
        layer.weight.qdata.mul_(-1)  # every sampled element moves
    assert not _same(first, fingerprint())


def test_bnb_repacked_layout_decoded_exactly():
    """After bitsandbytes' CPU repack, dequantize_4bit reads the new layout wrongly; our decoding
    of it equals the weight before the repack up to absmax's rounding to bfloat16."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as F

    for kind in ("bnb_nf4", "bnb_fp4"):
        model = quantized(kind, repack=False)
        layer = _v_proj(model)
        before = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
        assert torch.equal(effective_weight(layer), before)  # not repacked: bnb's own
        state_before = layer.weight.data.data_ptr()
        with torch.no_grad():
            model(input_ids=IDS)  # the eval forward that repacks (AVX512-BF16 CPUs)
        state = layer.weight.quant_state
        if not getattr(state, "packing_format_for_cpu", False):
            pytest.skip("this CPU has no AVX512-BF16: bitsandbytes does not repack")
        assert layer.weight.data.data_ptr() != state_before
        wrong = F.dequantize_4bit(layer.weight.data, state)
        assert float((wrong.float() - before).abs().max()) > 0.05  # the trap
        after = effective_weight(layer)
        assert float((after - before).abs().max() / before.abs().max()) < 2 ** -8


def test_checking_never_changes_a_layer():
    """The check runs the forward with requires_grad inputs: bitsandbytes does not repack."""
    pytest.importorskip("bitsandbytes")
    model = quantized("bnb_nf4", repack=False)
    layer = _v_proj(model)
    data = layer.weight.data.clone()
    effective_weight(layer)
    assert torch.equal(layer.weight.data, data)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)


def test_fake_layout_is_refused_with_the_layer_name():
    """A layer whose dequantization does not match its forward (here a kernel that reads its
    input in another order, as a layout this package does not know would) is refused by the
    analysis, naming the layer; the other layers still read."""
    model = quantized("bnb_nf4")
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=IDS)
    o_proj = model.layers[0].self_attn.o_proj
    original = o_proj.forward
    o_proj.forward = lambda x: original(x.flip(-1))  # the fake layout
    try:
        with pytest.raises(UnsupportedModelError,
                           match=r"layers\.0\.self_attn\.o_proj \(Linear4bit 64 -> 64\).*"
                           r"does not match its own forward"):
            probe.analyze(power=True).power
    finally:
        del o_proj.forward
    assert len(probe.analyze(power=True).power) == 2


def test_wrong_scale_is_refused():
    """torchao: a dequantize() that disagrees with the kernel (scale changed behind the
    kernel's back is impossible, so the dequantization is faked) is refused by the check."""
    model = quantized("torchao_int8")
    layer = _v_proj(model)
    q = quantization_of(layer)
    assert q is not None
    W = dequantized(layer)
    with pytest.raises(UnsupportedModelError, match="does not match its own forward"):
        verify(layer, W * 1.01, None, q)
    verify(layer, W, None, q)


def test_unknown_quantized_layer_refused_in_one_line():
    class QuantLinear(torch.nn.Module):  # a GPTQ-style layer: packed qweight, no dequantize
        def __init__(self):
            super().__init__()
            self.register_buffer("qweight", torch.zeros(8, 32, dtype=torch.int32))
            self.in_features, self.out_features = 64, 32

        def forward(self, x):
            return x[..., :32]

    layer = QuantLinear()
    with pytest.raises(UnsupportedModelError, match="QuantLinear") as err:
        effective_weight(layer)
    assert "\n" not in str(err.value)
    block = torch.nn.Sequential(torch.nn.Linear(64, 64), layer)
    with pytest.raises(UnsupportedModelError, match="QuantLinear"):
        quantized_layers(block)


def test_qlora_weight_is_dequantized_base_plus_adapter_delta():
    peft = pytest.importorskip("peft")
    model = quantized("bnb_nf4")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "o_proj"],
                             init_lora_weights=False)
    adapted = peft.get_peft_model(model, config)
    layer = adapted.base_model.model.layers[0].self_attn.v_proj
    base = dequantized(layer.base_layer).double()
    delta = (layer.lora_B["default"].weight.double() @ layer.lora_A["default"].weight.double()
             * layer.scaling["default"])
    torch.testing.assert_close(effective_weight(layer), base + delta, rtol=0, atol=1e-12)
    with adapted.disable_adapter():
        torch.testing.assert_close(effective_weight(layer).double(), base, rtol=0, atol=0)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = layer(x)
    ref = x.double() @ (base + delta).t()
    assert float((y.double() - ref).norm() / ref.norm()) < 0.02  # bf16 kernel after repack


@pytest.mark.parametrize("kind", ("torchao_float8", "torchao_dynamic_int8", "bnb_fp4"))
def test_more_schemes_read_and_say_what_they_are(kind):
    """torchao float8 weight-only and dynamic int8 (activations quantized: the Jacobian replay is
    the weight-dequantized surrogate, said in the metadata), bitsandbytes fp4."""
    model = quantized(kind)
    q = quantization_of(_v_proj(model))
    assert q is not None and q.activations == (kind == "torchao_dynamic_int8")
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=IDS)
    report = probe.analyze(power=True, jacobian={"k": 4}, progress=False)
    assert len(report.power) == 2 and len(report.jacobian) == 2
    cause = ("quantized.weight_dequantized_surrogate" if q.activations
             else "quantized.dequantized_weights")
    assert cause in (report.metadata.fallbacks or [])
