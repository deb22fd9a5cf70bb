"""Probe: forward hooks that record a transformer's residual stream, and nothing else.

    >>> with instrument(model) as probe:           # doctest: +SKIP
    ...     model(**batch)
    >>> probe.recording.resid_post[2].shape        # doctest: +SKIP
    torch.Size([4, 12, 768])

Guarantees: the probe removes exactly the handles it registered (also when the forward raises,
when used as a context manager), never changes a model output, records detached copies, counts
applications of shared blocks (ALBERT), appends generate() decode steps, and ignores block calls
outside a forward of the model (gradient-checkpointing recomputation during backward).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import Tensor, nn

from .anatomy import Anatomy, anatomy_of
from .anatomy.base import CACHE_KWARGS
from .recording import CAPTURES, STORES, BlockCall, Recording, map_tensors
from .suspend import is_suspended, suspended  # noqa: F401  (suspended: public re-export)

log = logging.getLogger(__name__)


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def _is_cache(value: Any) -> bool:
    return value is not None and hasattr(value, "get_seq_length")


def _cache_length(kwargs: dict) -> int:
    """Positions already in a KV cache passed to the model or to a block (0: a fresh call)."""
    for name in CACHE_KWARGS:
        value = kwargs.get(name)
        if value is None or isinstance(value, (Tensor, bool)):
            continue
        if _is_cache(value):  # HF Cache objects
            return int(value.get_seq_length())
        past_keys = getattr(value, "past_keys", None)  # TL3 per-block cache entry
        if isinstance(past_keys, Tensor):
            return int(past_keys.shape[1])
        mask = getattr(value, "previous_attention_mask", None)  # TL3 whole-model cache
        if isinstance(mask, Tensor):
            return int(mask.shape[-1])
    return 0


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1



def _replayable_call(args: tuple, kwargs: dict, to_store) -> BlockCall:
    hidden_in_args = len(args) > 0
    kwargs = {k: v for k, v in kwargs.items() if k not in CACHE_KWARGS and not _is_cache(v)}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    args = tuple(None if _is_cache(a) else a for a in args)
    store = lambda t: to_store(t, copy=False)  # noqa: E731
    if hidden_in_args:
        args = (to_store(args[0]),) + map_tensors(args[1:], store)
        return BlockCall(args, map_tensors(kwargs, store), True)
    kwargs = map_tensors(kwargs, store)
    kwargs["hidden_states"] = to_store(kwargs["hidden_states"])
    return BlockCall(args, kwargs, False)


class _Call:
    """State of one forward of the model while it runs. ``implicit``: the blocks were called
    without the model's own forward (TL3's generate() calls ``forward`` directly)."""

    def __init__(self, mask: Optional[Tensor], continues: bool, implicit: bool = False) -> None:
        self.mask, self.continues, self.implicit = mask, continues, implicit
        self.counts: dict = {}
        self.captured: dict = {}
        self.block_calls: dict = {}
        self.inputs: Optional[tuple] = None

    def next_layer(self, key: tuple, order: list[int]) -> Optional[int]:
        count = self.counts.get(key, 0)
        self.counts[key] = count + 1
        return order[count] if count < len(order) else None


class Probe:
    """Hooks on one model; see :func:`instrument`."""

    def __init__(self, model: nn.Module, *, layers: Optional[Iterable[int]] = None,
                 capture: Sequence[str] = CAPTURES, store: str = "device",
                 dtype: Optional[torch.dtype] = None, anatomy: Optional[Anatomy] = None) -> None:
        self.anatomy = anatomy if anatomy is not None else anatomy_of(model)
        self.model = model
        capture = (capture,) if isinstance(capture, str) else tuple(capture)
        unknown = [c for c in capture if c not in CAPTURES]
        if unknown or not capture:
            raise ValueError(f"unknown capture name(s) {unknown or capture}: choose from {CAPTURES}")
        if store not in STORES:
            raise ValueError(f"store={store!r}: choose from {STORES}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")
        self.layers = self._normalise_layers(layers)
        self.recording = Recording(n_layers=self.anatomy.n_layers, layers=self.layers,
                                   capture=capture, store=store, dtype=dtype)
        self._handles: list = []
        self._call: Optional[_Call] = None
        self._analyzer = None
        self._attach()

    def _normalise_layers(self, layers: Optional[Iterable[int]]) -> tuple[int, ...]:
        if layers is None:
            return tuple(range(self.anatomy.n_layers))
        if isinstance(layers, int):
            layers = [layers]
        normalised = sorted({self.anatomy.layer_index(layer) for layer in layers})
        if not normalised:
            raise ValueError("layers is empty: pass None to record every layer")
        return tuple(normalised)

    # ---------------------------------------------------------------- attaching
    def _register(self, module: nn.Module, hook, *, pre: bool = False) -> None:
        if pre:
            handle = module.register_forward_pre_hook(hook, with_kwargs=True)
        else:
            handle = module.register_forward_hook(hook, with_kwargs=True)
        self._handles.append(handle)

    def _orders(self, attr: str) -> dict:
        """module id -> (module, [layer indices in application order]) for recorded layers."""
        orders: dict = {}
        for part in self.anatomy.layers:
            module = getattr(part, attr)
            if module is None:
                continue
            entry = orders.setdefault(id(module), (module, []))
            entry[1].append(part.index)
        return orders

    def _attach(self) -> None:
        root = self.anatomy.call_root
        self._root_signature = inspect.signature(root.forward)
        self._register(root, self._begin_call, pre=True)
        self._register(root, self._end_call)
        capture = self.recording.capture
        last_block = self.anatomy.layers[-1].block
        self._first_block = self.anatomy.layers[0].block
        self._last_block_uses = sum(p.block is last_block for p in self.anatomy.layers)
        for module, order in self._orders("block").values():
            self._register(module, self._block_pre_hook(order), pre=True)
            if "resid_post" in capture and self.anatomy.layers[order[0]].resid_post_hook is None:
                self._register(module, self._output_hook("resid_post", ("block", id(module)),
                                                         order))
        for attr, name in (("resid_pre_hook", "resid_pre"), ("resid_post_hook", "resid_post"),
                           ("attn_out_module", "attn_out")):
            if name not in capture:
                continue
            for module, order in self._orders(attr).values():
                self._register(module, self._output_hook(name, (attr, id(module)), order))
        # last, so that an implicit call commits after every other hook of the last block ran
        self._register(last_block, self._end_implicit_call)

    # ---------------------------------------------------------------- hooks
    def _begin_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        try:
            bound = self._root_signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = dict(kwargs)
        extra = bound.pop("kwargs", None)
        if isinstance(extra, dict):
            bound.update(extra)
        inputs = next((bound[k] for k in ("input_ids", "inputs_embeds", "input", "tokens")
                       if isinstance(bound.get(k), Tensor)), None)
        if inputs is not None and (inputs.shape[0] == 0 or (inputs.ndim > 1 and
                                                            inputs.shape[1] == 0)):
            raise ValueError(f"empty batch: the model was called with inputs of shape "
                             f"{tuple(inputs.shape)}")
        mask = bound.get("attention_mask")
        mask = mask if isinstance(mask, Tensor) and mask.ndim == 2 else None
        texts = bound.get("input")
        if (mask is None and isinstance(texts, (list, tuple)) and len(texts) > 1
                and all(isinstance(t, str) for t in texts)):
            raise ValueError("a list of strings is padded inside the model, so the probe cannot "
                             "tell padding from tokens: pass tokens (model.to_tokens(...)) and "
                             "attention_mask= instead")
        self._call = _Call(mask, continues=_cache_length(bound) > 0)
        if not self._call.continues:
            keep = lambda t: self.recording.to_store(t, copy=False)  # noqa: E731
            clean = {k: v for k, v in kwargs.items()
                     if k not in CACHE_KWARGS and not _is_cache(v)}
            self._call.inputs = (map_tensors(tuple(args), keep), map_tensors(clean, keep))

    def _end_call(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        call, self._call = self._call, None
        if call is None or not call.captured:
            return
        missing = sorted({layer for name in self.recording.capture for layer in self.layers
                          if (name, layer) not in call.captured})
        if missing:  # e.g. stop_at_layer, or an exception swallowed inside the model
            log.warning("forward call not recorded: layers %s did not run (recorded layers "
                        "must all run in every call)", missing)
            return
        sample = next(iter(call.captured.values()))
        batch, n_new = sample.shape[0], sample.shape[1]
        if call.mask is not None and call.mask.shape[0] == batch and call.mask.shape[1] >= n_new:
            mask = call.mask[:, -n_new:]
        else:
            mask = torch.ones(batch, n_new, dtype=torch.long)
        self.recording.commit(call.captured, mask, continues=call.continues,
                              block_calls=call.block_calls, inputs=call.inputs)

    def _end_implicit_call(self, module: nn.Module, args: tuple, kwargs: dict,
                           output: Any) -> None:
        call = self._call
        if call is None or not call.implicit or is_suspended():
            return
        if call.next_layer(("implicit_end", id(module)), [0] * self._last_block_uses) is None:
            return
        if call.counts[("implicit_end", id(module))] == self._last_block_uses:
            self._end_call(module, args, kwargs, output)

    def _block_pre_hook(self, order: list[int]):
        recorded = set(self.layers)
        wants_pre = "resid_pre" in self.recording.capture

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if is_suspended():
                return
            if self._call is None and module is self._first_block and not _in_backward():
                mask = kwargs.get("attention_mask")  # the model's forward was bypassed
                mask = mask if isinstance(mask, Tensor) and mask.ndim == 2 else None
                self._call = _Call(mask, continues=_cache_length(kwargs) > 0, implicit=True)
            call = self._call
            if call is None:
                return  # outside a model forward: e.g. checkpoint recomputation in backward
            layer = call.next_layer(("block_pre", id(module)), order)
            if layer is None or layer not in recorded:
                return
            hidden = args[0] if args else kwargs.get("hidden_states")
            if not isinstance(hidden, Tensor):
                return
            block_call = None
            if not call.continues:
                block_call = _replayable_call(args, kwargs, self.recording.to_store)
                call.block_calls[layer] = block_call
            if wants_pre and self.anatomy.layers[layer].resid_pre_hook is None:
                call.captured[("resid_pre", layer)] = (
                    block_call.hidden if block_call is not None
                    else self.recording.to_store(hidden))

        return hook

    def _output_hook(self, name: str, key: tuple, order: list[int]):
        recorded = set(self.layers)

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            call = self._call
            if call is None or is_suspended():
                return
            layer = call.next_layer(key, order)
            if layer is not None and layer in recorded:
                call.captured[(name, layer)] = self.recording.to_store(_first(output))

        return hook

    # ---------------------------------------------------------------- lifecycle
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def n_handles(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        """Remove exactly the hooks this probe registered. Safe to call twice."""
        while self._handles:
            self._handles.pop().remove()
        self._call = None

    def clone_on(self, model: nn.Module) -> "Probe":
        """A new probe with the same layers, captures and store on another model (e.g. a
        re-initialised copy of this one)."""
        rec = self.recording
        return Probe(model, layers=self.layers, capture=rec.capture, store=rec.store,
                     dtype=rec.dtype)

    def clear(self) -> None:
        """Forget the recording, keep the hooks."""
        self.recording.clear()

    def jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                 kind: str = "token", dtype: torch.dtype = torch.float64, **options: Any):
        """Block ``layer``'s Jacobian at its recorded input as a matrix-free LinearOperator
        (matvec = JVP, rmatvec = VJP). ``position=-1``: the last real token of ``sample``.
        ``options``: ``method``, ``single_query`` (see linearize.block_jacobian)."""
        from .linearize import block_jacobian

        return block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                              position=position, kind=kind, dtype=dtype, **options)

    def jacobian_product(self, first: int, last: int, *, position: int = -1, sample: int = 0,
                         dtype: torch.dtype = torch.float64, **options: Any):
        """P = J_last ... J_first at one token position (exact for causal models)."""
        from .linearize import jacobian_product

        return jacobian_product(self.anatomy, self.recording, first, last, sample=sample,
                                position=position, dtype=dtype, **options)

    def dense_jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                       kind: str = "token", dtype: torch.dtype = torch.float64):
        """The dense Jacobian by forward-mode AD (small models; a float64 Tensor)."""
        from .linearize import dense_block_jacobian

        return dense_block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                                    position=position, kind=kind, dtype=dtype)

    def analyze(self, **options: Any):
        """A lazily computed :class:`~spectral_hooks.report.Report` (see Analyzer.analyze)."""
        if self._analyzer is None:
            from .analyzer import Analyzer

            self._analyzer = Analyzer(self)
        return self._analyzer.analyze(**options)

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "removed"
        return (f"Probe({self.anatomy.family}, layers={list(self.layers)}, {state}, "
                f"{self.recording!r})")


def instrument(model: nn.Module, *, layers: Optional[Iterable[int]] = None,
               capture: Sequence[str] = CAPTURES, store: str = "device",
               dtype: Optional[torch.dtype] = None) -> Probe:
    """Attach recording hooks to ``model`` and return the :class:`Probe`.

        >>> from transformers import GPT2Config, GPT2Model
        >>> import torch
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
        >>> with instrument(model) as probe:
        ...     _ = model(torch.tensor([[1, 2, 3]]))
        >>> probe.recording.resid_post[1].shape
        torch.Size([1, 3, 32])

    Args:
        layers: indices to record (negative allowed); None records every layer.
        capture: any of "resid_pre", "resid_post", "attn_out".
        store: "device" (keep where computed), "cpu" (offload) or "stats" (running mean and
            covariance only: constant memory for arbitrarily long runs).
        dtype: cast recorded tensors (e.g. torch.float32 for a bf16 model).
    """
    return Probe(model, layers=layers, capture=capture, store=store, dtype=dtype)
