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

from .calls import HF_CALLS, HF_CROSS_CALLS
from .hf import HFFamily
from .stacks import EncoderDecoderFamily, register_encoder_decoder


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
