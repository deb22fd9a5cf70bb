"""Anatomy: where the blocks, attention and its weights live in a model.

Everything downstream sees a frozen :class:`Anatomy`; only this package knows architectures.

    >>> from transformers import GPT2Config, GPT2Model
    >>> from spectral_hooks import anatomy_of
    >>> anat = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
    >>> anat.family, anat.n_layers, anat.d_model
    ('gpt2', 2, 32)
    >>> anat.layers[0].value_weights().shape     # [H, d_head, d_model]
    torch.Size([4, 8, 32])

Convention: column vectors. ``value_weights()[h]`` maps a residual vector x (d_model) to head h's
value (d_head); ``output_weights()[h]`` maps it back, so F = sum_h W_O[h] @ W_V[h].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, cast

import torch
from torch import Tensor, nn

from ..checks import checked_layer
from ..errors import MissingWeightsError, UnsupportedModelError
from .calls import HF_CALLS, BlockCallConvention
from .heads import HeadWeights
from .mixers import ATTENTION_MIXERS, POWER_MIXERS, ov_extras
from .mixers import describe as describe_mixer

__all__ = ["Anatomy", "LayerParts", "FamilyInfo", "NORM_PLACEMENTS", "config_int",
           "config_layer_kinds", "fresh_model", "get_path", "layer_dims",
           "per_layer_attributes"]

NORM_PLACEMENTS = ("pre", "post", "sandwich", "sublayer_post", "unknown")


@dataclass(frozen=True)
class LayerParts:
    """One application of a transformer block.

    ``block`` is called with the residual stream as its first argument (or ``hidden_states=``)
    and returns the new residual stream (or a tuple starting with it). ``attn_out_module``'s
    output (first element if a tuple) is the attention sublayer's contribution to the residual
    stream (after any post-attention norm). TransformerLens models also name the HookPoints
    whose outputs are the residual stream before and after the block (``resid_*_hook``) and
    the attention probabilities (``pattern_hook``, see :mod:`.patterns`).
    Decoder blocks of encoder-decoder models also name their cross-attention projections
    (``cross_value``, ``cross_output``: they read the encoder output).

        >>> from transformers import GPT2Config, GPT2Model
        >>> from spectral_hooks import anatomy_of
        >>> part = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))).layers[0]
        >>> part.index, part.value_weights().shape, part.output_weights().shape  # W_V^h, W_O^h
        (0, torch.Size([4, 8, 32]), torch.Size([4, 32, 8]))
    """

    index: int
    block: nn.Module
    attention: Optional[nn.Module]
    attn_out_module: Optional[nn.Module]
    value: Optional[HeadWeights] = None
    output: Optional[HeadWeights] = None
    attn_norm: Optional[nn.Module] = None
    norm_weight_offset: float = 0.0
    resid_pre_hook: Optional[nn.Module] = None
    resid_post_hook: Optional[nn.Module] = None
    pattern_hook: Optional[nn.Module] = None
    cross_value: Optional[HeadWeights] = None
    cross_output: Optional[HeadWeights] = None
    mixer: Optional[str] = None
    mlp: Optional[str] = None
    #: the attention reuses an earlier layer's keys and values (KV sharing, Gemma 3n): it has
    #: no value projection of its own, so no OV map
    reuses_kv: bool = False

    @property
    def has_ov_map(self) -> bool:
        """Whether the layer has softmax attention with readable W_V and W_O (an OV map
        F = W_O W_V: the power view covers it; see :mod:`.mixers`)."""
        return (self.value is not None and self.output is not None
                and (self.mixer is None or self.mixer in POWER_MIXERS))

    @property
    def kv_cache_only(self) -> bool:
        """Whether earlier tokens reach this block only through softmax attention's keys and
        values (so a KV cache can hold them fixed: the Jacobian view's single-query replay);
        a recurrent state (Mamba, linear attention) or a convolution window carries them too."""
        return self.mixer is None or self.mixer in ATTENTION_MIXERS

    def describe(self) -> str:
        """What the layer is, for messages: "layer 0 is a state_space mixer (Mamba2Mixer)"."""
        return f"layer {self.index} is {describe_mixer(self.block, self.mixer)}"

    def _require(self, part: Optional[HeadWeights], what: str) -> HeadWeights:
        if self.mixer is not None and self.mixer not in POWER_MIXERS:
            raise MissingWeightsError(
                f"{self.describe()}: it has no softmax attention, so no attention {what} "
                "projection and no OV map (the power view and steering need one)")
        if part is None and self.reuses_kv:
            raise MissingWeightsError(
                f"layer {self.index}: its attention reuses an earlier layer's keys and values "
                "(KV sharing), so it has no value projection and no OV map of its own (the "
                "power view and steering need one): pick a layer of anatomy.ov_layers")
        if part is None:
            raise MissingWeightsError(
                f"layer {self.index}: no attention {what} projection found in "
                f"{type(self.attention or self.block).__name__}; register an anatomy for this "
                "model (spectral_hooks.register_anatomy) to use weight-based metrics"
            )
        return part

    def value_weights(self) -> Tensor:
        """W_V per head, [H, d_head, d_model] (GQA groups expanded to H heads)."""
        return self._require(self.value, "value").read()

    def output_weights(self) -> Tensor:
        """W_O per head, [H, d_model, d_head]."""
        return self._require(self.output, "output").read()

    def value_bias(self) -> Optional[Tensor]:
        """b_V per head, [H, d_head], or None."""
        part = self._require(self.value, "value")
        return part.bias() if part.bias is not None else None

    def output_bias(self) -> Optional[Tensor]:
        """b_O, [d_model], or None."""
        part = self._require(self.output, "output")
        return part.bias() if part.bias is not None else None

    def _require_cross(self, part: Optional[HeadWeights]) -> HeadWeights:
        if part is None:
            raise MissingWeightsError(
                f"layer {self.index} ({type(self.block).__name__}) has no cross-attention: "
                "only decoder blocks of encoder-decoder models (T5, BART, Whisper) attend to an "
                "encoder output")
        return part

    def cross_value_weights(self) -> Tensor:
        """Cross-attention W_V per head, [H, d_head, d_model] (applied to the encoder output).

            >>> from transformers import T5Config, T5Model
            >>> from spectral_hooks import anatomy_of
            >>> anat = anatomy_of(T5Model(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2,
            ...                                    num_heads=4, vocab_size=100)))
            >>> part = anat.decoder.layers[0]
            >>> F_cross = torch.einsum("hdk,hkm->dm", part.cross_output_weights(),
            ...                        part.cross_value_weights())
            >>> F_cross.shape                    # d_model x d_model
            torch.Size([32, 32])
        """
        return self._require_cross(self.cross_value).read()

    def cross_output_weights(self) -> Tensor:
        """Cross-attention W_O per head, [H, d_model, d_head]."""
        return self._require_cross(self.cross_output).read()

    def attn_norm_weight(self) -> Optional[Tensor]:
        """The effective elementwise gain of the norm that feeds attention (Gemma: 1 + weight)."""
        if self.attn_norm is None:
            return None
        weight = getattr(self.attn_norm, "weight", None)
        if weight is None:
            weight = getattr(self.attn_norm, "w", None)  # TransformerLens 3 norms
        if not isinstance(weight, torch.Tensor):
            return None
        return weight.detach() + self.norm_weight_offset


@dataclass(frozen=True)
class Anatomy:
    """Frozen description of a transformer: its blocks in application order and their parts.

    Besides where things are: ``causal``; ``norm_placement`` (one of ``NORM_PLACEMENTS``);
    ``shared_groups`` (layers that apply one shared block, ALBERT); ``layer_kinds`` (the
    attention type of each layer, e.g. ``("sliding_attention", "full_attention", ...)`` from
    ``config.layer_types`` or GPT-Neo's ``("global", "local", ...)``; None where every layer
    is alike or the config does not say); ``norm_upcasts`` (the block's norms compute in
    float32 whatever the model dtype, as HF's Llama-family RMSNorm does: a float64 replay then
    carries ~1e-8 relative rounding); ``call_convention`` (how a block is called, see
    :mod:`spectral_hooks.anatomy.calls`); ``default_position`` (the recording row the
    Jacobian view linearises at by default: -1, the last real token, for text; 0, the CLS
    token, for ViT-style vision towers; see each family file); ``verify`` (None, or a check
    still to run on the first recorded batch: ``verify(anatomy, forward_call, output)``
    returns the checked anatomy or raises; the generic fallback's, see generic.py);
    ``stack`` ("encoder" or "decoder" for one stack of an
    encoder-decoder model, see :mod:`spectral_hooks.anatomy.stacks`; None otherwise).

        >>> from transformers import GPT2Config, GPT2Model
        >>> from spectral_hooks import anatomy_of
        >>> anatomy = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
        >>> anatomy.family, anatomy.n_layers, anatomy.d_model, anatomy.n_heads
        ('gpt2', 2, 32, 4)
    """

    family: str
    model: nn.Module
    layers: tuple[LayerParts, ...]
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    causal: bool
    norm_placement: str
    call_root: nn.Module
    final_norm: Optional[nn.Module] = None
    shared_groups: tuple[tuple[int, ...], ...] = ()
    config: Any = None
    hook_prefix: str = "blocks"
    layer_kinds: Optional[tuple[str, ...]] = None
    norm_upcasts: bool = False
    call_convention: BlockCallConvention = HF_CALLS
    default_position: int = -1
    verify: Optional[Callable[..., "Anatomy"]] = None
    stack: Optional[str] = None

    @property
    def n_layers(self) -> int:
        """The number of blocks of the stack."""
        return len(self.layers)

    @property
    def residual_width(self) -> int:
        """The width of a recorded residual token vector: ``d_model``, or ``streams *
        d_model`` for blocks of parallel residual streams (Gemma 3n; :mod:`.streams`)."""
        streams = self.call_convention.streams
        return self.d_model * (1 if streams is None else streams.count)

    def ov_tokens(self, tokens: Tensor) -> Tensor:
        """The part of recorded residual token vectors [..., residual_width] that the layers'
        F = W_O W_V acts on: all of it, or the active stream of parallel residual streams."""
        streams = self.call_convention.streams
        return tokens if streams is None else streams.active_part(tokens)

    @property
    def ov_layers(self) -> tuple[int, ...]:
        """The layers with an OV map (softmax attention: the power view's layers)."""
        return tuple(part.index for part in self.layers if part.has_ov_map)

    def power_coverage(self, layers: Optional[tuple[int, ...]] = None) -> Optional[str]:
        """One line saying which of ``layers`` (default: all) the power view does not cover,
        or covers in part, and why; None where it covers every one in full."""
        chosen = range(self.n_layers) if layers is None else layers
        missing: dict[str, list[int]] = {}
        parallel, borrowed, unread = [], [], []
        for part in (self.layers[t] for t in chosen):
            if part.reuses_kv:
                borrowed.append(part.index)
            elif not part.has_ov_map and part.mixer in POWER_MIXERS:
                unread.append(part.index)
            elif not part.has_ov_map:
                missing.setdefault(describe_mixer(part.block, part.mixer), []).append(part.index)
            elif part.mixer == "attention+ssm":
                parallel.append(part.index)
        notes = []
        if missing:
            what = "; ".join(f"{'layer' if len(ix) == 1 else 'layers'} "
                             f"{', '.join(map(str, ix))}: {kind}" for kind, ix in missing.items())
            notes.append(f"no power rows for {what}: no softmax attention, so no OV map "
                         "F = W_O W_V (the power view's theory assumes row-stochastic mixing)")
        if unread:
            notes.append(f"no power rows for layers {', '.join(map(str, unread))}: their softmax "
                         "attention's value and output projections were not found (a layout "
                         "no family describes: spectral_hooks.register_anatomy)")
        if borrowed:
            notes.append(f"no power rows for layers {', '.join(map(str, borrowed))}: their "
                         "attention has no value projection of its own (it reuses an earlier "
                         "layer's keys and values: KV sharing), so no F = W_O W_V")
        extras = list(dict.fromkeys(what for t in chosen if self.layers[t].has_ov_map
                                    for what in ov_extras(self.layers[t].attention)))
        if extras:
            notes.append(f"outside F: {'; '.join(extras)}")
        if self.call_convention.streams is not None:
            notes.append("F acts on one of the parallel residual streams (AltUp): the power "
                         "rows read the tokens of the active stream")
        if parallel:
            notes.append(f"layers {', '.join(map(str, parallel))} add a state-space mixer in "
                         "parallel with attention: F = W_O W_V covers the attention only, the "
                         "mixer's contribution is outside F")
        return "; ".join(notes) or None

    def replay_kind(self, layer: int) -> tuple[Any, ...]:
        """What makes two blocks of one class compute differently beyond their weights: the
        mixer and MLP kinds, the attention type (``layer_kinds``: sliding window or full) and
        whether the layer applies rotary embeddings (``config.no_rope_layers``, SmolLM3).
        Blocks of different replay kinds never share a traced graph or a layer group."""
        part = self.layers[layer]
        kind = self.layer_kinds[layer] if self.layer_kinds is not None else None
        text = getattr(self.config, "text_config", None) or self.config
        no_rope = getattr(text, "no_rope_layers", None)
        rope = no_rope[layer] if isinstance(no_rope, (list, tuple)) and layer < len(no_rope) \
            else None
        return (part.mixer, part.mlp, kind, rope, part.has_ov_map)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the model carries (TransformerLens models keep one), or None."""
        return getattr(self.model, "tokenizer", None)

    def layer_index(self, layer: int, *, argument: str = "layer") -> int:
        """Normalise a (possibly negative) layer index, with a clear error when out of range;
        ``argument`` is the name the error gives it (e.g. "layers" for instrument())."""
        return checked_layer(layer, self.n_layers, argument=argument, model=self.family)

    def replace(self, **changes: Any) -> "Anatomy":
        """A copy with ``changes`` applied to its fields (the anatomy itself is frozen)."""
        return dataclasses.replace(self, **changes)


def get_path(root: nn.Module, path: Optional[str]) -> Optional[nn.Module]:
    """Follow a dotted attribute path; None when any step is missing."""
    if path is None:
        return None
    node: Any = root
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def config_int(config: Any, *names: str) -> Optional[int]:
    """The first of the config attributes ``names`` that holds an int (bools do not count).

        >>> from types import SimpleNamespace
        >>> config_int(SimpleNamespace(n_head=None, num_attention_heads=12), "n_head",
        ...            "num_attention_heads")
        12

    Returns:
        That int, or None when no attribute of ``names`` holds one.
    """
    varying = per_layer_attributes(config)
    for name in names:
        if name in varying:  # differs by layer: read from each layer's module instead
            continue
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def per_layer_attributes(config: Any) -> frozenset[str]:
    """The config attributes that differ by layer (transformers' heterogeneous configs, e.g.
    Gemma 4's ``head_dim`` and ``num_key_value_heads`` on its full-attention layers: reading
    one from the config raises), read from each layer's own modules instead.

        >>> from types import SimpleNamespace
        >>> per_layer_attributes(SimpleNamespace(head_dim=8))
        frozenset()
    """
    spec = vars(config).get("_heterogeneity_spec") if hasattr(config, "__dict__") else None
    return frozenset(getattr(spec, "per_layer_attributes", ()) or ())


def layer_dims(attention: Optional[nn.Module], varying: frozenset[str], n_heads: int,
                n_kv: int, d_head: int) -> tuple[int, int]:
    """(key/value heads, head size) of one layer: the config's, or, where the config says they
    differ by layer (:func:`per_layer_attributes`: Gemma 4), the attention module's own
    (HF's ``num_key_value_groups`` and ``head_dim``).

        >>> layer_dims(None, frozenset({"head_dim"}), 4, 2, 8)
        (2, 8)
    """
    if attention is None or not varying & {"head_dim", "num_key_value_heads"}:
        return n_kv, d_head
    groups, size = (getattr(attention, name, None) for name in ("num_key_value_groups", "head_dim"))
    if "num_key_value_heads" in varying:
        if not isinstance(groups, int) or groups < 1:
            raise UnsupportedModelError(f"{type(attention).__name__}: the key/value heads differ "
                                        "by layer and the module does not state its groups")
        n_kv = n_heads // groups
    if "head_dim" in varying:
        if not isinstance(size, int):
            raise UnsupportedModelError(f"{type(attention).__name__}: the head size differs by "
                                        "layer and the module does not state its head_dim")
        d_head = size
    return n_kv, d_head


def config_layer_kinds(config: Any, n_layers: int) -> Optional[tuple[str, ...]]:
    """Per-layer attention types a config states (``layer_types``: Gemma 2/3, Qwen2 sliding
    windows, ...; ``attention_layers``: GPT-Neo; ``attn_types``: TransformerLens 3), or None.
    A multimodal config's ``text_config`` is read when present."""
    if config is None:
        return None
    config = getattr(config, "text_config", None) or config
    for attr in ("layer_types", "attention_layers", "attn_types"):
        kinds = getattr(config, attr, None)
        if isinstance(kinds, (list, tuple)) and len(kinds) >= n_layers > 0:
            return tuple(str(kind) for kind in kinds[:n_layers])
    return None


def fresh_model(model: nn.Module, *, seed: int = 0) -> nn.Module:
    """A freshly initialised model of the same architecture and config (fixed ``seed``),
    with the same dtype, device and train/eval mode. The global RNG state is left untouched."""
    config = getattr(model, "config", None)
    params = list(model.parameters())
    dtype = params[0].dtype if params else torch.float32
    device = params[0].device if params else torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if config is not None and hasattr(type(model), "_from_config"):  # HF transformers
            fresh = cast(Any, type(model))._from_config(config)
        elif type(model).__name__ == "HookedTransformer" and hasattr(model, "cfg"):
            fresh = type(model)(model.cfg)
        else:
            raise UnsupportedModelError(
                f"cannot build a freshly initialised {type(model).__name__}: supported for HF "
                "transformers models and TransformerLens 3 HookedTransformer")
    return fresh.to(device=device, dtype=dtype).train(model.training)


@dataclass(frozen=True)
class FamilyInfo:
    """What a family declares about itself, for people (README's table of supported models).

        >>> FamilyInfo("gpt2", ("gpt2",), causal="yes", norm_placement="pre").row()[:3]
        ('gpt2', 'gpt2', 'yes')

    ``causal``: "yes", "no" or a sentence ("from the config", "checked by behaviour");
    ``attention_type``: e.g. "full", "global/local", "disentangled relative";
    ``power_view`` / ``jacobian_view``: "yes", "no" or what is left out; ``tested_by``: the
    test file that checks the family against its oracles ("" where none does).
    """

    name: str
    model_types: tuple[str, ...]
    causal: str
    norm_placement: str
    attention_type: str = "full"
    power_view: str = "yes"
    jacobian_view: str = "yes"
    tested_by: str = ""

    def row(self) -> tuple[str, ...]:
        """This family's row of the supported-models table (``anatomy/table.py``)."""
        return (self.name, ", ".join(self.model_types) or "-", self.causal, self.norm_placement,
                self.attention_type, self.power_view, self.jacobian_view,
                self.tested_by or "untested")
