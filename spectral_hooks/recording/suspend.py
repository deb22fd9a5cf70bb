"""A switch that turns every probe off while a block is replayed (Jacobians, dense oracles).

    >>> with suspended():
    ...     is_suspended()          # block calls made here are never recorded
    True
    >>> is_suspended()
    False
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class _Depth(threading.local):
    depth = 0  # class default: every thread starts unsuspended, read without getattr


class _Suspensions:
    """How many :func:`suspended` contexts are open on any thread: a hook reads
    ``SUSPENSION.active`` (a plain attribute, unlike the thread-local depth) and asks
    :func:`is_suspended` only when it is not 0."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: int = 0


_state = _Depth()
SUSPENSION = _Suspensions()
_lock = threading.Lock()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Block calls inside this context are not recorded by any probe (thread-local)."""
    with _lock:
        SUSPENSION.active += 1
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        with _lock:
            SUSPENSION.active -= 1


def is_suspended() -> bool:
    """True inside :func:`suspended` on this thread."""
    return _state.depth > 0
