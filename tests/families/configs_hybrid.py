"""Tiny offline configs of the 2025-2026 architectures (issue 54): hybrid stacks, latent
attention, routed experts with grouped kernels, sliding/full and RoPE/NoPE stacks.

    >>> from tests.families.configs_hybrid import make
    >>> model = make("jamba")            # JambaModel: a Mamba layer, then an attention layer

Every model: d_model 32, 2 layers whose kinds differ where the architecture mixes kinds (Gemma
3n and Gemma 4: 4, for their key/value sharing),
4 experts (2 per token), vocab 100, random init from ``seed``, eval mode, cast to ``dtype``;
nothing is downloaded. In float64 the experts run HF's "eager" loop (the default grouped-matmul
kernels have no float64 kernel): the user's own float64 model must, too.
"""

from __future__ import annotations

import torch
from torch import nn

D, VOCAB = 32, 100
_IDS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _base(**extra):
    return dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64, **_IDS, **extra)


# multi-head latent attention (and its experts: layer 0 dense, layer 1 routed + shared)
_MLA = dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
            qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)


# Gated DeltaNet, then gated softmax attention
_DELTANET = dict(head_dim=8, linear_num_value_heads=4, linear_num_key_heads=2,
                 linear_key_head_dim=8, linear_value_head_dim=8,
                 layer_types=["linear_attention", "full_attention"])


def _experts(**extra):
    return _base(num_key_value_heads=2, num_experts_per_tok=2, **extra)


def _configs():
    import transformers as tf

    return {
        # multi-head latent attention; layer 0 dense, layer 1 routed + shared experts
        "deepseek_v3": lambda: tf.DeepseekV3Config(**_base(**_MLA)),
        # the same MLA, and a top-k token indexer (DSA) that keeps 4 of each query's keys
        "deepseek_v32": lambda: tf.DeepseekV32Config(**_base(**_MLA, index_n_heads=2,
                                                             index_head_dim=8, index_topk=4)),
        "glm_moe_dsa": lambda: tf.GlmMoeDsaConfig(**_base(**_MLA, index_n_heads=2,
                                                          index_head_dim=8, index_topk=4)),
        "glm4_moe_lite": lambda: tf.Glm4MoeLiteConfig(**_base(**_MLA)),
        "qwen3_next": lambda: tf.Qwen3NextConfig(**_experts(
            **_DELTANET, num_experts=4, moe_intermediate_size=16,
            shared_expert_intermediate_size=16)),
        "qwen3_5_text": lambda: tf.Qwen3_5TextConfig(**_base(num_key_value_heads=2,
                                                            **_DELTANET)),
        "qwen3_5_moe_text": lambda: tf.Qwen3_5MoeTextConfig(**_experts(
            **_DELTANET, num_experts=4, moe_intermediate_size=16,
            shared_expert_intermediate_size=16)),
        "lfm2": lambda: tf.Lfm2Config(**_base(num_key_value_heads=2,
                                              layer_types=["conv", "full_attention"])),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(**_experts(
            layer_types=["mamba", "attention"], num_local_experts=4, mamba_n_heads=4,
            mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8,
            shared_intermediate_size=16)),
        "jamba": lambda: tf.JambaConfig(**_experts(
            num_experts=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=1, mamba_d_state=8, mamba_expand=2)),
        "mamba2": lambda: tf.Mamba2Config(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2,
                                          num_heads=4, head_dim=16, state_size=8, n_groups=1,
                                          chunk_size=8, **_IDS),
        "gpt_oss": lambda: tf.GptOssConfig(**_experts(
            head_dim=8, num_local_experts=4, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"])),
        "glm4_moe": lambda: tf.Glm4MoeConfig(**_experts(
            head_dim=8, n_routed_experts=4, moe_intermediate_size=16, first_k_dense_replace=1,
            n_group=1, topk_group=1)),
        "dots1": lambda: tf.Dots1Config(**_experts(
            head_dim=8, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16,
            first_k_dense_replace=1, n_group=1, topk_group=1)),
        "phimoe": lambda: tf.PhimoeConfig(**_experts(num_local_experts=4)),
        "minimax": lambda: tf.MiniMaxConfig(**_experts(
            head_dim=8, num_local_experts=4, block_size=4,
            layer_types=["linear_attention", "full_attention"])),
        "exaone4": lambda: tf.Exaone4Config(**_base(
            num_key_value_heads=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"])),
        "smollm3": lambda: tf.SmolLM3Config(**_base(num_key_value_heads=2,
                                                    no_rope_layers=[1, 0])),
        "cohere2": lambda: tf.Cohere2Config(**_base(
            num_key_value_heads=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"])),
        "falcon_h1": lambda: tf.FalconH1Config(**_base(
            num_key_value_heads=2, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8,
            mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=1,
            mamba_d_conv=4)),
        # AltUp: 3 residual streams; layers 2-3 reuse the keys/values of layers 0-1 (KV
        # sharing); layer 0's MLP keeps its top 5% activations (Gaussian top-k sparsity)
        "gemma3n_text": lambda: tf.Gemma3nTextConfig(**{**_base(
            num_key_value_heads=2, head_dim=8, vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=8, num_kv_shared_layers=2, laurel_rank=4,
            activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0], altup_num_inputs=3,
            sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2),
            "num_hidden_layers": 4}),
        # full-attention layers with their own head size (16) and one key/value head, whose
        # values are their keys; layers 2-3 reuse 0-1's keys/values; routed experts beside
        # the dense MLP; per-layer inputs
        "gemma4_text": lambda: tf.Gemma4TextConfig(**{**_base(
            num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=4, num_kv_shared_layers=2,
            layer_types=["sliding_attention", "full_attention"] * 2,
            vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16),
            "num_hidden_layers": 4}),
    }


#: the architectures with one residual stream (Gemma 3n's AltUp streams: its own tests)
SUPPORTED = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite", "qwen3_next",
             "qwen3_5_text", "qwen3_5_moe_text",
             "lfm2", "granitemoehybrid", "jamba", "mamba2", "gpt_oss", "glm4_moe", "dots1",
             "phimoe", "minimax", "exaone4", "smollm3", "cohere2", "falcon_h1")


def make(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A tiny randomly initialised base model of ``name`` (see the module doc)."""
    import transformers as tf

    configs = _configs()
    if name not in configs:
        raise ValueError(f"unknown architecture {name!r}: choose from {sorted(configs)}")
    config = configs[name]()
    if dtype == torch.float64 and hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"
    torch.manual_seed(seed)
    return tf.AutoModel.from_config(config).to(dtype).eval()
