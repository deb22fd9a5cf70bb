"""A block's recorded call, and the one walker over nested tensor structures.

    >>> import torch
    >>> call = BlockCall((torch.ones(2, 3, 4),), {"mask": torch.zeros(2, 3)}, hidden_in_args=True)
    >>> call.hidden.shape, call.select(1).kwargs["mask"].shape
    (torch.Size([2, 3, 4]), torch.Size([1, 3]))
    >>> map_tensors({"a": (torch.ones(1), [2, torch.zeros(1)])}, lambda t: t + 1)
    {'a': (tensor([2.]), [2, tensor([1.])])}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor

__all__ = ["BlockCall", "map_tensors"]


_LEAVES = (type(None), bool, int, float, str, complex, bytes)
_DATACLASS: dict[type, bool] = {}  # type -> is a dataclass (checked once per type)


def map_tensors(obj: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``obj`` with ``fn`` applied to every tensor inside nested tuples, lists, dicts and
    dataclass instances (tuples and dicts come back as plain tuples and dicts, dataclasses as
    copies by ``dataclasses.replace``); anything else is returned as it is. Hooks call it on
    every block call, so the common types are tested first."""
    kind = type(obj)
    if kind is Tensor or isinstance(obj, Tensor):
        return fn(obj)
    if kind in _LEAVES:
        return obj
    if isinstance(obj, tuple):
        return tuple([map_tensors(o, fn) for o in obj])
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    is_dataclass = _DATACLASS.get(kind)
    if is_dataclass is None:
        is_dataclass = _DATACLASS[kind] = dataclasses.is_dataclass(kind)
    if is_dataclass:
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


@dataclass(frozen=True)
class BlockCall:
    """A block's call arguments, with the residual input stored in them, caches removed.

    The residual input is ``args[0]`` when ``hidden_in_args``, else ``kwargs[hidden_kwarg]``
    (the keyword is an anatomy fact, ``anatomy.call_convention.hidden_kwarg``, passed by the
    probe: HF blocks take ``hidden_states``, TransformerLens 3 blocks ``resid_pre``).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    hidden_in_args: bool
    hidden_kwarg: str = "hidden_states"

    @property
    def hidden(self) -> Tensor:
        """The residual input the block was called with."""
        return self.args[0] if self.hidden_in_args else self.kwargs[self.hidden_kwarg]

    def with_hidden(self, hidden: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's (args, kwargs) with the residual input replaced by ``hidden``."""
        if self.hidden_in_args:
            return (hidden,) + tuple(self.args[1:]), dict(self.kwargs)
        return tuple(self.args), {**self.kwargs, self.hidden_kwarg: hidden}

    def select(self, row: int) -> "BlockCall":
        """The same call for one batch row (tensors with a batch dimension are sliced)."""
        batch = self.hidden.shape[0]

        def pick(t: Tensor) -> Tensor:
            if batch > 1 and t.ndim >= 2 and t.shape[0] == batch:
                return t[row:row + 1]
            return t

        return dataclasses.replace(self, args=map_tensors(self.args, pick),
                                   kwargs=map_tensors(self.kwargs, pick))
