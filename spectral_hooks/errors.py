"""Errors and warnings of spectral_hooks, and the record of fallbacks taken.

Every exception the library raises on purpose derives from :class:`SpectralHooksError` and also
from the builtin a user would catch: ``ValueError`` for a bad argument, ``IndexError`` for a
layer out of range, ``KeyError`` for a name a recording does not hold.

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
import warnings
from typing import Any, Iterator, Optional


class SpectralHooksError(Exception):
    """Base class of every error spectral_hooks raises on purpose."""


class OptionError(SpectralHooksError, ValueError):
    """A bad option or argument: names the option, the bad value and what is valid."""

    def __init__(self, option: str, value: Any, valid: str, *, hint: str = "") -> None:
        self.option, self.value, self.valid = option, value, valid
        message = f"{option}={value!r} is not valid: expected {valid}"
        super().__init__(message + (f" ({hint})" if hint else ""))


class UnknownOptionError(OptionError, TypeError):
    """An option name that does not exist (a TypeError, as for an unknown keyword)."""

    def __init__(self, where: str, unknown: list, known: list) -> None:
        self.option, self.value, self.valid = where, unknown, known
        SpectralHooksError.__init__(self, f"unknown {where} option(s) {sorted(unknown)}: "
                                          f"choose from {sorted(known)}")


class UnsupportedModelError(SpectralHooksError, ValueError):
    """The model (or this part of it) is not supported: the message says how to register it."""


class MissingWeightsError(UnsupportedModelError):
    """The anatomy cannot find a value or output projection for this model's attention."""


class RecordingError(SpectralHooksError, ValueError):
    """The recording cannot support what was asked (nothing recorded, stats only, padding)."""


class LayerIndexError(SpectralHooksError, IndexError, ValueError):
    """A layer index out of range (an IndexError, and a ValueError for older callers)."""


class RecordingKeyError(SpectralHooksError, KeyError):
    """A capture name or hook name the recording does not hold."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


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
    """Report a fallback: warn once per ``cause`` in this process, record it every time."""
    collected = _collector.get()
    if collected is not None and cause not in collected:
        collected.append(cause)
    if cause not in _warned:
        _warned.add(cause)
        warnings.warn(f"{message} [{cause}]", FallbackWarning, stacklevel=3)


@contextlib.contextmanager
def collecting_fallbacks(into: list) -> Iterator[list]:
    """Append the cause of every fallback taken inside this context to ``into`` (once each)."""
    token = _collector.set(into)
    try:
        yield into
    finally:
        _collector.reset(token)
