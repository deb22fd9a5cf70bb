"""What mixes tokens in each block, and what its MLP is: the one home of layer kinds.

    >>> from transformers import GPT2Config, GPT2Model
    >>> from spectral_hooks import anatomy_of
    >>> part = anatomy_of(GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4))).layers[0]
    >>> part.mixer, part.mlp, part.has_ov_map
    ('mha', 'dense', True)

A stack may mix kinds (Jamba: Mamba and attention blocks; Qwen3-Next: Gated DeltaNet and
attention; LFM2: short convolutions and attention; Falcon-H1: attention and a Mamba-2 mixer side
by side in every block), so every layer is described on its own, by what its block holds:

==================  ====================================================================
mixer               what the block holds
==================  ====================================================================
``mha``             softmax attention, as many key/value heads as query heads
``gqa``             softmax attention, fewer key/value heads (groups) than query heads
``mqa``             softmax attention, one key/value head
``mla``             multi-head latent attention (DeepSeek-V3: keys and values from a
                    compressed latent, ``kv_a_proj_with_mqa`` then ``kv_b_proj``)
``linear_attention``  linear attention (Gated DeltaNet, lightning attention): no softmax
``state_space``     a selective state-space mixer (Mamba, Mamba-2)
``short_conv``      a gated short convolution (LFM2)
``attention+ssm``   softmax attention and a state-space mixer in parallel (Falcon-H1)
==================  ====================================================================

and ``mlp`` is ``dense``, ``routed`` (a router picks experts per token), ``routed+shared``
(routed experts plus always-on shared experts) or ``none`` (Mamba-2 blocks have no MLP).

Which views apply: the power view needs an OV map (F = W_O W_V of softmax attention, whose
rows are row-stochastic mixings: the view's theory), so it covers ``mha``/``gqa``/``mqa``/
``mla`` layers; ``attention+ssm`` layers have one too, but the parallel mixer's contribution is
outside F (the family table says so). The Jacobian view covers every block whatever its mixer.

Detection reads the block's children by name and class: a state-space mixer holds ``A_log``
and a ``conv1d`` and is called ``mamba``/``mixer``; Qwen3-Next's Gated DeltaNet is
``linear_attn``; LFM2's convolution is ``conv``; a config ``layer_types`` entry of
``"linear_attention"`` marks lightning attention (MiniMax), whose module is ``self_attn``.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

__all__ = ["ATTENTION_MIXERS", "MIXERS", "MLPS", "POWER_MIXERS", "attention_child", "child",
           "mixer_kind", "mixer_module", "mlp_kind", "ssm_child"]

#: softmax-attention mixers (those with an OV map F = W_O W_V)
ATTENTION_MIXERS = ("mha", "gqa", "mqa", "mla")
#: every mixer kind, attention first
MIXERS = ATTENTION_MIXERS + ("linear_attention", "state_space", "short_conv", "attention+ssm")
#: mixers the power view covers (an OV map; for "attention+ssm" the attention part only)
POWER_MIXERS = ATTENTION_MIXERS + ("attention+ssm",)
MLPS = ("dense", "routed", "routed+shared", "none")

_ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
_SSM_NAMES = ("mamba", "mixer")
_LINEAR_ATTENTION_NAMES = ("linear_attn", "linear_attention")
_CONV_NAMES = ("conv", "short_conv")
_SHARED_NAMES = ("shared_expert", "shared_experts", "shared_mlp")
_MLP_NAMES = ("mlp", "feed_forward")
_LINEAR_WORDS = ("Linear", "Lightning", "DeltaNet")


def child(module: Optional[nn.Module], names: tuple[str, ...]) -> Optional[nn.Module]:
    """The first attribute of ``module`` named in ``names`` that is a Module, or None."""
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Module):
            return found
    return None


def _is_ssm(module: Optional[nn.Module]) -> bool:
    """A selective state-space mixer: a learned decay ``A_log`` and a causal ``conv1d``."""
    return module is not None and hasattr(module, "A_log") and hasattr(module, "conv1d")


def ssm_child(block: nn.Module) -> Optional[nn.Module]:
    """The block's state-space mixer (``mamba`` / ``mixer`` holding ``A_log``), or None."""
    found = child(block, _SSM_NAMES)
    return found if _is_ssm(found) else None


def attention_child(block: nn.Module) -> Optional[nn.Module]:
    """The block's (softmax or lightning) attention module, by its usual names, or None."""
    return child(block, _ATTENTION_NAMES)


def _linear_attention(block: nn.Module, attention: Optional[nn.Module],
                      layer_type: Optional[str]) -> Optional[nn.Module]:
    named = child(block, _LINEAR_ATTENTION_NAMES)
    if named is not None:
        return named
    if attention is not None and (layer_type == "linear_attention" or any(
            word in type(attention).__name__ for word in _LINEAR_WORDS)):
        return attention
    return None


def _softmax_kind(attention: nn.Module, n_heads: int, n_kv_heads: int) -> str:
    if hasattr(attention, "kv_b_proj"):
        return "mla"
    if n_kv_heads == 1 and n_heads > 1:
        return "mqa"
    return "gqa" if n_kv_heads < n_heads else "mha"


def mixer_kind(block: nn.Module, *, n_heads: int, n_kv_heads: int,
               layer_type: Optional[str] = None,
               attention: Optional[nn.Module] = None) -> Optional[str]:
    """The kind of ``block``'s token mixer (one of :data:`MIXERS`), or None where the block
    holds none this module recognises. ``layer_type``: the config's ``layer_types`` entry of
    the layer, where it states one; ``attention``: the block's attention where its family
    names it by a path, for a block with no child of a usual name (T5's
    ``layer.0.SelfAttention``).

        >>> from torch import nn
        >>> block = nn.Module(); block.self_attn = nn.Module()
        >>> mixer_kind(block, n_heads=8, n_kv_heads=2)
        'gqa'
    """
    ssm = ssm_child(block)
    named = attention_child(block)
    attention = named if named is not None else attention
    if ssm is not None:
        return "attention+ssm" if attention is not None else "state_space"
    if _linear_attention(block, attention, layer_type) is not None:
        return "linear_attention"
    if attention is not None:
        return _softmax_kind(attention, n_heads, n_kv_heads)
    if child(block, _CONV_NAMES) is not None:
        return "short_conv"
    return None


def mixer_module(block: nn.Module, mixer: Optional[str]) -> Optional[nn.Module]:
    """The module that mixes tokens in ``block`` for a ``mixer`` kind (for messages: "layer 0
    is a Mamba2Mixer"), or None."""
    if mixer in ("state_space",):
        return ssm_child(block)
    if mixer == "linear_attention":
        return _linear_attention(block, attention_child(block), "linear_attention")
    if mixer == "short_conv":
        return child(block, _CONV_NAMES)
    return attention_child(block)


def _has_experts(module: nn.Module) -> bool:
    return any("Experts" in type(m).__name__ for m in module.modules())


def mlp_kind(block: nn.Module, mixer: Optional[str] = None) -> str:
    """``block``'s MLP kind (one of :data:`MLPS`): what the block holds besides its token
    mixer (``mixer``'s module and the attention) and its norms.

        >>> from torch import nn
        >>> block = nn.Module(); block.mlp = nn.Linear(2, 2)
        >>> mlp_kind(block)
        'dense'
    """
    mixers = {id(m) for m in (mixer_module(block, mixer), attention_child(block),
                              ssm_child(block)) if m is not None}
    rest = [sub for sub in block.children() if id(sub) not in mixers
            and "Norm" not in type(sub).__name__ and any(True for _ in sub.parameters())]
    if not rest:
        return "none"
    if not any(_has_experts(sub) for sub in rest):
        return "dense"
    # shared experts by name, or a dense MLP beside the block's experts (Gemma 4): both run
    # on every token
    dense = child(block, _MLP_NAMES)
    shared = any(child(sub, _SHARED_NAMES) is not None for sub in rest) or \
        child(block, _SHARED_NAMES) is not None or \
        (dense is not None and not _has_experts(dense))
    return "routed+shared" if shared else "routed"


_GATE_NAMES = ("g_proj", "gate_proj", "o_gate", "output_gate")
_QK_NORM_PREFIXES = ("q_", "k_", "query", "key")
# a post-norm of the residual sum held by the attention module (ALBERT): not on F's path
_RESIDUAL_NORM_NAMES = ("LayerNorm", "layer_norm", "layernorm", "ln", "norm")


def ov_extras(attention: Optional[nn.Module]) -> list[str]:
    """What an attention module puts on the path from W_V to W_O besides the attention
    weights, which F = W_O W_V leaves out (the power view says so): a norm of the values
    (Gemma 3n/4) or of the attention output (BitNet, DiffLlama), another module on the values
    (Inkling's short convolution), the per-token scale of a latent norm (MLA), an output gate
    computed from the layer's input (Qwen3-Next and Qwen3.5 from a doubled query projection,
    LFM3 and Laguna from a gate projection), a scale of the values, attention sinks (each
    row's weights sum to less than 1).

        >>> from torch import nn
        >>> attention = nn.Module(); attention.v_norm = nn.Identity()
        >>> attention.k_norm, attention.o_norm = nn.RMSNorm(8), nn.RMSNorm(8)
        >>> attention.v_proj, attention.v_conv = nn.Linear(8, 8), nn.Conv1d(8, 8, 3)
        >>> for what in ov_extras(attention):
        ...     print(what)
        the values' RMS norm (v_norm) between W_V and the attention
        a norm on the values or the attention output (o_norm)
        Conv1d on the values (v_conv)
    """
    if attention is None:
        return []
    found = []
    for name, sub in attention.named_children():
        if name == "v_norm":
            found.append("the values' RMS norm (v_norm) between W_V and the attention")
        elif name.startswith("v_") and "Linear" not in type(sub).__name__:  # not W_V itself:
            # Inkling's short convolution
            found.append(f"{type(sub).__name__} on the values ({name})")
        elif ("Norm" not in type(sub).__name__ or name.startswith(_QK_NORM_PREFIXES)
              or name in _RESIDUAL_NORM_NAMES):
            continue  # not a norm; one of the queries or keys (scores only); the residual's
        elif name == "kv_a_layernorm":  # latent attention: its gain is in W_V, not its scale
            found.append("the latent norm's per-token scale (kv_a_layernorm; its gain is in W_V)")
        else:
            found.append(f"a norm on the values or the attention output ({name})")
    query = child(attention, ("q_proj",))
    heads = getattr(getattr(attention, "config", None), "num_attention_heads", None)
    size = getattr(attention, "head_dim", None)
    doubled = (isinstance(heads, int) and isinstance(size, int)
               and getattr(query, "out_features", None) == 2 * heads * size)
    if doubled or child(attention, _GATE_NAMES) is not None:
        found.append("the attention output's gate (computed per token from the layer's input)")
    scale = getattr(attention, "v_scale", None)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
        found.append(f"the values' scale ({scale:g})")
    if isinstance(getattr(attention, "sinks", None), nn.Parameter):
        found.append("attention sinks (each row's attention weights sum to less than 1)")
    return found


def describe(block: nn.Module, mixer: Optional[str]) -> str:
    """``"a state_space mixer (Mamba2Mixer)"``: a layer's kind and module, for messages."""
    module: Any = mixer_module(block, mixer)
    name = type(module).__name__ if module is not None else type(block).__name__
    return f"a {mixer or 'unrecognised'} mixer ({name})"
