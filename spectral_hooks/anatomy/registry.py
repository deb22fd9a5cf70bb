"""The registry of families, and the lookup that asks them: :func:`anatomy_of`.

A family file registers a builder here when it is imported (:func:`register_anatomy`); the
registry imports no family. :mod:`.families` lists the built-in ones, and the package
``spectral_hooks.anatomy`` imports that list, so every built-in family is registered before any
anatomy module is used.

    >>> from transformers import BertConfig, BertModel
    >>> anatomy_of(BertModel(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
    ...                                 intermediate_size=64, vocab_size=100))).family
    'bert'
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from torch import nn

from ..errors import OptionTypeError
from .base import Anatomy, FamilyInfo
from .generic import generic_anatomy
from .stacks import EncoderDecoderAnatomy
from .wrappers import unwrap_model

__all__ = ["Builder", "anatomy_of", "family_infos", "register_anatomy", "registered_families"]

Builder = Callable[[nn.Module], Optional[Union[Anatomy, EncoderDecoderAnatomy]]]

_REGISTRY: list[tuple[str, Builder]] = []
_INFOS: dict[str, FamilyInfo] = {}


def register_anatomy(name: str, builder: Builder, *, first: bool = True,
                     info: Optional[FamilyInfo] = None) -> None:
    """Teach spectral_hooks a new architecture.

    ``builder(model)`` returns an :class:`Anatomy` when it recognises ``model`` and None
    otherwise. User builders are tried before the built-in families (``first=True``).
    ``info`` declares the family's facts for the table of supported models.

        >>> def my_builder(model):
        ...     return None            # inspect `model`, return Anatomy(...) when it is yours
        >>> register_anatomy("mine", my_builder)
    """
    if not isinstance(name, str) or not name:
        raise OptionTypeError("name", name, "a non-empty str naming the family")
    if not callable(builder):
        raise OptionTypeError("builder", builder, "a callable: model -> Anatomy | None")
    entry = (name, builder)
    _REGISTRY.insert(0, entry) if first else _REGISTRY.append(entry)
    if info is not None:
        _INFOS[name] = info


def registered_families() -> list[str]:
    """The names of the registered families, in lookup order (user families first).

        >>> "transformer_lens.TransformerBridge" in registered_families()
        True
    """
    return [name for name, _ in _REGISTRY]


def family_infos(*, builtin: bool = False) -> list[FamilyInfo]:
    """The declared facts of every registered family that declared them, in lookup order;
    ``builtin``: only the families spectral_hooks itself registers.

        >>> family_infos(builtin=True)[0].name
        'transformer_lens.TransformerBridge'
    """
    return [_INFOS[name] for name, builder in _REGISTRY if name in _INFOS and (
        not builtin or getattr(builder, "__module__", "").startswith(__package__ or ""))]


def anatomy_of(model: Any) -> "Anatomy | EncoderDecoderAnatomy":
    """Describe ``model`` (HF transformers, TransformerLens 3 or 4) as an :class:`Anatomy`; an
    encoder-decoder model (T5, BART, Whisper) as an
    :class:`~spectral_hooks.anatomy.stacks.EncoderDecoderAnatomy`: one Anatomy per stack.

    Wrappers (DDP, DataParallel, accelerate, ``torch.compile``, PEFT, sentence-transformers,
    nnsight, pipelines) are looked through (:func:`spectral_hooks.anatomy.wrappers.unwrap_model`);
    anything else that is not a Module raises :class:`~spectral_hooks.errors.OptionTypeError` (a
    TypeError). A model no family recognises gets the generic
    fallback (:mod:`.generic`: a :class:`~spectral_hooks.errors.GenericAnatomyWarning`, checked
    on the first recorded batch) or :class:`~spectral_hooks.errors.UnsupportedModelError` (a
    ValueError) that names ``spectral_hooks.register_anatomy``.

        >>> from transformers import GPT2Config, GPT2Model
        >>> anatomy = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
        >>> anatomy.family, anatomy.n_layers, anatomy.causal
        ('gpt2', 2, True)
    """
    model = unwrap_model(model, quiet=True)  # the one rule: DDP, PEFT, sentence-transformers...
    for _, builder in _REGISTRY:
        anatomy = builder(model)
        if anatomy is not None:
            return anatomy
    return generic_anatomy(model)
