"""What a projection's weight *is*: the matrix its forward multiplies by.

    >>> import torch
    >>> lin = torch.nn.Linear(4, 3)
    >>> torch.equal(effective_weight(lin), lin.weight.detach())
    True

Every weight reader of the package (power view, steering, ``layer_matrices``, the re-initialised
control, the training events) goes through :func:`effective_weight` (via
:func:`~spectral_hooks.anatomy.heads.column_weight`), so these are decided here only:

- a plain ``nn.Linear`` / ``Conv1D``: its ``weight``; a ``torch.nn.utils.parametrize`` weight
  (weight_norm, orthogonal, ...) is evaluated as its forward evaluates it; an FSDP2 shard is
  gathered whole;
- a PEFT tuner layer (LoRA, DoRA, LoHa, LoKr, IA3, ...): the base weight with the adapters its
  forward applies, merged by PEFT's own ``merge()`` on a float64 copy of the layer (the user's
  layer is never touched): the active adapters, none under ``disable_adapter()``, and the base
  alone once adapters are merged (PEFT's forward then ignores unmerged ones);
- a PEFT ``modules_to_save`` wrapper: the copy that runs (the active adapter's, else the
  original);
- a quantized layer (bitsandbytes 4-bit and 8-bit, torchao tensor subclasses, optimum-quanto,
  HQQ: :mod:`.quantized`): its dequantized weight, one layer at a time (a fresh tensor, freed by
  the caller), each dequantization checked against the layer's own forward on a probe input;
  plus, under a PEFT LoRA adapter (QLoRA), the adapters' delta in float64; plus a steering edit's
  additive term (:func:`additive_term`: packed weights are never written);
- a weight that cannot be read exactly (packed or quantized by another library: GPTQ / AWQ
  ``qweight``, ``torch.ao`` quantized modules, int8/4-bit, float8 or any weight with a separate
  scale, an unknown tensor subclass) is refused with
  :class:`~spectral_hooks.errors.UnsupportedModelError` naming the layer type, never read stale.

Block replays (the Jacobian view) run quantized layers as float ``nn.Linear`` layers holding the
same verified dequantized weights (:func:`replay_tensors`, :func:`float_layers`), never forward-mode
AD through a quantized kernel.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import weakref
from typing import Any, Callable, ContextManager, Iterator, Optional, cast

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError, fallback
from . import quantized as qz
from .calls import BlockCallConvention

__all__ = ["effective_weight", "effective_bias", "stored_layout_module", "adapter_state",
           "writable_weight", "running_module", "adapter_modules", "quantized_layers",
           "replay_tensors", "float_layers", "float_shells", "replay_convention", "additive_term",
           "release_additive_term", "additive_state", "name_layers"]

name_layers = qz.name_layers


def _peft_classes() -> tuple[Optional[type], Optional[type]]:
    """(BaseTunerLayer, ModulesToSaveWrapper) when peft is imported, else (None, None): a model
    can hold PEFT layers only once peft is imported, so nothing is imported here."""
    if "peft" not in sys.modules:
        return None, None
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    return BaseTunerLayer, ModulesToSaveWrapper


def is_tuner_layer(module: nn.Module) -> bool:
    """True for a PEFT tuner layer (LoRA and the like); False when peft is not installed."""
    tuner, _ = _peft_classes()
    return tuner is not None and isinstance(module, tuner)


def running_module(module: nn.Module) -> nn.Module:
    """The module a PEFT ``modules_to_save`` wrapper runs (as its forward decides); any other
    module as it is."""
    _, to_save = _peft_classes()
    if to_save is None or not isinstance(module, to_save):
        return module
    wrapper: Any = module  # PEFT's attributes (nn.Module's __getattr__ types them loosely)
    active = list(wrapper.active_adapters)
    copies = wrapper.modules_to_save
    if wrapper.disable_adapters or not active or any(a not in copies for a in active):
        return running_module(wrapper.original_module)
    return running_module(copies[active[0]])


def stored_layout_module(module: nn.Module) -> nn.Module:
    """The module whose class says how the weight is stored (Conv1D stores it transposed):
    the base layer under PEFT tuner layers, the running copy of a modules_to_save wrapper."""
    module = running_module(module)
    while is_tuner_layer(module):
        module = cast(Any, module).get_base_layer()
    return module


_SCALES = ("weight_scale", "weight_scale_inv", "scales", "weight_scales")  # fp8 / int schemes
_QUANTIZED_LIBRARIES = ("bitsandbytes", "torchao", "optimum.quanto", "quanto", "hqq",
                        "auto_gptq", "gptqmodel", "awq", "torch.ao.nn.quantized")


def _refuse_unreadable(module: nn.Module, weight: Any) -> None:
    kind = type(module).__name__
    why = None
    if type(module).__module__.startswith(_QUANTIZED_LIBRARIES):
        why = f"a quantized layer from {type(module).__module__.split('.')[0]}"
    elif hasattr(module, "qweight"):
        why = "packed quantized weights (qweight)"
    elif not isinstance(weight, Tensor):
        why = "no weight tensor (a quantized or packed layer)"
    elif not weight.is_floating_point():
        why = f"{weight.dtype} packed weights (quantized)"
    elif weight.element_size() == 1 or any(hasattr(module, name) for name in _SCALES):
        why = f"{weight.dtype} weights with a separate scale (quantized)"
    elif type(weight) not in (Tensor, nn.Parameter) and not callable(
            getattr(weight, "full_tensor", None)):
        why = f"a {type(weight).__name__} weight (a tensor subclass such as a quantized one)"
    if why is not None:
        raise UnsupportedModelError(
            f"a {kind} projection holds {why}: its effective matrix cannot be read exactly, so "
            "weight-based metrics (power view, steering) refuse it; analyse an unquantized copy "
            "of the model (loaded without quantization_config) or use the Jacobian view")


def _looks_quantized(module: nn.Module) -> bool:
    """A layer whose weight is packed or quantized (by any library; :func:`_refuse_unreadable`
    names why), as opposed to a container or a float layer."""
    if type(module).__module__.startswith(_QUANTIZED_LIBRARIES) or hasattr(module, "qweight"):
        return True
    weight = module.__dict__.get("_parameters", {}).get("weight")
    if not isinstance(weight, Tensor):
        return False
    return (not weight.is_floating_point() or weight.element_size() == 1
            or (type(weight) not in (Tensor, nn.Parameter)
                and not callable(getattr(weight, "full_tensor", None))))


# steering's additive terms on quantized layers: module -> (delta parameter, hook handle)
_ADDITIVE: "weakref.WeakKeyDictionary[nn.Module, tuple[nn.Parameter, Any]]" = \
    weakref.WeakKeyDictionary()


def additive_term(module: nn.Module) -> nn.Parameter:
    """The float (out, in) term added to quantized ``module``'s output, x -> forward(x) +
    x term^T (created as zeros, with its forward hook, on first use): the weight steering
    writes where the packed weight cannot be. :func:`release_additive_term` removes it."""
    held = _ADDITIVE.get(module)
    if held is not None:
        return held[0]
    shape = qz._shape(module)
    if shape is None:
        shape = tuple(qz.dequantized(module).shape)
    term = nn.Parameter(torch.zeros(shape, dtype=torch.float32, device=qz._device(module)),
                        requires_grad=False)

    def add(_module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        x = args[0]
        return out + nn.functional.linear(x.to(term.dtype), term).to(out.dtype)

    _ADDITIVE[module] = (term, module.register_forward_hook(add))
    return term


def release_additive_term(term: Tensor) -> None:
    """Remove an :func:`additive_term` and its hook (steering, once its last edit is undone:
    the term is zero again, and the layer is exactly as it was)."""
    for module, (held, handle) in list(_ADDITIVE.items()):
        if held is term:
            handle.remove()
            del _ADDITIVE[module]


def additive_state() -> tuple:
    """(id, version) of every live additive term: the analysis cache keys on it (the terms are
    no parameters of the model, so its fingerprint does not see them)."""
    return tuple((id(term), term._version) for term, _ in list(_ADDITIVE.values()))


def _quantized_weight(module: nn.Module, q: qz.Quantization,
                      dtype: Optional[torch.dtype] = None) -> Tensor:
    """Dequantized (verified; in ``dtype`` where given) plus the additive term where steering
    put one."""
    weight = qz.dequantized(module, q, dtype=dtype)
    held = _ADDITIVE.get(module)
    if held is not None:
        weight = weight.to(torch.float64) + held[0].detach().to(weight.device, torch.float64)
    return weight


def _plain_weight(module: nn.Module) -> Tensor:
    q = qz.quantization_of(module)
    if q is not None:
        return _quantized_weight(module, q)
    weight: Any = getattr(module, "weight", None)
    _refuse_unreadable(module, weight)
    weight = weight.detach()
    gather = getattr(weight, "full_tensor", None)
    if callable(gather):  # an FSDP2 shard (a collective: every rank must read it)
        weight = gather()
    return weight


def _merged_copy(layer: Any) -> nn.Module:
    """A float64 copy of a PEFT tuner layer with exactly the adapters its forward applies merged
    into the base layer (PEFT's own merge: LoRA, DoRA, LoHa, LoKr, IA3, ...)."""
    base = layer.get_base_layer()
    _refuse_unreadable(base, getattr(base, "weight", None))
    if layer.disable_adapters and not layer.merged:
        return base
    if layer.merged and not layer.disable_adapters:
        return base  # PEFT's forward: the merged base alone, unmerged adapters ignored
    available = layer._get_available_adapters() if hasattr(
        layer, "_get_available_adapters") else None
    pending = [a for a in layer.active_adapters if available is None or a in available]
    if not pending and not layer.merged:
        return base
    dtype = torch.float32 if base.weight.device.type == "mps" else torch.float64
    with torch.no_grad():
        twin = copy.deepcopy(layer).to(dtype)
        if layer.disable_adapters:
            twin.unmerge()  # PEFT's forward unmerges first when adapters are disabled
        else:
            twin.merge(adapter_names=pending)
    return twin.get_base_layer()


def effective_weight(module: nn.Module) -> Tensor:
    """The weight ``module``'s forward multiplies by, detached, in its stored layout
    ((out, in) for ``nn.Linear``, (in, out) for GPT-2's Conv1D: see
    :func:`stored_layout_module`); float64 for a PEFT layer with adapters applied, else the
    module's own dtype. Refuses what cannot be read exactly (module docstring)."""
    module = running_module(module)
    if is_tuner_layer(module):
        base = cast(Any, module).get_base_layer()
        q = qz.quantization_of(base)
        if q is not None:
            return _quantized_tuner(module, _quantized_weight(base, q), "weight")
        return _plain_weight(_merged_copy(module))
    return _plain_weight(module)


def _quantized_tuner(layer: Any, base: Tensor, what: str) -> Tensor:
    """A PEFT LoRA layer over a quantized base (QLoRA): ``base`` (the dequantized weight, or
    bias) plus, in float64, the delta of each adapter its forward applies (PEFT's merge would
    re-quantize: not the forward's matrix)."""
    name = type(layer).__name__
    if layer.merged:
        if layer.disable_adapters:
            raise UnsupportedModelError(
                f"a PEFT {name} layer over a quantized base has merged adapters and is disabled: "
                "PEFT would unmerge (re-quantize) on the next forward, so its weight cannot be "
                "read exactly")
        return base  # merged into the quantized base: the base alone runs
    pending = [] if layer.disable_adapters else [
        a for a in layer.active_adapters if a in getattr(layer, "lora_A", {})]
    if not pending:
        return base
    if not type(layer).__module__.startswith("peft.tuners.lora") or any(
            a in getattr(layer, "lora_variant", {}) or getattr(layer, "use_dora", {}).get(a)
            for a in pending):
        raise UnsupportedModelError(
            f"a PEFT {name} layer over a quantized base applies a non-additive adapter (DoRA or "
            "another variant): its effective weight cannot be read exactly; plain LoRA adapters "
            "are supported")
    out = base.to(torch.float64)
    for a in pending:
        A, B = layer.lora_A[a], layer.lora_B[a]
        if what == "weight":
            delta = B.weight.detach().double() @ A.weight.detach().double()
        elif getattr(B, "bias", None) is not None:
            delta = B.bias.detach().double()
        else:
            continue
        out = out + delta.to(out.device) * float(layer.scaling[a])
    return out


def effective_bias(module: nn.Module) -> Optional[Tensor]:
    """The bias ``module``'s forward adds (LoRA with ``lora_bias`` changes it), or None."""
    module = running_module(module)
    if is_tuner_layer(module):
        base_layer = cast(Any, module).get_base_layer()
        if qz.quantization_of(base_layer) is not None:
            bias = qz._bias(base_layer)
            ups = [B for B in getattr(module, "lora_B", {}).values()
                   if getattr(B, "bias", None) is not None]
            if not ups:  # no adapter adds a bias (lora_bias=False, the default)
                return bias
            if bias is None:
                bias = torch.zeros(ups[0].bias.shape, dtype=torch.float64)
            return _quantized_tuner(module, bias, "bias")
        module = _merged_copy(module)
    bias = getattr(module, "bias", None)
    return bias.detach() if isinstance(bias, Tensor) else None


def writable_weight(module: nn.Module) -> tuple[Optional[nn.Parameter], str]:
    """(the parameter to write so that the effective weight moves by exactly the same amount,
    "") or (None, why not). Additive adapters (LoRA without DoRA, LoHa, LoKr) keep
    effective = stored + delta, so an edit of the stored base weight is an edit of the
    effective one; DoRA and IA3 rescale it, parametrizations recompute it. Packed quantized
    weights are never written: a supported quantized layer (:mod:`.quantized`) gets an
    :func:`additive_term` instead, a float term its forward adds (created on this call)."""
    module = running_module(module)
    if is_tuner_layer(module):
        tuner: Any = module
        base = tuner.get_base_layer()
        kind = type(module).__module__.split(".")[-2] if "." in type(module).__module__ else ""
        dora = any(bool(v) for v in getattr(module, "use_dora", {}).values())
        applied = [] if tuner.disable_adapters else list(tuner.active_adapters)
        if applied and (dora or kind not in ("lora", "loha", "lokr")):
            name = "DoRA" if dora else type(module).__name__
            return None, (f"a PEFT {name} adapter is applied: its effective weight is not the "
                          "base weight plus a fixed delta (merge_and_unload() it first)")
        if tuner.merged and tuner.disable_adapters:
            return None, "PEFT would unmerge its adapters on the next forward"
        module = base
    if qz.quantization_of(module) is not None:
        return additive_term(module), ""
    if torch.nn.utils.parametrize.is_parametrized(module, "weight"):
        return None, "its weight is computed by a parametrization (torch.nn.utils.parametrize)"
    weight = getattr(module, "weight", None)
    _refuse_unreadable(module, weight)
    if not isinstance(weight, nn.Parameter):
        return None, f"its weight is a {type(weight).__name__}, not a parameter"
    return weight, ""


def adapter_modules(model: nn.Module) -> list[nn.Module]:
    """The PEFT tuner layers and modules_to_save wrappers of ``model`` ([] without peft)."""
    tuner, to_save = _peft_classes()
    if tuner is None or to_save is None:
        return []
    return [m for m in model.modules() if isinstance(m, (tuner, to_save))]


def adapter_state(modules: list[nn.Module]) -> tuple[tuple[tuple[str, ...], bool, tuple[str, ...]], ...]:
    """Which adapters each of ``modules`` (:func:`adapter_modules`) applies: a hashable summary
    that changes with ``set_adapter``, ``disable_adapter()`` and merging, which change
    effective weights without touching a parameter (the analysis cache keys on it)."""
    layers: list[Any] = list(modules)
    return tuple((tuple(m.active_adapters), bool(m.disable_adapters),
                  tuple(getattr(m, "merged_adapters", ()))) for m in layers)


# ----------------------------------------------------------------------------------------------
# Block replays (linearize): quantized layers run as float nn.Linear layers holding the verified
# dequantized weights, never forward-mode AD through a quantized kernel.


def quantized_layers(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name in ``block``, module) of each quantized layer of ``block`` (outermost
    only). A quantized layer no supported library made is refused here (one line, its type)."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in block.named_modules():
        if module is block or any(name.startswith(f"{p}.") for p, _ in found):
            continue
        if qz.quantization_of(module) is not None:
            found.append((name, module))
        elif _looks_quantized(module):
            _refuse_unreadable(module, getattr(module, "weight", None))
            found.append((name, module))  # not reached: refused above
    return found


def _inside(name: str, prefixes: list[str]) -> bool:
    return any(name.startswith(f"{p}.") for p in prefixes)


def replay_tensors(block: nn.Module, device: Any, dtype: torch.dtype) -> dict[str, Tensor]:
    """``block``'s parameters and buffers for a ``functional_call`` replay, floating ones in
    ``dtype`` on ``device``; each quantized layer's replaced by ``<layer>.weight`` (its verified
    dequantized weight plus any additive term) and ``<layer>.bias``, which the float layers of
    :func:`float_layers` take. Records in the report's fallbacks whether that replay is the
    forward's function (weight-only quantization) or the weight-dequantized surrogate (layers
    that also quantize their inputs)."""
    layers = quantized_layers(block)
    prefixes = [name for name, _ in layers]
    out: dict[str, Tensor] = {}
    for name, t in block.named_parameters():
        if not _inside(name, prefixes):
            out[name] = t.detach().to(device, dtype)
    for name, t in block.named_buffers():
        if not _inside(name, prefixes):
            t = t.detach()
            out[name] = (t.to(dtype) if t.is_floating_point() else t).to(device)
    surrogate = []
    for name, module in layers:
        q = qz.quantization_of(module)
        assert q is not None  # quantized_layers refused the others
        out[f"{name}.weight"] = _quantized_weight(module, q, dtype).to(device, dtype)
        bias = qz._bias(module)
        if bias is not None:
            out[f"{name}.bias"] = bias.to(device, dtype)
        if q.activations:
            surrogate.append(f"{name} ({q.describe()})")
    if surrogate:
        fallback("quantized.weight_dequantized_surrogate",
                 f"{', '.join(surrogate[:3])}{' ...' if len(surrogate) > 3 else ''} also "
                 "quantize their inputs: the block is replayed with the dequantized weights in "
                 "float, the weight-dequantized surrogate of the function its forward computes")
    elif layers:
        fallback("quantized.dequantized_weights",
                 "quantized layers (weight-only) are replayed as float layers holding their "
                 "verified dequantized weights: the function their forward computes")
    return out


def _float_shell(module: nn.Module) -> nn.Linear:
    shape = qz._shape(module)
    if shape is None:
        meta: Any = getattr(module, "meta", None)
        weight = getattr(module, "weight", None)
        if isinstance(meta, dict) and "shape" in meta:
            shape = tuple(meta["shape"])
        elif isinstance(weight, Tensor) and weight.ndim == 2:
            shape = tuple(weight.shape)
        else:
            shape = tuple(qz.dequantized(module).shape)
    out_features, in_features = shape
    return nn.Linear(in_features, out_features, bias=qz._bias(module) is not None,
                     device="meta")


def float_shells(block: nn.Module) -> dict[str, nn.Linear]:
    """A float ``nn.Linear`` shell (meta device, no storage) per quantized layer of ``block``,
    by qualified name: built once, outside any trace (an ``nn.Linear`` initialises itself with
    random ops a ``torch.func`` transform refuses), for :func:`float_layers`."""
    return {name: _float_shell(module) for name, module in quantized_layers(block)}


@contextlib.contextmanager
def float_layers(block: nn.Module, shells: Optional[dict[str, nn.Linear]] = None
                 ) -> Iterator[None]:
    """For the duration, each quantized layer of ``block`` is swapped for its float
    ``nn.Linear`` shell (:func:`float_shells`; the replay's :func:`replay_tensors` fill it), and
    put back on exit, whatever happens."""
    shells = float_shells(block) if shells is None else shells
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for name, shell in shells.items():
            parent_name, _, child = name.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            swapped.append((parent, child, parent.get_submodule(child)))
            setattr(parent, child, shell)
        yield
    finally:
        for parent, child, module in reversed(swapped):
            setattr(parent, child, module)


def replay_convention(convention: BlockCallConvention, block: nn.Module) -> BlockCallConvention:
    """``convention`` with :func:`float_layers` entered around every replay of a block that
    holds quantized layers (before the family's own ``replay_context``); else ``convention``.
    The shells are built here, once per block (a replay of another block of the same structure,
    a stacked template, gets its own on first use)."""
    shells = {id(block): float_shells(block)}
    if not shells[id(block)]:
        return convention
    inner = convention.replay_context

    @contextlib.contextmanager
    def replaying(b: nn.Module) -> Iterator[None]:
        if id(b) not in shells:
            shells[id(b)] = float_shells(b)
        with float_layers(b, shells[id(b)]), (
                inner(b) if inner is not None else contextlib.nullcontext()):
            yield

    context: Callable[[nn.Module], ContextManager[Any]] = replaying
    return dataclasses.replace(convention, replay_context=context)
