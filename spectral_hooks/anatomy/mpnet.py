"""MPNet: BERT-like post-norm encoder, bidirectional; q/k/v/o in ``attention.attn`` (its own
attention code) with a relative position bias on the scores (shared, computed by the
encoder and passed to every block as ``position_bias``)."""

from .calls import BlockCallConvention
from .hf import HFFamily, register

MPNET = register(HFFamily(
    name="mpnet", model_types=("mpnet",), blocks="encoder.layer", attention="attention.attn",
    value="attention.attn.v", output="attention.attn.o", attn_out="attention.dropout",
    attn_norm=None, norm_placement="post", causal=False,
    call_convention=BlockCallConvention(pluggable_attention=False),
    attention_type="full + relative position bias", tested_by="tests/families/test_encoders.py",
))
