"""A recording read like TransformerLens' ``ActivationCache``: a mapping of hook names.

    >>> "blocks.3.hook_resid_post" in probe.recording                     # doctest: +SKIP
    True
    >>> probe.recording["resid_post", -1] is probe.recording.resid_post[-1]  # doctest: +SKIP
    True
    >>> {name: x.shape for name, x in probe.recording.items()}            # doctest: +SKIP
    >>> probe.recording.to("cpu")                 # moves everything, returns the recording

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

from .errors import RecordingKeyError, UnknownNameError
from .tl_names import POINTS, hook_name, parse

_RUN_ORDER = ("resid_pre", "attn_pattern", "attn_out", "resid_post")  # the order a block runs its hooks


class ActivationCacheView:
    """Mixin for :class:`~spectral_hooks.recording.Recording` (needs ``layers``, ``capture``,
    ``n_layers``, ``store``, ``tensor(point, layer)``, ``mask`` and ``_has_data()``)."""

    if TYPE_CHECKING:  # provided by Recording
        n_layers: int
        layers: tuple[int, ...]
        capture: tuple[str, ...]
        store: str
        mask: Any

        def _has_data(self) -> bool: ...

        def tensor(self, capture: str, layer: int) -> torch.Tensor: ...

    def keys(self) -> list[str]:
        if not self._has_data():
            return []
        points = [p for p in _RUN_ORDER if p in self.capture]
        return [hook_name(p, layer) for layer in self.layers for p in points]

    def values(self) -> list[Tensor]:
        return [self[name] for name in self.keys()]

    def items(self) -> list[tuple[str, Tensor]]:
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
            raise UnknownNameError("name", key, "a hook name: 'blocks.<l>.hook_resid_pre', "
                                   "'blocks.<l>.hook_resid_post', 'blocks.<l>.hook_attn_out', "
                                   "'blocks.<l>', 'hook_<point>' or 'mask'") from None
    else:
        raise RecordingKeyError(f"unknown key {key!r}: use a hook name such as "
                                "'blocks.3.hook_resid_post' or a tuple ('resid_post', 3)")
    if point not in POINTS or not isinstance(layer, int) or isinstance(layer, bool):
        raise RecordingKeyError(f"{key!r} names no recorded point of a layer: use e.g. "
                                "'blocks.3.hook_resid_post' or ('resid_post', 3)")
    return point, layer


def move(obj: Any, device: Union[str, torch.device]) -> Any:
    """``obj`` with every tensor inside (dataclasses, tuples, lists, dicts) moved to ``device``."""
    import dataclasses

    if isinstance(obj, Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, (tuple, list)):
        return type(obj)(move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    return obj
