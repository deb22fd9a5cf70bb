"""BERT and ALBERT: post-norm, bidirectional. ALBERT applies one shared layer N times."""

from typing import Any, cast

from torch import nn

from .hf import HFFamily, register

BERT = register(HFFamily(
    name="bert", model_types=("bert", "roberta", "xlm-roberta", "electra", "camembert",
                              "data2vec-text", "ernie", "bert-generation", "roc_bert",
                              "rembert"),
    blocks="encoder.layer", attention="attention", value="attention.self.value",
    output="attention.output.dense", attn_out="attention.output.dropout", attn_norm=None,
    norm_placement="post", causal=False,
    tested_by="tests/test_probe_families.py (bert); tests/families/test_encoders.py (electra, "
              "xlm-roberta, camembert, data2vec-text, ernie, bert-generation, roc_bert, "
              "rembert)",
))


def albert_application_order(base: nn.Module) -> list[nn.Module]:
    """The AlbertLayer modules in the order the encoder applies them (shared ones repeated)."""
    config, groups = cast(Any, base).config, cast(Any, base).encoder.albert_layer_groups
    order = []
    for i in range(config.num_hidden_layers):
        group = groups[int(i / (config.num_hidden_layers / config.num_hidden_groups))]
        order.extend(group.albert_layers)
    return order


ALBERT = register(HFFamily(
    name="albert", model_types=("albert",), blocks="encoder.albert_layer_groups",
    attention="attention", value="attention.value", output="attention.dense",
    attn_out="attention.output_dropout", attn_norm=None, norm_placement="post", causal=False,
    block_order=albert_application_order, tested_by="tests/test_probe_families.py",
))
