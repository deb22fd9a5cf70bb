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
from .anatomy.wrappers import weights_in
from .checks import check_bool, check_float_dtype
from .errors import NonFiniteComputationError, OptionError
from .linalg import LinearOperator, LowRankOperator, merge_shared_factors
from .linalg.lowrank import shared_value_groups

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
                   dtype: torch.dtype = torch.float64, attention: str = "self",
                   device: Union[str, torch.device] = "cpu") -> Tensor:
    """Tensor[L, d, d]: F_t for every layer (shared blocks computed once), on ``device`` (the
    CPU by default).

    ``fold_norm=True`` multiplies F on the right by diag(gain) of the norm feeding attention
    (Gemma: 1 + weight); layers without such a norm (post-norm models) are left as they are.
    ``attention="cross"``: F of the cross-attention of a decoder stack (it maps the encoder
    output into the decoder's residual stream), e.g.
    ``layer_matrices(anatomy_of(t5).decoder, attention="cross")``; no ``fold_norm`` then.

        >>> from transformers import GPT2Config, GPT2Model
        >>> layer_matrices(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))).shape
        torch.Size([2, 32, 32])
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
                W_O, W_V = (w.to(device, dtype) for w in _weights(part, attention))
                gain = part.attn_norm_weight() if fold_norm else None
                if callable(getattr(gain, "full_tensor", None)):
                    gain = gain.full_tensor()  # pyright: ignore  # an FSDP2 shard (DTensor): every rank gathers it
            F = torch.einsum("hdk,hkm->dm", W_O, W_V)
            if gain is not None:
                F = F * gain.to(device, dtype)[None, :]
            cache[key] = F
        out.append(cache[key])
    return torch.stack(out)


def head_weights(anatomy: Anatomy, *, fold_norm: bool = False,
                 dtype: torch.dtype = torch.float64) -> list[tuple[Tensor, Tensor]]:
    """Per layer (W_V [H, d_head, d], W_O [H, d, d_head]) on the CPU (GQA groups expanded to
    H heads), so that sum_h W_O[h] @ W_V[h] is ``layer_matrices(...)[t]``; ``fold_norm``
    multiplies W_V on the right by diag(gain) of the norm feeding attention, as there."""
    check_bool("fold_norm", fold_norm)
    out = []
    for part in anatomy.layers:
        with weights_in(part.block, where=f"layer {part.index}"):
            W_O, W_V = (w.to("cpu", dtype) for w in _weights(part, "self"))
            gain = part.attn_norm_weight() if fold_norm else None
        if gain is not None:
            W_V = W_V * gain.to("cpu", dtype)[None, None, :]
        out.append((W_V, W_O))
    return out


def layer_biases(model: Union[nn.Module, Anatomy], *, dtype: torch.dtype = torch.float64
                 ) -> Tensor:
    """Tensor[L, d]: c_t = W_O b_V + b_O, the constant part of each attention layer's output.

        >>> from transformers import GPT2Config, GPT2Model
        >>> layer_biases(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))).shape
        torch.Size([2, 32])
    """
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


def krylov_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (CPU, CUDA), float32 elsewhere (MPS)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


class LayerOperators:
    """F_t = W_O W_V of every layer as a :class:`~spectral_hooks.linalg.LowRankOperator`
    applied as two thin products (x -> W_O (W_V x)), never formed: ``ops[t]`` builds layer t's
    operator when asked (its factors, 2 d r numbers, live as long as the operator), on the
    model's device, in float64 where the device has it. Heads that share their W_V (grouped-query
    attention) share one block of the factors, so r = (key/value heads) x d_head; the power
    view then gets F's full spectrum exactly from the r x r matrix W_V W_O where r is small
    (``metrics.spectrum.FACTORED_EXACT_MAX``). ``shape`` is (L, d, d), like the dense stack's.

        >>> from transformers import GPT2Config, GPT2Model
        >>> ops = layer_operators(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
        >>> ops.shape, torch.allclose(ops[1].to_dense(), layer_matrices(ops.anatomy)[1])
        ((2, 32, 32), True)
    """

    def __init__(self, anatomy: Anatomy, *, fold_norm: bool, attention: str) -> None:
        self.anatomy: Anatomy = anatomy
        self.fold_norm: bool = fold_norm
        self.attention: str = attention
        d = anatomy.d_model
        self.shape: tuple[int, int, int] = (anatomy.n_layers, d, d)
        self.ndim: int = 3
        with weights_in(anatomy.layers[0].block, where="layer 0"):  # offloaded: its real device
            self.device: torch.device = _weights(anatomy.layers[0], attention)[0].device
        self.dtype: torch.dtype = krylov_dtype(self.device)

    def __len__(self) -> int:
        return self.shape[0]

    def inner_width(self, t: int) -> int:
        """r of layer t's factors (``ops[t].rank_bound``) from its W_V alone, nothing copied."""
        part = self.anatomy.layers[t]
        with weights_in(part.block, where=f"layer {part.index}"):
            W_V = _weights(part, self.attention)[1]
            return len(shared_value_groups(W_V.detach())[1]) * W_V.shape[1]

    def __getitem__(self, t: int) -> LinearOperator:
        part = self.anatomy.layers[t]
        with weights_in(part.block, where=f"layer {part.index}"):  # offloaded / meta
            W_O, W_V = (w.detach().to(self.device, self.dtype)
                        for w in _weights(part, self.attention))
            gain = part.attn_norm_weight() if self.fold_norm else None
            if callable(getattr(gain, "full_tensor", None)):
                gain = gain.full_tensor()  # pyright: ignore  # an FSDP2 shard (DTensor): every rank gathers it
        A, B = merge_shared_factors(W_O, W_V)  # [d, r], [r, d]: GQA copies of W_V merged
        if gain is not None:
            B = B * gain.to(self.device, self.dtype)[None, :]
        if not bool(torch.isfinite(A).all() & torch.isfinite(B).all()):  # once per layer
            raise NonFiniteComputationError(
                f"W_O or W_V of layer {t} is not finite: restore finite attention weights, "
                "then analyse again", layer=t)
        return LowRankOperator(A, B, name=f"F_{t}")


def layer_operators(model: Union[nn.Module, Anatomy], *, fold_norm: bool = False,
                    attention: str = "self") -> LayerOperators:
    """The matrix-free counterpart of :func:`layer_matrices` (same arguments, no ``dtype``:
    float64 where the model's device has it): a :class:`LayerOperators`."""
    check_bool("fold_norm", fold_norm)
    if attention not in ATTENTIONS:
        raise OptionError("attention", attention, f"one of {ATTENTIONS}")
    return LayerOperators(_anatomy(model), fold_norm=fold_norm, attention=attention)
