"""Encoder-decoder families: T5 / Flan-T5, BART, Whisper (one anatomy per stack, see stacks.py).

* T5: pre-norm with T5LayerNorm (RMS, no mean, no bias; computed in float32 whatever the model
  dtype: ``norm_upcasts``), no attention scaling, a relative position bias computed by the
  first block of each stack and passed on to the others (a recorded block input, held fixed);
  blocks return tuples ``(hidden, position_bias, cross_position_bias)``; each stack ends with
  ``final_layer_norm`` (and dropout).
* BART: post-norm (``self_attn_layer_norm`` after the residual add), learned positions.
* Whisper: pre-norm; the encoder reads ``input_features`` (a mel spectrogram) through two
  convolutions; both stacks end with ``layer_norm``.

Decoder blocks call their cross-attention (``layer.1.EncDecAttention`` / ``encoder_attn``) on
the encoder output and take the :data:`~.calls.HF_CROSS_CALLS` convention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from torch import nn

from .base import Anatomy, FamilyInfo, get_path
from .calls import HF_CALLS, HF_CROSS_CALLS
from .hf import HFFamily, base_model_of, build, model_type_of
from .registry import register_anatomy
from .stacks import EncoderDecoderAnatomy


@dataclass(frozen=True)
class EncoderDecoderFamily:
    """Where an HF encoder-decoder family keeps each stack: one :class:`HFFamily` per stack,
    its paths relative to the base model (``blocks="encoder.block"``, ``call_root="encoder"``).
    """

    name: str
    model_types: tuple[str, ...]
    encoder: HFFamily
    decoder: HFFamily
    attention_type: str = "self + cross (decoder)"


def _stack(model: nn.Module, family: HFFamily, stack: str) -> Anatomy:
    return dataclasses.replace(build(model, family), stack=stack)


def build_encoder_decoder(model: nn.Module, family: EncoderDecoderFamily
                          ) -> Union[Anatomy, EncoderDecoderAnatomy]:
    """The :class:`EncoderDecoderAnatomy` of ``model`` (one anatomy per stack), or the
    encoder's :class:`Anatomy` alone for an encoder-only model of the family.
    """
    encoder = _stack(model, family.encoder, "encoder")
    if get_path(base_model_of(model), family.decoder.blocks) is None:
        return encoder  # an encoder-only model of the family (T5EncoderModel)
    return EncoderDecoderAnatomy(family=family.name, model=model, encoder=encoder,
                                 decoder=_stack(model, family.decoder, "decoder"))


def register_encoder_decoder(family: EncoderDecoderFamily) -> EncoderDecoderFamily:
    """Register an encoder-decoder family so :func:`anatomy_of` recognises its model types."""

    def builder(model: nn.Module) -> Optional[Union[Anatomy, EncoderDecoderAnatomy]]:
        if model_type_of(model) in family.model_types and hasattr(model, "config"):
            return build_encoder_decoder(model, family)
        return None

    register_anatomy(family.name, builder, first=False, info=FamilyInfo(
        family.name, family.model_types, causal="encoder no, decoder yes",
        norm_placement=family.encoder.norm_placement, attention_type=family.attention_type,
        tested_by="tests/families/test_encoder_decoder.py"))
    return family


def _t5(stack: str) -> HFFamily:
    attn = "layer.0.SelfAttention"
    decoder = stack == "decoder"
    return HFFamily(
        name="t5", model_types=("t5",), blocks=f"{stack}.block", attention=attn,
        value=f"{attn}.v", output=f"{attn}.o", attn_out=attn, attn_norm="layer.0.layer_norm",
        norm_placement="pre", final_norm=f"{stack}.final_layer_norm", causal=decoder,
        norm_upcasts=True, call_root=stack, heads="num_heads",
        call_convention=HF_CROSS_CALLS if decoder else HF_CALLS,
        cross_value="layer.1.EncDecAttention.v" if decoder else None,
        cross_output="layer.1.EncDecAttention.o" if decoder else None,
    )


def _bart_like(name: str, stack: str, *, pre_norm: bool) -> HFFamily:
    decoder = stack == "decoder"
    return HFFamily(
        name=name, model_types=(name,), blocks=f"{stack}.layers", attention="self_attn",
        value="self_attn.v_proj", output="self_attn.out_proj", attn_out="self_attn",
        attn_norm="self_attn_layer_norm" if pre_norm else None,
        norm_placement="pre" if pre_norm else "post", final_norm=f"{stack}.layer_norm",
        causal=decoder, call_root=stack, heads=f"{stack}_attention_heads",
        call_convention=HF_CROSS_CALLS if decoder else HF_CALLS,
        cross_value="encoder_attn.v_proj" if decoder else None,
        cross_output="encoder_attn.out_proj" if decoder else None,
    )


T5 = register_encoder_decoder(EncoderDecoderFamily(
    name="t5", model_types=("t5",), encoder=_t5("encoder"), decoder=_t5("decoder"),
    attention_type="self (relative bias) + cross (decoder)"))

BART = register_encoder_decoder(EncoderDecoderFamily(
    name="bart", model_types=("bart",), encoder=_bart_like("bart", "encoder", pre_norm=False),
    decoder=_bart_like("bart", "decoder", pre_norm=False)))

WHISPER = register_encoder_decoder(EncoderDecoderFamily(
    name="whisper", model_types=("whisper",),
    encoder=_bart_like("whisper", "encoder", pre_norm=True),
    decoder=_bart_like("whisper", "decoder", pre_norm=True)))
