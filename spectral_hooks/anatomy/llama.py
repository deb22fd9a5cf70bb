"""Llama-style decoders: Llama, Mistral, Qwen2/3, Gemma 1-3, OLMo, OLMo2.

All keep q/k/v/o projections in ``self_attn`` and rotary embeddings; they differ in norms:
pre-norm (Llama, Mistral, Qwen, Gemma 1, OLMo), sandwich (Gemma 2/3: the attention output is
normalised before the residual add), and post-sublayer norms only (OLMo2). Every one of
them computes its norms in float32 whatever the model dtype (``norm_upcasts``).
"""

from typing import Optional, TypedDict

from .hf import HFFamily, register


class _Common(TypedDict):
    """The fields of :class:`HFFamily` that these families share, typed."""

    blocks: str
    attention: str
    value: str
    output: str
    final_norm: Optional[str]
    norm_upcasts: bool


_COMMON = _Common(blocks="layers", attention="self_attn", value="self_attn.v_proj",
                  output="self_attn.o_proj", final_norm="norm", norm_upcasts=True)

LLAMA = register(HFFamily(
    name="llama", model_types=("llama", "mistral", "qwen2", "qwen3", "olmo"),
    attn_out="self_attn", attn_norm="input_layernorm", norm_placement="pre", **_COMMON,
    tested_by="tests/test_probe_families.py (llama, mistral, qwen2)",
))

GEMMA = register(HFFamily(
    name="gemma", model_types=("gemma",), attn_out="self_attn", attn_norm="input_layernorm",
    norm_placement="pre", norm_weight_offset=1.0, **_COMMON,
))

GEMMA2 = register(HFFamily(
    name="gemma2", model_types=("gemma2", "gemma3_text"), attn_out="post_attention_layernorm",
    attn_norm="input_layernorm", norm_placement="sandwich", norm_weight_offset=1.0, **_COMMON,
    attention_type="sliding/global alternating", tested_by="tests/test_probe_families.py",
))

OLMO2 = register(HFFamily(
    name="olmo2", model_types=("olmo2",), attn_out="post_attention_layernorm", attn_norm=None,
    norm_placement="sublayer_post", **_COMMON,
    tested_by="tests/test_probe_families.py",
))
