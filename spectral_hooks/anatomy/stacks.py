"""Encoder-decoder models: one :class:`~spectral_hooks.anatomy.base.Anatomy` per stack.

    >>> from transformers import T5Config, T5Model
    >>> from spectral_hooks import anatomy_of
    >>> anat = anatomy_of(T5Model(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2,
    ...                                    num_heads=4, vocab_size=100)))
    >>> anat.family, anat.encoder.causal, anat.decoder.causal, anat.decoder.stack
    ('t5', False, True, 'decoder')
    >>> anat.decoder.layers[0].cross_value_weights().shape   # [H, d_head, d_model]
    torch.Size([4, 8, 32])

Each stack is an ordinary Anatomy (its ``call_root`` is the stack module, so a probe sees one
forward call per stack call; ``stack`` names it). The encoder is bidirectional, the decoder
causal; decoder blocks also name their cross-attention projections, and are called with the
encoder output and the cross-attention mask, which a block replay holds fixed as recorded.
An encoder-only model of such a family (``T5EncoderModel``) is a plain Anatomy of its encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from torch import nn

from ..errors import OptionError, UnsupportedModelError
from .base import Anatomy

__all__ = ["EncoderDecoderAnatomy", "STACKS", "stack_of"]

STACKS = ("encoder", "decoder")


@dataclass(frozen=True)
class EncoderDecoderAnatomy:
    """The two stacks of an encoder-decoder model, each a frozen :class:`Anatomy`.

        >>> from transformers import T5Config, T5Model
        >>> from spectral_hooks import anatomy_of
        >>> t5 = T5Model(T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
        ...                       vocab_size=100))
        >>> anatomy = anatomy_of(t5)
        >>> type(anatomy).__name__, anatomy.encoder.n_layers, anatomy.decoder.n_layers
        ('EncoderDecoderAnatomy', 2, 2)
    """

    family: str
    model: nn.Module
    encoder: Anatomy
    decoder: Anatomy

    @property
    def stacks(self) -> dict[str, Anatomy]:
        """``{"encoder": ..., "decoder": ...}`` in the order the model runs them."""
        return {"encoder": self.encoder, "decoder": self.decoder}

    def __getitem__(self, stack: str) -> Anatomy:
        if stack not in STACKS:
            raise OptionError("stack", stack, f"one of {STACKS}")
        return self.stacks[stack]


def stack_of(anatomy: Union[Anatomy, EncoderDecoderAnatomy], stack: Optional[str] = None,
             *, what: str = "this") -> Anatomy:
    """The Anatomy of ``stack`` ("encoder"/"decoder") of an encoder-decoder anatomy, or
    ``anatomy`` itself when ``stack`` is None and it has one stack; a clear error otherwise.

        >>> from transformers import T5Config, T5Model
        >>> from spectral_hooks import anatomy_of
        >>> anat = anatomy_of(T5Model(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2,
        ...                                    num_heads=4, vocab_size=100)))
        >>> stack_of(anat, "decoder").stack
        'decoder'
    """
    if isinstance(anatomy, EncoderDecoderAnatomy):
        if stack is None:
            raise UnsupportedModelError(
                f"{type(anatomy.model).__name__} is an encoder-decoder model ({anatomy.family}: "
                f"an encoder and a decoder stack); {what} works on one stack: use "
                "spectral_hooks.instrument(model) (a probe per stack), or pass "
                "anatomy_of(model).encoder / .decoder")
        return anatomy[stack]
    if stack is not None and anatomy.stack != stack:
        raise OptionError("stack", stack, f"None: {type(anatomy.model).__name__} has one stack")
    return anatomy
