"""Vision towers (ViT, DeiT, CLIP, SigLIP; bidirectional, pixel_values in) and CLIP's text
tower (causal) pass tests/families/harness.check_family; the Jacobian view's default
position is the anatomy's (CLS for ViT/DeiT/CLIP, the centre patch for SigLIP)."""

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import AnalysisCache, Subject
from spectral_hooks.analysis.jacobian import JacobianView
from spectral_hooks.analysis.options import JacobianOptions
from spectral_hooks.errors import UnsupportedModelError
from tests.families.configs_encoders import CAUSAL, RAW, VISION, f_call, inputs_for, make
from tests.families.harness import check_family

DEFAULT_ROW = {"vit": 0, "deit": 0, "clip_vision": 0, "siglip_vision": 3, "clip_text": -1}


@pytest.mark.parametrize("family", VISION)
def test_tower_passes_the_family_checks(family):
    model = make(family)
    value_in, output = RAW[family]
    probe = check_family(model, inputs_for(family), value_in=value_in, output=output,
                         causal=CAUSAL.get(family, False), family=family,
                         f_call=f_call(family), layers=(1,))
    assert probe.anatomy.default_position == DEFAULT_ROW[family]
    assert bool(probe.recording.mask.all())  # patches: every position is real


@pytest.mark.parametrize("family", ["vit", "siglip_vision"])
def test_jacobian_view_linearises_at_the_default_position(family):
    model = make(family)
    with sh.instrument(model, layers=[1]) as probe, torch.no_grad():
        model(**inputs_for(family, batch=1))
    table = probe.analyze(jacobian={"k": 2}).jacobian
    assert set(table["position"]) == {DEFAULT_ROW[family]}
    subject = Subject(anatomy=probe.anatomy, recording=probe.recording,
                      cache=AnalysisCache(model, probe.recording))
    view = JacobianView(subject, JacobianOptions(k=2, positions="last"))
    assert view.row_position(1, view.positions()[0]) == probe.recording.mask.shape[1] - 1
    assert view.anchor == DEFAULT_ROW[family]  # chain, bottleneck and amplification


def test_two_tower_models_point_to_their_towers():
    import transformers as tf

    text = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, image_size=8, patch_size=4)
    model = tf.CLIPModel(tf.CLIPConfig(text_config=text, vision_config=vision))
    with pytest.raises(UnsupportedModelError, match="model.vision_model or model.text_model"):
        sh.anatomy_of(model)
    assert sh.anatomy_of(model.vision_model).family == "clip_vision"
    assert sh.anatomy_of(model.text_model).causal
