"""Encoders (issue 15): DistilBERT, ModernBERT, DeBERTa-v2, MPNet, ELECTRA, XLM-RoBERTa; BERT's
layers under other names (CamemBERT, data2vec-text, ERNIE, BertGeneration, RoCBert, RemBERT).

Each passes tests/families/harness.check_family: recording = output_hidden_states, F = the
raw-weight least-squares fit (1e-6, float64), dense block Jacobian = jacfwd of the real block
(1e-10), matrix-free top-k = dense eig, outputs bit-identical, no handle left. MPNet and
DeBERTa-v2 add score biases in place: their dense-Jacobian check is also the regression test
of linearize's re-trace through functionalize (a stateful trace drifts by ~1e-5 per call).
"""

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import UnsupportedModelError
from tests.families.configs_encoders import BERT_CLONES, ENCODERS, RAW, f_call, inputs_for, make
from tests.families.harness import check_family

FAMILY_NAME = {"electra": "bert", "xlm_roberta": "bert", **dict.fromkeys(BERT_CLONES, "bert")}
# Jacobians checked on the last layer (layers alike), on both for ModernBERT (global, local)
JACOBIAN_LAYERS = {"modernbert": (0, 1)}


@pytest.mark.parametrize("family", ENCODERS + BERT_CLONES)
def test_encoder_passes_the_family_checks(family):
    model = make(family)
    value_in, output = RAW[family]
    probe = check_family(model, inputs_for(family), value_in=value_in, output=output,
                         causal=False, family=FAMILY_NAME.get(family, family),
                         f_call=f_call(family), layers=JACOBIAN_LAYERS.get(family, (1,)))
    assert probe.anatomy.default_position == -1


def test_modernbert_alternates_global_and_local_layers():
    anatomy = sh.anatomy_of(make("modernbert"))
    assert anatomy.layer_kinds == ("full_attention", "sliding_attention")
    assert anatomy.layers[0].attn_norm_weight() is None  # layer 0's attention norm: identity
    assert anatomy.layers[1].attn_norm_weight() is not None


def test_deberta_with_a_convolution_between_blocks_is_refused():
    import transformers as tf

    config = tf.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64,
                                conv_kernel_size=3)
    with pytest.raises(UnsupportedModelError, match="register_anatomy"):
        sh.anatomy_of(tf.DebertaV2Model(config))


def test_deberta_power_view_is_the_content_path():
    """F reads value_proj and attention.output.dense only: the relative-position projections
    (scores only) leave it unchanged."""
    model = make("deberta_v2")
    part = sh.anatomy_of(model).layers[0]
    before = torch.einsum("hdk,hkm->dm", part.output_weights(), part.value_weights())
    with torch.no_grad():
        model.encoder.layer[0].attention.self.pos_key_proj.weight.add_(1.0)
    after = torch.einsum("hdk,hkm->dm", part.output_weights(), part.value_weights())
    assert torch.equal(before, after)
