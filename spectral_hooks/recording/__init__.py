"""Recording: what a probe saw, as data (no analysis code lives here).

- :mod:`.core`: :class:`Recording` and its per-layer views, :class:`StepInfo`;
- :mod:`.points`: the capture-point table (names, TransformerLens hook names, run order);
- :mod:`.block_call`: a block's recorded call (:class:`BlockCall`) and :func:`map_tensors`,
  the one walker over nested tensor structures;
- :mod:`.cache_view`: a recording read like TransformerLens' ``ActivationCache``;
- :mod:`.patterns`: recorded attention patterns; :mod:`.running_stats`: ``store="stats"``;
- :mod:`.suspend`: the switch that turns every probe off during block replays.

    >>> from spectral_hooks.recording import CAPTURES, DEFAULT_CAPTURES
    >>> set(CAPTURES) - set(DEFAULT_CAPTURES)
    {'attn_pattern'}
"""

from .block_call import BlockCall, map_tensors
from .core import STORES, Recording, StepInfo, tensor_versions
from .points import CAPTURES, DEFAULT_CAPTURES, POINTS, CapturePoint
from .running_stats import RunningStats
from .suspend import SUSPENSION, is_suspended, suspended

__all__ = ["Recording", "StepInfo", "STORES", "BlockCall", "map_tensors", "CAPTURES",
           "DEFAULT_CAPTURES", "POINTS", "CapturePoint", "RunningStats", "suspended",
           "is_suspended", "SUSPENSION", "tensor_versions"]
