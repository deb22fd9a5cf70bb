"""Where a model's attention probabilities can be read: the ``attn_pattern`` capture point.

Hugging Face attention modules (transformers >= 4.48) return ``(attn_output, attn_weights)``;
``attn_weights`` [batch, head, query, key] is a tensor only under eager attention
(``attn_implementation="eager"``: SDPA and flash kernels never form it and return None).
TransformerLens models (TL3 ``HookedTransformer``, TL4 ``TransformerBridge``) pass the pattern
through the HookPoint ``blocks.<l>.attn.hook_pattern`` (``LayerParts.pattern_hook``).

    >>> from transformers import GPT2Config, GPT2Model
    >>> from spectral_hooks.anatomy import anatomy_of
    >>> eager = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4,
    ...                              attn_implementation="eager"))
    >>> pattern_capture(anatomy_of(eager)).attr
    'attention'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor

from ..errors import RecordingError, UnsupportedModelError

__all__ = ["PatternCapture", "pattern_capture"]

_HOW = ("load the model with eager attention to capture attn_pattern: "
        "from_pretrained(..., attn_implementation='eager'), or for a model built from a config, "
        "Config(..., attn_implementation='eager')")


@dataclass(frozen=True)
class PatternCapture:
    """The module whose output holds a layer's attention probabilities: ``attr`` names it on
    :class:`~.base.LayerParts`; ``index`` is the element of its (tuple) output that holds them,
    None for the output itself (a TransformerLens HookPoint)."""

    attr: str
    index: Optional[int]

    def extract(self, output: Any) -> Tensor:
        """The pattern [batch, head, query, key] in ``output``; RecordingError if absent."""
        value = output
        if self.index is not None:
            value = output[self.index] if isinstance(output, (tuple, list)) \
                and len(output) > self.index else None
        if not isinstance(value, Tensor) or value.ndim != 4:
            raise RecordingError(
                "the attention module returned no attention probabilities "
                f"[batch, head, query, key] (got {type(value).__name__}); {_HOW}")
        return value


def pattern_capture(anatomy: Any) -> PatternCapture:
    """How ``anatomy``'s model gives its attention patterns; UnsupportedModelError (one
    sentence that says how to load the model) where it cannot."""
    if all(p.pattern_hook is not None for p in anatomy.layers):
        return PatternCapture("pattern_hook", None)
    model = anatomy.model
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has neither a Hugging Face attention implementation nor "
            "TransformerLens hook_pattern points, so its attention patterns cannot be recorded")
    if impl != "eager":
        raise UnsupportedModelError(
            f"{type(model).__name__} computes attention with attn_implementation={impl!r}, "
            f"which returns no attention probabilities: {_HOW}")
    return PatternCapture("attention", 1)
