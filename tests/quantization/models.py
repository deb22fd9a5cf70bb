"""Tiny Llama models quantized by the real libraries, offline on the CPU, and their float copies.

Every quantized model comes from one float model (seeded, d_model 64: bitsandbytes' 4-bit CPU
layout needs multiples of 32 and 64). ``float_copy(q)`` is that float model with each Linear
weight replaced by the quantized layer's dequantized weight: the oracle of every table.
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

D, VOCAB, LAYERS = 64, 100, 2
IDS = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))

#: the kinds the acceptance names (bnb nf4 after the repack: eval forwards under no_grad)
KINDS = ("torchao_int8", "torchao_int4", "bnb_nf4", "bnb_int8", "quanto_qint4", "hqq_4bit")
LIBRARY = {"torchao_int8": "torchao", "torchao_int4": "torchao", "torchao_float8": "torchao",
           "torchao_dynamic_int8": "torchao", "bnb_nf4": "bitsandbytes",
           "bnb_fp4": "bitsandbytes", "bnb_int8": "bitsandbytes", "quanto_qint4": "optimum.quanto",
           "hqq_4bit": "hqq"}


def config():
    import transformers as tf

    return tf.LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=128,
                          num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                          pad_token_id=0)


@functools.lru_cache(maxsize=None)
def _saved_float(lm_head: bool = False) -> str:
    """The float model saved once to a temporary directory (bitsandbytes quantizes at load)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="sh_quant_")
    base_model(lm_head).save_pretrained(folder)
    return folder


def base_model(lm_head: bool = False):
    import transformers as tf

    torch.manual_seed(0)
    cls = tf.LlamaForCausalLM if lm_head else tf.LlamaModel
    return cls(config()).eval()


def _replace_linears(model, make):
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and name != "lm_head":
                setattr(module, name, make(child))


def quantized(kind: str, *, lm_head: bool = False, repack: bool = True):
    """The tiny Llama quantized by ``kind`` (one of KINDS, or "bnb_fp4"); bitsandbytes 4-bit
    models have run one eval forward under no_grad (bitsandbytes repacks then, on CPUs with
    AVX512-BF16) unless ``repack=False``."""
    pytest.importorskip(LIBRARY[kind])
    import transformers as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind.startswith("bnb"):
            if kind == "bnb_int8":
                qc = tf.BitsAndBytesConfig(load_in_8bit=True)
            else:
                qc = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind[4:],
                                           bnb_4bit_use_double_quant=True,
                                           bnb_4bit_compute_dtype=torch.float32)
            cls = tf.LlamaForCausalLM if lm_head else tf.LlamaModel
            model = cls.from_pretrained(_saved_float(lm_head), quantization_config=qc,
                                        device_map="cpu").eval()
            if repack:
                with torch.no_grad():
                    model(input_ids=IDS)
            return model
        model = base_model(lm_head)
        if kind.startswith("torchao"):
            from torchao.quantization import (
                Int8WeightOnlyConfig,
                IntxWeightOnlyConfig,
                quantize_,
            )

            if kind == "torchao_float8":
                from torchao.quantization import Float8WeightOnlyConfig as cfg_class

                cfg = cfg_class()
            elif kind == "torchao_dynamic_int8":  # activations quantized too
                from torchao.quantization import Int8DynamicActivationInt8WeightConfig

                cfg = Int8DynamicActivationInt8WeightConfig()
            else:
                cfg = (Int8WeightOnlyConfig() if kind == "torchao_int8"
                       else IntxWeightOnlyConfig(weight_dtype=torch.int4))
            quantize_(model, cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear)
                      and "lm_head" not in fqn)
        elif kind == "quanto_qint4":
            from optimum.quanto import freeze, qint4, quantize

            quantize(model, weights=qint4, exclude="lm_head")
            freeze(model)
        elif kind == "hqq_4bit":
            from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

            qc = BaseQuantizeConfig(nbits=4, group_size=64)
            _replace_linears(model, lambda lin: HQQLinear(lin, qc, compute_dtype=torch.float32,
                                                          device="cpu"))
        else:
            raise ValueError(kind)
        return model


def float_copy(qmodel, lm_head: bool = False):
    """The float model whose Linear weights are ``qmodel``'s dequantized (verified) weights."""
    from spectral_hooks.anatomy.quantized import dequantized, quantization_of

    model = base_model(lm_head)
    layers = dict(qmodel.named_modules())
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and quantization_of(layers[name]) is not None:
            with torch.no_grad():
                module.weight.copy_(dequantized(layers[name]).to(torch.float32))
    return copy.deepcopy(model)
