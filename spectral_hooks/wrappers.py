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

from torch import nn

log = logging.getLogger(__name__)


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
