"""TransformerLens: TL 4 ``TransformerBridge`` (wrapping an HF model) and TL 3
``HookedTransformer``. Both name their hook points the TL way; TL stores W_V as
[H, d_model, d_head] and W_O as [H, d_head, d_model] (row convention), transposed here.
"""

from __future__ import annotations

from typing import Any, Optional, cast

from torch import Tensor, nn

from .base import Anatomy, FamilyInfo, LayerParts, config_layer_kinds, get_path
from .calls import TL3_CALLS, TL_BRIDGE_CALLS
from .heads import HeadWeights, expand_kv, output_heads
from .mixers import mixer_kind, mlp_kind
from .registry import anatomy_of, register_anatomy
from .stacks import stack_of


def _tl_value(attn: Any, n_heads: int) -> HeadWeights:
    def read() -> Tensor:
        return expand_kv(attn.W_V.detach().transpose(-1, -2), n_heads)

    def bias() -> Optional[Tensor]:
        b = getattr(attn, "b_V", None)
        return None if b is None else expand_kv(b.detach(), n_heads)

    param = getattr(attn, "_W_V", None)
    if not isinstance(param, nn.Parameter):
        param = attn.W_V
    return HeadWeights(read=read, bias=bias, fixed_param=param)


def _tl3_output(attn: Any) -> HeadWeights:
    def bias() -> Optional[Tensor]:
        b = getattr(attn, "b_O", None)
        return None if b is None else b.detach()

    return HeadWeights(fixed_param=attn.W_O, read=lambda: attn.W_O.detach().transpose(-1, -2),
                       to_param=lambda w: w.transpose(-1, -2), bias=bias)


def _tl3_layer(i: int, block: Any, cfg: Any, n_kv: int) -> LayerParts:
    mixer = mixer_kind(block, n_heads=cfg.n_heads, n_kv_heads=n_kv)
    routed = bool(getattr(cfg, "num_experts", None))  # TL's MoE class names no "Experts"
    return LayerParts(index=i, block=block, attention=block.attn,
                      attn_out_module=block.hook_attn_out,
                      value=_tl_value(block.attn, cfg.n_heads), output=_tl3_output(block.attn),
                      attn_norm=getattr(block, "ln1", None),
                      resid_pre_hook=block.hook_resid_pre, resid_post_hook=block.hook_resid_post,
                      pattern_hook=getattr(block.attn, "hook_pattern", None),
                      mixer=mixer, mlp="routed" if routed else mlp_kind(block, mixer))


def _hooked_transformer(model: nn.Module) -> Optional[Anatomy]:
    if type(model).__name__ != "HookedTransformer" or not hasattr(model, "cfg"):
        return None
    cfg = cast(Any, model).cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    layers = tuple(_tl3_layer(i, block, cfg, n_kv)
                   for i, block in enumerate(cast(Any, model).blocks))
    return Anatomy(
        family="tlens3", model=model, layers=layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
        n_kv_heads=n_kv, d_head=cfg.d_head, causal=cfg.attention_dir == "causal",
        norm_placement="pre", call_root=model, final_norm=getattr(model, "ln_final", None),
        config=cfg, layer_kinds=config_layer_kinds(cfg, len(layers)), norm_upcasts=False,
        call_convention=TL3_CALLS,
    )


def _bridge_attn_out(block: nn.Module) -> nn.Module:
    aliases = getattr(block, "hook_aliases", {}) or {}
    target = get_path(block, aliases.get("hook_attn_out", "attn.hook_out"))
    return target if target is not None else cast(nn.Module, block.attn)


def _transformer_bridge(model: nn.Module) -> Optional[Anatomy]:
    if type(model).__name__ != "TransformerBridge":
        return None
    # norms, causality and sizes of the wrapped model (one stack: encoder-decoder bridges are
    # not supported)
    inner = stack_of(anatomy_of(cast(Any, model).original_model), what="a TransformerLens bridge")
    layers = []
    for i, block in enumerate(cast(Any, model).blocks):
        attn = block.attn
        o_module = get_path(attn, "o._original_component")
        layers.append(LayerParts(
            index=i, block=block, attention=attn, attn_out_module=_bridge_attn_out(block),
            value=_tl_value(attn, inner.n_heads),
            output=output_heads(o_module, inner.n_heads, inner.d_head) if o_module is not None
            else None,
            attn_norm=inner.layers[i].attn_norm if i < inner.n_layers else None,
            norm_weight_offset=inner.layers[i].norm_weight_offset if i < inner.n_layers else 0.0,
            resid_pre_hook=block.hook_in, resid_post_hook=block.hook_out,
            pattern_hook=getattr(attn, "hook_pattern", None),
            mixer=inner.layers[i].mixer if i < inner.n_layers else None,
            mlp=inner.layers[i].mlp if i < inner.n_layers else None,
        ))
    return inner.replace(family=f"tlens_bridge/{inner.family}", model=model, layers=tuple(layers),
                         call_root=model, shared_groups=(), call_convention=TL_BRIDGE_CALLS)


register_anatomy("transformer_lens.TransformerBridge", _transformer_bridge, first=False,
                 info=FamilyInfo("transformer_lens.TransformerBridge", ("any HF family below",),
                                 causal="as the wrapped model", norm_placement="as wrapped",
                                 attention_type="as wrapped",
                                 tested_by="tests/test_real_and_tlens.py"))
register_anatomy("transformer_lens.HookedTransformer", _hooked_transformer, first=False,
                 info=FamilyInfo("transformer_lens.HookedTransformer", ("TL 3",),
                                 causal="cfg.attention_dir", norm_placement="pre",
                                 attention_type="cfg.attn_types",
                                 tested_by="tests/tl3/ (own venv)"))
