"""The block as a function of its residual input at the recorded call (see the package doc)."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import Tensor

from ..anatomy.calls import BlockCallConvention
from ..anatomy.effective import replay_convention, replay_tensors
from ..checks import check_float_dtype, check_int
from ..errors import NonFiniteError, OptionError, RecordingError
from ..recording import BlockCall, map_tensors, suspended
from ..recording.points import BLOCK_INPUT, describe
from .routing import HeldTopk, check_routing

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

KINDS = ("token", "sequence")
#: What torch raises when a function transform (linearize, jvp, vjp, vmap, make_fx) or a kernel
#: refuses a block: a RuntimeError (NotImplementedError for a kernel without forward AD is one),
#: a TypeError or ValueError from a module's Python code run under a transform.
REPLAY_ERRORS = (RuntimeError, TypeError, ValueError)
_CONST_FOLD_NOISE = "Attempted to insert a get_attr Node with no underlying reference"


def _sdpa_math_kernel():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - very old torch
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


_LOWER_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_DOWNCASTS = {Tensor.float, Tensor.half, Tensor.bfloat16}


def _keep(value):
    return torch.float64 if value in _LOWER_FLOATS else value


class _KeepFloat64(torch.overrides.TorchFunctionMode):
    """Within a replay, a float64 tensor is never cast down: ``x.to(torch.float32)``,
    ``x.float()``, ``x.type(torch.float32)`` and a ``dtype=torch.float32`` keyword (softmax,
    mean, ...) keep float64. Hugging Face's RMSNorms (Llama, Mistral, Qwen2/3, Gemma's (1 + w),
    OLMo2's post-norms; ``anatomy.norm_upcasts``) compute in float32 whatever the model dtype,
    which would make a float64 operator linear only to ~1e-8; under this mode every norm (and an
    eager softmax's float32 upcast) runs in the analysis dtype. Float32 work is untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, Tensor) and x.dtype == torch.float64:
            if func in _DOWNCASTS:
                return x  # what x.float() returns for a float32 x: x itself
            if func is Tensor.to or func is Tensor.type:
                args = (x,) + tuple(_keep(a) for a in args[1:])
                if "dtype" in kwargs:
                    kwargs = {**kwargs, "dtype": _keep(kwargs["dtype"])}
            elif kwargs.get("dtype") in _LOWER_FLOATS:
                kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


@contextlib.contextmanager
def math_sdpa():
    """Every block replay runs here: under the math SDPA kernel (fused kernels have no forward
    AD), with float64 kept float64 (:class:`_KeepFloat64`: norms in the analysis dtype) and
    with probes suspended, so replays are never recorded as model calls."""
    with suspended(), _sdpa_math_kernel(), _KeepFloat64():
        yield


def one_snapshot_mode():
    """Context for a ``make_fx`` trace (and ``torch.func.linearize``, which is one): in "real"
    tracing mode make_fx snapshots every traced value as a fake tensor, creating a fresh
    ``FakeTensorMode`` for each unless one is ambient, and each new mode captures a Python
    stack trace. One ambient mode gives the same graph in about half the time (a GPT-2-small
    block's batched JVP: 0.73 -> 0.38 s at 128 columns, 0.62 -> 0.22 s at 1)."""
    try:
        from torch._guards import TracingContext, tracing
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:  # pragma: no cover - private API moved: the slower trace
        return contextlib.nullcontext()
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def agreement_tol(dtype: torch.dtype) -> float:
    """Relative tolerance when a faster replay path is checked against a reference one: 1e-9
    in float64 (the paths differ by rounding only), 1e3 eps (capped at 5e-2) otherwise."""
    if dtype == torch.float64:
        return 1e-9
    return min(1e3 * torch.finfo(dtype).eps, 5e-2)


def _traced_jvp(f: Callable[[Tensor], Tensor], x0: Tensor) -> Callable[[Tensor], Tensor]:
    with math_sdpa(), warnings.catch_warnings(), one_snapshot_mode():
        warnings.filterwarnings("ignore", message=_CONST_FOLD_NOISE, category=UserWarning)
        _, jvp = torch.func.linearize(f, x0)
    return jvp


def linearize(f: Callable[[Tensor], Tensor], x0: Tensor) -> Callable[[Tensor], Tensor]:
    """v -> J_f(x0) v by ``torch.func.linearize`` (traced once), under the math SDPA kernel.

    torch.func.linearize const-folds its traced graph with torch.fx, which warns "Attempted to
    insert a get_attr Node with no underlying reference" for every constant it lifts (harmless:
    the folded module holds the constant); that one message is silenced here, nothing else.
    Const-folding also makes an in-place op on a tensor that does not depend on x stateful:
    MPNet's ``scores += position_bias`` (DeBERTa-v2 has the like) mutates the folded primal
    scores, T5's bidirectional relative-position buckets (``relative_buckets += ...``) the
    folded buckets, so every call adds again and the JVP drifts (or indexes out of range). The
    traced JVP is therefore called twice on one vector (:func:`_irreproducible`); unless both
    agree, ``f`` is traced again through ``torch.func.functionalize``, which replaces mutations
    by pure ops, and checked again. A RuntimeError says that it is still not reproducible;
    callers then use :func:`plain_jvp`."""
    jvp = _traced_jvp(f, x0)
    if _irreproducible(jvp, x0) is None:
        return jvp
    jvp = _traced_jvp(torch.func.functionalize(f), x0)
    why = _irreproducible(jvp, x0)
    if why is not None:
        raise RuntimeError(f"the traced linearisation is not reproducible ({why})")
    return jvp


def _irreproducible(jvp: Callable[[Tensor], Tensor], x0: Tensor) -> Optional[str]:
    """Apply the traced JVP twice to one vector: None when both agree bit for bit, else why
    not."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
    try:
        with math_sdpa():
            first, second = jvp(v), jvp(v)
    except IndexError as err:  # a drifted folded constant indexed out of range
        return str(err)
    if torch.equal(first, second):
        return None
    err = float((first - second).norm() / first.norm().clamp_min(1e-300))
    return (f"two calls on one vector differ by {err:.1e}: the block mutates a tensor the "
            "trace folded as a constant")


def plain_jvp(f: Callable[[Tensor], Tensor], x0: Tensor) -> Callable[[Tensor], Tensor]:
    """v -> J_f(x0) v by ``torch.func.jvp`` (primal recomputed per call), under the math SDPA."""
    def jvp(v: Tensor) -> Tensor:
        with math_sdpa():
            return torch.func.jvp(f, (x0,), (v,))[1]
    return jvp


def first_output(out):
    """A block's hidden states: the first element of a tuple / list output, else the output."""
    return out[0] if isinstance(out, (tuple, list)) else out


class BlockFunction:
    """f(X): block ``layer`` with rows ``positions`` of its recorded input replaced by X [m, d].

    Returns the block's output at the same rows, [m, d]. Built by :func:`block_function`.
    """

    block: torch.nn.Module
    call: BlockCall
    params: dict[str, Tensor]
    convention: BlockCallConvention
    layer: int
    sample: int
    hidden: Tensor
    positions: Tensor
    rows: tuple[int, ...]
    x0: Tensor
    #: what, beyond its class and weights, decides what the block computes (the anatomy's
    #: ``replay_kind``: mixer, MLP, attention type, RoPE): blocks of different replay kinds
    #: share no traced graph and no layer group
    replay_kind: tuple[Any, ...] = ()
    #: routed experts: the recorded forward's top-k choices, held in :meth:`full` where the
    #: replay's own would differ (linearize.routing); None otherwise
    held_routing: Optional[list[Tensor]] = None

    def __init__(self, block: torch.nn.Module, call: BlockCall, hidden: Tensor,
                 positions: Tensor, params: dict[str, Tensor], layer: int, sample: int,
                 convention: BlockCallConvention, rows: Optional[tuple[int, ...]] = None
                 ) -> None:
        self.block, self.call, self.params = block, call, params
        self.convention = convention  # how this family's blocks are called (anatomy fact)
        self.layer, self.sample = layer, sample
        self.hidden = hidden  # [1, L, d] in the working dtype
        self.positions = positions  # LongTensor [m] on the block's device
        # the same rows as host ints (names, checks, keys: no device read each)
        self.rows = tuple(positions.tolist()) if rows is None else tuple(rows)
        L = hidden.shape[1]
        keep = torch.ones(L, 1, dtype=hidden.dtype, device=hidden.device)
        keep[positions] = 0
        self._base = hidden[0] * keep  # recorded rows, replaced rows zeroed
        self._scatter = torch.eye(L, dtype=hidden.dtype, device=hidden.device)[:, positions]
        self.x0 = hidden[0, positions].clone()  # [m, d]

    def full(self, H: Tensor) -> Tensor:
        """The block on a full [L, d] input (no batch dimension); returns [L, d]. A block of
        parallel residual streams (``convention.streams``) is called with [streams, 1, L, d /
        streams] and its output read back as [L, d]."""
        streams = self.convention.streams
        hidden = H[None] if streams is None else streams.from_tokens(H[None])
        args, kwargs = self.call.with_hidden(hidden)
        held = HeldTopk(self.held_routing) if self.held_routing else contextlib.nullcontext()
        with math_sdpa(), self.convention.replaying(self.block), held:
            out = first_output(torch.func.functional_call(self.block, self.params, args, kwargs))
        return (out if streams is None else streams.to_tokens(out))[0]

    def sequence(self, X: Tensor) -> Tensor:
        """The block's full [L, d] input: the recorded one with rows ``positions`` replaced by
        X [m, d]."""
        return self._base + self._scatter @ X

    def __call__(self, X: Tensor) -> Tensor:
        return self.full(self.sequence(X)).index_select(0, self.positions)


def _working_dtype(dtype: torch.dtype, like: Tensor) -> Callable[[Tensor], Tensor]:
    def cast(t: Tensor) -> Tensor:
        return t.detach().to(dtype) if t.is_floating_point() else t.detach()
    return cast


def _resolve_sample(recording, layer: int, sample: int):
    try:
        return recording.block_input(layer, sample)
    except RecordingError as err:  # a bad ``sample`` is an OptionIndexError from the recording
        raise RecordingError(
            f"no replayable input for layer {layer}, sample {sample}: block inputs are captured "
            "for prefill calls only, so a recording of decode steps alone (a call continuing a "
            "KV cache made before the probe was attached) cannot be linearised, and "
            f"store='stats' keeps only the latest run's inputs ({err})") from err


def _resolve_positions(recording, layer: int, sample: int, position: Optional[int], kind: str,
                       L: int) -> tuple[int, ...]:
    """The recording rows to linearise at, as host ints (the mask is on the host: one read)."""
    mask = recording.mask[sample].tolist()
    real = [i for i, m in enumerate(mask[:L]) if m != 0]
    if kind == "sequence":
        if position not in (None, -1):
            raise OptionError("position", position, "-1 (the default)",
                              hint="kind='sequence' covers every real position")
        if not real:
            raise RecordingError(f"sample {sample} has no real (non-padding) token at layer {layer}")
        return tuple(real)
    position = check_int("position", position)
    width = len(mask)
    if position < 0:
        if -position > len(real):
            raise OptionError("position", position, f"a row >= -{len(real)}",
                              hint=f"position {position} is out of range: sample {sample} has "
                              f"{len(real)} real tokens")
        return tuple(real[position:position + 1 if position != -1 else None])
    if position >= width:
        raise OptionError("position", position, f"a row < {width}",
                          hint=f"position {position} is out of range: the recording has "
                          f"{width} positions (sample {sample})")
    if mask[position] == 0:
        raise OptionError("position", position, "a real (non-padding) row",
                          hint=f"position {position} of sample {sample} is padding")
    if position >= L or int(recording.position_step[sample, position]) > 0:
        raise OptionError("position", position, "a prefill row",
                          hint=f"position {position} of sample {sample} was written by a "
                          "generate() decode step: block inputs are kept for the prefill only")
    return (position,)


def _check_finite_input(hidden: Tensor, positions: Tensor, *, layer: int, sample: int) -> None:
    """The recorded block input at the linearised rows is finite, else a NonFiniteError."""
    bad = ~torch.isfinite(hidden[positions]).all(dim=-1)
    if bool(bad.any()):
        row = int(positions[bad.nonzero()[0, 0]])
        raise NonFiniteError.at(layer=layer, capture=BLOCK_INPUT,
                                description=describe(BLOCK_INPUT), sample=sample, position=row,
                                consequence=": the Jacobian cannot be taken there")


def block_function(anatomy: Anatomy, recording: Recording, layer: int, *, sample: int = 0, position: int = -1,
                   kind: str = "token", dtype: torch.dtype = torch.float64) -> BlockFunction:
    """The block map at the recorded input, restricted to the chosen rows (see module doc)."""
    if kind not in KINDS:
        raise OptionError("kind", kind, f"one of {KINDS}")
    check_float_dtype("dtype", dtype)
    layer = anatomy.layer_index(layer)
    if layer not in recording.layers:
        raise RecordingError(f"layer {layer} was not recorded (recorded: "
                             f"{list(recording.layers)}); instrument with layers=None to record "
                             "every layer")
    call = _resolve_sample(recording, layer, sample)
    block = anatomy.layers[layer].block
    device = call.hidden.device
    cast = _working_dtype(dtype, call.hidden)
    args, kwargs = map_tensors(call.args, cast), map_tensors(call.kwargs, cast)
    call = dataclasses.replace(call, args=args, kwargs=kwargs)
    hidden = call.hidden
    rows = _resolve_positions(recording, layer, sample, position, kind, hidden.shape[1])
    positions = torch.tensor(rows, dtype=torch.long).to(device)
    _check_finite_input(hidden[0], positions, layer=layer, sample=sample)
    # dtype copies of the block's tensors; quantized layers replayed as float layers holding
    # their verified dequantized weights (anatomy.effective), never AD through their kernels
    params = replay_tensors(block, device, dtype)
    fn = BlockFunction(block, call, hidden, positions, params, layer, sample,
                       replay_convention(anatomy.call_convention, block), rows=rows)
    fn.replay_kind = anatomy.replay_kind(layer)
    if (anatomy.layers[layer].mlp or "").startswith("routed"):
        mask = recording.mask[sample]
        L = hidden.shape[1]
        real = mask[-L:] != 0 if mask.shape[0] >= L else torch.ones(L, dtype=torch.bool)
        fn.held_routing = check_routing(fn, real)
    return fn
