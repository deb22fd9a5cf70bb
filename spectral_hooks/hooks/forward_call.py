"""What the probe's hooks need to know about one forward call of the model.

    >>> call = ForwardCall(mask=None, continues=False)
    >>> call.next_layer(("block", 1), [0, 1, 2]), call.next_layer(("block", 1), [0, 1, 2])
    (0, 1)

A :class:`ForwardCall` lives while the model runs: which application of each (possibly shared)
module this is, what was captured, each block's replayable call. A call's arguments (the
keyword names of inputs, mask and KV caches, and reading them) are read in
:mod:`spectral_hooks.recording.block_call`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import weakref
from itertools import repeat
from operator import is_
from types import FunctionType
from typing import Any, Callable, Iterable, NamedTuple, Optional, cast

import torch
from torch import Tensor, nn

from ..anatomy import Anatomy
from ..anatomy.patterns import pattern_capture
from ..anatomy.streams import ResidualStreams
from ..errors import OptionError, OptionTypeError, RecordingError, UnsupportedModelError
from ..recording import CAPTURES, POINTS, suspended
from ..recording.block_call import (
    CACHE_NAMES,
    MODEL_INPUT_KWARGS,
    cache_length,
    kept_block_kwargs,
    padding_mask,
    replayable_call,
    without_cache_args,
)
from ..recording.points import capture_points, layer_list

log: logging.Logger = logging.getLogger(__name__)


def recorded_layers(anatomy: Anatomy, layers: Optional[Iterable[int]]) -> tuple[int, ...]:
    """``instrument(layers=...)`` as sorted layer indices (None: every layer); TransformerLens
    names (``"blocks.3"``, ``"blocks.3.hook_resid_post"``) name their layer."""
    if layers is None:
        return tuple(range(anatomy.n_layers))
    if isinstance(layers, bytes) or not isinstance(layers, (int, str, Iterable)):
        raise OptionTypeError("layers", layers, "None (every layer), an int, a TransformerLens "
                              "block name ('blocks.3') or a list of them")
    try:
        layers = cast(Iterable[int], layer_list(layers))
    except ValueError as err:
        raise OptionError("layers", layers, "layer indices or TransformerLens block names",
                          hint=str(err)) from None
    normalised = sorted({anatomy.layer_index(layer, argument="layers") for layer in layers})
    if not normalised:
        raise OptionError("layers", layers, "None (every layer) or a non-empty list")
    return tuple(normalised)


def recorded_points(capture: Any) -> tuple[str, ...]:
    """``instrument(capture=...)``: capture points by our names or TransformerLens hook names
    (``"hook_resid_post"``, ``"blocks.0.hook_resid_post"``), validated."""
    points = capture_points(capture)
    if not points or any(c not in CAPTURES for c in points):
        raise OptionError("capture", capture, f"a non-empty subset of {CAPTURES} (or their "
                          "TransformerLens hook names)")
    return points


def output_points(anatomy: Anatomy, capture: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """(LayerParts attribute, capture point, output -> recorded tensor) for every point captured
    by a module's output hook (``resid_*`` only where a TransformerLens HookPoint has them;
    ``attn_pattern`` where the anatomy says it can be read, else UnsupportedModelError)."""
    points = [(point.anatomy_attr, point.name, first_tensor) for point in POINTS
              if point.name in capture and point.anatomy_attr is not None]
    if "attn_pattern" in capture:
        source = pattern_capture(anatomy)
        points.append((source.attr, "attn_pattern", source.extract))
    return points


def absent_points(anatomy: Anatomy, capture: tuple[str, ...], layers: Iterable[int]
                  ) -> dict[tuple[str, int], str]:
    """(point, layer) -> why: the module-output points of ``capture`` that ``layers`` lack
    (``attn_out`` of a layer without attention: a Mamba or convolution layer of a hybrid)."""
    absent = {}
    for point in POINTS:
        if point.name != "attn_out" or point.name not in capture:
            continue
        for layer in layers:
            part = anatomy.layers[layer]
            if getattr(part, cast(str, point.anatomy_attr)) is None:
                absent[(point.name, layer)] = f"{part.describe()}, with no attention output"
    return absent


def application_orders(anatomy: Anatomy, attr: str) -> dict[Any, Any]:
    """module id -> (module, [layer indices in application order]) for ``LayerParts.attr``."""
    orders: dict = {}
    for part in anatomy.layers:
        module = getattr(part, attr)
        if module is not None:
            orders.setdefault(id(module), (module, []))[1].append(part.index)
    return orders


def first_tensor(output: Any) -> Tensor:
    """A module's output, or the first element of a tuple output."""
    return output[0] if isinstance(output, (tuple, list)) else output


_NOT_THERE = repeat(object())  # dict.get's default for every key: never one of its values
_INPUT_RANK = {name: i for i, name in enumerate(MODEL_INPUT_KWARGS)}


WRITTEN_WARNING = ("forward call not recorded: a recorded state was written in place after it "
                   "was recorded (by the model, or after the call); this probe stores copies "
                   "from now on")


class StoreMode:
    """What the probes on one model learned from its calls (see :func:`model_facts`): whether
    they store copies of what they record (True until a call shows that nothing writes a
    recorded state in place) or references, and the merge rule a first call settled
    (``Probe._merge_rule``: "on" or "off"; None until one did). Shared by the probes and the
    calls they defer (:class:`DeferredCommit`), which turn copies back on when they find such
    a write."""

    __slots__ = ("copies", "merge")

    def __init__(self) -> None:
        self.copies: bool = True
        self.merge: Optional[str] = None


# call root -> (capture points, layers) -> what its probes learned; weak: an entry goes with
# its module, and holds nothing of the model
_FACTS: "weakref.WeakKeyDictionary[nn.Module, dict[Any, StoreMode]]" = \
    weakref.WeakKeyDictionary()


def model_facts(root: nn.Module, capture: tuple[str, ...], layers: tuple[int, ...]) -> StoreMode:
    """What probes recording ``capture`` at ``layers`` of the model called through ``root``
    learned from its calls, shared: a fresh probe (``with instrument(model)`` around each
    batch) starts where the last one left, its first call on the steady path (references,
    deferred; the merge settled) rather than copied and checked again. An in-place write found
    later still drops that call with a warning and turns copies on, for every such probe."""
    facts = _FACTS.get(root)
    if facts is None:
        facts = _FACTS[root] = {}
    return facts.setdefault((capture, layers), StoreMode())


def in_backward() -> bool:
    """True while autograd runs a backward pass (gradient-checkpointing recomputation)."""
    return torch._C._current_graph_task_id() != -1


def verified(anatomy: Anatomy, call: "ForwardCall", output: Any, *,
             on_refusal: Callable[[], None]) -> Anatomy:
    """``anatomy`` after its pending check (``Anatomy.verify``: the generic fallback's, see
    anatomy/generic.py) on this recorded call, replays unrecorded; unchanged when none is
    pending. On a refusal ``on_refusal()`` runs (the probe removes its hooks), then it raises."""
    if anatomy.verify is None:
        return anatomy
    try:
        with suspended():
            return anatomy.verify(anatomy, call, output)
    except UnsupportedModelError:
        on_refusal()
        raise


class ModelCallBinder:
    """The model call's arguments by name (``**kwargs`` flattened). The signature is
    read once, when the probe attaches; a call binds its positional arguments by name.

        >>> bind = ModelCallBinder(inspect.signature(lambda input_ids, attention_mask=None,
        ...                                                  **kwargs: None))
        >>> sorted(bind((torch.ones(1, 2),), {"attention_mask": None, "labels": 3}))
        ['attention_mask', 'input_ids', 'labels']
    """

    def __init__(self, signature: inspect.Signature) -> None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = list(signature.parameters.values())
        self.positional: tuple[str, ...] = tuple(p.name for p in params if p.kind in kinds)
        self.var_positional: bool = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        self.var_keyword: Optional[str] = next(
            (p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.positional) and not self.var_positional:
            bound = dict(kwargs)  # more than the signature takes: the model itself will say so
        else:
            bound = dict(zip(self.positional, args))
            bound.update(kwargs)
        extra = bound.pop(self.var_keyword, None) if self.var_keyword == "kwargs" else None
        if isinstance(extra, dict):  # a model forward(**kwargs) called with kwargs={...}
            bound.update(extra)
        return bound


# a model class's forward function -> its binder (weak: goes with the function)
_BINDERS: "weakref.WeakKeyDictionary[Any, ModelCallBinder]" = weakref.WeakKeyDictionary()


def model_call_binder(forward: Callable[..., Any]) -> ModelCallBinder:
    """The :class:`ModelCallBinder` of a model's ``forward``, read once per function when it
    is a method (``inspect.signature`` follows the decorators' ``__wrapped__``: ~80 us a
    probe otherwise); another callable (a wrapper library's instance attribute) is read anew."""
    function = getattr(forward, "__func__", None)
    if not isinstance(function, FunctionType) or getattr(forward, "__self__", None) is None:
        return ModelCallBinder(inspect.signature(forward))
    binder = _BINDERS.get(function)
    if binder is None:
        binder = _BINDERS[function] = ModelCallBinder(inspect.signature(forward))
    return binder


class ForwardCall:
    """State of one forward of the model while it runs. ``implicit``: the blocks were called
    without the model's own forward (TL3's generate() calls ``forward`` directly)."""

    __slots__ = ("mask", "continues", "implicit", "token_ids", "counts", "captured",
                 "block_calls", "block_args", "inputs", "input_versions", "versions", "defer",
                 "noted_blocks", "noted_outputs", "deferred", "deferred_outputs",
                 "inputs_owned", "block_output", "merge_ok", "merge_checks")
    mask: Optional[Tensor]
    continues: bool
    implicit: bool

    def __init__(self, mask: Optional[Tensor], continues: bool, implicit: bool = False,
                 token_ids: Optional[Tensor] = None) -> None:
        self.mask, self.continues, self.implicit = mask, continues, implicit
        self.token_ids = token_ids
        self.counts: dict[Any, int] = {}
        self.captured: dict[Any, Any] = {}
        self.block_calls: dict[Any, Any] = {}
        # (layer, args, kwargs, stored input, keep) per recorded block call, until the call ends
        self.block_args: list[tuple[Any, ...]] = []
        self.inputs: Optional[tuple[Any, ...]] = None
        self.input_versions: list[tuple[Tensor, int]] = []  # noted when the call ends
        self.versions: list[tuple[Tensor, int]] = []  # (recorded state, its in-place version)
        # whether hooks only note what they see (the probe stores references and has seen a
        # call end without an in-place write), and what they noted, until the call ends
        self.defer: bool = False
        # what the hooks' steady path noted, in the order it ran, until resolve(): block
        # calls ((counter, plans), input, version, args, kwargs) and recorded outputs
        # ((counter, [(point, layer) or None per application]), output, version)
        self.noted_blocks: list[tuple[Any, ...]] = []
        self.noted_outputs: list[tuple[Any, ...]] = []
        # the same with their layer: block calls (plan, input, version, args, kwargs), their
        # KV caches dropped at close(); outputs (point, layer, output, version)
        self.deferred: list[tuple[Any, ...]] = []
        self.deferred_outputs: list[tuple[Any, ...]] = []
        self.inputs_owned: bool = False  # mask and token_ids are copies (close)
        # the merge check (Probe._merge_rule): the last block output, and whether each block
        # input so far was the block output before it
        self.block_output: Optional[Tensor] = None
        self.merge_ok: bool = True
        self.merge_checks: int = 0

    @classmethod
    def begin(cls, bound: dict[str, Any]) -> "ForwardCall":
        """The state of a model call whose arguments are ``bound`` (see ModelCallBinder):
        its padding mask, its integer token ids [batch, pos] (None for embeddings and strings)
        and whether it continues a KV cache, read in one pass over the arguments. Refused when
        the batch is empty, or a list of strings that the model would pad out of the probe's
        sight."""
        inputs = ids = None
        rank = ids_rank = len(MODEL_INPUT_KWARGS)
        for name, value in bound.items():  # the inputs by MODEL_INPUT_KWARGS' preference
            r = _INPUT_RANK.get(name)
            if r is None or not isinstance(value, Tensor):
                continue
            if r < rank:
                inputs, rank = value, r
            if r < ids_rank and not value.is_floating_point() and value.ndim in (1, 2):
                ids, ids_rank = value, r
        if inputs is not None and 0 in inputs.shape[:2]:
            raise RecordingError(f"empty batch: the model was called with inputs of shape "
                                 f"{tuple(inputs.shape)}")
        mask = padding_mask(bound)
        texts = bound.get("input")
        if (mask is None and isinstance(texts, (list, tuple)) and len(texts) > 1
                and all(isinstance(t, str) for t in texts)):
            raise RecordingError("a list of strings is padded inside the model, so the probe "
                                 "cannot tell padding from tokens: pass tokens "
                                 "(model.to_tokens(...)) and attention_mask= instead")
        continues = not CACHE_NAMES.isdisjoint(bound) and cache_length(bound) > 0
        if ids is not None and ids.ndim == 1:
            ids = ids[None]
        return cls(mask, continues=continues, token_ids=ids)

    def next_layer(self, key: tuple[Any, ...], order: list[int]) -> Optional[int]:
        """The layer of this application of a module (None past its last application)."""
        count = self.counts.get(key, 0)
        self.counts[key] = count + 1
        return order[count] if count < len(order) else None

    def needs_input(self, plan: tuple[int, bool, bool, bool], merge_on: bool) -> bool:
        """Whether a block call with ``plan`` = (layer, recorded, keeps resid_pre, holds
        resid_post of the layer before) keeps its input (see :meth:`note_block`)."""
        _, recorded, keep_pre, post_before = plan
        return (post_before and merge_on) or (recorded and not (self.continues and not keep_pre))

    def note_block(self, plan: tuple[int, bool, bool, bool], stored: Tensor, args: tuple[Any, ...],
                   kwargs: dict[str, Any], keep: Optional[Callable[[Tensor], Tensor]],
                   merge_on: bool) -> None:
        """What a block call adds, its input stored as ``stored``: resid_pre, resid_post of
        the layer before (``merge_on``: read from this input, not hooked at that block's
        output), and the replayable call (not for a cache continuation)."""
        layer, recorded, keep_pre, post_before = plan
        if post_before and merge_on:
            self.captured[("resid_post", layer - 1)] = stored
        if not recorded or (self.continues and not keep_pre):
            return
        if not self.continues:  # the replayable call is built when the call is committed
            self.block_args.append((layer, args, kwargs, stored, keep))
        if keep_pre:
            self.captured[("resid_pre", layer)] = stored

    def written(self) -> bool:
        """Whether a state recorded by reference was written in place after it was noted."""
        return (any(t._version != v for t, v in self.versions)
                or any(t._version != v for _, t, v, *_ in self.deferred)
                or any(t._version != v for *_, t, v in self.deferred_outputs))

    def complete(self, expected: int, capture: tuple[str, ...], layers: tuple[int, ...]) -> bool:
        """Whether every recorded layer ran (``expected`` captured points); else say so."""
        if len(self.captured) == expected:
            return True
        missing = sorted({layer for name in capture for layer in layers
                          if (name, layer) not in self.captured})
        # e.g. stop_at_layer, or an exception swallowed inside the model
        log.warning("forward call not recorded: layers %s did not run (recorded layers "
                    "must all run in every call)", missing)
        return False

    def commit_to(self, recording: Any, hidden_kwarg: str,
                  streams: Optional[ResidualStreams] = None) -> None:
        """Add this call to ``recording`` (a :class:`~spectral_hooks.recording.Recording`),
        its replayable block calls built if they are not yet. ``streams``: the blocks' residual
        state is parallel streams (the anatomy's ``call_convention.streams``), recorded as
        token vectors [batch, pos, streams * d]."""
        self.build_block_calls(hidden_kwarg)
        if streams is not None:
            self.streams_to_tokens(streams)
        recording.commit(self.captured, self.captured_mask(), self.shape(),
                         continues=self.continues, block_calls=self.block_calls,
                         inputs=self.inputs, input_versions=self.input_versions,
                         token_ids=self.new_token_ids(), owned=self.inputs_owned)

    def streams_to_tokens(self, streams: ResidualStreams) -> None:
        """The residual states of a multi-stream model ([streams, batch, pos, d]) as token
        vectors [batch, pos, streams * d], in what was captured and in the block calls (one
        copy of each state: a block's input is also its resid_pre and the resid_post before)."""
        done: dict[int, Tensor] = {}

        def tokens(state: Tensor) -> Tensor:
            if id(state) not in done:
                done[id(state)] = streams.to_tokens(state)
            return done[id(state)]

        for key, value in self.captured.items():
            if key[0] in ("resid_pre", "resid_post"):
                self.captured[key] = tokens(value)
        for layer, call in self.block_calls.items():
            args, kwargs = call.with_hidden(tokens(call.hidden))
            self.block_calls[layer] = dataclasses.replace(call, args=args, kwargs=kwargs)

    def resolve(self) -> None:
        """Give what the hooks' steady path noted its layer, through the same per-module
        application counters as the other path, in the order it ran; drop applications past
        a module's last, outputs of unrecorded layers, and the KV caches in the block calls'
        arguments: once for the blocks given the same objects under the same names (as a
        model's layer loop gives them). Runs when the other path takes over mid-call, and
        when a deferred call is committed (a pending call is only :meth:`close` d)."""
        counts = self.counts
        if self.noted_blocks:
            noted, self.noted_blocks = self.noted_blocks, []
            append = self.deferred.append
            before: dict[str, Any] = {}
            kept: dict[str, Any] = {}
            for (key, plans), hidden, version, args, kwargs in noted:
                i = counts.get(key, 0)
                counts[key] = i + 1
                if i >= len(plans):
                    continue
                if len(kwargs) != len(before) or not all(map(
                        is_, kwargs.values(), map(before.get, kwargs, _NOT_THERE))):
                    before, kept = kwargs, kept_block_kwargs(kwargs)
                if len(args) > 1:
                    args = without_cache_args(args)
                append((plans[i], hidden, version, args, kept))
        if self.noted_outputs:
            noted, self.noted_outputs = self.noted_outputs, []
            for (key, targets), value, version in noted:
                i = counts.get(key, 0)
                counts[key] = i + 1
                if i < len(targets) and targets[i] is not None:
                    self.deferred_outputs.append((*targets[i], value, version))

    def close(self) -> None:
        """End a call whose hooks noted references (:class:`DeferredCommit`): keep copies of
        the padding mask and token ids, so that a later write to the caller's buffers changes
        nothing, and drop the KV caches from the block calls noted (:meth:`drop_caches`). What
        the hooks noted gets its layer when the call is committed (:meth:`resolve`)."""
        # (no detach: no grad here, and integer tensors never need one)
        if self.mask is not None:
            self.mask = self.mask.clone()
        if self.token_ids is not None:
            self.token_ids = self.token_ids.clone()
        self.inputs_owned = True
        self.drop_caches()

    def drop_caches(self) -> None:
        """Take the KV caches out of the block calls the steady path noted, so that a pending
        call holds none: the keyword arguments under a cache name (the taps' own dicts, made
        for the call, so edited in place) and caches passed by position. The replay drops
        caches under any name at commit (:func:`kept_block_kwargs`)."""
        noted = self.noted_blocks
        for i, entry in enumerate(noted):
            kwargs = entry[4]
            for name in kwargs.keys() & CACHE_NAMES:
                del kwargs[name]
            args = entry[3]
            if len(args) > 1:
                noted[i] = (*entry[:3], without_cache_args(args), kwargs)

    def build_block_calls(self, hidden_kwarg: str) -> None:
        """Turn the block calls noted while the model ran into replayable calls (see
        :func:`replayable_call`), once per forward rather than inside each block's hook. Blocks
        whose keyword arguments are one dict (the probe's hooks share one kept copy between
        blocks given the same ones) share one kept copy: nothing in a BlockCall is written to."""
        before: Optional[dict[str, Any]] = None
        keep_before, kept = None, {}
        for layer, args, kwargs, stored, keep in self.block_args:
            if kwargs is not before or keep is not keep_before:
                before, keep_before, kept = kwargs, keep, kept_block_kwargs(kwargs, keep)
            self.block_calls[layer] = replayable_call(args, kwargs, stored, keep,
                                                      hidden_kwarg=hidden_kwarg,
                                                      kept_kwargs=kept)
        self.block_args = []

    def captured_mask(self) -> Optional[Tensor]:
        """The padding mask of the captured positions as the model got it (on its device, not
        read here: no host sync), or None when the model got none (every position is real)."""
        batch, n_new = self.shape()
        mask = self.mask
        if mask is not None and mask.shape[0] == batch and mask.shape[1] >= n_new:
            return mask if mask.shape[1] == n_new else mask[:, -n_new:]
        return None

    def batch_mask(self) -> Tensor:
        """The padding mask of the captured positions (all ones when the model got none)."""
        mask = self.captured_mask()
        return torch.ones(self.shape(), dtype=torch.long) if mask is None else mask

    def new_token_ids(self) -> Optional[Tensor]:
        """The token ids of the captured positions [batch, n_new] as the model got them (on
        their device; None when the model got embeddings, or ids of another shape)."""
        batch, n_new = self.shape()
        ids = self.token_ids
        if ids is None or ids.shape[0] != batch or ids.shape[1] < n_new:
            return None
        return ids if ids.shape[1] == n_new else ids[:, -n_new:]

    def shape(self) -> tuple[int, int]:
        """(batch, new positions) of the captured states."""
        sample = next(iter(self.captured.values()))
        return sample.shape[0], sample.shape[1]


class CommitSettings(NamedTuple):
    """A probe's settings that a deferred call is committed with (they are fixed while the
    probe defers: its merge rule and anatomy are settled by then)."""

    mode: StoreMode
    merge_on: bool
    expected: int  # captured (point, layer) pairs a complete call holds
    capture: tuple[str, ...]
    layers: tuple[int, ...]
    hidden_kwarg: str
    streams: Optional[ResidualStreams] = None  # the anatomy's call_convention.streams


class DeferredCommit:
    """A call recorded by reference, committed when its recording is next read
    (``Recording.defer``): the hooks only noted what they saw, this does the rest, first
    checking that nothing wrote a noted state in place since (else the call is dropped, with
    a warning, and ``settings.mode`` turns copies on). It holds the call's states and inputs:
    no KV cache, no model, no probe."""

    __slots__ = ("call", "settings")

    def __init__(self, call: ForwardCall, settings: CommitSettings) -> None:
        call.close()
        self.call: ForwardCall = call
        self.settings: CommitSettings = settings

    def __call__(self, recording: Any) -> None:
        call, keep, settings = self.call, recording.keep, self.settings
        merge_on = settings.merge_on
        call.resolve()
        if not (call.deferred or call.deferred_outputs or call.captured):
            return  # nothing of a recorded layer ran
        if call.written():
            settings.mode.copies = True
            log.warning(WRITTEN_WARNING)
            return
        for plan, hidden, _, args, kwargs in call.deferred:  # noted with grad off
            if call.needs_input(plan, merge_on):
                call.note_block(plan, keep(hidden), args, kwargs, None, merge_on)
        for name, layer, value, _ in call.deferred_outputs:
            call.captured[(name, layer)] = keep(value)
        call.deferred, call.deferred_outputs = [], []
        if call.complete(settings.expected, settings.capture, settings.layers):
            call.commit_to(recording, settings.hidden_kwarg, settings.streams)
