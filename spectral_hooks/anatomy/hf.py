"""Declarative anatomy of Hugging Face `transformers` models.

A family file states where things are (dotted paths relative to the base model and to a block);
:func:`build` turns that into an :class:`Anatomy`. Wrappers (``*ForCausalLM``, ``*ForMaskedLM``)
are unwrapped with ``model.base_model``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypedDict, Union, cast

from torch import nn

from ..errors import UnsupportedModelError
from .base import (
    Anatomy,
    FamilyInfo,
    LayerParts,
    config_int,
    config_layer_kinds,
    get_path,
    layer_dims,
    per_layer_attributes,
)
from .calls import HF_CALLS, BlockCallConvention
from .heads import latent_value_heads, output_heads, value_heads
from .mixers import mixer_kind, mlp_kind
from .registry import register_anatomy


class HFPaths(TypedDict):
    """Where a family's parts are (fields of :class:`HFFamily`), typed: families that share
    them spread one such dict into each ``HFFamily(...)``."""

    blocks: str
    attention: str
    value: str
    output: str
    attn_out: str
    attn_norm: Optional[str]
    norm_placement: str


class HFPathsAndFinalNorm(HFPaths):
    """:class:`HFPaths` and the final norm's path."""

    final_norm: Optional[str]


@dataclass(frozen=True)
class HFFamily:
    """Where a Hugging Face family keeps its parts.

    ``value`` is a path from the block to the value projection; with ``qkv="gpt2"`` it is the
    fused c_attn (values are its last third), with ``qkv="neox"`` the per-head interleaved fused
    projection, with ``qkv="q_k_v"`` a fused projection stacked [q (H d_head) | k | v
    (n_kv d_head each)] (Phi3, multi-query GPT-BigCode and Falcon, MPT), with
    ``qkv="grouped"`` one laid out per KV group [q_1..q_g | k | v] (Falcon's new decoder
    architecture). ``attn_out`` names the module whose output is the attention contribution.
    ``norm_upcasts``: the family's norms compute in float32 whatever the model dtype.
    ``call_convention``: how its blocks are called (see :mod:`.calls`). ``n_kv_heads``: the
    number of key/value groups where the config does not state it as ``num_key_value_heads``.
    ``variant(config)``: field overrides for configs that change the layout (Falcon's three
    attention layouts, OPT's post-norm variant), applied before the anatomy is built.
    ``call_convention``: how its blocks are called (see :mod:`.calls`).
    ``default_position``: the row the Jacobian view linearises at by default (-1: the last
    real token; 0: a CLS token), or a function of the config that returns it.
    ``unsupported(config)``: a sentence saying why this config cannot be described, or None.
    ``attention_type``, ``power_view``, ``jacobian_view``, ``tested_by``: declared facts for
    the table of supported models (:class:`~.base.FamilyInfo`).
    One stack of an encoder-decoder model (see :mod:`.stacks`): ``call_root`` is the path to
    the stack module whose forward runs the blocks (default: the base model), ``heads`` the
    config attribute holding the stack's number of heads (as many key/value heads: these
    families have no groups), ``cross_value``/``cross_output`` the paths from a block to its
    cross-attention projections. ``attention_free``: no layer has attention (Mamba), so the
    config need not state a head count. ``value_from_keys``: the path to the key projection,
    read as the value projection in layers that have none because their values are their keys
    (Gemma 4's full-attention layers, ``attention_k_eq_v``).
    """

    name: str
    model_types: tuple[str, ...]
    blocks: str
    attention: str
    value: str
    output: str
    attn_out: str
    attn_norm: Optional[str]
    norm_placement: str
    final_norm: Optional[str] = None
    causal: bool = True
    qkv: str = "separate"
    norm_weight_offset: float = 0.0
    norm_upcasts: bool = False
    call_convention: BlockCallConvention = HF_CALLS
    block_order: Optional[Callable[[nn.Module], list[nn.Module]]] = None
    n_kv_heads: Optional[int] = None
    variant: Optional[Callable[[Any], dict]] = None
    default_position: Union[int, Callable[[Any], int]] = -1
    unsupported: Optional[Callable[[Any], Optional[str]]] = None
    attention_type: str = "full"
    power_view: str = "yes"
    jacobian_view: str = "yes"
    tested_by: str = ""

    @property
    def info(self) -> FamilyInfo:
        """This family's entry of the supported-models table."""
        return FamilyInfo(
            self.name, self.model_types, causal="yes" if self.causal else "no",
            norm_placement=self.norm_placement, attention_type=self.attention_type,
            power_view=self.power_view, jacobian_view=self.jacobian_view,
            tested_by=self.tested_by)

    def position(self, config: Any) -> int:
        """The default Jacobian position for ``config``."""
        p = self.default_position
        return p if isinstance(p, int) else int(p(config))
    call_root: Optional[str] = None
    heads: Optional[str] = None
    cross_value: Optional[str] = None
    cross_output: Optional[str] = None
    attention_free: bool = False
    value_from_keys: Optional[str] = None


def base_model_of(model: nn.Module) -> nn.Module:
    """The model under its task head (``model.base_model``), or ``model`` itself."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) else model


def model_type_of(model: nn.Module) -> Optional[str]:
    """``model.config.model_type``, or None for a model without one."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


def _dims(config, d_model_fallback: int, heads: Optional[str] = None, *,
          attention_free: bool = False) -> tuple[int, int, int, int]:
    d_model = config_int(config, "hidden_size", "n_embd", "d_model") or d_model_fallback
    names = (heads,) if heads else ("num_attention_heads", "n_head", "num_heads")
    n_heads = config_int(config, *names)
    if n_heads is None and attention_free:  # (Mamba) no heads to count: one nominal head
        return d_model, 1, 1, d_model
    if n_heads is None:
        raise UnsupportedModelError(
            f"cannot read the number of attention heads from {type(config).__name__}")
    n_kv = n_heads if heads else config_int(config, "num_key_value_heads") or n_heads
    d_head = config_int(config, "v_head_dim", "head_dim") or d_model // n_heads
    return d_model, n_heads, n_kv, d_head


def _cross_projections(family: HFFamily, block: nn.Module, n_heads: int, d_head: int):
    v_mod, o_mod = get_path(block, family.cross_value), get_path(block, family.cross_output)
    if v_mod is None or o_mod is None:
        return None, None
    return value_heads(v_mod, n_heads, d_head), output_heads(o_mod, n_heads, d_head)


def _projections(family: HFFamily, block: nn.Module, n_heads: int, n_kv: int, d_head: int,
                 d_model: int):
    v_mod, o_mod = get_path(block, family.value), get_path(block, family.output)
    if v_mod is None and family.value_from_keys is not None:
        v_mod = get_path(block, family.value_from_keys)
    if v_mod is None or o_mod is None:
        return None, None
    if family.qkv == "gpt2":
        rows = slice(2 * n_heads * d_head, 3 * n_heads * d_head)
        value = value_heads(v_mod, n_heads, d_head, rows=rows)
    elif family.qkv == "q_k_v":
        rows = slice((n_heads + n_kv) * d_head, (n_heads + 2 * n_kv) * d_head)
        value = value_heads(v_mod, n_heads, d_head, rows=rows)
    elif family.qkv == "neox":
        value = value_heads(v_mod, n_heads, d_head, fused_neox=True)
    elif family.qkv == "grouped":
        value = value_heads(v_mod, n_heads, d_head, fused_groups=n_kv)
    elif family.qkv == "separate":
        value = value_heads(v_mod, n_heads, d_head)
    elif family.qkv == "latent":
        value = latent_value_heads(v_mod, n_heads)
    else:
        raise UnsupportedModelError(f"{family.name}: unknown fused qkv layout {family.qkv!r}")
    return value, output_heads(o_mod, n_heads, d_head)


def build(model: nn.Module, family: HFFamily) -> Anatomy:
    """The :class:`Anatomy` of ``model`` as ``family`` describes it (its variant applied
    to the config first); an :class:`UnsupportedModelError` naming what does not fit.
    """
    base = base_model_of(model)
    config = model.config
    if family.variant is not None:
        family = dataclasses.replace(family, **family.variant(config))
    reason = family.unsupported(config) if family.unsupported is not None else None
    if reason:
        raise UnsupportedModelError(f"{type(model).__name__}: {reason}")
    container = get_path(base, family.blocks)
    if container is None:
        raise UnsupportedModelError(f"{type(model).__name__}: expected blocks at "
                                    f"'{family.blocks}' "
                         f"for the {family.name} family")
    blocks = family.block_order(base) if family.block_order else list(cast(nn.ModuleList, container))
    d_model, n_heads, n_kv, d_head = _dims(config, 0, family.heads,
                                           attention_free=family.attention_free)
    n_kv = family.n_kv_heads or n_kv
    layer_kinds = config_layer_kinds(config, len(blocks))
    varying = per_layer_attributes(config)
    layers, seen, first = [], {}, None
    for index, block in enumerate(blocks):
        # a family's declared paths exist in the models it names (tests/families); in a
        # hybrid stack the attention paths exist in its attention layers only
        attention = get_path(block, family.attention)
        layer_kv, layer_head = layer_dims(attention, varying, n_heads, n_kv, d_head)
        first = first or (layer_kv, layer_head)
        mixer = mixer_kind(block, n_heads=n_heads, n_kv_heads=layer_kv,
                           layer_type=layer_kinds[index] if layer_kinds else None,
                           attention=attention)
        value, output = _projections(family, block, n_heads, layer_kv, layer_head, d_model)
        cross_value, cross_output = _cross_projections(family, block, n_heads, d_head)
        layers.append(LayerParts(
            index=index, block=block, attention=attention,
            attn_out_module=get_path(block, family.attn_out),
            value=value, output=output,
            attn_norm=get_path(block, family.attn_norm),
            norm_weight_offset=family.norm_weight_offset,
            cross_value=cross_value, cross_output=cross_output,
            mixer=mixer, mlp=mlp_kind(block, mixer),
            # HF's flag on attention that reads an earlier layer's keys and values (Gemma 3n)
            reuses_kv=bool(getattr(attention, "is_kv_shared_layer", False)),
        ))
        seen.setdefault(id(block), []).append(index)
    shared = tuple(tuple(ix) for ix in seen.values() if len(ix) > 1)
    causal = family.causal or bool(getattr(config, "is_decoder", False))
    n_kv, d_head = first or (n_kv, d_head)  # (where they differ by layer: the first layer's)
    return Anatomy(
        family=family.name, model=model, layers=tuple(layers), d_model=d_model,
        n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head, causal=causal,
        norm_placement=family.norm_placement,
        call_root=cast(nn.Module, get_path(base, family.call_root)) if family.call_root else base,
        final_norm=get_path(base, family.final_norm), shared_groups=shared, config=config,
        layer_kinds=layer_kinds, norm_upcasts=family.norm_upcasts,
        call_convention=family.call_convention, default_position=family.position(config),
    )


def register(family: HFFamily) -> HFFamily:
    """Register an HF family so :func:`anatomy_of` recognises its ``model_types``."""

    def builder(model: nn.Module) -> Optional[Anatomy]:
        if model_type_of(model) in family.model_types and hasattr(model, "config"):
            return build(model, family)
        return None

    register_anatomy(family.name, builder, first=False, info=family.info)
    return family


# ---------------------------------------------------------------- attention dispatch
# HF models (transformers >= 4.48) call their attention core through the AttentionInterface
# registry, keyed by ``config._attn_implementation`` and read at call time. Block replays that
# need a different core (linearize/single_query.py) register one and switch a block to it
# for the duration of a call; the user's config is restored afterwards.

def register_attention(name: str, fn: Callable[..., Any]) -> bool:
    """Register ``fn`` as HF attention implementation ``name``; False where unsupported."""
    try:
        from transformers import AttentionInterface
        AttentionInterface.register(name, fn)
        return True
    except ImportError:  # older transformers: no pluggable attention
        return False


@contextlib.contextmanager
def attention_implementation(block: nn.Module, name: str):
    """Dispatch the attention modules inside ``block`` to implementation ``name`` meanwhile.

    Yields False (and changes nothing) when the block's modules carry no HF config with a
    pluggable implementation."""
    configs = {}
    for module in block.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            configs[id(config)] = config
    old = {key: c._attn_implementation_internal for key, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation_internal = name
        yield bool(configs)
    finally:
        for key, c in configs.items():
            c._attn_implementation_internal = old[key]


# ---------------------------------------------------------------- experts dispatch
# HF mixture-of-experts layers (``@use_experts_implementation``) pick their expert kernels at
# call time from ``config._experts_implementation``; the default grouped-matmul kernels take
# neither float64 nor forward AD, the "eager" loop over experts takes both.

@contextlib.contextmanager
def experts_implementation(block: nn.Module, name: str):
    """Run the experts inside ``block`` with implementation ``name`` meanwhile (the user's
    configs are restored afterwards); changes nothing in a block without such experts."""
    configs = {}
    for module in block.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation_internal"):
            configs[id(config)] = config
    old = {key: c._experts_implementation_internal for key, c in configs.items()}
    try:
        for c in configs.values():
            c._experts_implementation_internal = name
        yield bool(configs)
    finally:
        for key, c in configs.items():
            c._experts_implementation_internal = old[key]
