"""The module that owns the blocks, out of the wrappers training puts around it.

    >>> inner = unwrap_model(DistributedDataParallel(model))   # doctest: +SKIP
    >>> inner is model                                         # doctest: +SKIP
    True

Unwrapped (and logged at INFO, so a user sees what was instrumented): DistributedDataParallel
and DataParallel (``.module``), accelerate's wrappers (``.module``), ``torch.compile``'s
``OptimizedModule`` (``._orig_mod``) and PEFT's ``PeftModel`` (any task type) and tuner models
(``LoraModel``, ...: the transformers model inside, whose projections carry the adapters; what
a projection's weight then is: :mod:`spectral_hooks.anatomy.effective`). Every entry point
(``instrument``, ``anatomy_of``, ``steer``, the callbacks, the CLI) applies this one rule.
Hooks go on the inner module's blocks, which the wrapper calls, so recording through the
wrapper works. One limit of ``torch.compile``: a graph compiled
*before* the hooks existed does not see them (Dynamo does not guard on module hooks,
``torch._dynamo.config.skip_nnmodule_hook_guards``), so instrument before the first compiled
call, or call ``torch._dynamo.reset()`` after instrumenting; a warning says so when the compiled
wrapper is instrumented.
"""

from __future__ import annotations

import logging
import sys
from contextlib import ExitStack, contextmanager
from typing import Iterator, Optional

from torch import nn

log: logging.Logger = logging.getLogger(__name__)


def _peft_inner(model: nn.Module) -> Optional[nn.Module]:
    """The transformers model inside a PeftModel / PEFT tuner model, else None (peft is never
    imported here: a model can be a PEFT wrapper only once peft is imported)."""
    if "peft" not in sys.modules:
        return None
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    if isinstance(model, PeftModel):
        return model.get_base_model()
    if isinstance(model, BaseTuner):
        return model.model
    return None


def unwrap_model(model: nn.Module, *, quiet: bool = False) -> nn.Module:
    """``model`` without DDP / DataParallel / accelerate / torch.compile / PEFT wrappers;
    ``quiet``: log nothing (for repeated look-ups such as ``anatomy_of``)."""
    say = (lambda *args: None) if quiet else log.info
    while True:
        inner = _peft_inner(model)
        if isinstance(inner, nn.Module) and inner is not model:
            say("instrument(): unwrapped %s; instrumenting the %s inside (adapters included)",
                type(model).__name__, type(inner).__name__)
            model = inner
            continue
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            (say if quiet else log.warning)(
                "instrument(): %s is a torch.compile wrapper; hooks go on the original %s. A "
                "graph compiled before now does not see them: instrument before the first "
                "compiled call or call torch._dynamo.reset()",
                type(model).__name__, type(inner).__name__)
            model = inner
            continue
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module):
            say("instrument(): unwrapped %s; instrumenting the %s inside",
                type(model).__name__, type(inner).__name__)
            model = inner
            continue
        return model


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter is an FSDP2 shard (a DTensor)."""
    return any(callable(getattr(p, "full_tensor", None)) for p in model.parameters())


def refuse_sharded(model: nn.Module, what: str) -> None:
    """One clear sentence instead of a crash inside torch for what FSDP2 shards and accelerate
    offloading (CPU/disk, ``device_map``) cannot do: replaying a block under forward-mode AD."""
    if any(hasattr(m, "_hf_hook") and getattr(m._hf_hook, "offload", False)
           for m in model.modules()):
        from ..errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"{what} of a model with accelerate-offloaded weights is not supported (accelerate's "
            "hooks swap the weights in during the block replay and break forward-mode AD): "
            "load the model without offloading (no device_map, or one that fits in memory)")
    if is_sharded(model):
        from ..errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"{what} of an FSDP2-sharded model is not supported (its blocks are replayed outside "
            "FSDP's own forward, on DTensor shards): run it on an unsharded copy, e.g. a model "
            "loaded from get_model_state_dict(model, options=StateDictOptions("
            "full_state_dict=True))")


@contextmanager
def weights_in(module: nn.Module, *, where: str = "this block") -> Iterator[None]:
    """``module``'s weights present for the duration: accelerate-offloaded submodules (CPU or
    disk, ``device_map``) are brought in with ``align_module_device`` and sent back after;
    weights still on the meta device (``init_empty_weights`` never loaded) are refused with
    one sentence (UnsupportedModelError) instead of a raw torch error."""
    with ExitStack() as stack:
        offloaded = [m for m in module.modules() if hasattr(m, "_hf_hook")]
        if offloaded:
            from accelerate.utils import align_module_device, has_offloaded_params

            for m in offloaded:
                if has_offloaded_params(m):
                    stack.enter_context(align_module_device(m))
        if any(p.device.type == "meta" for p in module.parameters()):
            from ..errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"the weights of {where} are on the meta device (init_empty_weights, never "
                "loaded): load them first (accelerate's load_checkpoint_and_dispatch, or "
                "from_pretrained with a device_map) and analyse the loaded model")
        yield
