"""Vision towers (ViT, DeiT, CLIP, SigLIP) and CLIP's text tower.

Vision towers are bidirectional, pre-norm, and read ``pixel_values``; their tokens are the
image patches (plus a CLS token, and DeiT's distillation token, at the front). Every position
is real: there is no padding mask. The Jacobian view linearises by default at the token the
model's pooled output reads (``default_position``):

- ViT, DeiT, CLIP vision: row 0, the CLS token (the pooler, and CLIP's projection, read it;
  DeiT's distillation token is row 1).
- SigLIP vision has no CLS token: its pooled output is an attention-pooling head whose learned
  query reads every patch, so no row stands for the image. We pick the centre patch of the
  grid (row ``(g // 2) * g + g // 2`` for a g x g grid from ``image_size // patch_size``):
  the patch most often on the subject of an object-centred image, where the last row would be
  the bottom-right corner, mostly background. At another input resolution
  (``interpolate_pos_encoding``) that row is still a patch, not the centre: pass
  ``jacobian={"positions": [...]}`` there.

CLIP's text tower is causal (a causal mask, though its config has no ``is_decoder``) and pools
the end-of-text token; its default position is the last real token, as for every text model.

A two-tower ``CLIPModel`` / ``SiglipModel`` is refused with a pointer to its towers
(``model.vision_model``, ``model.text_model``), each a model of its own to instrument.
"""

from typing import Any, Optional

from torch import nn

from ..errors import UnsupportedModelError
from .base import Anatomy, FamilyInfo
from .hf import HFFamily, HFPaths, HFPathsAndFinalNorm, model_type_of, register
from .registry import register_anatomy


class _VitFacts(HFPathsAndFinalNorm):
    """The fields of :class:`HFFamily` that these families share, typed."""

    causal: bool
    default_position: int
    tested_by: str


_VIT = _VitFacts(blocks="layers", attention="attention", value="attention.v_proj",
                 output="attention.o_proj", attn_out="attention", attn_norm="layernorm_before",
                 norm_placement="pre", final_norm="layernorm", causal=False, default_position=0,
                 tested_by="tests/families/test_vision.py")
class _ClipFacts(HFPaths):
    """The fields of :class:`HFFamily` that these families share, typed."""

    tested_by: str


_CLIP = _ClipFacts(blocks="encoder.layers", attention="self_attn", value="self_attn.v_proj",
                   output="self_attn.out_proj", attn_out="self_attn", attn_norm="layer_norm1",
                   norm_placement="pre", tested_by="tests/families/test_vision.py")


def centre_patch(config: Any) -> int:
    """The row of the centre patch of a square grid (no CLS token in front).

        >>> from types import SimpleNamespace
        >>> centre_patch(SimpleNamespace(image_size=224, patch_size=16))   # 14 x 14 grid
        105
    """
    grid = config.image_size // config.patch_size
    return (grid // 2) * grid + grid // 2


VIT = register(HFFamily(name="vit", model_types=("vit",), **_VIT))
DEIT = register(HFFamily(name="deit", model_types=("deit",), **_VIT))
CLIP_VISION = register(HFFamily(
    name="clip_vision", model_types=("clip_vision_model",), final_norm="post_layernorm",
    causal=False, default_position=0, **_CLIP))
SIGLIP_VISION = register(HFFamily(
    name="siglip_vision", model_types=("siglip_vision_model",), final_norm="post_layernorm",
    causal=False, default_position=centre_patch, **_CLIP))
CLIP_TEXT = register(HFFamily(
    name="clip_text", model_types=("clip_text_model",), final_norm="final_layer_norm",
    causal=True, **_CLIP))


TWO_TOWERS = ("clip", "siglip")


def _two_towers(model: nn.Module) -> Optional[Anatomy]:
    if model_type_of(model) not in TWO_TOWERS:
        return None
    raise UnsupportedModelError(
        f"{type(model).__name__} holds two towers: instrument model.vision_model or "
        "model.text_model, each a model of its own")


register_anatomy("clip/siglip two towers", _two_towers, first=False, info=FamilyInfo(
    "clip/siglip two towers", TWO_TOWERS, causal="per tower", norm_placement="pre",
    power_view="per tower", jacobian_view="per tower", tested_by="tests/families/test_vision.py"))
