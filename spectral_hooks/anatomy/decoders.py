"""Decoders whose parts are plain paths: GPT-J, OPT, Phi, Phi3, StableLM, Cohere, Granite,
Starcoder2, Nemotron, GPT-BigCode, SmolLM3 (NoPE layers), Cohere2 and EXAONE 4 (sliding and
full layers; EXAONE 4 normalises each sublayer's output, as OLMo2).

All are pre-norm, causal and call their attention core through HF's AttentionInterface.
Parallel blocks (attention and MLP both read one norm of the residual and add to it):
GPT-J, Phi, Cohere (and StableLM with ``use_parallel_residual``). Fused value projections:
Phi3's ``qkv_proj`` and multi-query GPT-BigCode's ``c_attn`` stack [q | k | v]; GPT-BigCode
without multi-query interleaves per head like GPT-NeoX. Norm facts: Phi3 and Granite use
RMSNorms and Cohere a LayerNorm that compute in float32 (``norm_upcasts``); Nemotron's
LayerNorm1P scales by (1 + weight). Granite scales each sublayer's output by
``config.residual_multiplier`` before the residual add: its recorded ``attn_out`` (the
attention module's output) and F are before that scale.
"""


from .hf import HFFamily, HFPathsAndFinalNorm, register

_LLAMA_PATHS = HFPathsAndFinalNorm(
    blocks="layers", attention="self_attn", value="self_attn.v_proj", output="self_attn.o_proj",
    attn_out="self_attn", attn_norm="input_layernorm", norm_placement="pre", final_norm="norm")

GPTJ = register(HFFamily(
    name="gptj", tested_by="tests/families/test_decoders.py",
    model_types=("gptj",), blocks="h", attention="attn", value="attn.v_proj",
    output="attn.out_proj", attn_out="attn", attn_norm="ln_1", norm_placement="pre",
    final_norm="ln_f",
))


def _opt_variant(config) -> dict:
    """OPT-350m normalises after each sublayer (``do_layer_norm_before=False``)."""
    if getattr(config, "do_layer_norm_before", True):
        return {}
    return dict(norm_placement="post", attn_norm=None)


OPT = register(HFFamily(
    name="opt", tested_by="tests/families/test_decoders.py",
    model_types=("opt",), blocks="decoder.layers", attention="self_attn",
    value="self_attn.v_proj", output="self_attn.out_proj", attn_out="self_attn",
    attn_norm="self_attn_layer_norm", norm_placement="pre", final_norm="decoder.final_layer_norm",
    variant=_opt_variant,
))

PHI = register(HFFamily(
    name="phi", tested_by="tests/families/test_decoders.py",
    **{**_LLAMA_PATHS, "output": "self_attn.dense", "final_norm": "final_layernorm"},
    model_types=("phi",),
))

PHI3 = register(HFFamily(
    name="phi3", tested_by="tests/families/test_decoders.py",
    model_types=("phi3",), **{**_LLAMA_PATHS, "value": "self_attn.qkv_proj"},
    qkv="q_k_v", norm_upcasts=True,
))

STABLELM = register(HFFamily(
    name="stablelm", tested_by="tests/families/test_decoders.py",
    model_types=("stablelm",), **_LLAMA_PATHS))

STARCODER2 = register(HFFamily(
    name="starcoder2", tested_by="tests/families/test_decoders.py",
    model_types=("starcoder2",), **_LLAMA_PATHS))

SMOLLM3 = register(HFFamily(
    name="smollm3", tested_by="tests/families/test_hybrid.py", attention_type="RoPE / NoPE layers",
    model_types=("smollm3",), **_LLAMA_PATHS, norm_upcasts=True))

COHERE2 = register(HFFamily(
    name="cohere2", tested_by="tests/families/test_hybrid.py",
    attention_type="sliding/full alternating", model_types=("cohere2",), **_LLAMA_PATHS,
    norm_upcasts=True))

EXAONE4 = register(HFFamily(
    name="exaone4", tested_by="tests/families/test_hybrid.py",
    attention_type="sliding/full alternating", model_types=("exaone4",),
    **{**_LLAMA_PATHS, "attn_out": "post_attention_layernorm", "attn_norm": None,
       "norm_placement": "sublayer_post"}, norm_upcasts=True))

COHERE = register(HFFamily(
    name="cohere", tested_by="tests/families/test_decoders.py",
    model_types=("cohere",), **_LLAMA_PATHS, norm_upcasts=True,
))

GRANITE = register(HFFamily(
    name="granite", tested_by="tests/families/test_decoders.py",
    model_types=("granite",), **_LLAMA_PATHS, norm_upcasts=True,
))

NEMOTRON = register(HFFamily(
    name="nemotron", tested_by="tests/families/test_decoders.py",
    model_types=("nemotron",), **_LLAMA_PATHS, norm_weight_offset=1.0,
))


def _bigcode_variant(config) -> dict:
    """Multi-query: one key/value head after the queries; else per-head interleaved."""
    if getattr(config, "multi_query", True):
        return dict(qkv="q_k_v", n_kv_heads=1)
    return dict(qkv="neox")


GPT_BIGCODE = register(HFFamily(
    name="gpt_bigcode", tested_by="tests/families/test_decoders.py", attention_type="multi-query (or full)",
    model_types=("gpt_bigcode",), blocks="h", attention="attn",
    value="attn.c_attn", output="attn.c_proj", attn_out="attn", attn_norm="ln_1",
    norm_placement="pre", final_norm="ln_f", variant=_bigcode_variant,
))
