"""Hybrid stacks and latent attention: Qwen3-Next, Jamba, Granite-4 hybrid, LFM2, Falcon-H1,
MiniMax, Mamba and Mamba-2, DeepSeek-V3, and Gemma 3n.

Each block is described by its own kind (:mod:`.mixers`): the attention paths below exist in
the attention layers only; a Mamba, Gated DeltaNet, lightning-attention or short-convolution
layer has no OV map, so no power rows, and is linearised like any other block by the Jacobian
view. Routed-expert MLPs (Qwen3-Next, Jamba, Granite-4, MiniMax, DeepSeek-V3) are replayed with
traceable experts (:func:`.moe.traceable_experts`).

Family facts:

- Qwen3-Next and Qwen3.5 (dense and MoE): zero-centred RMSNorm gains (the norm multiplies by
  1 + weight); the softmax layers gate their output per token (outside F, said).
- Falcon-H1: attention and a Mamba-2 mixer read the same norm of the residual in parallel; F is
  the attention's W_O W_V before its muP multipliers (``attention_in_multiplier``,
  ``attention_out_multiplier``); the mixer's contribution is not in F.
- MiniMax: the residual add is ``alpha residual + beta sublayer``; F is before beta.
- Granite-4 hybrid: sublayers are scaled by ``residual_multiplier`` before the add (F before it).
- LFM2: the final norm is ``embedding_norm``.
- DeepSeek-V3 (and V2, GLM-4.7-Flash): multi-head latent attention; W_V^h reads ``kv_b_proj``'s
  value rows through the latent (:func:`.heads.latent_value_heads`).
- DeepSeek-V3.2 and GLM-5 (DSA): the same MLA, and an indexer that keeps each query's top-k
  keys; the selection masks scores only, so F is unchanged, and the Jacobian holds it fixed at
  the recorded choice (locally constant, as expert routing is). Replays run the whole
  sequence: the indexer keeps no cache a single-query replay could hold fixed.
- Gemma 3n: its blocks carry AltUp's parallel residual streams, a [streams, batch, pos, d]
  tensor (:mod:`.streams`), recorded and replayed as [batch, pos, streams * d]; each block also
  takes a per-layer input (held fixed, as recorded). F is the attention's W_O W_V on the active
  stream, without the values' RMS norm (``v_norm``, no gain) between them; the layers that reuse
  an earlier layer's keys and values (KV sharing) have no W_V of their own, so no power rows.
  Replays run the whole sequence (no KV-cache replay), the shared keys and values held as the
  recorded forward computed them.
- Gemma 4: Gemma 3n's KV sharing, per-layer inputs and unscaled ``v_norm``, on one residual
  stream; its full-attention layers have their own head size and key/value heads (read from
  each layer: the config raises on them) and no value projection: their values are their keys
  (``attention_k_eq_v``), so W_V is the key projection. An optional routed-experts MLP runs
  beside the dense one.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .calls import BlockCallConvention
from .hf import HFFamily, HFPathsAndFinalNorm, register
from .moe import traceable_experts
from .streams import ResidualStreams

_TESTS = "tests/families/test_hybrid.py"
_EXPERTS = BlockCallConvention(replay_context=traceable_experts)
_LLAMA_PATHS = HFPathsAndFinalNorm(
    blocks="layers", attention="self_attn", value="self_attn.v_proj", output="self_attn.o_proj",
    attn_out="self_attn", attn_norm="input_layernorm", norm_placement="pre", final_norm="norm")
_NO_SOFTMAX = "attention layers only (none for linear-attention/SSM/conv layers)"
# whole-sequence replays (no KV cache a single-query replay could hold fixed), traceable experts
_WHOLE_SEQUENCE = BlockCallConvention(cache_kwargs=(), replay_context=traceable_experts)


def _multimodal(name: str, causal_lm: str) -> Callable[[Any], Optional[str]]:
    def refusal(config: Any) -> Optional[str]:
        if getattr(config, "text_config", None) is None:
            return None
        return (f"the multimodal {name} wrapper (its vision or audio towers) is not described: "
                f"load its language model alone, e.g. {causal_lm}.from_pretrained(path), or "
                "instrument model.model.language_model")
    return refusal


QWEN3_NEXT = register(HFFamily(
    name="qwen3_next", model_types=("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                                    "qwen3_5_moe_text"),
    **_LLAMA_PATHS, norm_weight_offset=1.0, norm_upcasts=True, call_convention=_EXPERTS,
    unsupported=_multimodal("Qwen3.5", "Qwen3_5ForCausalLM"), tested_by=_TESTS,
    attention_type="Gated DeltaNet + full (GQA); routed+shared experts", power_view=_NO_SOFTMAX))

JAMBA = register(HFFamily(
    name="jamba", model_types=("jamba",), **{**_LLAMA_PATHS, "final_norm": "final_layernorm"},
    norm_upcasts=True, call_convention=_EXPERTS, tested_by=_TESTS,
    attention_type="Mamba + full (GQA); dense and routed experts", power_view=_NO_SOFTMAX))

GRANITE_HYBRID = register(HFFamily(
    name="granitemoehybrid", model_types=("granitemoehybrid",), **_LLAMA_PATHS,
    norm_upcasts=True, call_convention=_EXPERTS, tested_by=_TESTS,
    attention_type="Mamba-2 + full (GQA); routed+shared experts", power_view=_NO_SOFTMAX))

LFM2 = register(HFFamily(
    name="lfm2", model_types=("lfm2",),
    **{**_LLAMA_PATHS, "output": "self_attn.out_proj", "attn_norm": "operator_norm",
       "final_norm": "embedding_norm"},
    norm_upcasts=True, tested_by=_TESTS, attention_type="short conv + full (GQA)",
    power_view=_NO_SOFTMAX))

FALCON_H1 = register(HFFamily(
    name="falcon_h1", model_types=("falcon_h1",),
    **{**_LLAMA_PATHS, "final_norm": "final_layernorm"}, norm_upcasts=True, tested_by=_TESTS,
    attention_type="attention + Mamba-2 in parallel",
    power_view="attention part only (the parallel Mamba-2 mixer is outside F)"))

MINIMAX = register(HFFamily(
    name="minimax", model_types=("minimax",), **_LLAMA_PATHS, norm_upcasts=True,
    call_convention=_EXPERTS, tested_by=_TESTS,
    attention_type="lightning (linear) + full (GQA); routed experts", power_view=_NO_SOFTMAX))

MAMBA2 = register(HFFamily(
    name="mamba", model_types=("mamba", "mamba2", "falcon_mamba"), blocks="layers", attention="self_attn",
    value="self_attn.v_proj", output="self_attn.o_proj", attn_out="self_attn",
    attn_norm="norm", norm_placement="pre", final_norm="norm_f", norm_upcasts=True,
    tested_by=_TESTS, attention_type="Mamba / Mamba-2 (no attention)", attention_free=True,
    power_view="no (no attention)"))

DEEPSEEK_V3 = register(HFFamily(
    name="deepseek_v3", model_types=("deepseek_v3", "deepseek_v2", "glm4_moe_lite"),
    **{**_LLAMA_PATHS, "value": "self_attn"}, qkv="latent", norm_upcasts=True,
    call_convention=_EXPERTS, tested_by=_TESTS,
    attention_type="multi-head latent (MLA); dense, then routed+shared experts"))


DEEPSEEK_SPARSE = register(HFFamily(
    name="deepseek_v32", model_types=("deepseek_v32", "glm_moe_dsa"),
    **{**_LLAMA_PATHS, "value": "self_attn"}, qkv="latent", norm_upcasts=True,
    call_convention=_WHOLE_SEQUENCE, tested_by=_TESTS,
    attention_type="multi-head latent (MLA) with a top-k token indexer (DSA); dense, then "
                   "routed+shared experts",
    power_view="yes (F is the value path; the indexer's selection only masks scores)"))


def _altup_streams(config: Any) -> dict[str, Any]:
    """Gemma 3n's call convention: its AltUp streams, whole-sequence replays (a reused KV
    layer reads the keys and values of an earlier one, which a single-query cache cannot
    hold fixed)."""
    text = getattr(config, "text_config", None) or config
    streams = ResidualStreams(count=int(getattr(text, "altup_num_inputs", 1)),
                              active=int(getattr(text, "altup_active_idx", 0)))
    return {"call_convention": BlockCallConvention(cache_kwargs=(), streams=streams)}


GEMMA3N = register(HFFamily(
    name="gemma3n", model_types=("gemma3n", "gemma3n_text"),
    **{**_LLAMA_PATHS, "attn_out": "post_attention_layernorm"}, norm_upcasts=True,
    variant=_altup_streams, unsupported=_multimodal("Gemma 3n", "Gemma3nForCausalLM"),
    tested_by=_TESTS,
    attention_type="AltUp residual streams; sliding + full (GQA); KV sharing",
    power_view="attention layers with their own W_V, on the active stream (v_norm outside F)",
    jacobian_view="yes (every stream: width streams x d)"))

GEMMA4 = register(HFFamily(
    name="gemma4", model_types=("gemma4", "gemma4_text"),
    **{**_LLAMA_PATHS, "attn_out": "post_attention_layernorm"}, value_from_keys="self_attn.k_proj",
    norm_upcasts=True, call_convention=_WHOLE_SEQUENCE,
    unsupported=_multimodal("Gemma 4", "Gemma4ForCausalLM"), tested_by=_TESTS,
    attention_type="sliding + full (GQA; full layers: own head size, keys = values); KV "
                   "sharing; optional routed experts beside the dense MLP",
    power_view="attention layers with their own keys/values (v_norm outside F)"))
