"""Tiny offline configs of the decoder and mixture-of-experts families (issue 15).

    >>> from tests.families.configs_decoders import make
    >>> model = make("falcon")            # FalconModel, d_model 32, 2 layers, float64

Every model: d_model 32, 2 layers, vocab 100, small intermediate sizes, random init from
``seed`` (``torch.manual_seed``), eval mode, cast to ``dtype``; nothing is downloaded. Where a
family has variants that change the attention layout (multi-query, GQA, fused qkv, parallel
blocks, ALiBi) the config picks the one that tests the most. Kept out of
``tests/tiny_models.FAMILIES`` on purpose (those drive many slow parametrized tests).
"""

from __future__ import annotations

import torch
from torch import nn

D, VOCAB, LAYERS, HEADS = 32, 100, 2, 4
_IDS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=None)  # inside the tiny vocab


def _llama_like(**extra):
    return dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=48, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, max_position_embeddings=64, **_IDS, **extra)


def _moe(**extra):
    return _llama_like(num_key_value_heads=2, **extra)


def _configs():
    import transformers as tf

    return {
        "gptj": lambda: (tf.GPTJConfig(**_IDS, vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                                       rotary_dim=4, n_inner=48, n_positions=64),
                         tf.GPTJModel),
        "opt": lambda: (tf.OPTConfig(**_IDS, vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS,
                                     ffn_dim=48, num_attention_heads=HEADS,
                                     max_position_embeddings=64, word_embed_proj_dim=D),
                        tf.OPTModel),
        "bloom": lambda: (tf.BloomConfig(**_IDS, vocab_size=VOCAB, hidden_size=D, n_layer=LAYERS,
                                         n_head=HEADS), tf.BloomModel),
        # new_decoder_architecture: grouped KV (2 groups for 4 heads), two norms in parallel
        "falcon": lambda: (tf.FalconConfig(**_IDS, vocab_size=VOCAB, hidden_size=D,
                                           num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                           num_kv_heads=2, new_decoder_architecture=True,
                                           ffn_hidden_size=48, max_position_embeddings=64,
                                           bias=True), tf.FalconModel),
        # the original Falcon-7B layout: multi-query, one shared norm, parallel attention/MLP
        "falcon_mq": lambda: (tf.FalconConfig(**_IDS, vocab_size=VOCAB, hidden_size=D,
                                              num_hidden_layers=LAYERS,
                                              num_attention_heads=HEADS, multi_query=True,
                                              parallel_attn=True, ffn_hidden_size=48,
                                              max_position_embeddings=64), tf.FalconModel),
        # the classic layout with ALiBi: per-head interleaved qkv, sequential attention/MLP
        "falcon_alibi": lambda: (tf.FalconConfig(**_IDS, vocab_size=VOCAB, hidden_size=D,
                                                 num_hidden_layers=LAYERS,
                                                 num_attention_heads=HEADS, alibi=True,
                                                 multi_query=False, parallel_attn=False,
                                                 ffn_hidden_size=48, max_position_embeddings=64,
                                                 bias=True), tf.FalconModel),
        # OPT-350m's post-norm blocks; GPT-BigCode without multi-query (per-head interleaved)
        "opt_post": lambda: (tf.OPTConfig(**_IDS, vocab_size=VOCAB, hidden_size=D,
                                          num_hidden_layers=LAYERS, ffn_dim=48,
                                          num_attention_heads=HEADS, max_position_embeddings=64,
                                          do_layer_norm_before=False), tf.OPTModel),
        "gpt_bigcode_mha": lambda: (tf.GPTBigCodeConfig(**_IDS, vocab_size=VOCAB, n_embd=D,
                                                        n_layer=LAYERS, n_head=HEADS, n_inner=48,
                                                        n_positions=64, multi_query=False),
                                    tf.GPTBigCodeModel),
        "phi": lambda: (tf.PhiConfig(**_llama_like(partial_rotary_factor=0.5)), tf.PhiModel),
        "phi3": lambda: (tf.Phi3Config(**_llama_like(num_key_value_heads=2)), tf.Phi3Model),
        "stablelm": lambda: (tf.StableLmConfig(**_llama_like(num_key_value_heads=2,
                                                             use_qkv_bias=True)),
                             tf.StableLmModel),
        "cohere": lambda: (tf.CohereConfig(**_llama_like(num_key_value_heads=2)),
                           tf.CohereModel),
        "granite": lambda: (tf.GraniteConfig(**_llama_like(num_key_value_heads=2,
                                                           residual_multiplier=0.5,
                                                           attention_multiplier=0.2)),
                            tf.GraniteModel),
        "starcoder2": lambda: (tf.Starcoder2Config(**_llama_like(num_key_value_heads=2)),
                               tf.Starcoder2Model),
        "gpt_bigcode": lambda: (tf.GPTBigCodeConfig(**_IDS, vocab_size=VOCAB, n_embd=D, n_layer=LAYERS,
                                                    n_head=HEADS, n_inner=48, n_positions=64,
                                                    multi_query=True), tf.GPTBigCodeModel),
        "mpt": lambda: (tf.MptConfig(**_IDS, vocab_size=VOCAB, d_model=D, n_layers=LAYERS,
                                     n_heads=HEADS, expansion_ratio=2, max_seq_len=64),
                        tf.MptModel),
        "nemotron": lambda: (tf.NemotronConfig(**_llama_like(num_key_value_heads=2)),
                             tf.NemotronModel),
        # mixtures of experts: 4 experts, 2 per token
        "mixtral": lambda: (tf.MixtralConfig(**_moe(num_local_experts=4,
                                                    num_experts_per_tok=2)), tf.MixtralModel),
        "qwen2_moe": lambda: (tf.Qwen2MoeConfig(**_moe(num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=16,
                                                       shared_expert_intermediate_size=24)),
                              tf.Qwen2MoeModel),
        "qwen3_moe": lambda: (tf.Qwen3MoeConfig(**_moe(num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=16,
                                                       norm_topk_prob=True)),
                              tf.Qwen3MoeModel),
        "olmoe": lambda: (tf.OlmoeConfig(**_moe(num_experts=4, num_experts_per_tok=2)),
                          tf.OlmoeModel),
    }


DECODERS = ("gptj", "opt", "bloom", "falcon", "phi", "phi3", "stablelm", "cohere", "granite",
            "starcoder2", "gpt_bigcode", "mpt", "nemotron")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# layouts a config switches, checked more cheaply (F, kv groups, a Jacobian or two)
VARIANTS = ("falcon_mq", "falcon_alibi", "opt_post", "gpt_bigcode_mha")


def make(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float64,
         experts: str | None = None) -> nn.Module:
    """A tiny randomly initialised base model of ``name`` (see the module doc).

    ``experts``: the mixture-of-experts implementation; default "eager" in float64 (HF's
    default grouped-matmul kernels refuse float64) and the transformers default otherwise."""
    configs = _configs()
    if name not in configs:
        raise ValueError(f"unknown family {name!r}: choose from {sorted(configs)}")
    config, cls = configs[name]()
    if name in MOE:
        experts = experts or ("eager" if dtype == torch.float64 else None)
        if experts is not None:
            config._experts_implementation = experts
    torch.manual_seed(seed)
    return cls(config).to(dtype).eval()
