"""Quantized layers: the float matrix their forward multiplies by, checked against that forward.

    >>> import torch
    >>> quantization_of(torch.nn.Linear(4, 3)) is None   # a float layer: not quantized
    True

Used by :mod:`.effective` (the one reader of effective weights) and nowhere else. One layer at a
time: :func:`dequantized` returns a fresh float tensor (out, in) that the caller drops after use;
nothing is cached on the layer and the layer is never written.

Supported, each through its library's own dequantization:

- bitsandbytes ``Linear4bit`` (nf4, fp4, with or without double quantization):
  ``bitsandbytes.functional.dequantize_4bit``; after bitsandbytes repacked the weight for its
  AVX512-BF16 CPU kernel (it does so in place at the first eval forward under no_grad:
  ``quant_state.packing_format_for_cpu``), ``dequantize_4bit`` reads that layout wrongly, so the
  repacked layout is decoded here (the inverse of bitsandbytes'
  ``_convert_weight_packed_for_cpu``: 4-bit codes [N, K], the codebook, bfloat16 absmax
  [K / blocksize, N]);
- bitsandbytes ``Linear8bitLt`` (LLM.int8): row-wise int8 codes times ``SCB`` / 127
  (``int8_vectorwise_dequant``); on a GPU it also quantizes its inputs (``activations=True``);
- torchao tensor subclasses with a ``dequantize()`` (``Int8Tensor``, ``IntxUnpackedToInt8Tensor``,
  ``Float8Tensor``, ...), activations quantized where the weight carries ``act_quant_kwargs`` /
  ``activation_quantization``;
- optimum-quanto ``QLinear`` (``qweight.dequantize()``; weight-only: with ``activations=`` its
  forward rounds inputs and outputs with static scales that a probe cannot check, refused);
- HQQ ``HQQLinear`` (``dequantize()``).

Every other quantized layer (GPTQ / AWQ ``qweight``, ``torch.ao`` quantized modules, an unknown
tensor subclass) is refused in one line naming its type.

Each dequantization is verified: the layer's own ``forward`` runs on a seeded probe input
(16 Gaussian rows, no hooks, no side effect: bitsandbytes' repacking is not triggered) and must
equal the dequantized matrix's product to the precision of the layer's compute dtype, per output
feature (:func:`verify`). A repacked, unknown or changed layout (or a ``dequantize`` that does not
match the kernel) is refused with the layer's name, never read as a wrong matrix.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError

__all__ = ["Quantization", "quantization_of", "dequantized", "verify", "layer_name",
           "name_layers", "PROBE_ROWS", "ACTIVATION_TOL"]

#: Rows of the seeded Gaussian probe input each dequantization is checked on.
PROBE_ROWS = 16
#: Per-feature relative tolerance of the check for layers that also quantize their inputs
#: (int8 rows: a step of max|x| / 127; a Gaussian probe's error is ~1e-2 of the output).
ACTIVATION_TOL = 0.05
#: Relative tolerance floor in units of the compute dtype's eps (input and output rounding).
_EPS_UNITS = 4.0
#: Elements per chunk where a whole layer would otherwise be copied (decoding, the check's
#: float64 reference): 2^22 (32 MiB in float64), so reading a layer costs its float matrix and
#: little more (benchmarks/quantized.py).
_CHUNK = 1 << 22

# qualified names of quantized layers (filled by name_layers(model): the analysis cache does)
_NAMES: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Quantization:
    """What a quantized layer is: ``library`` and ``scheme`` (e.g. "bitsandbytes", "nf4"),
    ``activations`` (its forward also quantizes its inputs: a Jacobian replay with the
    dequantized weights is then the weight-dequantized surrogate, not the forward's function)
    and ``compute_dtype`` (the dtype its kernel computes in: the precision of the check)."""

    library: str
    scheme: str
    activations: bool
    compute_dtype: torch.dtype

    def describe(self) -> str:
        """A short phrase: "bitsandbytes nf4", "torchao Int8Tensor (activations quantized)"."""
        return f"{self.library} {self.scheme}" + (
            " (activations quantized)" if self.activations else "")


def name_layers(model: nn.Module) -> None:
    """Remember the qualified names of ``model``'s quantized layers, for the messages that
    refuse one (weakly: nothing is kept alive)."""
    for name, module in model.named_modules():
        if module is not model and _library(module) is not None:
            _NAMES[module] = name


def layer_name(module: nn.Module) -> str:
    """``module``'s qualified name where :func:`name_layers` saw it, plus its type and shape."""
    shape = _shape(module)
    kind = type(module).__name__ + (f" {shape[1]} -> {shape[0]}" if shape else "")
    name = _NAMES.get(module)
    return f"{name} ({kind})" if name else f"a {kind} layer"


def _shape(module: nn.Module) -> Optional[tuple[int, int]]:
    out, inp = getattr(module, "out_features", None), getattr(module, "in_features", None)
    if isinstance(out, int) and isinstance(inp, int):
        return out, inp
    return None


def _from(obj: Any, *prefixes: str) -> bool:
    return type(obj).__module__.startswith(prefixes)


def _library(module: nn.Module) -> Optional[str]:
    """Which supported library quantized ``module`` (None: not one of them)."""
    weight = module.__dict__.get("_parameters", {}).get("weight")
    if _from(module, "bitsandbytes") and weight is not None and _from(weight, "bitsandbytes"):
        return "bitsandbytes"
    if _from(module, "optimum.quanto") and hasattr(module, "qweight"):
        return "quanto"
    if _from(module, "hqq") and callable(getattr(module, "dequantize", None)):
        return "hqq"
    if weight is not None and _from(weight, "torchao") and callable(
            getattr(weight, "dequantize", None)):
        return "torchao"
    return None


def quantization_of(module: nn.Module) -> Optional[Quantization]:
    """The :class:`Quantization` of a layer a supported library quantized, else None (a float
    layer, or a quantized one no supported library made: :mod:`.effective` refuses those)."""
    library = _library(module)
    if library is None:
        return None
    m: Any = module
    if library == "bitsandbytes":
        weight = m.weight
        if type(weight).__name__ == "Params4bit":
            state = weight.quant_state
            if state is None:
                return None if weight.is_floating_point() else Quantization(
                    library, "4-bit (not quantized yet)", False, torch.float32)
            packed = bool(getattr(state, "packing_format_for_cpu", False))
            compute = torch.bfloat16 if packed else (m.compute_dtype or state.dtype)
            scheme = f"{state.quant_type}{' double-quant' if state.nested else ''}"
            return Quantization(library, scheme + (" (CPU-repacked)" if packed else ""), False,
                                compute)
        if weight.dtype != torch.int8:  # Linear8bitLt holding float weights (has_fp16_weights)
            return None
        return Quantization(library, "int8 (LLM.int8)", True, torch.float32)
    if library == "torchao":
        weight = m.weight
        acts = getattr(weight, "act_quant_kwargs", None) is not None or getattr(
            weight, "activation_quantization", None) is not None
        return Quantization(library, type(weight).__name__, acts, weight.dtype)
    if library == "quanto":
        acts = getattr(m, "activation_qtype", None) is not None
        qtype = getattr(m, "weight_qtype", None)
        return Quantization(library, str(getattr(qtype, "name", qtype)), acts, m.weight.dtype)
    nbits = getattr(m, "meta", {}).get("nbits", "?")
    return Quantization(library, f"{nbits}-bit", False, m.compute_dtype)


def _unpack_cpu_4bit(packed: Tensor, state: Any, dtype: torch.dtype = torch.float32
                     ) -> Tensor:
    """The weight [N, K] of bitsandbytes' AVX512-BF16 CPU layout: the inverse of its
    ``_convert_weight_packed_for_cpu`` (block_n = 32: bytes [N, K/2], byte i of each row of
    32 holding code i in its low nibble and code 32 + i in its high one, codes laid out
    [N/32, K/2, 32, 2]), times the codebook and the bfloat16 absmax [K / blocksize, N].
    Decoded in chunks of rows straight into a ``dtype`` matrix (no full-size temporaries)."""
    N, half = packed.shape
    K, block = 2 * half, int(state.blocksize)
    lut = state.code.to(torch.float32)
    absmax = state.absmax.to(torch.float32).t()  # [N, K / blocksize]
    out = torch.empty(N, K, dtype=dtype, device=packed.device)
    step = max(32, (_CHUNK // max(K, 1)) // 32 * 32)
    for r0 in range(0, N, step):
        n = min(step, N - r0)
        rows = packed[r0:r0 + n].reshape(-1, 32)
        codes = torch.cat([rows & 0xF, (rows >> 4) & 0xF], dim=-1)  # [-1, 64]
        codes = codes.reshape(n // 32, half, 32, 2).transpose(1, 2).reshape(n, K)
        values = lut[codes.int()].view(n, K // block, block) * absmax[r0:r0 + n, :, None]
        out[r0:r0 + n] = values.view(n, K)
    return out


def _dequantize_raw(module: nn.Module, q: Quantization, dtype: Optional[torch.dtype]) -> Tensor:
    m: Any = module
    if q.library == "bitsandbytes":
        import bitsandbytes.functional as bnbf

        weight = m.weight
        if type(weight).__name__ == "Params4bit":
            state = weight.quant_state
            if state is None:
                raise UnsupportedModelError(
                    f"{layer_name(module)} holds 4-bit weights with no quant_state (not "
                    "quantized yet: move the model to its device first)")
            if getattr(state, "packing_format_for_cpu", False):
                return _unpack_cpu_4bit(weight.data, state, dtype or torch.float32)
            return bnbf.dequantize_4bit(weight.data, state)
        scb = getattr(weight, "SCB", None)
        if scb is None:
            scb = getattr(getattr(m, "state", None), "SCB", None)
        if scb is None:
            raise UnsupportedModelError(f"{layer_name(module)} holds int8 weights with no "
                                        "row scales (SCB): its matrix cannot be read")
        return bnbf.int8_vectorwise_dequant(weight.data, scb)
    if q.library == "torchao":
        return m.weight.dequantize()
    if q.library == "quanto":
        return m.qweight.dequantize()
    return m.dequantize()


def _bias(module: nn.Module) -> Optional[Tensor]:
    bias = getattr(module, "bias", None)
    return bias.detach() if isinstance(bias, Tensor) else None


def _probe_dtype(module: nn.Module, q: Quantization) -> torch.dtype:
    """The dtype of the inputs the layer takes in its model (what the probe feeds it)."""
    if q.library == "bitsandbytes":
        compute = getattr(module, "compute_dtype", None)
        return compute if compute in (torch.float16, torch.bfloat16) else torch.float32
    return q.compute_dtype if q.compute_dtype.is_floating_point else torch.float32


def _device(module: nn.Module) -> torch.device:
    for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        return t.device
    return torch.device(getattr(module, "device", "cpu"))


def tolerance(q: Quantization, dtype: torch.dtype, k: int) -> float:
    """The per-feature relative tolerance of :func:`verify`: a few eps of the coarser of the
    compute and input dtypes, plus float32 accumulation over ``k`` inputs; ``ACTIVATION_TOL``
    at least for layers that quantize their inputs."""
    eps = max(torch.finfo(q.compute_dtype).eps if q.compute_dtype.is_floating_point else 0.0,
              torch.finfo(dtype).eps)
    tol = _EPS_UNITS * eps + 4 * math.sqrt(k) * torch.finfo(torch.float32).eps
    return max(tol, ACTIVATION_TOL) if q.activations else tol


@contextlib.contextmanager
def _quiet(library: str) -> Iterator[None]:
    """The library's own log lines and warnings about the probe's input (bitsandbytes 8-bit:
    "inputs will be cast to float16", once per read) silenced while the probe runs."""
    logger = logging.getLogger(library.split(".")[0])
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _probe_forward(m: Any, xin: Tensor, keep_layout: bool) -> Tensor:
    """``m.forward(xin)`` (no hooks), detached; with ``keep_layout`` under autograd, so that
    bitsandbytes 4-bit does not repack its weights in place (it does so only at an eval forward
    under no_grad)."""
    if keep_layout:
        with torch.enable_grad():
            return m.forward(xin.clone().requires_grad_(True)).detach()
    with torch.no_grad():
        return m.forward(xin)


def verify(module: nn.Module, weight: Tensor, bias: Optional[Tensor], q: Quantization) -> float:
    """Check that ``module``'s own forward is x -> x W^T + b for the dequantized ``weight``
    (out, in) on a seeded Gaussian probe: per output feature j,
    ||y_j - y_ref_j|| <= tol * sqrt(n) (||W_j|| + |b_j|) (:func:`tolerance`). Returns the worst
    relative error; raises UnsupportedModelError naming the layer when it is above tol.

    The forward is called directly (no hooks run). bitsandbytes 4-bit layers repack their
    weights in place at an eval forward under no_grad on AVX512-BF16 CPUs; the probe runs with
    ``requires_grad`` set there, so checking never changes the layer."""
    out_features, in_features = weight.shape
    dtype, device = _probe_dtype(module, q), _device(module)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(PROBE_ROWS, in_features, generator=gen, dtype=torch.float64)
    xin = x.to(device, dtype)
    packed = q.library == "bitsandbytes" and bool(getattr(
        getattr(getattr(module, "weight", None), "quant_state", None),
        "packing_format_for_cpu", False))
    m: Any = module
    try:
        with _quiet(q.library):
            y = _probe_forward(m, xin, q.library == "bitsandbytes" and not packed)
    except (RuntimeError, TypeError, ValueError, AssertionError) as err:
        raise UnsupportedModelError(
            f"{layer_name(module)} ({q.describe()}): its forward failed on a probe input "
            f"({type(err).__name__}: {err}), so its dequantized weight cannot be checked; "
            "refused") from err
    b = None if bias is None else bias.detach().to("cpu", torch.float64)
    y = y.detach().to("cpu", torch.float64).reshape(PROBE_ROWS, -1)
    if y.shape != (PROBE_ROWS, out_features):
        raise UnsupportedModelError(
            f"{layer_name(module)} ({q.describe()}): its forward returns {tuple(y.shape)} "
            f"features, its dequantized weight {out_features}: refused")
    # x W^T and the row norms in float64, a chunk of rows at a time (no float64 copy of W)
    ref = torch.empty(PROBE_ROWS, out_features, dtype=torch.float64)
    norms = torch.empty(out_features, dtype=torch.float64)
    step = max(1, _CHUNK // max(in_features, 1))
    for r0 in range(0, out_features, step):
        chunk = weight[r0:r0 + step].detach().to("cpu", torch.float64)
        ref[:, r0:r0 + step] = x @ chunk.t()
        norms[r0:r0 + step] = chunk.norm(dim=1)
    if b is not None:
        ref += b
    scale = math.sqrt(PROBE_ROWS) * (norms + (b.abs() if b is not None else 0.0))
    err = (y - ref).norm(dim=0) / scale.clamp_min(torch.finfo(torch.float64).tiny)
    worst = float(err.max()) if err.numel() else 0.0
    tol = tolerance(q, dtype, in_features)
    if not math.isfinite(worst) or worst > tol:
        feature = int(torch.nan_to_num(err, nan=math.inf).argmax())
        raise UnsupportedModelError(
            f"{layer_name(module)} ({q.describe()}): its dequantized weight does not match its "
            f"own forward (relative error {worst:.2g} at output feature {feature}, tolerance "
            f"{tol:.1g}): an unknown or changed layout, refused rather than read as a wrong "
            "matrix")
    return worst


def dequantized(module: nn.Module, q: Optional[Quantization] = None, *,
                dtype: Optional[torch.dtype] = None) -> Tensor:
    """The verified float weight (out, in) of quantized ``module`` (:func:`verify`), detached,
    in ``dtype`` (None: the dtype its library dequantizes to; float32 for bitsandbytes'
    repacked layout, which is then decoded straight into ``dtype``)."""
    q = q if q is not None else quantization_of(module)
    if q is None:
        raise UnsupportedModelError(f"{layer_name(module)} is not a quantized layer this "
                                    "package can read")
    if q.library == "quanto" and q.activations:
        raise UnsupportedModelError(
            f"{layer_name(module)} ({q.describe()}): quanto rounds its inputs and outputs with "
            "static scales, so its forward cannot confirm the dequantized weight; refused "
            "(quantize the weights only: quantize(model, weights=...))")
    with torch.no_grad():
        weight = _dequantize_raw(module, q, dtype).detach()
        if dtype is not None and weight.dtype != dtype:
            weight = weight.to(dtype)
    if weight.ndim != 2:
        raise UnsupportedModelError(f"{layer_name(module)} ({q.describe()}) dequantizes to a "
                                    f"{tuple(weight.shape)} tensor, not a matrix: refused")
    verify(module, weight, _bias(module), q)
    return weight
