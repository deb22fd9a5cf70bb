"""Architecture knowledge lives here and nowhere else: see base.py and one file per family."""

from .base import (
                   Anatomy,
                   FamilyInfo,
                   HeadWeights,
                   LayerParts,
                   MissingWeightsError,
                   anatomy_of,
                   family_infos,
                   register_anatomy,
                   registered_families,
)
from .calls import BlockCallConvention
from .stacks import EncoderDecoderAnatomy, stack_of

__all__ = ["Anatomy", "FamilyInfo", "HeadWeights", "LayerParts", "MissingWeightsError",
           "BlockCallConvention", "EncoderDecoderAnatomy", "anatomy_of", "family_infos",
           "register_anatomy", "registered_families", "stack_of"]
