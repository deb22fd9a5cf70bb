"""GPT-NeoX / Pythia: pre-norm, per-head interleaved fused QKV, parallel residual by default."""

from .hf import HFFamily, register

GPT_NEOX = register(HFFamily(
    name="gpt_neox", model_types=("gpt_neox",), blocks="layers", attention="attention",
    value="attention.query_key_value", output="attention.dense",
    attn_out="post_attention_dropout", attn_norm="input_layernorm", norm_placement="pre",
    final_norm="final_layer_norm", qkv="neox",
    tested_by="tests/test_probe_families.py",
))
