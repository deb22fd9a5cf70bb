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


_state = _Depth()
SUSPENSION = _state  # read ``SUSPENSION.depth`` (> 0: suspended) where a call would cost


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Block calls inside this context are not recorded by any probe (thread-local)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1


def is_suspended() -> bool:
    """True inside :func:`suspended` on this thread."""
    return _state.depth > 0
