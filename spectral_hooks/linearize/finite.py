"""Non-finite values met while replaying a block: one error naming the layer and position.

    >>> import torch
    >>> checked(torch.ones(2), layer=1, sample=0, positions=(4,), what="JVP")
    tensor([1., 1.])
    >>> checked(torch.tensor([1.0, float("inf")]), layer=1, sample=0, positions=(4,),
    ...         what="JVP")                                    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.NonFiniteComputationError: the JVP of block 1 at sample 0, token 4 ...

The recorded input of a replayed block is checked when the block function is built
(``function.block_function``, a :class:`~spectral_hooks.errors.NonFiniteError` naming the
"block input" capture point); what arises afterwards, inside the replay, is checked here on
every JVP/VJP output, so a solver never iterates on NaN.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..errors import NonFiniteComputationError


def where(positions: Sequence[int]) -> str:
    """'token 4' or 'tokens [1, 2, 3]'."""
    positions = [int(p) for p in positions]
    return f"token {positions[0]}" if len(positions) == 1 else f"tokens {positions}"


def replay_error(*, layer: int, sample: int, positions: Sequence[int], what: str,
                 dtype: torch.dtype) -> NonFiniteComputationError:
    """The :class:`NonFiniteComputationError` for a NaN / Inf JVP or VJP (``what``) of
    block ``layer`` replayed in ``dtype`` from a finite recorded input: names the sample and
    token rows, and what to look for.
    """
    first = int(positions[0]) if len(positions) else None
    return NonFiniteComputationError(
        f"the {what} of block {layer} at sample {sample}, {where(positions)} holds NaN or Inf "
        f"although the block's recorded input there is finite: replaying block {layer} in "
        f"{dtype} overflows at this input. Look for huge or non-finite weights in layer "
        f"{layer} (p.abs().max() for its parameters; e.g. after a diverged optimizer step or "
        "a steering edit with a large alpha), restore them, then analyse again",
        layer=layer, sample=sample, position=first)


def checked(out: Tensor, *, layer: int, sample: int, positions: Sequence[int], what: str
            ) -> Tensor:
    """``out`` unchanged when finite, else a :class:`NonFiniteComputationError`."""
    if not bool(torch.isfinite(out).all()):
        raise replay_error(layer=layer, sample=sample, positions=positions, what=what,
                           dtype=out.dtype)
    return out
