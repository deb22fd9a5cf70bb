"""One cache per probe, keyed by a cheap fingerprint of the weights and the recording.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> cache = AnalysisCache(model, probe.recording)
    >>> cache.get("answer", lambda: 42), cache.get("answer", lambda: 0)   # computed once
    (42, 42)
    >>> with torch.no_grad():
    ...     model.h[0].mlp.c_fc.weight[0, 0] += 1.0    # an edit of the weights ...
    >>> cache.get("answer", lambda: 0)                # ... drops every entry
    0

Every lookup first checks the state: the model's tensors (identity, storage, dtype, device,
autograd ``_version``) plus the bit pattern of a fixed strided sample of each tensor's elements,
and the recording's generation. When anything differs from the state the cached entries were
computed in, every entry is dropped (nothing stale, nothing kept alive from an old state).

What is caught: ``steer()``, ``optimizer.step()`` (plain, foreach, and fused, which does not bump
``_version``: every element moves, so the sample does), ``load_state_dict``, ``model.to(...)``,
new or replaced parameters, writes of whole tensors through ``.data``, new recordings, and
PEFT's ``set_adapter`` / ``disable_adapter()`` / merging (which change the effective weights
without writing a parameter). A quantized tensor subclass (torchao, quanto) is fingerprinted
through the plain tensors it wraps (``__tensor_flatten__``); bitsandbytes' in-place repacking
of 4-bit weights replaces the weight's data, which the fingerprint sees; steering's additive
terms on quantized layers (``anatomy.effective.additive_term``) are keyed by their version.
The documented limit: an in-place write to a few elements that the sample does not cover and
that bypasses autograd's version counter; call ``probe.invalidate()`` after such an edit.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, cast

import numpy as np
import torch
from torch import Tensor, nn

from ..anatomy.effective import adapter_modules, adapter_state, additive_state, name_layers

SAMPLES_PER_TENSOR = 64
# numpy has no bfloat16/float8: sample those through an integer view of the same width
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _leaves(tensor: Tensor) -> list[Tensor]:
    """The plain tensors that hold ``tensor``'s values: itself, or for a wrapper tensor subclass
    (torchao ``Int8Tensor`` / ``IntxUnpackedToInt8Tensor`` / ``Float8Tensor``, quanto's
    ``WeightQBitsTensor``, ...: no storage of its own, and views such as ``reshape`` are not
    implemented) the inner tensors its ``__tensor_flatten__`` names, recursively."""
    if type(tensor) in (Tensor, nn.Parameter) or not callable(
            getattr(tensor, "__tensor_flatten__", None)):
        return [tensor]
    names = cast(Any, tensor).__tensor_flatten__()[0]
    inner = [getattr(tensor, name, None) for name in names]
    return [leaf for t in inner if isinstance(t, Tensor) for leaf in _leaves(t)]


def _sample_view(tensor: Tensor) -> Any:
    """A strided view of ~64 elements: a numpy view for contiguous CPU tensors (numpy gathers
    148 strided views in 0.14 ms where torch.cat needs 0.9 ms), else a torch view. An FSDP2
    DTensor is sampled through its local shard (no communication; each rank checks its own)."""
    local = getattr(tensor, "to_local", None)
    if callable(local):
        tensor = cast(Tensor, local())
    flat = tensor.detach().reshape(-1)
    stride = max(1, flat.numel() // SAMPLES_PER_TENSOR)
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.is_complex():
        return flat[::stride]
    return flat.view(_INT_OF_WIDTH[flat.element_size()]).numpy()[::stride]


class WeightsFingerprint:
    """A cheap, exact-equality fingerprint of a module's parameters and buffers.

    The module tree is walked once; each lookup re-reads every slot (so a replaced Parameter
    is seen), but modules added or removed after instrumenting are not (the anatomy would be
    out of date too: instrument again)."""

    def __init__(self, model: nn.Module) -> None:
        self._slots = [(module._parameters, name) for module in model.modules()
                       for name in module._parameters] + \
                      [(module._buffers, name) for module in model.modules()
                       for name in module._buffers]
        self._views: dict[int, tuple[int, Any]] = {}

    def _view(self, tensor: Tensor) -> Any:
        cached = self._views.get(id(tensor))
        if cached is None or cached[0] != tensor.data_ptr():
            cached = (tensor.data_ptr(), _sample_view(tensor))
            self._views[id(tensor)] = cached
        return cached[1]

    def __call__(self) -> tuple[list[Any], list[Any]]:
        slots = [t for t in (slots[name] for slots, name in self._slots) if t is not None]
        leaves = [_leaves(t) for t in slots]  # a quantized tensor subclass: its inner tensors
        meta = [(id(t), t._version, t.dtype, tuple((id(l), l.data_ptr(), l._version, l.dtype)
                                                   for l in held))
                for t, held in zip(slots, leaves)]
        tensors = [leaf for held in leaves for leaf in held]
        if len(self._views) > len(tensors):
            alive = {id(t) for t in tensors}
            self._views = {k: v for k, v in self._views.items() if k in alive}
        arrays: dict = {}
        for t in tensors:
            if t.numel() and t.device.type != "meta":  # meta (offloaded): no values to sample
                view = self._view(t)
                key = view.dtype if isinstance(view, np.ndarray) else (view.dtype, view.device)
                arrays.setdefault(key, []).append(view)
        samples = [np.concatenate(v).tobytes() if isinstance(v[0], np.ndarray)
                   else torch.cat(v) for v in arrays.values()]
        return meta, samples


def _same(a: tuple[list, list], b: tuple[list, list]) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(
        x == y if isinstance(x, bytes) else torch.equal(x, y)  # NaN: unequal, recomputed
        for x, y in zip(a[1], b[1]))


class AnalysisCache:
    """Results of one probe's analyses, valid for one state of the weights and recording."""

    def __init__(self, model: nn.Module, recording: Any) -> None:
        self._fingerprint = WeightsFingerprint(model)
        self._adapters = adapter_modules(model)  # PEFT: set_adapter / disable move no tensor
        name_layers(model)  # quantized layers: refusals name them
        self._recording = recording
        self._state: Any = None
        self._entries: dict[Hashable, Any] = {}
        self._working: "OrderedDict[Hashable, Any]" = OrderedDict()  # see get_working

    def _current_state(self) -> tuple:
        return ((id(self._recording), self._recording.generation, adapter_state(self._adapters),
                 additive_state()),  # steering's additive terms on quantized layers
                self._fingerprint())

    def refresh(self) -> None:
        """Check the state now; drop every entry if the weights or the recording changed."""
        state = self._current_state()
        if self._state is None or state[0] != self._state[0] or not _same(state[1],
                                                                         self._state[1]):
            self._entries.clear()
            self._working.clear()
            self._state = state

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value for ``key`` in the current state, computed on a miss."""
        self.refresh()
        if key not in self._entries:
            self._entries[key] = compute()
        return self._entries[key]

    def get_working(self, key: Hashable, compute: Callable[[], Any], *, keep: int) -> Any:
        """Like :meth:`get`, for large working objects rather than results (a block Jacobian
        operator holds float64 copies of the block's weights: 1.75 GB for a Llama-3-8B layer):
        only the ``keep`` most recently used stay cached, the others are recomputed on demand,
        so a section over every layer holds a few of them, not one per layer."""
        self.refresh()
        if key in self._working:
            self._working.move_to_end(key)
            return self._working[key]
        value = self._working[key] = compute()
        while len(self._working) > keep:
            self._working.popitem(last=False)
        return value

    def invalidate(self) -> None:
        """Forget every entry (after an edit the fingerprint cannot see)."""
        self._entries.clear()
        self._working.clear()
        self._state = None

    def __len__(self) -> int:
        return len(self._entries)
