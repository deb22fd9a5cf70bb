"""Single-query token functions: only row p is recomputed, earlier keys/values held fixed."""

from __future__ import annotations

import inspect
import logging
from typing import Optional

import torch
from torch import Tensor

from ..anatomy.base import HF_BLOCK_CACHE_KWARGS
from ..recording import map_tensors
from .function import BlockFunction, _first, _math_sdpa

log = logging.getLogger("spectral_hooks.linearize")


class _FixedKV:
    """A duck-typed KV cache: ``update`` returns the recorded keys/values of the earlier
    positions followed by the new ones, and never stores anything once filled."""

    def __init__(self) -> None:
        self.keys = self.values = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keys is None:  # filling: the block runs on the earlier positions once
            self.keys, self.values = key_states.detach(), value_states.detach()
            return key_states, value_states
        return (torch.cat([self.keys, key_states], dim=-2),
                torch.cat([self.values, value_states], dim=-2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])


def _slice_call(call, L: int, rows: slice, cols: slice, hidden: Tensor, cache,
                cache_slot: tuple) -> tuple:
    def cut(t: Tensor) -> Tensor:
        if t.ndim == 4 and t.shape[-1] == L and t.shape[-2] == L:  # [b, h, q, k] mask
            return t[..., rows, cols]
        if t.ndim >= 2 and t.shape[1] == L:  # position ids, rotary cos/sin [b, L, ...]
            return t[:, rows]
        return t
    args, kwargs = call.with_hidden(hidden)
    args = [args[0]] + list(map_tensors(tuple(args[1:]), cut))
    kwargs = map_tensors(kwargs, cut)
    name, index = cache_slot
    if index is not None and index < len(args):
        args[index] = cache
    else:
        kwargs[name] = cache
    return tuple(args), kwargs




def _cache_slot(block) -> tuple:
    """(name, positional index or None) of the block's KV-cache parameter."""
    try:
        params = list(inspect.signature(block.forward).parameters)
    except (TypeError, ValueError):
        params = []
    for name in HF_BLOCK_CACHE_KWARGS:
        if name in params:
            return name, params.index(name)
    raise RuntimeError(f"{type(block).__name__}.forward takes no KV cache argument")


class SingleQueryFunction:
    """f(x) = block output at p with only row p recomputed (causal models, HF Cache blocks).

    The keys/values of positions < p are computed once from the recording and held fixed;
    each call runs the block on one query row, so a JVP costs ~1/L of a full-sequence one.
    Built only after checking it against the full-sequence :class:`BlockFunction`.
    """

    def __init__(self, full: BlockFunction) -> None:
        self.full_fn = full
        self.block, self.params = full.block, full.params
        self.layer, self.sample, self.positions, self.x0 = (full.layer, full.sample,
                                                             full.positions, full.x0)
        p = int(full.positions[0])
        L = full.hidden.shape[1]
        self.cache = _FixedKV()
        self._L, self._p = L, p
        self._slot = _cache_slot(self.block)
        args, kwargs = _slice_call(full.call, L, slice(0, p), slice(0, p),
                                   full.hidden[:, :p], self.cache, self._slot)
        with torch.no_grad(), _math_sdpa():
            torch.func.functional_call(self.block, self.params, args, kwargs)
        if self.cache.keys is None:
            raise RuntimeError("the block did not call cache.update")

    def __call__(self, X: Tensor) -> Tensor:
        p = self._p
        args, kwargs = _slice_call(self.full_fn.call, self._L, slice(p, p + 1),
                                   slice(0, p + 1), X[None], self.cache, self._slot)
        with _math_sdpa():
            out = torch.func.functional_call(self.block, self.params, args, kwargs)
        return _first(out)[0]


def _single_query(fn: BlockFunction) -> Optional[SingleQueryFunction]:
    """The verified single-query function, or None where it does not apply or disagrees."""
    if fn.positions.numel() != 1 or int(fn.positions[0]) == 0:
        return None
    try:
        sq = SingleQueryFunction(fn)
        g = torch.Generator(device="cpu").manual_seed(0)
        delta = torch.randn(fn.x0.shape, generator=g, dtype=torch.float64).to(fn.x0)
        x = fn.x0 + 0.1 * delta * fn.x0.abs().max()
        with torch.no_grad():
            a, b = sq(x), fn(x)
        tol = 1e3 * torch.finfo(fn.x0.dtype).eps ** 0.5 if fn.x0.dtype != torch.float64 else 1e-9
        err = float((a - b).norm() / b.norm().clamp_min(1e-30))
        if not err <= tol:
            log.info("single-query path disagrees for layer %d (%.1e): using the full sequence",
                     fn.layer, err)
            return None
        return sq
    except Exception as err:  # noqa: BLE001 - not an HF Cache block: use the full sequence
        log.info("single-query path unavailable for layer %d: %s", fn.layer, err)
        return None
