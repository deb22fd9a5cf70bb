"""Routed experts: does the float64 replay pick the experts the recorded forward picked?

A mixture-of-experts block is piecewise smooth: its router's top-k choice is locally constant,
and the Jacobian at a point differentiates the mixing weights with that choice held. The replay
recomputes the router in its own dtype (float64) at the recorded input; where two experts'
scores nearly tie, rounding in the model's dtype may have chosen the other one, and the
Jacobian would then be that of a neighbouring piece. :func:`check_routing` runs the block once
in the model's own dtype (which reproduces the recorded forward) and once as the replay does,
logs every ``topk`` the block calls, and compares the choices on the real tokens of the row.
Where they differ, the recorded choice is held: the replay runs the whole sequence with every
``topk`` of the block answering the recorded indices (:class:`HeldTopk`), and a
:class:`~spectral_hooks.errors.FallbackWarning` (cause ``linearize.routing_held``) says so.

    >>> import torch
    >>> log = TopkLog()
    >>> with log:
    ...     _ = torch.topk(torch.tensor([[0.1, 0.7, 0.2]]), 2)
    >>> log.indices[0].tolist()
    [[1, 2]]
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ..errors import fallback
from ..recording import map_tensors

__all__ = ["HeldTopk", "TopkLog", "check_routing"]


class TopkLog(TorchFunctionMode):
    """Logs the indices of every ``torch.topk`` called while it is active (the routers'
    choices), detached copies in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.indices: list[Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.topk, Tensor.topk):
            self.indices.append(out[1].detach().clone())
        return out


class HeldTopk(TorchFunctionMode):
    """Within a replay of the whole sequence: the i-th ``torch.topk`` the block calls returns
    the i-th recorded choice (``held[i]``, the model-dtype forward's indices) and the input's
    values gathered there, so the router's mixing weights are differentiated at the recorded
    forward's experts."""

    def __init__(self, held: list[Tensor]) -> None:
        super().__init__()
        self.held, self.calls = held, 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[dict] = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.topk, Tensor.topk) and self.calls < len(self.held):
            index = self.held[self.calls].to(out[1].device)
            self.calls += 1
            if index.shape == out[1].shape:
                values = torch.gather(args[0], _dim(args, kwargs), index)
                return torch.return_types.topk((values, index))
        return out


def _dim(args: tuple, kwargs: Optional[dict]) -> int:
    """The ``dim`` of a topk call (default -1)."""
    kwargs = kwargs or {}
    if "dim" in kwargs:
        return int(kwargs["dim"])
    return int(args[2]) if len(args) > 2 else -1


def _choices(run: Callable[[], Any]) -> list[Tensor]:
    log = TopkLog()
    with torch.no_grad(), log:
        run()
    return log.indices


def check_routing(fn: Any, real: Tensor) -> Optional[list[Tensor]]:
    """Compare the top-k choices of the block of ``fn`` (a BlockFunction) in its model's own
    dtype (the recorded forward) and in the replay (``fn.full``) at the recorded input, on the
    real tokens ``real`` (bool [L]). Returns None where they agree (or cannot be compared), else
    the recorded choices to hold (:class:`HeldTopk`), with a FallbackWarning."""
    block, call = fn.block, fn.call
    param = next(block.parameters(), None)
    if param is None:
        return None
    own_dtype = param.dtype

    def model_dtype() -> Any:
        cast = (lambda t: t.to(own_dtype) if t.is_floating_point() else t)
        args, kwargs = map_tensors(call.with_hidden(fn.hidden.to(own_dtype)), cast)
        with fn.convention.replaying(block):
            return block(*args, **kwargs)

    try:
        recorded, replayed = _choices(model_dtype), _choices(lambda: fn.full(fn.hidden[0]))
    except (RuntimeError, TypeError, ValueError):  # the replay itself fails: the engine
        return None  # says so, with the layer and what to do (engine.Engine._unreplayable)
    L = int(real.shape[0])
    flipped: set[int] = set()
    for a, b in zip(recorded, replayed):
        if a.shape != b.shape or a.reshape(-1, a.shape[-1]).shape[0] != L:
            continue  # not a per-token choice of this row (a group choice, another layout)
        a, b = a.reshape(L, -1).sort(-1).values, b.reshape(L, -1).sort(-1).values
        differs = (a != b).any(-1).to(real.device) & real
        flipped.update(differs.nonzero().flatten().tolist())
    if len(recorded) != len(replayed):
        fallback("linearize.routing_flip",
                 f"layer {fn.layer}: the replay's router calls topk {len(replayed)} times, the "
                 f"model's own dtype {len(recorded)}: the routing could not be compared")
        return None
    if not flipped:
        return None
    fallback("linearize.routing_held",
             f"layer {fn.layer}, sample {fn.sample}: the {str(fn.x0.dtype)[6:]} replay would "
             f"route positions {sorted(flipped)} to other experts than the recorded forward (a "
             "near-tie of router scores): the recorded choice is held, and the whole sequence "
             "is replayed (no single-query replay)")
    return recorded
