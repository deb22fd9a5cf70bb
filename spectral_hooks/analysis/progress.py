"""One progress display over a whole analysis: sections x layers, shown from the first second.

    >>> progress = Progress(["power", "jacobian"], n_layers=2, enabled=False)
    >>> with progress.section("jacobian"):
    ...     for layer in progress.layers([0, 1]):
    ...         pass
    >>> progress.done, progress.total
    (2, 4)

Every section counts ``n_layers`` units (twice that when it also analyses the re-initialised
model; ``times[name]`` times that for a section analysing several models, reinit_test).
A section with a per-layer loop advances one unit per layer it finishes; any other
section advances all its units when it ends ("done": a log's last line reads total/total). A
section computed while another one runs (trends reads the Jacobian rows) counts inside the
outer one, never twice.

Where it goes: on a terminal, one tqdm bar, opened when a section starts and closed when it ends
(so no stale bar stays on screen between lazily read sections); elsewhere (a log file, CI), one
plain-text line on stderr per finished layer. ``enabled=False`` (``analyze(progress=False)``)
or ``TQDM_DISABLE=1`` in the environment shows nothing; ``enabled=True`` shows it even without a
terminal (as a bar only on a terminal); None (default) shows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from typing import Any, Iterable, Iterator, Optional, Sequence

_CURRENT: contextvars.ContextVar[Optional["Progress"]] = contextvars.ContextVar(
    "spectral_hooks_progress", default=None)
_TRUE = ("1", "true", "yes", "on")


def env_disabled() -> bool:
    """``TQDM_DISABLE`` set to a true value (as tqdm reads it)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in _TRUE


class Progress:
    """Progress of one report's sections (see the module docstring)."""

    def __init__(self, sections: Sequence[str], *, n_layers: int,
                 enabled: Optional[bool] = None, doubled: Sequence[str] = (),
                 times: Optional[dict[str, int]] = None) -> None:
        times = times or {}
        self.units: dict[Optional[str], int] = {
            name: n_layers * times.get(name, 2 if name in doubled else 1) for name in sections}
        self.total: int = sum(self.units.values())
        self.done: int = 0
        self.enabled: bool = enabled is not False and not env_disabled()
        self._section: Optional[str] = None
        self._spent = 0  # units advanced in the current section
        self._bar = None
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Around a section's computation (nested sections count in the outer one)."""
        if self._section is not None or name not in self.units:
            yield
            return
        self._section, self._spent = name, 0
        token = _CURRENT.set(self)
        self._open()
        try:
            yield
            self.advance(self.units[name] - self._spent, "done")
        finally:
            _CURRENT.reset(token)
            self._close()
            self._section = None

    def layers(self, items: Iterable[Any], label: str = "") -> Iterator[Any]:
        """Iterate ``items`` (layers, or (layer, position) pairs), one unit per finished layer."""
        items = list(items)
        layer_of = lambda item: item[0] if isinstance(item, tuple) else item  # noqa: E731
        for i, item in enumerate(items):
            yield item
            last = i + 1 == len(items) or layer_of(items[i + 1]) != layer_of(item)
            if last:
                self.advance(1, f"{label} layer {layer_of(item)}".strip())

    def advance(self, n: int, what: str = "") -> None:
        """Count ``n`` finished units of the current section (capped at what it has left);
        ``what`` names them on the display ("layer 3")."""
        n = max(0, min(n, self.units.get(self._section, 0) - self._spent))
        if not n:
            return
        self._spent += n
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(n)
        elif what:
            sys.stderr.write(f"spectral_hooks: {self._section} {what}: {self.done}/{self.total} "
                             f"units, {time.perf_counter() - self._start:.1f} s\n")
            sys.stderr.flush()

    def _open(self) -> None:
        if self.enabled and _is_terminal():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, initial=self.done, leave=False,
                             desc=f"spectral analysis: {self._section}", unit="layer")
            self._bar.refresh()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def layers(items: Iterable[Any], label: str = "") -> Iterator[Any]:
    """``Progress.layers`` of the section being computed (plain iteration outside one)."""
    current = _CURRENT.get()
    return iter(items) if current is None else current.layers(items, label)
