"""A layer's attention factors as its forward uses them, and the layer matrices built from them.

    >>> from transformers import GPT2Config, GPT2Model
    >>> F = layer_matrices(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
    >>> F.shape, F.dtype
    (torch.Size([2, 32, 32]), torch.float64)

Every reader of W_O, W_V and the norm gain (the power view, both dense and matrix-free, the
idealised attention, the training events) goes through :func:`layer_factors`: it brings
offloaded weights in, refuses meta weights, reads the effective matrices
(:mod:`spectral_hooks.anatomy.effective`: PEFT adapters, parametrizations, FSDP2 shards
gathered) and gathers a sharded norm gain. :class:`LayerFactors` then forms F_t = sum_h W_O^h
W_V^h diag(gain) (:meth:`LayerFactors.matrix`) or applies it as two thin products
(:meth:`LayerFactors.operator`), one formula each.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union, cast

import torch
from torch import Tensor, nn

from ..checks import check_bool, check_float_dtype
from ..errors import MissingWeightsError, NonFiniteComputationError, OptionError
from ..linalg import LinearOperator, LowRankOperator, merge_shared_factors
from ..linalg.lowrank import shared_value_groups
from .base import Anatomy, LayerParts
from .registry import anatomy_of
from .stacks import stack_of
from .wrappers import weights_in

__all__ = ["ATTENTIONS", "LayerFactors", "LayerOperators", "head_weights", "krylov_dtype",
           "layer_biases", "layer_factors", "layer_matrices", "layer_operators"]

ATTENTIONS = ("self", "cross")
DeviceLike = Union[str, torch.device, None]


def _anatomy(model_or_anatomy: Union[nn.Module, Anatomy]) -> Anatomy:
    if isinstance(model_or_anatomy, Anatomy):
        return model_or_anatomy
    return stack_of(anatomy_of(model_or_anatomy), what="layer_matrices")


def _check_attention(attention: str, fold_norm: bool) -> None:
    check_bool("fold_norm", fold_norm)
    if attention not in ATTENTIONS:
        raise OptionError("attention", attention, f"one of {ATTENTIONS}")
    if attention == "cross" and fold_norm:
        raise OptionError("fold_norm", fold_norm, "False with attention='cross'",
                          hint="the cross-attention values read the encoder output, not the "
                          "output of a norm of this stack")


def _gathered(tensor: Optional[Tensor]) -> Optional[Tensor]:
    """``tensor``, or the whole of an FSDP2 shard (DTensor): a collective, every rank calls it."""
    gather = getattr(tensor, "full_tensor", None)
    return cast(Tensor, gather()) if callable(gather) else tensor


@dataclass(frozen=True)
class LayerFactors:
    """Layer ``layer``'s W_O [H, d, d_head], W_V [H, d_head, d] (GQA groups expanded to H heads)
    and the gain [d] of the norm feeding attention (None unless ``fold_norm``), detached.

        >>> W_O, W_V = torch.ones(2, 3, 1, dtype=torch.float64), torch.ones(2, 1, 3, dtype=torch.float64)
        >>> factors = LayerFactors(0, W_O, W_V, None)
        >>> factors.matrix()[0].tolist(), factors.inner_width()
        ([2.0, 2.0, 2.0], 1)
    """

    layer: int
    W_O: Tensor
    W_V: Tensor
    gain: Optional[Tensor]

    @property
    def d_model(self) -> int:
        """The residual width (columns of W_O)."""
        return int(self.W_O.shape[1])

    def to(self, device: DeviceLike, dtype: Optional[torch.dtype]) -> "LayerFactors":
        """The same factors on ``device`` in ``dtype``."""
        return LayerFactors(self.layer, self.W_O.to(device, dtype), self.W_V.to(device, dtype),
                            None if self.gain is None else self.gain.to(device, dtype))

    def matrix(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """F = sum_h W_O^h W_V^h diag(gain), [d, d], on the factors' device, in ``dtype`` (None:
        the factors')."""
        f = self if dtype is None else self.to(self.W_O.device, dtype)
        F = torch.einsum("hdk,hkm->dm", f.W_O, f.W_V)
        return F * f.gain[None, :] if f.gain is not None else F

    @functools.cached_property
    def value_groups(self) -> tuple[list[int], list[int]]:
        """``linalg.lowrank.shared_value_groups(W_V)``: heads sharing a W_V, found once."""
        return shared_value_groups(self.W_V)

    def inner_width(self) -> int:
        """r of :meth:`operator`'s factors: (distinct W_V heads) x d_head, nothing copied."""
        return len(self.value_groups[1]) * int(self.W_V.shape[1])

    def operator(self, dtype: Optional[torch.dtype] = None) -> LowRankOperator:
        """F as x -> A (B x) with A [d, r], B [r, d] (heads sharing a W_V merged, the gain
        folded into B), never formed, in ``dtype`` (None: the factors'; only A and B are
        converted); NonFiniteComputationError when a factor is not finite."""
        A, B = merge_shared_factors(self.W_O, self.W_V, groups=self.value_groups, dtype=dtype)
        if self.gain is not None:
            B = B * self.gain.to(B.dtype)[None, :]
        if not bool(torch.isfinite(A).all() & torch.isfinite(B).all()):  # once per layer
            raise NonFiniteComputationError(
                f"W_O or W_V of layer {self.layer} is not finite: restore finite attention "
                "weights, then analyse again", layer=self.layer)
        return LowRankOperator(A, B, name=f"F_{self.layer}")


def layer_factors(part: LayerParts, *, fold_norm: bool = False, attention: str = "self",
                  device: DeviceLike = None, dtype: Optional[torch.dtype] = None
                  ) -> LayerFactors:
    """The one reader of a layer's attention factors: :class:`LayerFactors` of ``part``,
    copied to ``device`` / ``dtype`` (None: left where and as they are).

    Offloaded weights (accelerate) are brought in for the read, meta weights refused; W_O and
    W_V are the effective matrices the forward uses; ``fold_norm`` adds the gain of the norm
    feeding attention (Gemma: 1 + weight), gathered whole when it is an FSDP2 shard.
    ``attention="cross"``: a decoder block's cross-attention (no ``fold_norm`` then).

        >>> from transformers import GPT2Config, GPT2Model
        >>> from spectral_hooks import anatomy_of
        >>> part = anatomy_of(GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4))).layers[0]
        >>> factors = layer_factors(part, fold_norm=True, dtype=torch.float64)
        >>> factors.W_V.shape, factors.gain.shape
        (torch.Size([4, 8, 32]), torch.Size([32]))
    """
    _check_attention(attention, fold_norm)
    with weights_in(part.block, where=f"layer {part.index}"):  # offloaded / meta
        if attention == "cross":
            W_O, W_V = part.cross_output_weights(), part.cross_value_weights()
        else:
            W_O, W_V = part.output_weights(), part.value_weights()
        gain = _gathered(part.attn_norm_weight()) if fold_norm else None
        W_O, W_V = (w.detach().to(device, dtype) for w in (W_O, W_V))
        if gain is not None:
            gain = gain.detach().to(device, dtype)
    return LayerFactors(part.index, W_O, W_V, gain)


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
    A layer without an OV map (a hybrid stack's Mamba, linear-attention or convolution layer:
    ``LayerParts.has_ov_map``) is all NaN: there is no F to give.

        >>> from transformers import GPT2Config, GPT2Model
        >>> layer_matrices(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))).shape
        torch.Size([2, 32, 32])
    """
    check_float_dtype("dtype", dtype)
    _check_attention(attention, fold_norm)
    anatomy = _anatomy(model)
    cache: dict = {}
    out: list[Optional[Tensor]] = []
    for part in anatomy.layers:
        key = id(part.block)
        if attention == "self" and not part.has_ov_map:
            out.append(None)  # no softmax attention (a hybrid's Mamba layer): NaN below
            continue
        if key not in cache:
            cache[key] = layer_factors(part, fold_norm=fold_norm, attention=attention,
                                       device=device, dtype=dtype).matrix()
        out.append(cache[key])
    like = next((F for F in out if F is not None), None)
    if like is None:
        raise MissingWeightsError(f"no layer of {anatomy.family} has an OV map: "
                                  f"{anatomy.power_coverage()}")
    return torch.stack([like.new_full(like.shape, float("nan")) if F is None else F
                        for F in out])


def head_weights(anatomy: Anatomy, *, fold_norm: bool = False,
                 dtype: torch.dtype = torch.float64) -> list[tuple[Tensor, Tensor]]:
    """Per layer (W_V [H, d_head, d], W_O [H, d, d_head]) on the CPU (GQA groups expanded to
    H heads), so that sum_h W_O[h] @ W_V[h] is ``layer_matrices(...)[t]``; ``fold_norm``
    multiplies W_V on the right by diag(gain) of the norm feeding attention, as there.

        >>> from transformers import GPT2Config, GPT2Model
        >>> from spectral_hooks import anatomy_of
        >>> W_V, W_O = head_weights(anatomy_of(GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4))))[0]
        >>> W_V.shape, W_O.shape
        (torch.Size([4, 8, 32]), torch.Size([4, 32, 8]))
    """
    out = []
    for part in anatomy.layers:
        f = layer_factors(part, fold_norm=fold_norm, device="cpu", dtype=dtype)
        out.append((f.W_V * f.gain[None, None, :] if f.gain is not None else f.W_V, f.W_O))
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

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def device(self) -> torch.device:
        """Where layer 0's weights are used (offloaded: the device they are brought in to)."""
        return layer_factors(self.anatomy.layers[0], attention=self.attention).W_O.device

    @property
    def dtype(self) -> torch.dtype:
        """float64 where :attr:`device` has it (:func:`krylov_dtype`)."""
        return krylov_dtype(self.device)

    def inner_width(self, t: int) -> int:
        """r of layer t's factors (``ops[t].rank_bound``) from its weights, nothing copied."""
        return layer_factors(self.anatomy.layers[t], attention=self.attention).inner_width()

    def factors(self, t: int, *, convert: bool = True) -> LayerFactors:
        """Layer t's :class:`LayerFactors` where its weights are used (offloaded: brought in),
        in float64 where that device has it (:func:`krylov_dtype`); ``convert=False``: in the
        weights' own dtype (for :meth:`LayerFactors.operator` / ``matrix`` with a ``dtype``,
        which convert only what they build)."""
        factors = layer_factors(self.anatomy.layers[t], fold_norm=self.fold_norm,
                                attention=self.attention)
        device = factors.W_O.device
        return factors.to(device, krylov_dtype(device)) if convert else factors

    def __getitem__(self, t: int) -> LinearOperator:
        factors = self.factors(t, convert=False)
        return factors.operator(krylov_dtype(factors.W_O.device))


def layer_operators(model: Union[nn.Module, Anatomy], *, fold_norm: bool = False,
                    attention: str = "self") -> LayerOperators:
    """The matrix-free counterpart of :func:`layer_matrices` (same arguments, no ``dtype``:
    float64 where the model's device has it): a :class:`LayerOperators`.

        >>> from transformers import GPT2Config, GPT2Model
        >>> layer_operators(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))).shape
        (2, 32, 32)
    """
    _check_attention(attention, fold_norm)
    return LayerOperators(_anatomy(model), fold_norm=fold_norm, attention=attention)
