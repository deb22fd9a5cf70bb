"""The module that owns the blocks, out of the wrappers training puts around it.

    >>> inner = unwrap_model(DistributedDataParallel(model))   # doctest: +SKIP
    >>> inner is model                                         # doctest: +SKIP
    True

Unwrapped (and logged at INFO, so a user sees what was instrumented): DistributedDataParallel
and DataParallel (``.module``), accelerate's wrappers (``.module``) and ``torch.compile``'s
``OptimizedModule`` (``._orig_mod``). Hooks go on the inner module's blocks, which the wrapper
calls, so recording through the wrapper works. One limit of ``torch.compile``: a graph compiled
*before* the hooks existed does not see them (Dynamo does not guard on module hooks,
``torch._dynamo.config.skip_nnmodule_hook_guards``), so instrument before the first compiled
call, or call ``torch._dynamo.reset()`` after instrumenting; a warning says so when the compiled
wrapper is instrumented.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from typing import Iterator

from torch import nn

log: logging.Logger = logging.getLogger(__name__)


def unwrap_model(model: nn.Module) -> nn.Module:
    """``model`` without DDP / DataParallel / accelerate / torch.compile wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            log.warning("instrument(): %s is a torch.compile wrapper; hooks go on the original "
                        "%s. A graph compiled before now does not see them: instrument before "
                        "the first compiled call or call torch._dynamo.reset()",
                        type(model).__name__, type(inner).__name__)
            model = inner
            continue
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module):
            log.info("instrument(): unwrapped %s; instrumenting the %s inside",
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
        from .errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"{what} of a model with accelerate-offloaded weights is not supported (accelerate's "
            "hooks swap the weights in during the block replay and break forward-mode AD): "
            "load the model without offloading (no device_map, or one that fits in memory)")
    if is_sharded(model):
        from .errors import UnsupportedModelError

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
            from .errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"the weights of {where} are on the meta device (init_empty_weights, never "
                "loaded): load them first (accelerate's load_checkpoint_and_dispatch, or "
                "from_pretrained with a device_map) and analyse the loaded model")
        yield
