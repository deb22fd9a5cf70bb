"""Probe: forward hooks that record a transformer's residual stream, and nothing else.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=3, n_embd=32, n_head=4)).eval()
    >>> with instrument(model) as probe:
    ...     _ = model(torch.ones(4, 12, dtype=torch.long))
    >>> probe.recording.resid_post[2].shape
    torch.Size([4, 12, 32])
    >>> probe.jacobian(1, position=-1).shape            # the block Jacobian at a recorded token
    (32, 32)

Guarantees: the probe removes exactly its own handles (also when the forward raises, in a
``with``), never changes a model output, records detached copies, counts applications of shared
blocks (ALBERT), appends generate() decode steps, ignores block calls outside a model forward.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import torch
from torch import Tensor, nn

from .analysis import AnalysisCache, AnalyzeOptions, Subject, analyze
from .analysis.distributed import analyze_distributed
from .anatomy import Anatomy, EncoderDecoderAnatomy, anatomy_of, stack_of
from .anatomy.effective import name_layers
from .anatomy.wrappers import unwrap_model
from .checks import check_float_dtype
from .encoder_decoder import EncoderDecoderProbe
from .errors import OptionError, RecordingError
from .hooks import forward_call as fc
from .hooks.taps import ForwardTap
from .linearize import BlockJacobian, JacobianProduct
from .recording import (
    DEFAULT_CAPTURES,
    STORES,
    SUSPENSION,
    Recording,
    is_suspended,
    map_tensors,
    tensor_versions,
)
from .recording.block_call import block_arguments, block_padding_mask, cache_length, without_caches
from .report import Report

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .analysis.keywords import AnalyzeKeywords

log: logging.Logger = logging.getLogger(__name__)


class Probe:
    """Hooks on one model; see :func:`instrument`. Block Jacobians at the recorded inputs:
    ``jacobian``, ``jacobian_product``, ``dense_jacobian``; the same inputs on another model
    (how the re-initialised control is recorded): ``clone_on``, ``record_on``."""

    def __init__(self, model: nn.Module, *, layers: Optional[Iterable[int]] = None,
                 capture: Sequence[str] = DEFAULT_CAPTURES, store: str = "device",
                 dtype: Optional[torch.dtype] = None, anatomy: Optional[Anatomy] = None) -> None:
        self.anatomy: Anatomy = stack_of(anatomy if anatomy is not None else anatomy_of(model),
                                         what="Probe")
        self.model: nn.Module = model
        capture = fc.recorded_points(capture)  # TransformerLens hook names accepted
        if store not in STORES:
            raise OptionError("store", store, f"one of {STORES}")
        check_float_dtype("dtype", dtype, allow_none=True)
        self.layers: tuple[int, ...] = fc.recorded_layers(self.anatomy, layers)
        self.recording: Recording = Recording(
            n_layers=self.anatomy.n_layers, layers=self.layers, capture=capture, store=store,
            dtype=dtype, absent=fc.absent_points(self.anatomy, capture, self.layers))
        self._handles: list = []
        self._call: Optional[fc.ForwardCall] = None
        # stores copies until a call shows that nothing writes a recorded state in place;
        # shared with the calls deferred to the recording, which may turn copies back on, and
        # with the probes made later on this model (what a first call learned, it keeps)
        self._mode = fc.model_facts(self.anatomy.call_root, capture, self.layers)
        self._merge = self._merge_rule()
        # the store keeps tensors as they are (detached where they need grad): no walk needed
        self._references = store == "device" and dtype is None
        self._analysis_cache: Optional[AnalysisCache] = None  # made when first needed
        self._attach()

    # ---------------------------------------------------------------- attaching
    def _register(self, module: nn.Module, hook, *, pre: bool = False) -> None:
        """A tap (``hooks/taps.py``: the module keeps ``Module.__call__``'s fast path) on a layer's
        modules; a forward hook on the model's root, whose ``forward`` other libraries wrap
        and inspect (accelerate's mixed precision reads ``model.forward.__func__``)."""
        if module is self.anatomy.call_root:
            register = module.register_forward_pre_hook if pre else module.register_forward_hook
            self._handles.append(register(hook, with_kwargs=True))
        else:
            self._handles.append(ForwardTap(module, pre=hook) if pre else
                                 ForwardTap(module, post=hook))

    def _attach(self) -> None:
        """Register the hooks. Everything a hook can know before the model runs is worked out
        here, once: the model call's parameter names, each shared module's layer order, which
        layers record which point."""
        root, parts = self.anatomy.call_root, self.anatomy.layers
        capture = self.recording.capture
        points = fc.output_points(self.anatomy, capture)  # may refuse: before any hook
        self._bind = fc.model_call_binder(root.forward)
        # captured (point, layer) pairs a call holds (attn_out: only where a layer has attention)
        self._expected = len(capture) * len(self.layers) - len(self.recording.absent)
        self._register(root, self._begin_call, pre=True)
        self._register(root, self._end_call)
        last_block, self._first_block = parts[-1].block, parts[0].block
        self._last_block_uses = sum(p.block is last_block for p in parts)
        self._merge_handles = []  # block output hooks that the next block's input replaces
        for module, order in fc.application_orders(self.anatomy, "block").values():
            self._register(module, self._block_pre_hook(order), pre=True)
            if "resid_post" in capture and parts[order[0]].resid_post_hook is None:
                if self._merge == "on" and order[0] < len(parts) - 1:
                    continue  # read from the next block's input
                self._register(module, self._output_hook("resid_post", order, block=True))
                if self._merge == "check" and order[0] < len(parts) - 1:
                    self._merge_handles.append(self._handles[-1])
        for attr, name, read in points:
            for module, order in fc.application_orders(self.anatomy, attr).values():
                self._register(module, self._output_hook(name, order, read))
        # the end of an implicit call (blocks called without the model's forward) is hooked
        # on the last block when the first such call begins: last, so that it commits after
        # every other hook of that block ran; models called as a whole never carry it
        self._last_block, self._implicit_end = last_block, False
        self._commit_settings: Optional[fc.CommitSettings] = None
        self._recorded_a_call = self._said_no_block_ran = False

    def _merge_rule(self) -> str:
        """Whether ``resid_post`` of layer l is read from block l+1's input instead of a hook
        on block l's output: "check" (both hooked; the first recorded call compares them by
        identity, then "on" and the output hooks go, or "off"), "off" where it cannot hold
        (one module applied at several layers, TransformerLens hook points, one layer)."""
        parts = self.anatomy.layers
        blocks = {id(p.block) for p in parts}
        if ("resid_post" not in self.recording.capture or len(parts) < 2
                or len(blocks) != len(parts) or any(p.resid_post_hook is not None for p in parts)):
            return "off"
        return self._mode.merge or "check"  # settled by an earlier probe's first call

    def _settle_merge(self, call: fc.ForwardCall) -> None:
        """After the first recorded call: merge the hooks where every block's input was the
        previous block's output object, else keep them for good."""
        if call.merge_ok and call.merge_checks == len(self.anatomy.layers) - 1:
            self._merge = "on"
            for handle in self._merge_handles:
                self._handles.remove(handle)
                handle.remove()
        else:
            self._merge = "off"
        self._merge_handles = []
        self._mode.merge = self._merge

    def attach(self) -> "Probe":
        """Register the hooks again after :meth:`remove` (the recording is kept); nothing
        happens when they are attached. The training integrations attach a probe only for the
        steps they record."""
        if not self._handles:
            self._attach()
        return self

    # ---------------------------------------------------------------- hooks
    @property
    def _copies(self) -> bool:
        return self._mode.copies

    @_copies.setter
    def _copies(self, copies: bool) -> None:
        self._mode.copies = copies

    def _store(self, t: Tensor) -> Tensor:
        """How a hook keeps a recorded state: a reference (its in-place version noted and
        checked when the call ends), or a copy where the store asks for one, while the probe
        has not yet seen a call end without an in-place write to a recorded state, and for
        inference-mode tensors (whose writes cannot be seen). Under ``torch.compile`` it copies:
        Dynamo cannot trace ``is_inference`` or ``_version``, and a copy keeps the hook inside
        the compiled graph."""
        if torch.compiler.is_compiling() or t.is_inference():
            return self.recording.to_store(t)
        call = self._call
        if call is not None:
            call.versions.append((t, t._version))
        return self.recording.to_store(t) if self._copies else self.recording.keep(t)

    def _begin_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._call = call = fc.ForwardCall.begin(self._bind(args, kwargs))
        # references whose in-place writes can be seen: the hooks only note them, and the
        # recording commits them when next read (less Python in the forward, where a GPU waits)
        # (not under autograd: a pending call would hold the graph)
        grad = torch.is_grad_enabled()
        call.defer = (self._references and not grad and not self._mode.copies
                      and self._merge != "check" and self.anatomy.verify is None
                      and not torch.compiler.is_compiling())
        if not call.continues:
            if self._references and not grad:
                call.inputs = (args, without_caches(kwargs))
            else:
                keep = self.recording.keep
                call.inputs = (map_tensors(tuple(args), keep),
                               map_tensors(without_caches(kwargs), keep))

    def _end_call(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        if call.inputs is not None:  # kept by reference: a later write is caught at a replay
            call.input_versions = tensor_versions(call.inputs)
        if call.defer:
            self._defer_commit(call)
            return
        if not call.captured:
            self._say_no_block_ran()
            return
        if not call.complete(self._expected, self.recording.capture, self.layers):
            return
        written = call.written()
        if written and not self._copies:
            self._copies = True
            log.warning(fc.WRITTEN_WARNING)
            return
        hidden_kwarg = self.anatomy.call_convention.hidden_kwarg
        call.build_block_calls(hidden_kwarg)  # the anatomy's check replays them
        self.anatomy = fc.verified(self.anatomy, call, output, on_refusal=self.remove)
        self._commit_settings = None  # the anatomy or the merge rule may change here
        call.commit_to(self.recording, hidden_kwarg, self.anatomy.call_convention.streams)
        self._recorded_a_call = True
        self._copies = written  # references from the first call that sees no in-place write
        if self._merge == "check":
            if torch.compiler.is_compiling():  # Dynamo cannot remove handles: keep both hooks
                self._merge, self._merge_handles = "off", []
            else:
                self._settle_merge(call)

    def _say_no_block_ran(self) -> None:
        """Warn, once, that a model call ran none of the recorded blocks before any call was
        recorded (a model with several stacks whose instrumented one did not run: a vision
        tower beside the text stack): nothing else would say why the recording is empty."""
        if self._recorded_a_call or self._said_no_block_ran:
            return
        self._said_no_block_ran = True
        first = self.anatomy.layers[self.layers[0]]
        log.warning("the model ran, but none of the recorded blocks (%s, layers %d-%d) ran in "
                    "that call, so nothing was recorded: where a model has several stacks, "
                    "instrument the one that runs (e.g. sh.instrument(model.<stack>))",
                    type(first.block).__name__, self.layers[0], self.layers[-1])

    def _defer_commit(self, call: fc.ForwardCall) -> None:
        """End a call whose hooks only noted references: the recording commits it when next
        read, after checking them for in-place writes (``fc.DeferredCommit``)."""
        if (call.noted_blocks or call.noted_outputs or call.deferred or call.deferred_outputs
                or call.captured):
            settings = self._commit_settings
            if settings is None:  # worked out once: fixed while the probe defers
                self._commit_settings = settings = fc.CommitSettings(
                    self._mode, self._merge == "on", self._expected, self.recording.capture,
                    self.layers, self.anatomy.call_convention.hidden_kwarg,
                    self.anatomy.call_convention.streams)
            self.recording.defer(fc.DeferredCommit(call, settings))

    def _end_implicit_call(self, module: nn.Module, args: tuple, kwargs: dict,
                           output: Any) -> None:
        call = self._call
        if call is None or not call.implicit or is_suspended():
            return
        key = ("implicit_end", id(module))
        if call.next_layer(key, [0] * self._last_block_uses) is not None and \
                call.counts[key] == self._last_block_uses:
            self._end_call(module, args, kwargs, output)

    def _block_pre_hook(self, order: list[int]):
        parts, capture = self.anatomy.layers, self.recording.capture
        # per application: (layer, recorded, keeps resid_pre, holds resid_post of the layer
        # before once the merge is on)
        plans = [(layer, layer in self.layers,
                  layer in self.layers and "resid_pre" in capture
                  and parts[layer].resid_pre_hook is None,
                  layer - 1 in self.layers and "resid_post" in capture) for layer in order]
        n, hidden_kwarg = len(order), self.anatomy.call_convention.hidden_kwarg
        key = object()  # this hook's own application counter

        applications = (key, plans)

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            call = self._call
            if (call is not None and call.defer and not SUSPENSION.active
                    and not torch.is_grad_enabled() and not torch.compiler.is_compiling()):
                # the steady path, as short as it can be (a GPU waits on it): note the input
                # and the arguments; the call's end drops their KV caches (ForwardCall.close),
                # its commit gives them their layer (ForwardCall.resolve)
                hidden: Any = args[0] if args else kwargs.get(hidden_kwarg)
                try:  # a tensor other than an inference tensor (their writes cannot be seen)
                    version = hidden._version
                except (AttributeError, RuntimeError):
                    pass  # not one: the other path below copies it, or skips a non-tensor
                else:
                    call.noted_blocks.append((applications, hidden, version, args, kwargs))
                    return
            noted(module, args, kwargs)

        def noted(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if SUSPENSION.active and is_suspended():
                return
            call = self._call
            if call is None:
                if module is not self._first_block or fc.in_backward():
                    return  # outside a model forward: e.g. checkpoint recomputation in backward
                # the model's forward was bypassed (TL3 generate() calls the blocks directly)
                mask = block_padding_mask(block_arguments(module, args, kwargs),
                                          causal=self.anatomy.causal)
                self._call = call = fc.ForwardCall(mask, implicit=True,
                                                   continues=cache_length(kwargs) > 0)
                if not self._implicit_end:
                    self._register(self._last_block, self._end_implicit_call)
                    self._implicit_end = True
            call.resolve()  # the steady path's applications first: they ran first
            counts = call.counts
            i = counts.get(key, 0)
            counts[key] = i + 1
            if i >= n:
                return
            hidden = args[0] if args else kwargs.get(hidden_kwarg)
            if not isinstance(hidden, Tensor):
                return
            merge, plan = self._merge, plans[i]
            if merge == "check" and plan[0] > 0:
                call.merge_checks += 1
                call.merge_ok = call.merge_ok and hidden is call.block_output
            if call.needs_input(plan, merge == "on"):
                keep = None if self._references and not torch.is_grad_enabled() \
                    else self.recording.keep
                call.note_block(plan, self._store(hidden), args, kwargs, keep, merge == "on")

        return hook

    def _output_hook(self, name: str, order: list[int], read=fc.first_tensor, *,
                     block: bool = False):
        """``block``: the hook on a block's output (``resid_post``), which also notes the output
        for the merge check (see :meth:`_merge_rule`)."""
        recorded, n = [layer in self.layers for layer in order], len(order)
        key = object()  # this hook's own application counter
        first = fc.first_tensor
        # per application: (point, layer) where recorded, else None
        applications = (key, [(name, layer) if layer in self.layers else None
                              for layer in order])

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            call = self._call
            if call is None:
                return
            value = None
            if (call.defer and not SUSPENSION.active and not torch.is_grad_enabled()
                    and not torch.compiler.is_compiling()):
                if read is first:  # inline: a function call costs here
                    value = output[0] if isinstance(output, (tuple, list)) else output
                else:
                    value = read(output)
                try:  # as in the block hook's steady path
                    version = value._version
                except (AttributeError, RuntimeError):
                    pass  # an inference tensor: the other path below stores a copy
                else:
                    call.noted_outputs.append((applications, value, version))
                    return
            elif SUSPENSION.active and is_suspended():
                return
            call.resolve()
            counts = call.counts
            i = counts.get(key, 0)
            counts[key] = i + 1
            if i >= n:
                return
            if value is None:
                value = read(output)
            if block:
                call.block_output = value
            if recorded[i]:
                call.captured[(name, order[i])] = self._store(value)

        return hook

    # ---------------------------------------------------------------- lifecycle
    @property
    def attached(self) -> bool:
        """True while the probe's hooks are on the model (False after :meth:`remove`)."""
        return bool(self._handles)

    @property
    def n_handles(self) -> int:
        """Hook handles the probe holds (0 after :meth:`remove`: nothing leaked)."""
        return len(self._handles)

    def remove(self) -> None:
        """Remove exactly the hooks this probe registered. Safe to call twice."""
        while self._handles:
            self._handles.pop().remove()
        self._call, self._implicit_end = None, False

    def clear(self) -> None:
        """Forget the recording, keep the hooks."""
        self.recording.clear()

    def invalidate(self) -> None:
        """Forget every cached analysis result. Needed only after an in-place edit of a few
        weight elements that bypasses autograd (see ``analysis/cache.py``)."""
        if self._analysis_cache is not None:
            self._analysis_cache.invalidate()

    @property
    def _cache(self) -> AnalysisCache:
        """The analysis cache, made when first needed (its walk of the model's weights is not
        paid by a probe that only records)."""
        if self._analysis_cache is None:
            self._analysis_cache = AnalysisCache(self.model, self.recording)
        return self._analysis_cache

    # ---------------------------------------------------------------- block Jacobians
    def jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                 kind: str = "token", dtype: torch.dtype = torch.float64,
                 **options: Any) -> BlockJacobian:
        """Block ``layer``'s Jacobian at its recorded input as a matrix-free LinearOperator
        (matvec = JVP, rmatvec = VJP). ``position=-1``: the last real token of ``sample``.
        ``options``: ``method``, ``single_query`` (see linearize.block_jacobian)."""
        from .linearize import block_jacobian

        name_layers(self.model)  # a refusal names the quantized layer (as analyze's)
        return block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                              position=position, kind=kind, dtype=dtype, **options)

    def jacobian_product(self, first: int, last: int, *, position: int = -1, sample: int = 0,
                         dtype: torch.dtype = torch.float64, **options: Any) -> JacobianProduct:
        """P = J_last ... J_first at one token position (exact for causal models)."""
        from .linearize import jacobian_product

        name_layers(self.model)  # a refusal names the quantized layer (as analyze's)
        return jacobian_product(self.anatomy, self.recording, first, last, sample=sample,
                                position=position, dtype=dtype, **options)

    def dense_jacobian(self, layer: int, *, position: int = -1, sample: int = 0,
                       kind: str = "token", dtype: torch.dtype = torch.float64) -> Tensor:
        """The dense Jacobian by forward-mode AD (small models; a float64 Tensor)."""
        from .linearize import dense_block_jacobian

        name_layers(self.model)  # a refusal names the quantized layer (as analyze's)
        return dense_block_jacobian(self.anatomy, self.recording, layer, sample=sample,
                                    position=position, kind=kind, dtype=dtype)

    # ---------------------------------------------------------------- the same inputs elsewhere
    def clone_on(self, model: nn.Module) -> Any:
        """A new probe with the same layers, captures, store and stack on another model (e.g.
        a re-initialised copy of this one)."""
        rec = self.recording
        return type(self)(model, layers=self.layers, capture=rec.capture, store=rec.store,
                          dtype=rec.dtype, anatomy=stack_of(anatomy_of(model), self.anatomy.stack))

    def record_on(self, model: nn.Module) -> tuple[Anatomy, Recording]:
        """Run the recorded model inputs through ``model`` (same architecture) and return its
        anatomy and recording (used for the re-initialised control). A stack of an
        encoder-decoder model runs its own stack (a decoder: on the recorded encoder output)."""
        inputs = self.recording.model_inputs
        if not inputs or any(i is None for i in inputs):
            raise RecordingError("reinit needs the model inputs of every recorded run; they "
                                 "are missing (the model's forward was bypassed, e.g. TL3 "
                                 "generate())")
        device = next(model.parameters()).device
        with self.clone_on(model) as other, torch.no_grad():
            run = model if other.anatomy.stack is None else other.anatomy.call_root
            for args, kwargs in map_tensors(inputs, lambda t: t.to(device)):
                run(*args, **kwargs)
        return other.anatomy, other.recording

    # ---------------------------------------------------------------- analysis
    @property
    def subject(self) -> Subject:
        """What :meth:`analyze` hands to every section: this probe's anatomy, recording and
        analysis cache, and :meth:`record_on` (for calling a section of ``analysis/`` directly).
        A new frozen view at each read; the cache it holds is the probe's."""
        return Subject(anatomy=self.anatomy, recording=self.recording, cache=self._cache,
                       record_on=self.record_on)

    def analyze(self, options: Optional[AnalyzeOptions] = None, *, distributed: bool = False,
                group: Any = None, **keywords: Unpack[AnalyzeKeywords]) -> Report:
        """A :class:`~spectral_hooks.report.Report` whose sections are computed when first
        read. Results are cached until the weights or the recording change.

        Keywords: the fields of :class:`~spectral_hooks.analysis.AnalyzeOptions` (its
        attributes say each one's values and default; a keyword overrides the same field of
        ``options``):

        - ``power``: the power-method view (power, spectra; shared_weights for ALBERT);
        - ``iterate``: "F" or "I+F" (eigenvalues ordered by mu = 1 + lambda);
        - ``fold_norm``: multiply F by the gain of the norm that feeds attention;
        - ``jacobian``: the Jacobian view (jacobian, trends, Jacobian rows in spectra);
        - ``bottleneck``: the end-to-end bottleneck, its ablations, and propagation (its
          knobs are ``jacobian``'s ``bottleneck_*`` options);
        - ``reinit``: the same Jacobian analyses on a freshly initialised model, side by side;
        - ``reinit_seeds``: n >= 2 re-initialisations to test against (section reinit_test);
        - ``topology``: residual-unit communities, bridges and amplification;
        - ``idealised``: paper 1's idealised dynamics against the observation;
        - ``tokenizer``: decodes the tokens of the Jacobian rows (column ``token``);
        - ``progress``: one progress display over the whole analysis.

        ``distributed=True``: layers split over the ranks of ``group``, every rank gets the
        whole report (a collective; see ``analysis/distributed.py``)."""
        subject = self.subject
        resolved = AnalyzeOptions.resolve(options, **keywords)
        if distributed is not False:
            return analyze_distributed(subject, resolved, group=group, distributed=distributed)
        return analyze(subject, resolved)

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "removed"
        name = self.anatomy.family + (f".{self.anatomy.stack}" if self.anatomy.stack else "")
        return (f"Probe({name}, layers={list(self.layers)}, {state}, "
                f"{self.recording!r})")


def instrument(model: nn.Module, *, layers: Optional[Iterable[int]] = None,
               capture: Sequence[str] = DEFAULT_CAPTURES, store: str = "device",
               dtype: Optional[torch.dtype] = None) -> Probe | EncoderDecoderProbe:
    """Attach recording hooks to ``model`` (DDP/compile wrappers: to the module inside, see
    ``anatomy/wrappers.py``) and return the :class:`Probe` (for an encoder-decoder model, an
    :class:`~spectral_hooks.encoder_decoder.EncoderDecoderProbe`).

        >>> from transformers import GPT2Config, GPT2Model
        >>> import torch
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
        >>> with instrument(model) as probe:
        ...     _ = model(torch.tensor([[1, 2, 3]]))
        >>> probe.recording.resid_post[1].shape
        torch.Size([1, 3, 32])

    Args:
        layers: indices to record (negative allowed, or "blocks.3"); None: every layer.
        capture: any of "resid_pre", "resid_post", "attn_out" (the default: all three) and
            "attn_pattern" (opt-in; eager attention) or their TransformerLens hook names.
        store: "device" (keep where computed), "cpu" (offload) or "stats" (running mean and
            covariance only: constant memory for arbitrarily long runs).
        dtype: cast recorded tensors (e.g. torch.float32 for a bf16 model).
    """
    model = unwrap_model(model)
    anatomy = anatomy_of(model)
    if isinstance(anatomy, EncoderDecoderAnatomy):
        return EncoderDecoderProbe(model, anatomy, probe_type=Probe, layers=layers,
                                   capture=capture, store=store, dtype=dtype)
    return Probe(model, layers=layers, capture=capture, store=store, dtype=dtype,
                 anatomy=anatomy)
