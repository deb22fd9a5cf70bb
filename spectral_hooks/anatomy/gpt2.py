"""GPT-2: pre-norm, fused Conv1D c_attn (values are its last third), Conv1D c_proj."""

from .hf import HFFamily, register

GPT2 = register(HFFamily(
    name="gpt2", model_types=("gpt2",), blocks="h", attention="attn",
    value="attn.c_attn", output="attn.c_proj", attn_out="attn", attn_norm="ln_1",
    norm_placement="pre", final_norm="ln_f", qkv="gpt2",
    tested_by="tests/test_probe_families.py",
))
