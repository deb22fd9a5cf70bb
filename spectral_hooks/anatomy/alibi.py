"""ALiBi decoders: BLOOM and MPT. Pre-norm, causal, a linear per-head bias on the scores.

Both compute attention in their own code (not HF's AttentionInterface:
``pluggable_attention=False``), so a single-query replay runs their own attention on the fixed
keys/values concatenated with the new one, with their own bias, and is used only where it
agrees with the full-sequence block; the split core, which knows no ALiBi, never runs them.
Fused value projections: BLOOM's ``query_key_value`` is interleaved per head like GPT-NeoX's,
MPT's ``Wqkv`` stacks [q | k | v]. BLOOM's GeLU is an ``autograd.Function`` with a backward
but no forward-AD rule: replays swap in its own formula (the function its forward computes).
"""

from __future__ import annotations

import contextlib

from torch import nn

from .calls import BlockCallConvention
from .hf import HFFamily, register


@contextlib.contextmanager
def bloom_gelu_as_formula(block: nn.Module):
    """Meanwhile, every ``BloomGelu`` in ``block`` computes its forward formula with plain
    torch ops (differentiable in both modes); restored on exit."""
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    gelus = [m for m in block.modules() if type(m).__name__ == "BloomGelu"]
    own = {id(m): m.__dict__.get("forward") for m in gelus}  # an instance patch of the user's
    try:
        for module in gelus:
            module.forward = bloom_gelu_forward
        yield
    finally:
        for module in gelus:
            if own[id(module)] is None:
                del module.forward
            else:
                module.forward = own[id(module)]  # pyright: ignore[reportAttributeAccessIssue]  # not None here


BLOOM = register(HFFamily(
    name="bloom", tested_by="tests/families/test_decoders.py", attention_type="full + ALiBi",
    model_types=("bloom",), blocks="h", attention="self_attention",
    value="self_attention.query_key_value", output="self_attention.dense",
    attn_out="self_attention.dense", attn_norm="input_layernorm", norm_placement="pre",
    final_norm="ln_f", qkv="neox",
    call_convention=BlockCallConvention(pluggable_attention=False,
                                        replay_context=bloom_gelu_as_formula),
))

MPT = register(HFFamily(
    name="mpt", tested_by="tests/families/test_decoders.py", attention_type="full + ALiBi",
    model_types=("mpt",), blocks="blocks", attention="attn", value="attn.Wqkv",
    output="attn.out_proj", attn_out="attn", attn_norm="norm_1", norm_placement="pre",
    final_norm="norm_f", qkv="q_k_v",
    call_convention=BlockCallConvention(pluggable_attention=False),
))
