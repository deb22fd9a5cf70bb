"""Fallback for models no family knows: found by structure, then checked by behaviour.

    >>> import warnings
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaModel
    >>> from spectral_hooks import anatomy_of, instrument
    >>> model = LlamaModel(LlamaConfig(hidden_size=32, intermediate_size=64, vocab_size=100,
    ...                                num_hidden_layers=2, num_attention_heads=4)).eval()
    >>> model.config.model_type = "mystery"          # a model type no family registered
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     anatomy = anatomy_of(model)
    ...     with instrument(model) as probe, torch.no_grad():
    ...         _ = model(input_ids=torch.arange(6)[None])   # the first batch checks the anatomy
    >>> caught[0].category.__name__, anatomy.family, anatomy.causal   # causal: provisional
    ('GenericAnatomyWarning', 'generic/LlamaModel', False)
    >>> probe.anatomy.causal, probe.anatomy.verify is None           # decided by behaviour
    (True, True)

Structure (at ``anatomy_of``, cheap: no forward pass): the longest ``nn.ModuleList`` of blocks
that hold a token mixer (:mod:`.mixers`: softmax or latent attention, linear attention, a
state-space mixer, a short convolution; blocks of several classes, as Jamba's, are fine) is the
stack, in list order; each layer gets its own mixer and MLP kind. An attention layer's
attention is a child named like one (``self_attn``, ``attn``, ``attention``, ...), with query
and value projections (``q_proj``, ``v_proj``, ``value``, ...; or a fused qkv, whose values the
fallback cannot split: no power view) and an output projection; sizes come from the config. A
model without such a stack (RWKV's time mixing is none of these), whose first attention has no
query and value projections, or without a head count in its config is refused with one
sentence that says what was found and names ``spectral_hooks.register_anatomy``.

Behaviour (at ``instrument``, on the first recorded batch of at least two real tokens, by
:func:`verify`, which the probe calls through ``Anatomy.verify``; the blocks are replayed on
the recorded inputs, once: one extra forward of the recorded blocks; nothing is recorded):

- self-check: replaying each recorded block on its recorded input reproduces its recorded
  output; each block's output is the next block's input (a residual stream, not a stack with
  something between its blocks); the recorded inputs equal the model's own
  ``hidden_states`` where its output offers them (``output_hidden_states=True``).
- causality: a late token's input to the first recorded block is perturbed; if any earlier
  position of that block's output moves, the model is bidirectional, else causal (configs
  are not trusted: ``ViTConfig`` has no ``is_decoder``).

Until then ``anatomy.causal`` is provisional (False) and analysis refuses to run. A failed
self-check removes the probe's hooks and raises :class:`UnsupportedModelError`. The fallback
knows no CLS token: its default Jacobian position is the last real token (-1); pass
``jacobian={"positions": [0]}`` for a vision tower's CLS.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn

from ..errors import GenericAnatomyWarning, UnsupportedModelError
from ..recording.block_call import map_tensors
from .base import (
    Anatomy,
    FamilyInfo,
    LayerParts,
    config_int,
    config_layer_kinds,
    layer_dims,
    per_layer_attributes,
)
from .heads import output_heads, value_heads
from .mixers import POWER_MIXERS, child, mixer_kind, mlp_kind

_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
_QUERY_NAMES = ("q_proj", "query", "q", "q_lin", "query_proj")
_VALUE_NAMES = ("v_proj", "value", "v", "v_lin", "value_proj")
_FUSED_NAMES = ("c_attn", "qkv", "Wqkv", "query_key_value", "qkv_proj")
_OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "o", "out_lin", "Wo")
_REGISTER = "describe it with spectral_hooks.register_anatomy(name, builder)"
GENERIC_INFO = FamilyInfo(
    "generic fallback", ("any other",), causal="by behaviour (first batch)",
    norm_placement="unknown", attention_type="any with q/v projections",
    power_view="separate v/o projections only", jacobian_view="after the self-check",
    tested_by="tests/families/test_generic.py")


def refuse(model: nn.Module, why: str) -> UnsupportedModelError:
    """The :class:`UnsupportedModelError` for ``model``, saying ``why`` the generic
    fallback cannot describe it and naming ``register_anatomy``.
    """
    return UnsupportedModelError(f"{type(model).__name__} cannot be described by the generic "
                                 f"fallback ({why}): {_REGISTER}")


def _block_list(model: nn.Module) -> Optional[nn.ModuleList]:
    """The longest list of blocks that hold parameters and a token mixer (:mod:`.mixers`);
    the blocks may be of different classes (Jamba: Mamba and attention blocks)."""
    best = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 1 and all(
                any(True for _ in sub.parameters()) for sub in module) and any(
                mixer_kind(sub, n_heads=2, n_kv_heads=2) is not None for sub in module):
            if best is None or len(module) > len(best):
                best = module
    return best


def _has_weight(module: Optional[nn.Module]) -> bool:
    return module is not None and isinstance(getattr(module, "weight", None), Tensor)


def _heads_fitting(model: nn.Module, index: int, attn: nn.Module, v_mod: nn.Module,
                   o_mod: nn.Module, n_heads: int, d_head: int) -> tuple[int, int]:
    """(heads, head size) that fit layer ``index``'s value and output projections: the
    config's, else the attention module's own ``head_dim`` (a stack whose layer types differ
    in heads); refused, the shapes named, when neither fits (rather than a reshape failing
    inside an analysis)."""
    o_in, v_out = getattr(o_mod, "in_features", None), getattr(v_mod, "out_features", None)
    if not isinstance(o_in, int) or not isinstance(v_out, int):
        return n_heads, d_head  # not a plain Linear (Conv1D, quantized): read as stated
    size = getattr(attn, "head_dim", None)
    for h, s in [(n_heads, d_head)] + ([(o_in // size, size)] if isinstance(size, int)
                                        and size > 0 else []):
        if h * s == o_in and v_out % s == 0 and v_out // s > 0 and h % (v_out // s) == 0:
            return h, s
    raise refuse(model, f"layer {index}'s attention projections (values {v_out}, output "
                 f"{o_in} wide) fit neither the config's {n_heads} heads of {d_head} nor the "
                 "module's own head size")


def _layer(model: nn.Module, index: int, block: nn.Module, n_heads: int, n_kv: int,
           d_head: int, layer_type: Optional[str]) -> LayerParts:
    mixer = mixer_kind(block, n_heads=n_heads, n_kv_heads=n_kv, layer_type=layer_type)
    attn = child(block, _ATTN_NAMES) if mixer in POWER_MIXERS else None
    v_mod, o_mod = child(attn, _VALUE_NAMES), child(attn, _OUTPUT_NAMES)
    ok = _has_weight(v_mod) and _has_weight(o_mod)
    if ok:
        n_heads, d_head = _heads_fitting(model, index, cast(nn.Module, attn),
                                         cast(nn.Module, v_mod), cast(nn.Module, o_mod),
                                         n_heads, d_head)
    return LayerParts(
        index=index, block=block, attention=attn, attn_out_module=attn,
        value=value_heads(cast(nn.Module, v_mod), n_heads, d_head) if ok else None,
        output=output_heads(cast(nn.Module, o_mod), n_heads, d_head) if ok else None,
        mixer=mixer, mlp=mlp_kind(block, mixer),
    )


def _check_structure(model: nn.Module, blocks: Optional[nn.ModuleList]) -> None:
    if blocks is None:
        found = _block_list_any(model)
        what = (f"layer 0 is a {type(found[0]).__name__} holding no attention, state-space, "
                "linear-attention or convolution mixer this fallback recognises"
                if found is not None else "it does not look like a transformer: no list of "
                "repeated blocks was found")
        raise refuse(model, what)
    attention = child(blocks[0], _ATTN_NAMES)
    if attention is not None and mixer_kind(blocks[0], n_heads=2, n_kv_heads=2) in POWER_MIXERS:
        separate = child(attention, _QUERY_NAMES) is not None and \
            child(attention, _VALUE_NAMES) is not None
        if not separate and child(attention, _FUSED_NAMES) is None \
                and not hasattr(attention, "kv_b_proj"):
            raise refuse(model, f"layer 0's attention ({type(attention).__name__}) has no "
                         "query and value projections it recognises")


def _block_list_any(model: nn.Module) -> Optional[nn.ModuleList]:
    """The longest list of modules holding parameters (for the refusal's diagnosis)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) >= 1
             and all(any(True for _ in sub.parameters()) for sub in m)]
    return max(lists, key=len) if lists else None


def generic_anatomy(model: nn.Module) -> Anatomy:
    """The structural guess for ``model`` (see the module doc), with a
    :class:`GenericAnatomyWarning`; raises :class:`UnsupportedModelError` when there is none."""
    blocks = _block_list(model)
    _check_structure(model, blocks)
    assert blocks is not None  # refused by _check_structure
    config = getattr(model, "config", None)
    d_model = config_int(config, "hidden_size", "n_embd", "d_model")
    n_heads = config_int(config, "num_attention_heads", "n_head", "num_heads")
    if d_model is None or n_heads is None:
        raise refuse(model, "its config states no hidden size and number of attention heads")
    n_kv = config_int(config, "num_key_value_heads") or n_heads
    d_head = config_int(config, "head_dim") or d_model // n_heads
    kinds = config_layer_kinds(config, len(blocks))
    varying = per_layer_attributes(config)
    dims = [layer_dims(child(block, _ATTN_NAMES), varying, n_heads, n_kv, d_head)
            for block in blocks]
    layers = tuple(_layer(model, i, block, n_heads, *dims[i], kinds[i] if kinds else None)
                   for i, block in enumerate(blocks))
    n_kv, d_head = dims[0]  # (where they differ by layer: the first layer's)
    warnings.warn(f"no family knows {type(model).__name__}: a generic anatomy is in use "
                  f"({len(layers)} blocks of {type(blocks[0]).__name__}); its causality and "
                  "residual stream are checked on the first recorded batch", GenericAnatomyWarning,
                  stacklevel=3)
    return Anatomy(
        family=f"generic/{type(model).__name__}", model=model, layers=layers,
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head, causal=False,
        norm_placement="unknown", call_root=model, config=config,
        layer_kinds=kinds, verify=verify,
    )


# ---------------------------------------------------------------- behaviour (first batch)


def _replay(block: nn.Module, call: Any, hidden: Tensor) -> Tensor:
    param = next(block.parameters())

    def move(t: Tensor) -> Tensor:
        return t.to(param.device, param.dtype) if t.is_floating_point() else t.to(param.device)

    args, kwargs = map_tensors(call.with_hidden(hidden), move)
    with torch.no_grad():
        out = block(*args, **kwargs)
    return (out[0] if isinstance(out, (tuple, list)) else out).detach().to(hidden)


def _close(a: Tensor, b: Tensor) -> bool:
    tol = 1e-9 if a.dtype == torch.float64 and b.dtype == torch.float64 else 1e-4
    a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    scale = max(float(b.abs().max()), 1e-30)
    return a.shape == b.shape and float((a - b).abs().max()) <= tol * scale


def _self_check(anatomy: Anatomy, call: Any, output: Any) -> None:
    layers = sorted(call.block_calls)
    model_hidden = getattr(output, "hidden_states", None)
    for layer in layers:
        block_call = call.block_calls[layer]
        shape = tuple(block_call.hidden.shape)
        if len(shape) != 3 or shape[-1] != anatomy.d_model:
            raise refuse(anatomy.model, f"block {layer}'s input has shape {list(shape)}, not "
                         f"[batch, pos, {anatomy.d_model}]: its residual state is not one "
                         "vector a token (parallel residual streams, e.g. hyper-connections, "
                         "need a family that says how to read them)")
        out = _replay(anatomy.layers[layer].block, block_call, block_call.hidden)
        recorded = call.captured.get(("resid_post", layer))
        if recorded is not None and not _close(out, recorded):
            raise refuse(anatomy.model, f"replaying block {layer} on its recorded input does "
                         "not reproduce its recorded output")
        if layer + 1 in call.block_calls and not _close(out, call.block_calls[layer + 1].hidden):
            raise refuse(anatomy.model, f"block {layer}'s output is not block {layer + 1}'s "
                         "input, so the blocks do not form one residual stream")
        if isinstance(model_hidden, (tuple, list)) and len(model_hidden) == anatomy.n_layers + 1 \
                and not _close(block_call.hidden, model_hidden[layer]):
            raise refuse(anatomy.model, f"the recorded input of block {layer} differs from the "
                         f"model's own hidden_states[{layer}]")


def _causal(anatomy: Anatomy, call: Any) -> Optional[bool]:
    """Perturb the last real token's input to the first recorded block: do earlier positions
    of its output move? None when the batch has fewer than two real tokens."""
    layer = min(call.block_calls)
    block_call = call.block_calls[layer].select(0)
    real = call.batch_mask()[0].nonzero().flatten().tolist()
    if len(real) < 2 or block_call.hidden.shape[1] != call.batch_mask().shape[1]:
        return None
    block, hidden = anatomy.layers[layer].block, block_call.hidden
    last, earlier = real[-1], real[:-1]
    gen = torch.Generator(device="cpu").manual_seed(0)
    bump = torch.randn(hidden.shape[-1], generator=gen, dtype=torch.float64)
    moved = hidden.clone()
    moved[0, last] += (bump * float(hidden[0, last].abs().max() or 1.0)).to(moved)
    base, pert = _replay(block, block_call, hidden), _replay(block, block_call, moved)
    change = (pert - base).to(torch.float64).abs()
    return float(change[0, earlier].max()) <= 1e-6 * float(change[0, last].max())


def verify(anatomy: Anatomy, call: Any, output: Any) -> Anatomy:
    """Check a generic ``anatomy`` on a recorded forward ``call`` (the probe's ForwardCall:
    ``block_calls``, ``captured``, ``batch_mask()``) and the model's ``output``. Returns the
    anatomy with ``causal`` decided and nothing left to verify, the same anatomy when this
    batch cannot decide (fewer than two real tokens), or raises UnsupportedModelError."""
    if not call.block_calls or call.continues:
        return anatomy
    try:
        _self_check(anatomy, call, output)
        causal = _causal(anatomy, call)
    except UnsupportedModelError:  # a refusal of the checks themselves, already worded
        raise
    except (RuntimeError, TypeError, ValueError, IndexError) as err:  # a block the replay
        # cannot call as recorded (its input is not a [batch, pos, d] residual stream)
        raise refuse(anatomy.model, f"replaying its blocks on their recorded inputs failed: "
                     f"{type(err).__name__}: {err}") from err
    return anatomy if causal is None else anatomy.replace(causal=causal, verify=None)
