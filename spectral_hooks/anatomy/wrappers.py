"""The module that owns the blocks, out of the wrappers around it: the one unwrapping rule.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))
    >>> unwrap_model(torch.nn.DataParallel(model)) is model
    True

Looked through, repeatedly, and said in one log line (INFO) naming what was found and what is
recorded, e.g. "SentenceTransformer: recording its Transformer module's BertModel":

- training wrappers: DistributedDataParallel and DataParallel (``.module``), accelerate's
  wrappers (``.module``), ``torch.compile``'s ``OptimizedModule`` (``._orig_mod``), PEFT's
  ``PeftModel`` (any task type) and tuner models (``LoraModel``, ...: the transformers model
  inside, whose projections carry the adapters; what a projection's weight then is:
  :mod:`spectral_hooks.anatomy.effective`);
- sentence-transformers models: ``SentenceTransformer``, ``CrossEncoder``, ``SparseEncoder``
  (the transformers model of their Transformer module, ``auto_model``);
- nnsight envelopes: ``NNsight``, ``LanguageModel`` (the module they wrap);
- transformers pipelines (``pipe.model``).

Every entry point (``instrument``, ``anatomy_of``, ``steer``, the callbacks, the CLI) applies
this one rule. Hooks go on the inner module's blocks, which the wrapper calls, so recording
through the wrapper's own call path (``st.encode``, ``CrossEncoder.predict``, an nnsight
``trace``, ``pipe(texts)``, DDP's forward) works. Anything else that is not a
``torch.nn.Module`` is refused with one sentence naming its type (:data:`ACCEPTED`).

One limit of ``torch.compile``: a graph compiled *before* the hooks existed does not see them
(Dynamo does not guard on module hooks, ``torch._dynamo.config.skip_nnmodule_hook_guards``), so
instrument before the first compiled call, or call ``torch._dynamo.reset()`` after
instrumenting; a warning says so when the compiled wrapper is instrumented.
"""

from __future__ import annotations

import logging
import sys
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Optional

from torch import nn

from ..errors import OptionTypeError, UnsupportedModelError

log: logging.Logger = logging.getLogger(__name__)

ACCEPTED = ("a torch.nn.Module (a transformers or TransformerLens model), or one held by "
            "DistributedDataParallel, DataParallel, accelerate, torch.compile, PEFT, "
            "sentence-transformers (SentenceTransformer, CrossEncoder, SparseEncoder), nnsight "
            "(NNsight, LanguageModel) or a transformers pipeline")

_COMPILE_LIMIT = ("hooks go on the original module: a graph compiled before now does not see "
                  "them: instrument before the first compiled call or call "
                  "torch._dynamo.reset()")

# a rule: wrapper -> (the object inside, what it is: a phrase with {} for its type), or None
Rule = Callable[[Any], Optional[tuple[Any, str]]]


def _peft(model: Any) -> Optional[tuple[Any, str]]:
    """PeftModel / a PEFT tuner model: the transformers model inside (peft is never imported
    here: a model can be a PEFT wrapper only once peft is imported)."""
    if "peft" not in sys.modules:
        return None
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    if isinstance(model, PeftModel):
        return model.get_base_model(), "the {} inside (adapters included)"
    if isinstance(model, BaseTuner):
        return model.model, "the {} inside (adapters included)"
    return None


def _compiled(model: Any) -> Optional[tuple[Any, str]]:
    inner = getattr(model, "_orig_mod", None) if isinstance(model, nn.Module) else None
    return (inner, "the original {}") if isinstance(inner, nn.Module) else None


def _sentence_transformers(model: Any) -> Optional[tuple[Any, str]]:
    """SentenceTransformer, CrossEncoder, SparseEncoder: the transformers model of the
    Transformer module (``auto_model``); a CrossEncoder of sentence-transformers < 4 (not a
    Module) holds it as ``.model``."""
    if not type(model).__module__.startswith("sentence_transformers."):
        return None
    if isinstance(model, nn.Module):
        for holder in model.modules():
            inner = getattr(holder, "auto_model", None)
            if isinstance(inner, nn.Module):
                return inner, f"its {type(holder).__name__} module's {{}}"
    inner = getattr(model, "model", None)
    return (inner, "its model, a {}") if isinstance(inner, nn.Module) else None


def _nnsight(model: Any) -> Optional[tuple[Any, str]]:
    """NNsight / LanguageModel (an ``Envoy``): the module it wraps (``_module``)."""
    if not type(model).__module__.startswith("nnsight."):
        return None
    inner = vars(model).get("_module")  # vars: an Envoy forwards unknown attributes inward
    return (inner, "the {} it wraps") if isinstance(inner, nn.Module) else None


def _pipeline(model: Any) -> Optional[tuple[Any, str]]:
    if "transformers" not in sys.modules:
        return None
    from transformers import Pipeline

    if isinstance(model, Pipeline) and isinstance(model.model, nn.Module):
        return model.model, "its model, a {}"
    return None


def _dot_module(model: Any) -> Optional[tuple[Any, str]]:
    """DDP, DataParallel, accelerate's wrappers: ``.module``."""
    inner = getattr(model, "module", None) if isinstance(model, nn.Module) else None
    return (inner, "the {} inside") if isinstance(inner, nn.Module) else None


RULES: tuple[Rule, ...] = (_peft, _compiled, _sentence_transformers, _nnsight, _pipeline,
                           _dot_module)


def _look_inside(model: Any) -> Optional[tuple[Any, str]]:
    for rule in RULES:
        found = rule(model)
        if found is not None and found[0] is not model:
            return found
    return None


def unwrap_model(model: Any, *, quiet: bool = False) -> nn.Module:
    """The ``nn.Module`` that owns the blocks, out of ``model``'s wrappers (see the module
    docstring for the ones looked through); ``quiet``: log nothing (for repeated look-ups
    such as ``anatomy_of``).

        >>> import torch
        >>> from transformers import GPT2Config, GPT2Model
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))
        >>> unwrap_model(torch.nn.DataParallel(model), quiet=True) is model
        True
        >>> unwrap_model("gpt2")
        Traceback (most recent call last):
        ...
        spectral_hooks.errors.OptionTypeError: model='gpt2' is not valid: expected a torch.nn.Module ...

    Raises:
        OptionTypeError: ``model`` is not a Module and no rule finds one inside it.
    """
    outer, found, compiled = model, [], False
    while (inside := _look_inside(model)) is not None:
        model, what = inside
        compiled = compiled or what == "the original {}"
        found.append(what.format(type(model).__name__))
    if not isinstance(model, nn.Module):
        raise OptionTypeError("model", model, ACCEPTED)
    if found and not quiet:
        (log.warning if compiled else log.info)(
            "%s: recording %s%s", type(outer).__name__, ", ".join(found),
            f" ({_COMPILE_LIMIT})" if compiled else "")
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter is an FSDP2 shard (a DTensor)."""
    return any(callable(getattr(p, "full_tensor", None)) for p in model.parameters())


def refuse_sharded(model: nn.Module, what: str) -> None:
    """One clear sentence instead of a crash inside torch for what FSDP2 shards and accelerate
    offloading (CPU/disk, ``device_map``) cannot do: replaying a block under forward-mode AD."""
    if any(hasattr(m, "_hf_hook") and getattr(m._hf_hook, "offload", False)
           for m in model.modules()):
        raise UnsupportedModelError(
            f"{what} of a model with accelerate-offloaded weights is not supported (accelerate's "
            "hooks swap the weights in during the block replay and break forward-mode AD): "
            "load the model without offloading (no device_map, or one that fits in memory)")
    if is_sharded(model):
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
            raise UnsupportedModelError(
                f"the weights of {where} are on the meta device (init_empty_weights, never "
                "loaded): load them first (accelerate's load_checkpoint_and_dispatch, or "
                "from_pretrained with a device_map) and analyse the loaded model")
        yield
