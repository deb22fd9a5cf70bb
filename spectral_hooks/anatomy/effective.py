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
- a weight that cannot be read exactly (packed or quantized: int8/4-bit, float8 or any weight
  with a separate scale, a quantized tensor subclass, ``torch.ao`` quantized modules, GPTQ
  ``qweight``) is refused with
  :class:`~spectral_hooks.errors.UnsupportedModelError` naming the layer type, never read stale.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError

__all__ = ["effective_weight", "effective_bias", "stored_layout_module", "adapter_state",
           "writable_weight", "running_module", "adapter_modules"]


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


def _plain_weight(module: nn.Module) -> Tensor:
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
        return _plain_weight(_merged_copy(module))
    return _plain_weight(module)


def effective_bias(module: nn.Module) -> Optional[Tensor]:
    """The bias ``module``'s forward adds (LoRA with ``lora_bias`` changes it), or None."""
    module = running_module(module)
    if is_tuner_layer(module):
        module = _merged_copy(module)
    bias = getattr(module, "bias", None)
    return bias.detach() if isinstance(bias, Tensor) else None


def writable_weight(module: nn.Module) -> tuple[Optional[nn.Parameter], str]:
    """(the parameter to write so that the effective weight moves by exactly the same amount,
    "") or (None, why not). Additive adapters (LoRA without DoRA, LoHa, LoKr) keep
    effective = stored + delta, so an edit of the stored base weight is an edit of the
    effective one; DoRA and IA3 rescale it, parametrizations recompute it, quantized weights
    cannot be written."""
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
