"""Recording: what a :class:`~spectral_hooks.probe.Probe` saw. Data only, no analysis.

Every independent forward call adds its sequences as new rows (a "run"); a call that continues
a KV cache (a ``generate()`` decode step) appends positions to the run it continues. Rows of
different lengths are right-padded with zeros and ``mask == 0``; padding never counts downstream.

    recording.resid_pre[3]          # Tensor[batch, pos, d_model]
    recording["blocks.3.hook_resid_post"]   # read like an ActivationCache: in, keys(),
    recording["resid_post", -1]             # items(), len(), .to(device) (cache_view.py)
    recording.mask                  # Tensor[batch, pos], 1 for real tokens
    recording.position_step         # Tensor[batch, pos]: 0 = prefill, k = k-th decode step
    recording.tokens("resid_post", 3)       # Tensor[n_real_tokens, d_model]
    recording.attn_pattern[3]       # Tensor[batch, head, query_pos, key_pos] (opt-in capture)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import Tensor

from ..checks import checked_layer
from ..errors import (
    OptionError,
    OptionIndexError,
    OptionTypeError,
    RecordingError,
    RecordingKeyError,
    UnknownNameError,
)
from .block_call import BlockCall, map_tensors
from .cache_view import ActivationCacheView
from .patterns import stacked
from .points import CAPTURES, layer_of, point_of
from .running_stats import Accumulator, RunningStats

STORES = ("device", "cpu", "stats")


def tensor_versions(inputs: Optional[tuple[Any, ...]]) -> list[tuple[Tensor, int]]:
    """(tensor, in-place version) of the tensors at the top level of a model call's
    ``(args, kwargs)`` (inference tensors have no version: left out)."""
    if inputs is None:
        return []
    args, kwargs = inputs
    return [(t, t._version) for t in (*args, *kwargs.values())
            if isinstance(t, Tensor) and not t.is_inference()]


@dataclass(frozen=True)
class StepInfo:
    """One forward call seen by the probe."""

    index: int
    run: int
    step: int  # 0 = a new sequence batch (prefill), k = the k-th continuation of that run
    n_positions: int
    replayable: bool


@dataclass
class _Run:
    batch: int
    chunks: dict = field(default_factory=dict)  # (capture, layer) -> list[Tensor]
    widths: list = field(default_factory=list)  # per step: its new positions
    steps: list = field(default_factory=list)
    block_calls: dict[int, BlockCall] = field(default_factory=dict)  # layer -> BlockCall (prefill only)
    # per step, as the model got them (on its device, read only when asked: no host sync per
    # forward): the padding mask [batch, n_new] (None: every position is real) and the token
    # ids [batch, n_new] (None: embeddings)
    raw_masks: list = field(default_factory=list)
    raw_token_ids: list = field(default_factory=list)
    inputs: Optional[tuple] = None  # the model call's (args, kwargs), caches removed
    # (tensor, in-place version at the call's end) of the tensors in ``inputs`` kept by
    # reference: a caller that writes its input buffer in place later is caught at the replay
    input_versions: list = field(default_factory=list)
    read_masks: list = field(default_factory=list)  # raw_masks read to the CPU (long), so far

    @property
    def n_positions(self) -> int:
        return sum(self.widths)

    @property
    def masks(self) -> list[Tensor]:
        """Per step, the padding mask on the CPU (long, 1 for real tokens)."""
        for mask, width in zip(self.raw_masks[len(self.read_masks):],
                               self.widths[len(self.read_masks):]):
            self.read_masks.append(torch.ones(self.batch, width, dtype=torch.long)
                                   if mask is None else mask.to("cpu", torch.long))
        return self.read_masks

    @property
    def token_ids(self) -> list[Tensor]:
        """Per step, the token ids on the CPU (long; -1 where the model got embeddings)."""
        return [torch.full((self.batch, width), -1, dtype=torch.long) if ids is None
                else ids.to("cpu", torch.long) for ids, width in zip(self.raw_token_ids,
                                                                      self.widths)]


class _LayerView:
    """``recording.resid_post[l]``: indexing by layer, negative indices allowed."""

    def __init__(self, recording: "Recording", capture: str) -> None:
        self._recording, self._capture = recording, capture

    def __getitem__(self, layer: int) -> Tensor:
        return self._recording.tensor(self._capture, layer)

    def __len__(self) -> int:
        return len(self.keys())

    def __iter__(self) -> Iterator[Tensor]:
        return (self[layer] for layer in self.keys())

    def keys(self) -> tuple[int, ...]:
        """The recorded layers that have this point (no ``attn_out`` where there is no
        attention)."""
        return self._recording.layers_with(self._capture)


class Recording(ActivationCacheView):
    """Residual-stream states and attention outputs recorded per layer; also a mapping of
    TransformerLens hook names (see :mod:`spectral_hooks.recording.cache_view`)."""

    n_layers: int
    layers: tuple[int, ...]
    capture: tuple[str, ...]
    store: str
    dtype: Optional[torch.dtype]
    generation: int = 0

    def __init__(self, *, n_layers: int, layers: tuple[int, ...], capture: tuple[str, ...],
                 store: str = "device", dtype: Optional[torch.dtype] = None,
                 absent: Optional[dict[tuple[str, int], str]] = None) -> None:
        self.n_layers, self.layers, self.capture = n_layers, tuple(layers), tuple(capture)
        self.store, self.dtype = store, dtype
        #: (capture, layer) -> why that point does not exist there (attn_out of a Mamba layer)
        self.absent: dict[tuple[str, int], str] = dict(absent or {})
        if store == "stats" and "attn_pattern" in self.capture:
            raise OptionError("store", store, "'device' or 'cpu' with capture 'attn_pattern'",
                              hint="running statistics are kept per token vector, not for "
                              "[head, pos, pos] attention patterns")
        self.clear()

    # ---------------------------------------------------------------- writing (used by Probe)
    def clear(self) -> None:
        """Forget everything recorded so far (handles stay attached)."""
        self._run_list: list[_Run] = []
        self._call_list: list[StepInfo] = []
        self._call_count = 0  # every call ever committed (store="stats" keeps only the latest run's)
        self._stats: dict = {}
        self._cache: dict = {}
        # calls recorded by reference whose bookkeeping waits for the first read (see defer)
        self._pending: list[Callable[["Recording"], None]] = []
        self.generation += 1  # changes whenever the data do

    def defer(self, commit: Callable[["Recording"], None]) -> None:
        """Note a recorded call now and commit it when the recording is next read or written:
        ``commit(self)`` then calls :meth:`commit` (or drops the call), in the order the calls
        were made. The probe defers the bookkeeping of calls it recorded by reference, so a
        forward pays for noting them only; ``commit`` must hold no KV cache, model or probe."""
        self._cache.clear()
        self.generation += 1
        self._pending.append(commit)

    def _settle(self) -> None:
        pending, self._pending = self._pending, []
        generation = self.generation
        for commit in pending:
            commit(self)
        self.generation = generation  # the data changed when the calls were deferred, not now

    # every read goes through these, so that deferred calls are committed first
    @property
    def _runs(self) -> list[_Run]:
        if self._pending:
            self._settle()
        return self._run_list

    @property
    def _calls(self) -> list[StepInfo]:
        if self._pending:
            self._settle()
        return self._call_list

    @property
    def _n_calls(self) -> int:
        if self._pending:
            self._settle()
        return self._call_count

    def to_store(self, t: Tensor, *, copy: bool = True) -> Tensor:
        """Detached copy on the store's device; ``dtype`` casts floating-point tensors only
        (masks, position ids and token ids keep their dtype)."""
        device = "cpu" if self.store == "cpu" else t.device
        dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
        return t.detach().to(device=device, dtype=dtype, copy=copy)

    def keep(self, t: Tensor) -> Tensor:
        """``t`` as the store keeps it, copied only where the store asks (``store="cpu"`` from
        another device, another ``dtype``): else ``t`` itself (detached where it needs grad)."""
        if self.store == "cpu" or self.dtype is not None:
            return self.to_store(t, copy=False)
        return t.detach() if t.requires_grad else t

    def commit(self, captured: dict[Any, Any], mask: Optional[Tensor],
               shape: tuple[int, int], *, continues: bool, block_calls: dict[int, BlockCall],
               inputs: Optional[tuple[Any, ...]] = None,
               input_versions: Optional[list[tuple[Tensor, int]]] = None,
               token_ids: Optional[Tensor] = None, owned: bool = False) -> None:
        """Add one forward call: ``captured[(capture, layer)] = Tensor[batch, pos, d]``;
        ``mask`` [batch, pos] and ``token_ids`` [batch, pos] as the model got them (None: every
        position real / embeddings), ``shape`` = (batch, pos). Nothing is read to the host
        here: the mask and ids are kept on their device (copied there, so a caller reusing
        its buffers changes nothing; ``owned``: they are such copies already) and read when
        asked for."""
        self._cache.clear()
        self.generation += 1
        batch, width = shape
        if mask is not None and not owned:
            mask = mask.detach().clone()
        if token_ids is not None and not owned:
            token_ids = token_ids.detach().clone()
        if self.store == "stats":
            for key, tensor in captured.items():
                self._stats.setdefault(key, Accumulator()).update(tensor, mask)
            captured = {}
        if continues and self._runs and self._runs[-1].batch == batch:
            run, step = self._runs[-1], len(self._runs[-1].steps)
        else:
            if self.store == "stats" and self._runs:
                # stats keep only the latest run's block inputs and calls: memory stays flat
                self._run_list, self._call_list = [], []
            # a continuation with nothing to continue (decode steps of a cache filled before
            # the probe was attached) is marked step 1: it cannot be replayed
            run, step = _Run(batch=batch), int(continues)
            run.block_calls = dict(block_calls)
            run.inputs, run.input_versions = inputs, list(input_versions or ())
            self._runs.append(run)
        for key, tensor in captured.items():
            run.chunks.setdefault(key, []).append(tensor)
        run.raw_masks.append(mask)
        run.raw_token_ids.append(token_ids)
        run.widths.append(width)
        run.steps.append(step)
        self._call_list.append(StepInfo(self._call_count, len(self._run_list) - 1, step, width,
                                        not continues))
        self._call_count += 1

    # ---------------------------------------------------------------- reading
    @property
    def resid_pre(self) -> _LayerView:
        """Block inputs by layer: ``recording.resid_pre[l]`` is [batch, seq, d_model]."""
        return _LayerView(self, "resid_pre")

    @property
    def resid_post(self) -> _LayerView:
        """Block outputs by layer: ``recording.resid_post[l]`` is [batch, seq, d_model]."""
        return _LayerView(self, "resid_post")

    @property
    def attn_out(self) -> _LayerView:
        """Attention outputs by layer: ``recording.attn_out[l]`` is [batch, seq, d_model]."""
        return _LayerView(self, "attn_out")

    @property
    def attn_pattern(self) -> _LayerView:
        """``attn_pattern[l]``: Tensor[batch, head, query_pos, key_pos], the attention
        probabilities of layer l (captured with ``instrument(capture=[..., "attn_pattern"])``)."""
        return _LayerView(self, "attn_pattern")

    @property
    def steps(self) -> tuple[StepInfo, ...]:
        """Every forward call recorded, in order (generate(): prefill then each decode step).
        With ``store="stats"`` only the latest run's calls are kept (``index`` still counts
        every call), so that streaming any number of sequences keeps memory flat."""
        return tuple(self._calls)

    @property
    def n_calls(self) -> int:
        """Forward calls committed since the last :meth:`clear` (with every ``store``)."""
        return self._n_calls

    @property
    def n_samples(self) -> int:
        """Batch rows recorded, over every forward so far."""
        return sum(run.batch for run in self._runs)

    def _has_data(self) -> bool:
        return self.store != "stats" and bool(self._runs)

    def to(self, device: Union[str, torch.device]) -> "Recording":
        """Move every recorded tensor (states, block and model inputs, statistics) to
        ``device`` in place and return the recording, as ``ActivationCache.to`` does. The
        masks stay on the CPU; later forwards are stored as ``store`` says."""
        for run in self._runs:  # (commits what was deferred)
            run.chunks = {key: [t.to(device) for t in ts] for key, ts in run.chunks.items()}
            run.block_calls = map_tensors(run.block_calls, lambda t: t.to(device))
            run.inputs = map_tensors(run.inputs, lambda t: t.to(device))
            # a tensor already there is the caller's still: its version as of its call stays
            noted = {id(t): v for t, v in run.input_versions}
            run.input_versions = [(t, noted.get(id(t), v))
                                  for t, v in tensor_versions(run.inputs)]
        for acc in self._stats.values():
            acc.total, acc.outer = acc.total.to(device), acc.outer.to(device)
        self._cache.clear()
        self.generation += 1
        return self

    def has(self, capture: str, layer: int) -> bool:
        """Whether ``capture`` exists at recorded ``layer`` (``attn_out`` does not at a layer
        without attention: a Mamba, linear-attention or convolution layer of a hybrid)."""
        return (capture in self.capture and layer % self.n_layers in self.layers
                and (capture, layer % self.n_layers) not in self.absent)

    def layers_with(self, capture: str) -> tuple[int, ...]:
        """The recorded layers where ``capture`` exists (see :meth:`has`)."""
        return tuple(layer for layer in self.layers if (capture, layer) not in self.absent)

    def _layer(self, layer: int) -> int:
        try:  # "blocks.3" and "blocks.3.hook_resid_post" name layer 3
            layer = layer_of(layer)
        except ValueError as err:
            raise RecordingKeyError(str(err)) from None
        layer = checked_layer(layer, self.n_layers)
        if layer not in self.layers:
            raise RecordingKeyError(f"layer {layer} was not recorded (recorded: {list(self.layers)}); "
                           "pass layers=None to instrument() to record all")
        return layer

    def _capture(self, capture: str) -> str:
        capture = point_of(capture) if isinstance(capture, str) else capture
        if not isinstance(capture, str) or capture not in CAPTURES:
            raise UnknownNameError("capture", capture, f"one of {CAPTURES}")
        return capture

    def _per_token(self, capture: str) -> str:
        if point_of(capture) == "attn_pattern":
            raise RecordingKeyError("attn_pattern holds [batch, head, query, key] patterns, not "
                                    "token vectors: read recording.attn_pattern[layer]")
        return capture

    def _require_data(self, capture: str) -> str:
        capture = self._capture(capture)
        if capture not in self.capture:
            raise RecordingKeyError(f"capture={capture!r} was not captured (captured: "
                                    f"{list(self.capture)}); pass it in instrument(capture=...)")
        if self.store == "stats":
            raise RecordingError("store='stats' keeps only running statistics: use "
                             "recording.stats(capture, layer), or instrument with store='device'")
        if not self._runs:
            raise RecordingError("nothing recorded yet: run the model inside the probe first")
        return capture

    def _padded(self, pieces: list[Tensor], width: int, fill: float = 0) -> Tensor:
        rows = []
        for piece in pieces:
            pad = width - piece.shape[1]
            if pad:
                shape = (piece.shape[0], pad) + tuple(piece.shape[2:])
                piece = torch.cat([piece, piece.new_full(shape, fill)], dim=1)
            rows.append(piece)
        return torch.cat(rows, dim=0)

    def tensor(self, capture: str, layer: int) -> Tensor:
        """Tensor[batch, pos, d_model] of one capture at one layer, all runs, zero-padded
        (``attn_pattern``: Tensor[batch, head, query_pos, key_pos])."""
        layer = self._layer(layer)
        capture = self._require_data(capture)
        key = (capture, layer)
        if key in self.absent:
            raise RecordingError(f"no {capture} at layer {layer}: {self.absent[key]}")
        if key not in self._cache:
            width = max(run.n_positions for run in self._runs)
            if capture == "attn_pattern":
                self._cache[key] = stacked([run.chunks[key] for run in self._runs], width)
                return self._cache[key]
            pieces = [torch.cat(run.chunks[key], dim=1) for run in self._runs]
            self._cache[key] = self._padded(pieces, width)
        return self._cache[key]

    @property
    def mask(self) -> Tensor:
        """Tensor[batch, pos] (long): 1 for real tokens, 0 for padding."""
        if not self._runs:
            raise RecordingError("nothing recorded yet: run the model inside the probe first")
        width = max(run.n_positions for run in self._runs)
        return self._padded([torch.cat(run.masks, dim=1) for run in self._runs], width)

    @property
    def position_step(self) -> Tensor:
        """Tensor[batch, pos]: which step wrote each position (0 = prefill), -1 for padding."""
        if not self._runs:
            raise RecordingError("nothing recorded yet: run the model inside the probe first")
        width = max(run.n_positions for run in self._runs)
        pieces = [torch.cat([torch.full((run.batch, w), s, dtype=torch.long)
                             for w, s in zip(run.widths, run.steps)], dim=1)
                  for run in self._runs]
        steps = self._padded(pieces, width, fill=-1)
        return steps.masked_fill(self.mask == 0, -1)

    @property
    def token_ids(self) -> Tensor:
        """Tensor[batch, pos] (long): the token id at each recorded position; -1 for padding
        and where the model was called with embeddings rather than ids."""
        if not self._runs:
            raise RecordingError("nothing recorded yet: run the model inside the probe first")
        width = max(run.n_positions for run in self._runs)
        ids = self._padded([torch.cat(run.token_ids, dim=1) for run in self._runs], width,
                           fill=-1)
        return ids.masked_fill(self.mask == 0, -1)

    def tokens(self, capture: str, layer: int) -> Tensor:
        """Tensor[n_tokens, d_model]: the real (non-padding) tokens of all rows."""
        capture = self._per_token(self._capture(capture))
        x = self.tensor(capture, layer)
        return x[self.mask.to(x.device).bool()]

    def stats(self, capture: str, layer: int) -> RunningStats:
        """Running mean / covariance / count (store='stats'; computed from tensors otherwise)."""
        layer, capture = self._layer(layer), self._per_token(self._capture(capture))
        if (capture, layer) in self.absent:
            raise RecordingError(f"no {capture} at layer {layer}: {self.absent[(capture, layer)]}")
        if self.store == "stats":
            if (capture, layer) not in self._stats:
                raise RecordingError(f"no statistics for {capture} at layer {layer} yet")
            return self._stats[(capture, layer)].result()
        acc = Accumulator()
        acc.update(self.tensor(capture, layer), self.mask)
        return acc.result()

    def block_input(self, layer: int, sample: int = 0) -> BlockCall:
        """The recorded call of block ``layer`` for batch row ``sample`` (for replay)."""
        layer = self._layer(layer)
        if not self._runs:
            raise RecordingError("nothing recorded yet: run the model inside the probe first")
        if not isinstance(sample, int) or isinstance(sample, bool):
            raise OptionTypeError("sample", sample, "an int batch row")
        if not 0 <= sample < self.n_samples:
            raise OptionIndexError("sample", sample, f"a recorded batch row, 0..{self.n_samples - 1}",
                                   hint=f"out of range: {self.n_samples} samples recorded")
        for run in self._runs:
            if sample < run.batch:
                if layer not in run.block_calls:
                    raise RecordingError(f"no replayable input for layer {layer} (store='stats' keeps"
                                     " only the latest run's block inputs)")
                return run.block_calls[layer].select(sample)
            sample -= run.batch
        raise IndexError(sample)  # unreachable

    @property
    def model_inputs(self) -> list[Optional[tuple[Any, ...]]]:
        """Per run, the (args, kwargs) the model was called with (None when unknown), so the
        same inputs can be replayed through another model (e.g. a re-initialised copy).
        Refused when an input kept by reference was written in place after its call (a
        reused input buffer): a replay would run other inputs than the recorded ones."""
        for i, run in enumerate(self._runs):
            if any(t._version != v for t, v in run.input_versions):
                raise RecordingError(
                    f"the model inputs of recorded run {i} were written in place after the "
                    "call (an input buffer reused for the next batch?), so they cannot be "
                    "replayed (the re-initialised control replays them): pass a new tensor per "
                    "call, e.g. model(ids.clone())")
        return [run.inputs for run in self._runs]

    def __repr__(self) -> str:
        return (f"Recording(layers={list(self.layers)}, capture={list(self.capture)}, "
                f"store={self.store!r}, samples={self.n_samples}, calls={self._n_calls})")
