"""A block's call in one place: the keyword names a call's arguments go by, reading them from
a live call, and the recorded call a replay takes.

- the names (:data:`CACHE_KWARGS`, :data:`MODEL_INPUT_KWARGS`, :data:`MASK_KWARG`): under which
  keywords models and blocks of Hugging Face ``transformers`` and TransformerLens receive their
  tokens, padding mask and KV caches (a model call's names too: the probe reads both);
- reading a live call (the probe's hooks): its KV caches (:func:`is_cache`,
  :func:`cache_length`, :func:`without_caches`), its padding mask (:func:`padding_mask`,
  :func:`block_padding_mask`), its arguments by name (:func:`block_arguments`), and the call as
  a replay takes it (:func:`replayable_call`: caches dropped, ``use_cache`` off);
- the record: :class:`BlockCall` (the residual input and the other arguments) and
  :func:`map_tensors`, the one walker over nested tensor structures.

How one family's blocks take these (the keyword of the residual input, the cache slot a
replay plugs into, pluggable attention) is an anatomy fact:
:class:`~spectral_hooks.anatomy.calls.BlockCallConvention`.

    >>> import torch
    >>> call = BlockCall((torch.ones(2, 3, 4),), {"mask": torch.zeros(2, 3)}, hidden_in_args=True)
    >>> call.hidden.shape, call.select(1).kwargs["mask"].shape
    (torch.Size([2, 3, 4]), torch.Size([1, 3]))
    >>> map_tensors({"a": (torch.ones(1), [2, torch.zeros(1)])}, lambda t: t + 1)
    {'a': (tensor([2.]), [2, tensor([1.])])}
    >>> kept_block_kwargs({"use_cache": True, "past_key_values": None, "position_ids": 3})
    {'use_cache': False, 'position_ids': 3}
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import UserDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

__all__ = ["BlockCall", "map_tensors", "CACHE_KWARGS", "HF_BLOCK_CACHE_KWARGS", "CACHE_NAMES",
           "MODEL_INPUT_KWARGS", "MASK_KWARG", "is_cache", "cache_length", "without_caches",
           "padding_mask", "block_arguments", "block_padding_mask", "replayable_call",
           "without_cache_args", "kept_block_kwargs"]

#: Keyword names under which models and blocks receive a KV cache: HF (``cache`` since
#: transformers 5, ``past_key_values``/``past_key_value``/``layer_past`` before and in some
#: families), TransformerLens 3 (``past_kv_cache`` for the model, ``past_kv_cache_entry`` per
#: block). The first four are the HF block-level names, in order of preference.
CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past",
                "past_kv_cache_entry", "past_kv_cache")
HF_BLOCK_CACHE_KWARGS = CACHE_KWARGS[:4]
#: the keywords a KV cache is passed under, as a set
CACHE_NAMES = frozenset(CACHE_KWARGS)
#: Keyword names under which a model receives its tokens, in order of preference: HF
#: (``input_ids``, ``inputs_embeds``; vision towers ``pixel_values`` [batch, channels, h, w],
#: whose patches are the tokens, all real; Whisper's encoder ``input_features``),
#: TransformerLens (``input``, ``tokens``).
MODEL_INPUT_KWARGS = ("input_ids", "inputs_embeds", "pixel_values", "input_features", "input",
                      "tokens")
#: The keyword of the [batch, pos] padding mask (HF and TransformerLens alike).
MASK_KWARG = "attention_mask"

_LEAVES = (type(None), bool, int, float, str, complex, bytes)
_DATACLASS: dict[type, bool] = {}  # type -> is a dataclass (checked once per type)


def map_tensors(obj: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``obj`` with ``fn`` applied to every tensor inside nested tuples, lists, dicts,
    ``UserDict`` s and dataclass instances (tuples come back as plain tuples, both kinds of
    dict as plain dicts, dataclasses as copies by ``dataclasses.replace``); anything else is
    returned as it is. Hooks call it on every block call, so the common types are tested
    first."""
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
    if isinstance(obj, UserDict):  # transformers' KVSharingDict (Gemma 3n's shared keys/values)
        return {k: map_tensors(v, fn) for k, v in obj.data.items()}
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
        """The call's (args, kwargs) with the residual input replaced by ``hidden``; dict
        arguments are fresh copies, so that a block writing into one (Gemma 3n stores its
        shared keys and values in ``shared_kv_states``) never changes the recorded call."""
        kwargs = {k: dict(v) if isinstance(v, (dict, UserDict)) else v
                  for k, v in self.kwargs.items()}
        if self.hidden_in_args:
            return (hidden,) + tuple(self.args[1:]), kwargs
        return tuple(self.args), {**kwargs, self.hidden_kwarg: hidden}

    def select(self, row: int) -> "BlockCall":
        """The same call for one batch row (tensors with a batch dimension are sliced)."""
        batch = self.hidden.shape[0]

        def pick(t: Tensor) -> Tensor:
            if batch > 1 and t.ndim >= 2 and t.shape[0] == batch:
                return t[row:row + 1]
            return t

        return dataclasses.replace(self, args=map_tensors(self.args, pick),
                                   kwargs=map_tensors(self.kwargs, pick))


_CACHE_TYPES: dict[type, bool] = {}  # type -> a KV cache (HF Cache objects), checked once per type


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
