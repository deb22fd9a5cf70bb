"""Layer matrices F_t = sum_h W_O^h W_V^h read from any model through its anatomy.

    >>> from transformers import GPT2Config, GPT2Model
    >>> F = layer_matrices(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
    >>> F.shape, F.dtype
    (torch.Size([2, 32, 32]), torch.float64)
"""

from __future__ import annotations

from typing import Union

import torch
from torch import Tensor, nn

from .anatomy import Anatomy, anatomy_of, stack_of
from .checks import check_bool, check_float_dtype
from .errors import OptionError
from .wrappers import weights_in

ATTENTIONS = ("self", "cross")


def _anatomy(model_or_anatomy: Union[nn.Module, Anatomy]) -> Anatomy:
    if isinstance(model_or_anatomy, Anatomy):
        return model_or_anatomy
    return stack_of(anatomy_of(model_or_anatomy), what="layer_matrices")


def _weights(part, attention: str) -> tuple[Tensor, Tensor]:
    if attention == "cross":
        return part.cross_output_weights(), part.cross_value_weights()
    return part.output_weights(), part.value_weights()


def layer_matrices(model: Union[nn.Module, Anatomy], *, fold_norm: bool = False,
                   dtype: torch.dtype = torch.float64, attention: str = "self") -> Tensor:
    """Tensor[L, d, d]: F_t for every layer (shared blocks computed once), on the CPU.

    ``fold_norm=True`` multiplies F on the right by diag(gain) of the norm feeding attention
    (Gemma: 1 + weight); layers without such a norm (post-norm models) are left as they are.
    ``attention="cross"``: F of the cross-attention of a decoder stack (it maps the encoder
    output into the decoder's residual stream), e.g.
    ``layer_matrices(anatomy_of(t5).decoder, attention="cross")``; no ``fold_norm`` then.
    """
    check_bool("fold_norm", fold_norm)
    check_float_dtype("dtype", dtype)
    if attention not in ATTENTIONS:
        raise OptionError("attention", attention, f"one of {ATTENTIONS}")
    if attention == "cross" and fold_norm:
        raise OptionError("fold_norm", fold_norm, "False with attention='cross'",
                          hint="the cross-attention values read the encoder output, not the "
                          "output of a norm of this stack")
    anatomy = _anatomy(model)
    cache: dict = {}
    out = []
    for part in anatomy.layers:
        key = id(part.block)
        if key not in cache:
            with weights_in(part.block, where=f"layer {part.index}"):  # offloaded / meta
                W_O, W_V = (w.to("cpu", dtype) for w in _weights(part, attention))
                gain = part.attn_norm_weight() if fold_norm else None
                if callable(getattr(gain, "full_tensor", None)):
                    gain = gain.full_tensor()  # an FSDP2 shard: every rank gathers it
            F = torch.einsum("hdk,hkm->dm", W_O, W_V)
            if gain is not None:
                F = F * gain.to("cpu", dtype)[None, :]
            cache[key] = F
        out.append(cache[key])
    return torch.stack(out)


def layer_biases(model: Union[nn.Module, Anatomy], *, dtype: torch.dtype = torch.float64
                 ) -> Tensor:
    """Tensor[L, d]: c_t = W_O b_V + b_O, the constant part of each attention layer's output."""
    check_float_dtype("dtype", dtype)
    anatomy = _anatomy(model)
    out = []
    for part in anatomy.layers:
        W_O = part.output_weights().to("cpu", dtype)
        c = torch.zeros(W_O.shape[1], dtype=dtype)
        b_V, b_O = part.value_bias(), part.output_bias()
        if b_V is not None:
            c = c + torch.einsum("hdk,hk->d", W_O, b_V.to("cpu", dtype))
        if b_O is not None:
            c = c + b_O.to("cpu", dtype)
        out.append(c)
    return torch.stack(out)
