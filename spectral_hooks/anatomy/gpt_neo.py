"""GPT-Neo: pre-norm, separate q/k/v projections inside attn.attention, global/local layers."""

from .hf import HFFamily, register

GPT_NEO = register(HFFamily(
    name="gpt_neo", model_types=("gpt_neo",), blocks="h", attention="attn.attention",
    value="attn.attention.v_proj", output="attn.attention.out_proj", attn_out="attn",
    attn_norm="ln_1", norm_placement="pre", final_norm="ln_f",
))
