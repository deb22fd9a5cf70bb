"""Validators of the option values that need more than one check of
:mod:`spectral_hooks.checks` (positions, sample rows, a direction, the names a dict of options
may hold): each returns the normalised value or raises an OptionError naming the option, the
value and what is valid.

    >>> checked_positions([0, 3]), checked_samples("all")
    ((0, 3), 'all')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from ..checks import is_int
from ..errors import OptionError, OptionTypeError, UnknownOptionError

POSITION_KEYWORDS = ("default", "last", "all")


def checked_positions(value: Any) -> Union[str, tuple[int, ...]]:
    """jacobian.positions: one of POSITION_KEYWORDS, a row, or a non-empty list of rows.

    >>> checked_positions(2)
    (2,)
    """
    if isinstance(value, str):
        if value not in POSITION_KEYWORDS:
            raise OptionError("jacobian.positions", value,
                              "'default', 'last', 'all' or a list of rows")
        return value
    if is_int(value):
        return (int(value),)
    if isinstance(value, Sequence) and value and all(is_int(p) for p in value):
        return tuple(int(p) for p in value)
    raise OptionError("jacobian.positions", value,
                      "'default', 'last', 'all' or a non-empty list of ints")


def known_options(cls: type, values: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """``values`` as a dict, after checking that each key is a field of dataclass ``cls``.

    >>> from spectral_hooks.analysis.options import PowerOptions
    >>> known_options(PowerOptions, {"k": 4}, "power")
    {'k': 4}
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UnknownOptionError(where, unknown, sorted(names))
    return dict(values)


def checked_direction(value: Any) -> Union[None, tuple[float, ...]]:
    """power.direction: None, or a finite non-zero real vector as a tuple of floats.

    >>> checked_direction([1, 0])
    (1.0, 0.0)
    """
    if value is None:
        return None
    try:
        u = tuple(float(x) for x in value)  # a tensor, array or sequence
    except (TypeError, ValueError, RuntimeError):
        raise OptionTypeError("power.direction", value,
                              "a real vector of length d_model") from None
    if not u or not all(math.isfinite(x) for x in u) or not any(u):
        raise OptionError("power.direction", "a zero, empty or non-finite vector",
                          "a finite non-zero vector of length d_model")
    return u


def checked_samples(value: Any) -> Union[None, str, tuple[int, ...]]:
    """jacobian.samples: None, "all", or a non-empty list of batch rows (ints >= 0).

    >>> checked_samples([1, 0])
    (1, 0)
    """
    if value is None or value == "all":
        return value
    if not _int_list(value, minimum=0):
        raise OptionError("jacobian.samples", value,
                          'None, "all" or a non-empty list of batch rows (ints >= 0)')
    return tuple(int(x) for x in value)


def _int_list(value: Any, *, minimum: int) -> bool:
    """Is ``value`` a non-empty list (not a string) of ints >= ``minimum``?"""
    return (not isinstance(value, (str, bytes)) and isinstance(value, Sequence) and bool(value)
            and all(is_int(x) and x >= minimum for x in value))


def checked_depths(value: Any) -> Union[None, str, tuple[int, ...]]:
    """jacobian.bottleneck_depths: None (every depth), "log2" (1, 2, 4, ... and the last) or a
    non-empty list of depths (ints >= 1; each must be at most the number of layers, checked
    when the section runs).

    >>> checked_depths([8, 1])
    (1, 8)
    """
    if value is None or value == "log2":
        return value
    if not _int_list(value, minimum=1):
        raise OptionError("jacobian.bottleneck_depths", value,
                          'None, "log2" or a non-empty list of depths (ints >= 1)')
    return tuple(sorted({int(x) for x in value}))


def depths_of(value: Union[None, str, tuple[int, ...]], n_layers: int) -> Optional[list[int]]:
    """The depths a checked ``bottleneck_depths`` names for ``n_layers`` layers (None: all);
    an OptionError for a depth beyond them.

    >>> depths_of("log2", 12)
    [1, 2, 4, 8, 12]
    """
    if value is None:
        return None
    if isinstance(value, str):  # "log2" (checked_depths admits no other string)
        powers = [2 ** i for i in range(n_layers.bit_length()) if 2 ** i < n_layers]
        return powers + [n_layers]
    if value[-1] > n_layers:  # sorted by checked_depths
        raise OptionError("jacobian.bottleneck_depths", list(value),
                          f"depths in 1..{n_layers} (the recorded stack has {n_layers} layers)")
    return list(value)
