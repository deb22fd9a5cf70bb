"""Falcon: pre-norm, causal, attention and MLP in parallel (by default), rotary or ALiBi, its
own attention code (not HF's AttentionInterface: ``pluggable_attention=False``).

The fused ``query_key_value`` has three layouts, chosen by the config: the new decoder
architecture (Falcon-40B/180B) groups rows per KV group [q_1..q_g | k | v] and normalises
the attention input with its own ``ln_attn`` (two parallel norms); multi-query (Falcon-7B)
stacks [q (H heads) | k | v] with one key/value head; otherwise rows are interleaved per head
like GPT-NeoX's.
"""

from __future__ import annotations

from typing import Any

from .calls import BlockCallConvention
from .hf import HFFamily, register


def falcon_variant(config: Any) -> dict[str, Any]:
    """The Falcon layout a config describes (the family fields it changes).

    Returns:
        ``qkv`` ("grouped" for the new decoder architecture, "q_k_v" for multi-query, else
        "neox"), ``n_kv_heads``, and for the new architecture the ``attn_norm`` module name.
    """
    if getattr(config, "new_decoder_architecture", False):
        two_norms = getattr(config, "num_ln_in_parallel_attn", None) in (None, 2)
        return dict(qkv="grouped", n_kv_heads=config.num_kv_heads,
                    attn_norm="ln_attn" if two_norms else "input_layernorm")
    if getattr(config, "multi_query", False):
        return dict(qkv="q_k_v", n_kv_heads=1)
    return dict(qkv="neox", n_kv_heads=config.num_attention_heads)


FALCON = register(HFFamily(
    name="falcon", tested_by="tests/families/test_decoders.py", attention_type="multi-query / grouped (ALiBi optional)",
    model_types=("falcon",), blocks="h", attention="self_attention",
    value="self_attention.query_key_value", output="self_attention.dense",
    attn_out="self_attention", attn_norm="input_layernorm", norm_placement="pre",
    final_norm="ln_f", variant=falcon_variant,
    call_convention=BlockCallConvention(pluggable_attention=False),
))
