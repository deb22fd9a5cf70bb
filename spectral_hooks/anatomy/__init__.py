"""Architecture knowledge lives here and nowhere else: see base.py and one file per family.

Importing this package registers every built-in family (:mod:`.families` lists them) in the
registry (:mod:`.registry`), which itself imports no family.
"""

from ..errors import MissingWeightsError
from . import families  # noqa: F401  (registers the built-in families)
from .base import Anatomy, FamilyInfo, LayerParts
from .calls import BlockCallConvention
from .heads import HeadWeights
from .registry import anatomy_of, family_infos, register_anatomy, registered_families
from .stacks import EncoderDecoderAnatomy, stack_of

__all__ = ["Anatomy", "FamilyInfo", "HeadWeights", "LayerParts", "MissingWeightsError",
           "BlockCallConvention", "EncoderDecoderAnatomy", "anatomy_of", "family_infos",
           "register_anatomy", "registered_families", "stack_of"]
