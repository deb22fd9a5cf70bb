"""Architecture knowledge lives here and nowhere else: see base.py and one file per family."""

from .base import (
                   Anatomy,
                   HeadWeights,
                   LayerParts,
                   MissingWeightsError,
                   anatomy_of,
                   register_anatomy,
                   registered_families,
)
from .calls import BlockCallConvention
from .stacks import EncoderDecoderAnatomy, stack_of

__all__ = ["Anatomy", "HeadWeights", "LayerParts", "MissingWeightsError", "BlockCallConvention",
           "EncoderDecoderAnatomy", "anatomy_of", "register_anatomy", "registered_families",
           "stack_of"]
