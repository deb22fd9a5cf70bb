"""Validators of single option values (split from options.py to keep it short): each returns
the normalised value or raises an OptionError naming the option, the value and what is valid."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence, Union

from ..errors import OptionError, UnknownOptionError

POSITION_KEYWORDS = ("default", "last", "all")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise OptionError(name, value, what)


def _check_optional_bool(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise OptionError(name, value, "True, False or None")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise OptionError(name, value, "True or False")


def _positions(value: Any) -> Union[str, tuple[int, ...]]:
    if isinstance(value, str):
        if value not in POSITION_KEYWORDS:
            raise OptionError("jacobian.positions", value,
                              "'default', 'last', 'all' or a list of rows")
        return value
    if _is_int(value):
        return (value,)
    if isinstance(value, Sequence) and value and all(_is_int(p) for p in value):
        return tuple(int(p) for p in value)
    raise OptionError("jacobian.positions", value,
                      "'default', 'last', 'all' or a non-empty list of ints")


def _known(cls: type, values: Mapping, where: str) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UnknownOptionError(where, unknown, sorted(names))
    return dict(values)


def _direction(value: Any) -> Union[None, tuple[float, ...]]:
    """power.direction: None, or a finite non-zero real vector as a tuple of floats."""
    if value is None:
        return None
    try:
        u = tuple(float(x) for x in value)  # a tensor, array or sequence
    except (TypeError, ValueError, RuntimeError):
        raise OptionError("power.direction", type(value).__name__,
                          "a real vector of length d_model") from None
    if not u or not all(math.isfinite(x) for x in u) or not any(u):
        raise OptionError("power.direction", "a zero, empty or non-finite vector",
                          "a finite non-zero vector of length d_model")
    return u


def _samples(value: Any) -> Union[None, str, tuple[int, ...]]:
    """jacobian.samples: None, "all", or a non-empty list of batch rows (ints >= 0)."""
    if value is None or value == "all":
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value \
            or not all(_is_int(x) and x >= 0 for x in value):
        raise OptionError("jacobian.samples", value,
                          'None, "all" or a non-empty list of batch rows (ints >= 0)')
    return tuple(int(x) for x in value)
