"""GPT-Neo: pre-norm, separate q/k/v projections inside attn.attention, global/local layers
(``config.attention_layers``), an attention core of its own (not HF's AttentionInterface)."""

from .calls import BlockCallConvention
from .hf import HFFamily, register

GPT_NEO = register(HFFamily(
    name="gpt_neo", model_types=("gpt_neo",), blocks="h", attention="attn.attention",
    value="attn.attention.v_proj", output="attn.attention.out_proj", attn_out="attn",
    attn_norm="ln_1", norm_placement="pre", final_norm="ln_f",
    call_convention=BlockCallConvention(pluggable_attention=False),  # its own attention code
    attention_type="global/local alternating", tested_by="tests/test_probe_families.py",
))
