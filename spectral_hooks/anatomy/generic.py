"""Fallback for models no family knows: find the longest list of identical blocks."""

from __future__ import annotations

from typing import Optional

from torch import nn

from .base import Anatomy, LayerParts, config_int, config_layer_kinds, output_heads, value_heads

_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
_VALUE_NAMES = ("v_proj", "value", "v")
_OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "o")


def _block_list(model: nn.Module) -> Optional[nn.ModuleList]:
    best = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 1:
            kinds = {type(child) for child in module}
            if len(kinds) == 1 and any(True for _ in module[0].parameters()):
                if best is None or len(module) > len(best):
                    best = module
    return best


def _child(module: nn.Module, names: tuple[str, ...]) -> Optional[nn.Module]:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


def generic_anatomy(model: nn.Module) -> Optional[Anatomy]:
    blocks = _block_list(model)
    if blocks is None:
        return None
    attention = _child(blocks[0], _ATTN_NAMES)
    if attention is None:
        return None
    config = getattr(model, "config", None)
    d_model = config_int(config, "hidden_size", "n_embd", "d_model")
    n_heads = config_int(config, "num_attention_heads", "n_head", "num_heads")
    if d_model is None or n_heads is None:
        return None
    n_kv = config_int(config, "num_key_value_heads") or n_heads
    d_head = config_int(config, "head_dim") or d_model // n_heads
    layers = []
    for index, block in enumerate(blocks):
        attn = _child(block, _ATTN_NAMES)
        v_mod, o_mod = _child(attn, _VALUE_NAMES), _child(attn, _OUTPUT_NAMES)
        has_weights = all(getattr(m, "weight", None) is not None for m in (v_mod, o_mod) if m)
        layers.append(LayerParts(
            index=index, block=block, attention=attn, attn_out_module=attn,
            value=value_heads(v_mod, n_heads, d_head) if v_mod is not None and has_weights
            else None,
            output=output_heads(o_mod, n_heads, d_head) if o_mod is not None and has_weights
            else None,
        ))
    return Anatomy(
        family=f"generic/{type(model).__name__}", model=model, layers=tuple(layers),
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head,
        causal=bool(getattr(config, "is_decoder", True)), norm_placement="unknown",
        call_root=model, config=config, layer_kinds=config_layer_kinds(config, len(layers)),
    )
