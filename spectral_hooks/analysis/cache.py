"""One cache per probe, keyed by a cheap fingerprint of the weights and the recording.

    >>> cache = AnalysisCache(model, recording)          # doctest: +SKIP
    >>> cache.get(("power", options), compute)            # doctest: +SKIP

Every lookup first checks the state: the model's tensors (identity, storage, dtype, device,
autograd ``_version``) plus the bit pattern of a fixed strided sample of each tensor's elements,
and the recording's generation. When anything differs from the state the cached entries were
computed in, every entry is dropped (nothing stale, nothing kept alive from an old state).

What is caught: ``steer()``, ``optimizer.step()`` (plain, foreach, and fused, which does not bump
``_version``: every element moves, so the sample does), ``load_state_dict``, ``model.to(...)``,
new or replaced parameters, writes of whole tensors through ``.data``, and new recordings.
The documented limit: an in-place write to a few elements that the sample does not cover and
that bypasses autograd's version counter; call ``probe.invalidate()`` after such an edit.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch
from torch import Tensor, nn

SAMPLES_PER_TENSOR = 64


class _Sampler:
    """Fixed strided views of a tensor's elements, rebuilt when its storage changes."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[int, Tensor]] = {}

    def view(self, tensor: Tensor) -> Tensor:
        key, ptr = id(tensor), tensor.data_ptr()
        cached = self._views.get(key)
        if cached is None or cached[0] != ptr:
            flat = tensor.detach().reshape(-1)
            stride = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            cached = (ptr, flat[::stride])
            self._views[key] = cached
        return cached[1]

    def forget_missing(self, alive: set[int]) -> None:
        for key in [k for k in self._views if k not in alive]:
            del self._views[key]


class WeightsFingerprint:
    """A cheap, exact-equality fingerprint of a module's parameters and buffers."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._sampler = _Sampler()

    def __call__(self) -> tuple[tuple, tuple[Tensor, ...]]:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        meta = tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device, t.shape)
                     for t in tensors)
        groups: dict[tuple, list[Tensor]] = {}
        for t in tensors:
            if t.numel():
                groups.setdefault((t.dtype, t.device), []).append(self._sampler.view(t))
        if len(self._sampler._views) > len(tensors):
            self._sampler.forget_missing({id(t) for t in tensors})
        samples = tuple(torch.cat(views).view(torch.uint8) for views in groups.values())
        return meta, samples


def _same(a: tuple[tuple, tuple[Tensor, ...]], b: tuple[tuple, tuple[Tensor, ...]]) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(
        torch.equal(x, y) for x, y in zip(a[1], b[1]))


class AnalysisCache:
    """Results of one probe's analyses, valid for one state of the weights and recording."""

    def __init__(self, model: nn.Module, recording: Any) -> None:
        self._fingerprint = WeightsFingerprint(model)
        self._recording = recording
        self._state: Any = None
        self._entries: dict[Hashable, Any] = {}

    def _current_state(self) -> tuple:
        return (id(self._recording), self._recording.generation), self._fingerprint()

    def refresh(self) -> None:
        """Check the state now; drop every entry if the weights or the recording changed."""
        state = self._current_state()
        if self._state is None or state[0] != self._state[0] or not _same(state[1],
                                                                         self._state[1]):
            self._entries.clear()
            self._state = state

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value for ``key`` in the current state, computed on a miss."""
        self.refresh()
        if key not in self._entries:
            self._entries[key] = compute()
        return self._entries[key]

    def invalidate(self) -> None:
        """Forget every entry (after an edit the fingerprint cannot see)."""
        self._entries.clear()
        self._state = None

    def __len__(self) -> int:
        return len(self._entries)
