"""A recording read like TransformerLens' ``ActivationCache``: a mapping of hook names.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> from spectral_hooks.probe import instrument
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with instrument(model) as probe:
    ...     _ = model(torch.tensor([[1, 2, 3]]))
    >>> "blocks.1.hook_resid_post" in probe.recording
    True
    >>> probe.recording["resid_post", -1] is probe.recording.resid_post[-1]
    True
    >>> list(probe.recording)[:3]
    ['blocks.0.hook_resid_pre', 'blocks.0.hook_attn_out', 'blocks.0.hook_resid_post']
    >>> probe.recording.to("cpu") is probe.recording  # moves everything, returns the recording
    True

As in ``ActivationCache``: ``keys()`` are full hook names (``blocks.<l>.hook_<point>``) in the
order the model runs them, iteration and ``in`` go over those keys (exact names: a tuple is not
"in" even though indexing accepts it), ``len`` counts them, ``[key]`` takes a full name or
``(point, layer)`` with a negative layer allowed, a missing key raises KeyError, and
``to(device)`` moves the data in place and returns the recording. A recording with nothing
to read (before any forward, or ``store="stats"``) has no keys. ``recording.n_calls``
counts forward calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Union

import torch
from torch import Tensor

from ..errors import RecordingKeyError, UnknownNameError
from .points import CAPTURES, RUN_ORDER, hook_name, hook_names, parse


class ActivationCacheView:
    """Mixin for :class:`~spectral_hooks.recording.core.Recording` (needs ``layers``, ``capture``,
    ``n_layers``, ``store``, ``tensor(point, layer)``, ``mask`` and ``_has_data()``)."""

    if TYPE_CHECKING:  # provided by Recording
        n_layers: int
        layers: tuple[int, ...]
        capture: tuple[str, ...]
        absent: dict[tuple[str, int], str]
        store: str
        mask: Any

        def _has_data(self) -> bool: ...

        def tensor(self, capture: str, layer: int) -> torch.Tensor: ...

    def keys(self) -> list[str]:
        """The TransformerLens hook names recorded (``blocks.{l}.hook_resid_post``, ...), layer
        by layer in run order; empty before the first forward.
        """
        if not self._has_data():
            return []
        points = [p for p in RUN_ORDER if p in self.capture]
        return [hook_name(p, layer) for layer in self.layers for p in points
                if (p, layer) not in self.absent]

    def values(self) -> list[Tensor]:
        """The recorded tensors, in the order of :meth:`keys`."""
        return [self[name] for name in self.keys()]

    def items(self) -> list[tuple[str, Tensor]]:
        """``(hook name, tensor)`` pairs, in the order of :meth:`keys`."""
        return [(name, self[name]) for name in self.keys()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.keys()

    def __len__(self) -> int:
        return len(self.keys())

    def __getitem__(self, key: Union[str, tuple[Any, ...]]) -> Tensor:
        if key == "mask":
            return self.mask
        point, layer = _resolve(key)
        if not -self.n_layers <= layer < self.n_layers:
            raise RecordingKeyError(f"{key!r}: no layer {layer} in a {self.n_layers}-layer model")
        return self.tensor(point, layer % self.n_layers)


def _resolve(key: Any) -> tuple[str, int]:
    """(point, layer) from a full hook name or a ``(point, layer[, None])``."""
    if isinstance(key, tuple) and len(key) in (2, 3) and isinstance(key[0], str) \
            and (len(key) == 2 or key[2] is None):
        point, layer = key[0], key[1]
        point = point[len("hook_"):] if point.startswith("hook_") else point
    elif isinstance(key, str):
        try:
            point, layer = parse(key)
        except ValueError:
            raise UnknownNameError("name", key, f"a hook name: {hook_names()}, 'blocks.<l>', "
                                   "'hook_<point>' or 'mask'") from None
    else:
        raise RecordingKeyError(f"unknown key {key!r}: use a hook name such as "
                                "'blocks.3.hook_resid_post' or a tuple ('resid_post', 3)")
    if point not in CAPTURES or not isinstance(layer, int) or isinstance(layer, bool):
        raise RecordingKeyError(f"{key!r} names no recorded point of a layer: use e.g. "
                                "'blocks.3.hook_resid_post' or ('resid_post', 3)")
    return point, layer

