"""DistilBERT: BERT with half the layers, post-norm, bidirectional; q/k/v/out_lin in
``attention`` (HF's pluggable attention core), the attention output added before
``sa_layer_norm``."""

from .hf import HFFamily, register

DISTILBERT = register(HFFamily(
    name="distilbert", model_types=("distilbert",), blocks="transformer.layer",
    attention="attention", value="attention.v_lin", output="attention.out_lin",
    attn_out="attention", attn_norm=None, norm_placement="post", causal=False,
    tested_by="tests/families/test_encoders.py",
))
