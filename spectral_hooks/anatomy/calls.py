"""How a family's blocks are called: the facts block replays (``linearize``) rely on.

    >>> from spectral_hooks.anatomy.calls import HF_CALLS
    >>> HF_CALLS.hidden_kwarg, HF_CALLS.cache_kwargs[0], HF_CALLS.pluggable_attention
    ('hidden_states', 'cache', True)

A block is called with its residual input as the first positional argument or as the keyword
``hidden_kwarg``; it accepts an HF-style KV cache (an object with ``update(key, value, ...)``
returning the keys/values to attend to) under one of ``cache_kwargs`` (empty: it takes none
that a replay can use; the names themselves live with the block call,
:mod:`spectral_hooks.recording.block_call`); where ``pluggable_attention`` is True its
attention core is looked up at call time in HF's ``AttentionInterface`` (see
:func:`~spectral_hooks.anatomy.hf.attention_implementation`) and called as
``core(module, query, key, value, attention_mask, scaling=, dropout=, softcap=, **kwargs)``,
returning ``(output [b, q, h, d_head], weights)``;
``score_modifier_kwargs`` name the keyword inputs of that core that change the scores beyond
mask, scaling and softcap (a replacement core must refuse them). ``replay_context(block)``,
where set, is entered around every replay of ``block`` (``linearize``): it switches the block,
for the duration, to implementations a float64 forward-AD replay can trace (grouped-matmul
mixture-of-experts kernels take neither float64 nor forward AD; BLOOM's GeLU is an
``autograd.Function`` without a forward-AD rule) and restores the user's settings on exit.
``streams``, where set, says that the residual input and output are a stack of parallel
streams [streams, batch, pos, d] (Gemma 3n's AltUp; :mod:`.streams`): recorded and replayed
as [batch, pos, streams * d].
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

from torch import nn

from ..recording.block_call import HF_BLOCK_CACHE_KWARGS
from .streams import ResidualStreams

__all__ = ["BlockCallConvention", "HF_CALLS", "HF_CROSS_CALLS", "TL3_CALLS", "TL_BRIDGE_CALLS"]


@dataclass(frozen=True)
class BlockCallConvention:
    """How one family's blocks take their inputs (see the module doc)."""

    hidden_kwarg: str = "hidden_states"
    cache_kwargs: tuple[str, ...] = HF_BLOCK_CACHE_KWARGS
    pluggable_attention: bool = True
    score_modifier_kwargs: tuple[str, ...] = ("softmax_scale_bias", "position_bias", "s_aux",
                                              "sinks")
    replay_context: Optional[Callable[[nn.Module], ContextManager[Any]]] = None
    streams: Optional[ResidualStreams] = None

    def replaying(self, block: nn.Module) -> ContextManager[Any]:
        """The context every replay of ``block`` runs in (``replay_context``; else nothing)."""
        if self.replay_context is None:
            return contextlib.nullcontext()
        return self.replay_context(block)

    def cache_slot(self, block: nn.Module) -> Optional[tuple[str, Optional[int]]]:
        """(keyword, positional index or None) of ``block``'s KV-cache parameter, or None
        where its ``forward`` names none of ``cache_kwargs``."""
        try:
            params = list(inspect.signature(block.forward).parameters)
        except (TypeError, ValueError):  # a forward inspect cannot read: no named cache
            params = []
        for name in self.cache_kwargs:
            if name in params:
                return name, params.index(name)
        return None


#: Hugging Face ``transformers`` blocks (the default).
HF_CALLS = BlockCallConvention()
#: Decoder blocks of HF encoder-decoder models (T5, BART, Whisper): the one ``cache`` they take
#: is also handed to the cross-attention (an ``EncoderDecoderCache`` holds both), so no
#: single-query replay cache fits them: a replay runs the full decoder sequence, the encoder
#: output and masks held fixed as recorded.
HF_CROSS_CALLS = BlockCallConvention(cache_kwargs=())
#: TransformerLens 3 ``TransformerBlock``: ``resid_pre`` and a TL cache entry (no HF cache).
TL3_CALLS = BlockCallConvention(hidden_kwarg="resid_pre", cache_kwargs=(),
                                pluggable_attention=False)
#: TransformerLens 4 bridge blocks: forward(*args, **kwargs) to the wrapped HF block, whose
#: cache keyword the bridge does not expose by name.
TL_BRIDGE_CALLS = BlockCallConvention(cache_kwargs=(), pluggable_attention=False)
