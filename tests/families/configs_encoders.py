"""Tiny offline encoders and vision towers for the family tests (d_model 32, 2 layers, 4 heads,
vocab 100, 8 x 8 images in 4 x 4 patches), float64, eval mode. Nothing is downloaded.

    >>> from tests.families.configs_encoders import make, inputs_for
    >>> model = make("vit")                   # ViTModel: CLS + 4 patches
    >>> sorted(inputs_for("vit"))
    ['pixel_values']

``RAW`` names, per family, the module whose input feeds the value projection and the output
projection, written out here independently of spectral_hooks.anatomy (the oracle's knowledge).
"""

from __future__ import annotations

import torch
from torch import nn

D_MODEL, VOCAB, IMAGE, PATCH = 32, 100, 8, 4
_COMMON = dict(hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64)
_TEXT = dict(vocab_size=VOCAB, max_position_embeddings=64, **_COMMON)
_IMAGE = dict(image_size=IMAGE, patch_size=PATCH, num_channels=3, **_COMMON)

ENCODERS = ("distilbert", "modernbert", "deberta_v2", "mpnet", "electra", "xlm_roberta")
# BERT's layers under other names and embeddings (the bert family)
BERT_CLONES = ("camembert", "data2vec_text", "ernie", "bert_generation", "roc_bert", "rembert")
VISION = ("vit", "deit", "clip_vision", "siglip_vision", "clip_text")

RAW = {
    "distilbert": ("attention.v_lin", "attention.out_lin"),
    "modernbert": ("attn.Wqkv", "attn.Wo"),
    "deberta_v2": ("attention.self.value_proj", "attention.output.dense"),
    "mpnet": ("attention.attn.v", "attention.attn.o"),
    "electra": ("attention.self.value", "attention.output.dense"),
    "xlm_roberta": ("attention.self.value", "attention.output.dense"),
    **{clone: ("attention.self.value", "attention.output.dense") for clone in BERT_CLONES},
    "vit": ("attention.v_proj", "attention.o_proj"),
    "deit": ("attention.v_proj", "attention.o_proj"),
    "clip_vision": ("self_attn.v_proj", "self_attn.out_proj"),
    "siglip_vision": ("self_attn.v_proj", "self_attn.out_proj"),
    "clip_text": ("self_attn.v_proj", "self_attn.out_proj"),
}
CAUSAL = {"clip_text": True}


def _config(family: str):
    import transformers as tf

    if family == "distilbert":
        return tf.DistilBertConfig(vocab_size=VOCAB, dim=D_MODEL, n_layers=2, n_heads=4,
                                   hidden_dim=64, max_position_embeddings=64), tf.DistilBertModel
    if family == "modernbert":  # layer 0 global, layer 1 local (window 4)
        return tf.ModernBertConfig(**_TEXT, global_attn_every_n_layers=2, local_attention=4,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                   cls_token_id=1, sep_token_id=2), tf.ModernBertModel
    if family == "deberta_v2":
        return tf.DebertaV2Config(**_TEXT, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  max_relative_positions=16, position_buckets=8), \
            tf.DebertaV2Model
    if family == "mpnet":
        return tf.MPNetConfig(**_TEXT), tf.MPNetModel
    if family == "electra":
        return tf.ElectraConfig(**_TEXT, embedding_size=16), tf.ElectraModel
    if family == "xlm_roberta":
        return tf.XLMRobertaConfig(**{**_TEXT, "max_position_embeddings": 70}), \
            tf.XLMRobertaModel
    clones = {"camembert": (tf.CamembertConfig, tf.CamembertModel),
              "data2vec_text": (tf.Data2VecTextConfig, tf.Data2VecTextModel),
              "ernie": (tf.ErnieConfig, tf.ErnieModel),
              "bert_generation": (tf.BertGenerationConfig, tf.BertGenerationEncoder),
              "roc_bert": (tf.RoCBertConfig, tf.RoCBertModel),
              "rembert": (tf.RemBertConfig, tf.RemBertModel)}
    if family in clones:
        config, cls = clones[family]
        extra = {"input_embedding_size": 16, "output_embedding_size": 16,
                 "bos_token_id": 1, "eos_token_id": 2} if family == "rembert" else {}
        return config(**{**_TEXT, "max_position_embeddings": 70, **extra}), cls
    return _vision_config(family)


def _vision_config(family: str):
    import transformers as tf

    if family == "vit":
        return tf.ViTConfig(**_IMAGE), tf.ViTModel
    if family == "deit":
        return tf.DeiTConfig(**_IMAGE), tf.DeiTModel
    if family == "clip_vision":
        return tf.CLIPVisionConfig(**_IMAGE), tf.CLIPVisionModel
    if family == "siglip_vision":
        return tf.SiglipVisionConfig(**_IMAGE), tf.SiglipVisionModel
    if family == "clip_text":
        return tf.CLIPTextConfig(**_TEXT, bos_token_id=0, eos_token_id=2), tf.CLIPTextModel
    raise ValueError(f"unknown family {family!r}: choose from {ENCODERS + VISION}")


def make(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    config, cls = _config(family)
    torch.manual_seed(seed)
    return cls(config).to(dtype).eval()


def is_vision(family: str) -> bool:
    return family in VISION and family != "clip_text"


def inputs_for(family: str, *, batch: int = 2, length: int = 6, seed: int = 1) -> dict:
    """The model's keyword inputs: token ids [batch, length] or images [batch, 3, 8, 8]."""
    g = torch.Generator().manual_seed(seed)
    if is_vision(family):
        return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=g,
                                            dtype=torch.float64)}
    return {"input_ids": torch.randint(3, VOCAB, (batch, length), generator=g)}


def f_call(family: str):
    """How the F oracle runs the model on at least d + 1 sequences (see harness.oracle_F)."""
    n = 4 * D_MODEL
    if is_vision(family):
        return lambda model: model(**inputs_for(family, batch=n))
    return lambda model: model(**inputs_for(family, batch=n, length=1))
