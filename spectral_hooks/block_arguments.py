"""A block call's arguments as the probe reads them: its KV caches, its padding mask, and the
call with its residual input replaced, as a replay takes it (caches dropped, use_cache off).

    >>> kept_block_kwargs({"use_cache": True, "past_key_values": None, "position_ids": 3})
    {'use_cache': False, 'position_ids': 3}

The keyword names (inputs, mask, KV caches) are anatomy facts (``anatomy.calls``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from .anatomy.calls import CACHE_KWARGS, MASK_KWARG
from .recording import BlockCall, map_tensors

_CACHE_TYPES: dict[type, bool] = {}  # type -> a KV cache (HF Cache objects), checked once per type
#: the keywords a KV cache is passed under, as a set
CACHE_NAMES = frozenset(CACHE_KWARGS)


def is_cache(value: Any) -> bool:
    """True for a KV cache object (anything with ``get_seq_length``: HF Cache classes)."""
    kind = type(value)
    found = _CACHE_TYPES.get(kind)
    if found is None:
        found = _CACHE_TYPES[kind] = hasattr(kind, "get_seq_length")
    return found


def cache_length(kwargs: dict[str, Any]) -> int:
    """Positions already in a KV cache passed to the model or to a block (0: a fresh call)."""
    for name in CACHE_KWARGS:
        value = kwargs.get(name)
        if value is None or isinstance(value, (Tensor, bool)):
            continue
        if is_cache(value):  # HF Cache objects
            return int(value.get_seq_length())
        past_keys = getattr(value, "past_keys", None)  # TL3 per-block cache entry
        if isinstance(past_keys, Tensor):
            return int(past_keys.shape[1])
        mask = getattr(value, "previous_attention_mask", None)  # TL3 whole-model cache
        if isinstance(mask, Tensor):
            return int(mask.shape[-1])
    return 0


def without_caches(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the KV cache ones (by name, or any cache object)."""
    return {k: v for k, v in kwargs.items() if k not in CACHE_KWARGS and not is_cache(v)}


def padding_mask(kwargs: dict[str, Any]) -> Optional[Tensor]:
    """The [batch, pos] padding mask a model was called with (``attention_mask``), or None."""
    mask = kwargs.get(MASK_KWARG)
    return mask if isinstance(mask, Tensor) and mask.ndim == 2 else None


def block_arguments(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block call's arguments by name (BERT's layers take the mask positionally); the
    keyword arguments alone where the signature does not bind them."""
    try:
        return dict(inspect.signature(block.forward).bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return kwargs


def block_padding_mask(kwargs: dict[str, Any], *, causal: bool) -> Optional[Tensor]:
    """The [batch, pos] padding mask behind the mask a *block* was called with, for a call that
    bypassed the model's forward (sentence-transformers calls ``model.forward`` directly, TL3's
    generate calls the blocks): a 2-D mask as is; a 4-D one ([batch, 1 or heads, query, key],
    boolean "may attend" or additive 0 / -inf) read at its diagonal, since every real token
    attends to itself and a padding key is masked for every query. A causal row that attends
    to a later key is a padding row the model unmasked whole (transformers does so for rows
    with nothing to attend to). None where no mask was given or the call continues a cache.

        >>> allowed = torch.tensor([[[[0, 0, 0], [0, 1, 0], [0, 1, 1]]]], dtype=torch.bool)
        >>> block_padding_mask({"attention_mask": allowed}, causal=True).tolist()
        [[0, 1, 1]]
    """
    mask = kwargs.get(MASK_KWARG)
    if not isinstance(mask, Tensor) or mask.ndim not in (2, 4):
        return None
    if mask.ndim == 2:
        return mask
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = allowed[:, 0]
    q, k = allowed.shape[-2:]
    if q == 1 and k > 1 and not causal:  # one row broadcast over the queries (BERT's eager mask)
        return allowed[:, 0].long()
    if q != k:
        return None  # a cached continuation: its padding is the cache's, not this call's
    real = allowed.diagonal(dim1=-2, dim2=-1)
    if causal:
        real = real & ~allowed.triu(diagonal=1).any(-1)
    return real.long()


def replayable_call(args: tuple[Any, ...], kwargs: dict[str, Any], hidden: Tensor,
                    keep: Optional[Callable[[Tensor], Tensor]], *,
                    hidden_kwarg: str, kept_kwargs: Optional[dict[str, Any]] = None) -> BlockCall:
    """A block's call with its residual input replaced by ``hidden`` (as the probe stored it),
    the other tensors kept by ``keep`` (None: as they are, references), KV caches dropped,
    use_cache off. ``hidden_kwarg``: the keyword of the residual input when it is not passed
    positionally. ``kept_kwargs``: :func:`kept_block_kwargs` of ``kwargs``, when known."""
    if kept_kwargs is None:
        kept_kwargs = kept_block_kwargs(kwargs, keep)
    if not args:
        return BlockCall(args, {**kept_kwargs, hidden_kwarg: hidden}, False,
                         hidden_kwarg=hidden_kwarg)
    if len(args) == 1:
        return BlockCall((hidden,), kept_kwargs, True, hidden_kwarg=hidden_kwarg)
    rest = without_cache_args(args)[1:]
    if keep is not None:
        rest = map_tensors(rest, keep)
    return BlockCall((hidden,) + rest, kept_kwargs, True, hidden_kwarg=hidden_kwarg)


def without_cache_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A block call's positional arguments with its KV caches (after the first) as None."""
    return (args[0],) + tuple([None if is_cache(a) else a for a in args[1:]])


def kept_block_kwargs(kwargs: dict[str, Any],
                      keep: Optional[Callable[[Tensor], Tensor]] = None) -> dict[str, Any]:
    """A block call's keyword arguments as a replay takes them: KV caches dropped, use_cache
    off, tensors kept by ``keep`` (None: references)."""
    kept = {k: v for k, v in kwargs.items()
            if k not in CACHE_NAMES and not _CACHE_TYPES.get(type(v), False) and not is_cache(v)}
    if "use_cache" in kept:
        kept["use_cache"] = False
    return kept if keep is None else map_tensors(kept, keep)
