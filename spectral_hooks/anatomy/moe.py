"""Mixtures of experts: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss, GLM-4.5 (glm4_moe), dots1,
Phi-MoE.

Llama-style attention (q/k/v/o projections in ``self_attn``, RMSNorms computing in float32)
followed by a routed MLP: a router scores the experts, the top k run, their outputs are mixed
by the (renormalised) router weights; Qwen2-MoE adds a gated shared expert. F is read from the
attention as for Llama. The block Jacobian at a point differentiates through the router: the
top-k choice is locally constant (almost everywhere), the mixing weights are differentiable,
which is exactly what forward AD through the block computes. HF's default grouped-matmul
expert kernels take neither float64 nor forward AD, and its "eager" loop over the experts hit
branches on tensor values (which ``torch.func.linearize``'s tracer refuses), so every replay
runs the experts with HF's "batched_mm" implementation: each token's selected experts'
weights gathered and applied by ``bmm``, no data-dependent control flow, any float dtype
(the user's setting is restored afterwards: ``replay_context``).
"""

from __future__ import annotations

from typing import Any, ContextManager

from torch import nn

from .calls import BlockCallConvention
from .hf import HFFamily, HFPathsAndFinalNorm, experts_implementation, register


def traceable_experts(block: nn.Module) -> ContextManager[Any]:
    """The replay context of a mixture-of-experts block: its experts run "batched_mm"."""
    return experts_implementation(block, "batched_mm")


class _MoeFacts(HFPathsAndFinalNorm):
    """The fields of :class:`HFFamily` that these families share, typed."""

    norm_upcasts: bool
    call_convention: BlockCallConvention
    tested_by: str
    attention_type: str


_MOE = _MoeFacts(blocks="layers", attention="self_attn", value="self_attn.v_proj",
                 output="self_attn.o_proj", attn_out="self_attn", attn_norm="input_layernorm",
                 norm_placement="pre", final_norm="norm", norm_upcasts=True,
                 call_convention=BlockCallConvention(replay_context=traceable_experts),
                 tested_by="tests/families/test_moe.py", attention_type="full; mixture-of-experts MLP")

MIXTRAL = register(HFFamily(name="mixtral", model_types=("mixtral",), **_MOE))
QWEN2_MOE = register(HFFamily(name="qwen2_moe", model_types=("qwen2_moe",), **_MOE))
QWEN3_MOE = register(HFFamily(name="qwen3_moe", model_types=("qwen3_moe",), **_MOE))
OLMOE = register(HFFamily(name="olmoe", model_types=("olmoe",), **_MOE))

# 2025 releases with grouped-matmul experts: gpt-oss (attention sinks; sliding and full
# layers), GLM-4.5 and dots1 (dense first layers, then routed + shared experts), Phi-MoE
# (LayerNorms, which do not upcast).
GPT_OSS = register(HFFamily(name="gpt_oss", model_types=("gpt_oss",),
                            **{**_MOE, "attention_type": "sliding/full with sinks; routed experts"}))
GLM4_MOE = register(HFFamily(name="glm4_moe", model_types=("glm4_moe",),
                             **{**_MOE, "attention_type": "full; dense, then routed+shared experts"}))
DOTS1 = register(HFFamily(name="dots1", model_types=("dots1",),
                          **{**_MOE, "attention_type": "full; dense, then routed+shared experts"}))
PHIMOE = register(HFFamily(name="phimoe", model_types=("phimoe",),
                           **{**_MOE, "norm_upcasts": False}))
