"""ModernBERT: pre-norm, bidirectional, rotary; alternating global and local (sliding window)
attention (``config.layer_types``: a global layer every ``global_attn_every_n_layers``); fused
``Wqkv`` laid out [q | k | v] (values are its last third); the first layer's attention norm is
an identity."""

from .hf import HFFamily, register

MODERNBERT = register(HFFamily(
    name="modernbert", model_types=("modernbert",), blocks="layers", attention="attn",
    value="attn.Wqkv", output="attn.Wo", attn_out="attn", attn_norm="attn_norm",
    norm_placement="pre", final_norm="final_norm", causal=False, qkv="gpt2",
    attention_type="global/local alternating", tested_by="tests/families/test_encoders.py",
))
